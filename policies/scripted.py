"""Scripted policies: a callable (or the env's expert) behind the async Policy contract.

A scripted policy is the test twin of a model policy (like httpx's MockTransport): same contract,
no model. Like the model policies, it cuts its text at the request's stop strings and returns an
empty completion for ``max_tokens=0``. ``ScriptedPolicy(fn)`` calls ``fn(messages) -> str | Message``; ``ExpertPolicy`` asks the
env's privileged expert through ``GenRequest.oracle``, which the rollout engine fills in.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agentgym.errors import PolicyError
from agentgym.policy import Generation, GenRequest
from agentgym.types import Message

from ._common import cut_at_stop as _cut_at_stop

__all__ = ["ExpertPolicy", "ScriptedPolicy"]

Script = Callable[[list[Message]], "str | Message | Awaitable[str | Message]"]


def _to_generation(out: Any, version: int, req: GenRequest | None = None) -> Generation:
    stop = req.sampling.stop if req is not None else None
    if req is not None and req.sampling.max_tokens == 0:
        return Generation(text="", finish_reason="length", weight_version=version)
    if isinstance(out, str):
        text, _ = _cut_at_stop(out, stop)
        return Generation(text=text, weight_version=version)
    if isinstance(out, dict) and out.get("role") == "assistant":
        calls = out.get("tool_calls") or None
        text, _ = _cut_at_stop(out.get("content") or "", stop)
        return Generation(text=text, tool_calls=calls, weight_version=version)
    raise PolicyError(f"scripted policy returned {type(out).__name__}; expected str or assistant message")


class ScriptedPolicy:
    """Wraps ``fn(messages) -> str | Message`` (sync or async) as a Policy."""

    def __init__(self, fn: Script, policy_id: str = "scripted", weight_version: int = 0) -> None:
        self.fn = fn
        self.policy_id = policy_id
        self.weight_version = weight_version

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        out: list[Generation] = []
        for req in requests:
            for _ in range(req.n):
                res = self.fn(list(req.messages or []))
                if inspect.isawaitable(res):
                    res = await res
                out.append(_to_generation(res, self.weight_version, req))
        return out


class ExpertPolicy:
    """The env's privileged expert as a policy. Needs ``GenRequest.oracle`` (set by the rollout)."""

    def __init__(self, policy_id: str = "expert") -> None:
        self.policy_id = policy_id

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        out: list[Generation] = []
        for req in requests:
            if req.oracle is None:
                raise PolicyError("ExpertPolicy needs GenRequest.oracle: run it through agentgym.rollout.")
            for _ in range(req.n):
                action = req.oracle()
                if action is None:
                    raise PolicyError("this env has no expert (expert_action() returned None)")
                out.append(_to_generation(action, 0))
        return out

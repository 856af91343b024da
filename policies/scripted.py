"""Scripted policies: a callable behind the async Policy contract, and the env's expert.

A scripted policy is the test twin of a model policy (like httpx's MockTransport): same contract,
no model. Like the model policies, it cuts its text at the request's stop strings and returns an
empty completion for ``max_tokens=0``. ``ScriptedPolicy(fn)`` calls ``fn(messages) -> str | Message``.

``ExpertPolicy`` is an *env-side* policy (``capabilities.env_side``): the rollout asks it to act on
the env itself, through the env's public ``expert_action()`` method, so the expert never travels
inside a request and model policies never see it. It works for a local env and for an env served
over HTTP alike.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agentgym.errors import PolicyError
from agentgym.policy import Capabilities, Generation, GenRequest, PolicyLifecycle, describe_policy
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


class ScriptedPolicy(PolicyLifecycle):
    """Wraps ``fn(messages) -> str | Message`` (sync or async) as a Policy."""

    capabilities = Capabilities()

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

    async def aclose(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        fn = getattr(self.fn, "__qualname__", repr(self.fn))
        return describe_policy(self, backend="scripted", function=f"{getattr(self.fn, '__module__', '?')}.{fn}",
                               weight_version=self.weight_version)


class ExpertPolicy(PolicyLifecycle):
    """The env's privileged expert, acting through the env's public API (an env-side policy)."""

    capabilities = Capabilities(env_side=True)

    def __init__(self, policy_id: str = "expert") -> None:
        self.policy_id = policy_id

    def act(self, env: Any) -> str | Message:
        """The expert's action for ``env``'s current state (``env.expert_action()``, through wrappers)."""
        try:
            expert = env.get_wrapper_attr("expert_action") if hasattr(env, "get_wrapper_attr") else env.expert_action
        except AttributeError:
            raise PolicyError(f"{type(env).__name__} has no expert_action(); --policy expert needs an env expert") from None
        action = expert()
        if action is None:
            raise PolicyError("this env has no expert (expert_action() returned None)")
        return action  # type: ignore[no-any-return]

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        raise PolicyError("ExpertPolicy acts on the env (act(env)); run it through agentgym.rollout, not generate()")

    async def aclose(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return describe_policy(self, backend="env expert")

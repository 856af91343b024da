"""The policy contract, shared by ``agentgym.policies`` (implementations) and ``agentgym.rollout``.

A policy looks like a transport: one async method, plus a lifecycle. Implementations live in
``policies/`` (HF, vLLM, OpenAI-compatible HTTP, scripted); the core only knows this protocol.

**Capabilities are declared, not discovered.** Every policy carries a :class:`Capabilities` record;
the rollout engine reads it and never probes attributes:

* ``sessions``: :meth:`TokenPolicy.new_session` returns a token-exact :class:`ChatSession`. The
  engine then sends the session's *whole* token sequence each turn (``prompt_token_ids``); only the
  new observation messages are tokenized, nothing is re-tokenized.
* ``weight_updates``: ``update_weights(update, version)``, ``update`` a :class:`~agentgym.weights.WeightUpdate`
  or its signed wire form (``bytes``), versions strictly increasing: the
  :class:`~agentgym.weights.WeightReceiver` protocol.
* ``abort``: ``abort(request_ids)`` ends in-flight requests early; they return what they generated
  so far with ``finish_reason="abort"``, so the caller can resume the partial turn.
* ``env_side``: the policy acts through the env's public API (its expert), not through
  :meth:`Policy.generate`; see :class:`EnvSidePolicy`. Model policies never see the expert.

**Lifecycle.** ``async with policy: ...`` or ``await policy.aclose()`` releases engines, processes
and connections. ``describe()`` returns what an eval protocol records (backend, model, version,
template).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentgym.errors import ConfigurationError
from agentgym.types import Message, ToolCall, ToolSpec

__all__ = [
    "Capabilities",
    "ChatSession",
    "EnvSidePolicy",
    "GenRequest",
    "Generation",
    "Policy",
    "PolicyLifecycle",
    "SamplingParams",
    "TokenPolicy",
    "capabilities_of",
    "describe_policy",
    "session_factory",
]


@dataclass(frozen=True)
class Capabilities:
    """What a policy can do beyond ``generate`` (see the module docstring)."""

    sessions: bool = False
    weight_updates: bool = False
    abort: bool = False
    env_side: bool = False


@dataclass
class SamplingParams:
    """Sampling settings. ``seed`` makes a single request reproducible where the backend allows."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop: list[str] | None = None
    seed: int | None = None
    logprobs: bool = True


@dataclass
class GenRequest:
    """One generation request.

    Either ``messages`` (+ ``tools``), rendered with the model's own chat template, or exact
    ``prompt_token_ids``: the whole token context (never a delta). A request carries no privileged
    information; it is plain data (serializable), so it can cross a process or a network.
    """

    messages: list[Message] | None = None
    tools: list[ToolSpec] | None = None
    prompt_token_ids: list[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    request_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generation:
    """One sampled completion.

    Attributes:
        text: The decoded completion (without the stop string).
        token_ids: Completion token ids (empty for policies without a tokenizer).
        logprobs: Behaviour logprob per completion token (same length as ``token_ids`` or empty).
        finish_reason: ``"stop"``, ``"length"``, ``"abort"`` (cut by :meth:`abort`; resumable) or ``"error"``.
        weight_version: The weight version of the tokens: one int, or one per token
            (``[len(token_ids)]``) when a weight update landed while the request ran.
        prompt_token_ids: The prompt ids the backend actually used, where known.
        tool_calls: Structured tool calls (OpenAI-compatible servers), already parsed.
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    weight_version: int | list[int] = 0
    prompt_token_ids: list[int] | None = None
    tool_calls: list[ToolCall] | None = None

    def as_action(self) -> str | Message:
        """The env action: raw text, or an assistant message when the server returned tool_calls."""
        if self.tool_calls:
            return {"role": "assistant", "content": self.text, "tool_calls": list(self.tool_calls)}
        return self.text


@runtime_checkable
class Policy(Protocol):
    """Anything that turns requests into generations.

    ``generate`` returns ``len(requests) * n`` generations, request-major (all samples of request 0,
    then request 1, ...). It never hangs: every call has a deadline and raises a
    :class:`~agentgym.errors.PolicyError` subclass on failure.
    """

    policy_id: str

    @property
    def capabilities(self) -> Capabilities: ...

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]: ...

    async def aclose(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...


class PolicyLifecycle:
    """``async with`` support for policies: ``__aenter__`` returns self, ``__aexit__`` awaits ``aclose()``.

    A two-method convenience (policies still implement :meth:`Policy.aclose` themselves).
    """

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()  # type: ignore[attr-defined]


@runtime_checkable
class ChatSession(Protocol):
    """Exact token ids of one conversation, extended turn by turn without re-tokenizing.

    Usage by the rollout engine::

        session.start(messages, tools)                 # whole first prompt + generation prompt
        gen = await policy.generate([GenRequest(prompt_token_ids=session.token_ids)])
        session.append_completion(gen.token_ids)        # the sampled ids, verbatim
        delta = session.append_messages(observation)    # only the new tokens (+ generation prompt)
        gen = await policy.generate([GenRequest(prompt_token_ids=session.token_ids)])  # the WHOLE context
    """

    @property
    def token_ids(self) -> list[int]: ...

    def start(self, messages: list[Message], tools: list[ToolSpec] | None = None) -> list[int]: ...

    def append_completion(self, token_ids: list[int]) -> None: ...

    def append_messages(self, messages: list[Message]) -> list[int]: ...


@runtime_checkable
class TokenPolicy(Policy, Protocol):
    """A policy with a tokenizer, which can keep token-exact sessions (``capabilities.sessions``)."""

    def new_session(self) -> ChatSession: ...


@runtime_checkable
class EnvSidePolicy(Protocol):
    """A policy that acts through the env's public API (``capabilities.env_side``): the env's expert.

    ``act(env)`` runs in the rollout's worker pool (it may block) and returns the action for the
    env's current state: raw text or an assistant message.
    """

    policy_id: str

    @property
    def capabilities(self) -> Capabilities: ...

    def act(self, env: Any) -> str | Message: ...


def capabilities_of(policy: Any) -> Capabilities:
    """The declared capabilities of ``policy`` (a policy without the attribute declares none).

    Raises:
        ConfigurationError: ``capabilities`` is not a :class:`Capabilities`, or a declared capability's
            method is missing.
    """
    caps = getattr(policy, "capabilities", None)
    if caps is None:
        return Capabilities()
    if not isinstance(caps, Capabilities):
        raise ConfigurationError(f"{type(policy).__name__}.capabilities must be an agentgym.policy.Capabilities, "
                                 f"got {type(caps).__name__}")
    need = {"sessions": "new_session", "weight_updates": "update_weights", "abort": "abort", "env_side": "act"}
    for cap, method in need.items():
        if getattr(caps, cap) and not callable(getattr(policy, method, None)):
            raise ConfigurationError(f"{type(policy).__name__} declares {cap} but has no {method}()")
    return caps


def session_factory(policy: Any) -> Any:
    """``policy.new_session`` if the policy declares ``sessions``, else ``None``."""
    return policy.new_session if capabilities_of(policy).sessions else None


def describe_policy(policy: Any, **extra: Any) -> dict[str, Any]:
    """Common ``describe()`` fields: policy id, class, capabilities and, if it has a tokenizer, the
    sha1 of its chat template. Implementations add backend, model and weight version."""
    caps = capabilities_of(policy)
    d: dict[str, Any] = {
        "policy_id": policy.policy_id,
        "class": f"{type(policy).__module__}.{type(policy).__qualname__}",
        "capabilities": [k for k, v in caps.__dict__.items() if v],
        "token_in_token_out": caps.sessions,
    }
    tok = getattr(policy, "tokenizer", None)
    template = getattr(tok, "chat_template", None) if tok is not None else None
    if isinstance(template, str):
        d["chat_template_sha1"] = hashlib.sha1(template.encode()).hexdigest()[:12]
    d.update(extra)
    return d

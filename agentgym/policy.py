"""The policy contract, shared by ``agentgym.policies`` (implementations) and ``agentgym.rollout``.

A policy looks like a transport: one async method. Implementations live in ``policies/`` (HF,
vLLM, OpenAI-compatible HTTP, scripted); the core only knows this protocol.

Token in, token out: a policy that owns a tokenizer also offers :meth:`TokenPolicy.new_session`,
a :class:`ChatSession` that keeps the exact token ids of an episode and tokenizes only the new
observation messages (the chat-template suffix, with the prefix property verified). The rollout
engine then sends ``prompt_token_ids`` instead of messages, so nothing is ever re-tokenized.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentgym.types import Message, ToolCall, ToolSpec

__all__ = ["ChatSession", "GenRequest", "Generation", "Policy", "SamplingParams", "TokenPolicy"]


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
    ``prompt_token_ids``. ``oracle`` lets a scripted/expert policy ask the env's privileged expert
    for the next action without the policy importing envs.
    """

    messages: list[Message] | None = None
    tools: list[ToolSpec] | None = None
    prompt_token_ids: list[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    request_id: str = ""
    oracle: Callable[[], Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generation:
    """One sampled completion.

    Attributes:
        text: The decoded completion (without the stop string).
        token_ids: Completion token ids (empty for policies without a tokenizer).
        logprobs: Behaviour logprob per completion token (same length as ``token_ids`` or empty).
        finish_reason: ``"stop"``, ``"length"`` or ``"error"``.
        weight_version: The weight version that produced the tokens.
        prompt_token_ids: The prompt ids the backend actually used, where known.
        tool_calls: Structured tool calls (OpenAI-compatible servers), already parsed.
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    weight_version: int = 0
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

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]: ...


@runtime_checkable
class ChatSession(Protocol):
    """Exact token ids of one conversation, extended turn by turn without re-tokenizing.

    Usage by the rollout engine::

        ids = session.start(messages, tools)           # whole first prompt + generation prompt
        gen = await policy.generate([GenRequest(prompt_token_ids=ids)])
        session.append_completion(gen.token_ids)        # the sampled ids, verbatim
        delta = session.append_messages(observation)    # only the new tokens (+ generation prompt)
    """

    @property
    def token_ids(self) -> list[int]: ...

    def start(self, messages: list[Message], tools: list[ToolSpec] | None = None) -> list[int]: ...

    def append_completion(self, token_ids: list[int]) -> None: ...

    def append_messages(self, messages: list[Message]) -> list[int]: ...


@runtime_checkable
class TokenPolicy(Policy, Protocol):
    """A policy with a tokenizer, which can keep token-exact sessions."""

    def new_session(self) -> ChatSession: ...

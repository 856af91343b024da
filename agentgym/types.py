"""Core data types shared by envs, policies, rollout and trainers.

Envs and policies exchange :class:`Message` lists and nothing else; those go straight into
``tokenizer.apply_chat_template(messages, tools=...)``. A :class:`Trajectory` is what the rollout
engine hands to the dataflow layer and the trainers, which never see envs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from typing_extensions import NotRequired

__all__ = [
    "FunctionSpec",
    "Message",
    "Role",
    "TaskSpec",
    "ToolCall",
    "ToolSpec",
    "TrainingView",
    "Trajectory",
    "Turn",
]

Role = Literal["system", "user", "assistant", "tool"]


class ToolCall(TypedDict):
    """A parsed tool call. ``arguments`` is already a dict (never a JSON string)."""

    id: str
    name: str
    arguments: dict[str, Any]


class Message(TypedDict):
    """An OpenAI-style chat message.

    ``tool_calls`` appears on assistant messages, ``tool_call_id``/``name`` on tool results.
    """

    role: Role
    content: str
    tool_calls: NotRequired[list[ToolCall]]
    tool_call_id: NotRequired[str]
    name: NotRequired[str]


class FunctionSpec(TypedDict):
    name: str
    description: str
    parameters: dict[str, Any]


class ToolSpec(TypedDict):
    """A tool's JSON schema in OpenAI function format: ``{"type": "function", "function": {...}}``."""

    type: Literal["function"]
    function: FunctionSpec


@dataclass(frozen=True)
class TaskSpec:
    """One task an env can be reset to.

    Attributes:
        task_id: Unique within the env (across splits).
        split: ``"train"``, ``"test"``, ``"valid_seen"``, ...
        task_type: A coarse category for reporting (``"pick_and_place_simple"``, ``"join"``...).
        data: Env-specific payload (gold answer, scene, tests...). Must be JSON-serialisable.
    """

    task_id: str
    split: str
    task_type: str = "default"
    data: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass
class Turn:
    """One policy call inside an episode.

    Attributes:
        policy_id: Which policy generated this turn (multi-policy workflows tag every turn).
        prompt_token_ids: The *delta* of prompt tokens since the previous turn (the first turn holds
            the whole rendered prompt). Env/tool tokens: never trained on.
        completion_token_ids: Tokens the policy generated.
        completion_logprobs: Behaviour logprob of each completion token (``[len(completion)]``).
        weight_version: One int for the whole turn, or one per completion token.
        text: Decoded completion text.
        tool_calls: Tool calls parsed from the completion.
        observation: The env messages that followed this turn.
        finish_reason: ``"stop"``, ``"length"``, ...
    """

    policy_id: str
    prompt_token_ids: list[int] = field(default_factory=list)
    completion_token_ids: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)
    weight_version: int | list[int] = 0
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    observation: list[Message] = field(default_factory=list)
    finish_reason: str = "stop"
    reward: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Turn:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class TrainingView:
    """The token-level training view of one trajectory.

    Attributes:
        token_ids: ``[L]`` every prompt and completion token, in order.
        loss_masks: policy_id -> ``[L]`` 1 where that policy generated the token, else 0.
        logprobs: ``[L]`` behaviour logprob for generated tokens, 0.0 elsewhere.
        versions: ``[L]`` weight version of generated tokens, -1 elsewhere.
    """

    token_ids: list[int]
    loss_masks: dict[str, list[int]]
    logprobs: list[float]
    versions: list[int]


@dataclass
class Trajectory:
    """One episode: the turns, the outcome and the bookkeeping the trainer and eval need.

    ``terminated`` (the task ended) and ``truncated`` (a limit was hit) are never merged.
    ``early_stopped`` marks a group cut short by a gate; the trainer excludes it from the loss.
    """

    task_id: str
    env_id: str
    group_id: str = ""
    turns: list[Turn] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    early_stopped: bool = False
    error: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(t.completion_token_ids) for t in self.turns)

    def action_texts(self) -> list[str]:
        return [t.text for t in self.turns]

    def training_view(self, zero_truncated: bool = False) -> TrainingView:
        """Concatenate the turns into ``token_ids`` with one loss mask per policy.

        Per turn: ``[0]*len(prompt_delta) + [1]*len(completion)`` for the policy that generated it.
        With ``zero_truncated``, a truncated episode gets all-zero masks (it is kept out of the loss).
        """
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        owner: list[str | None] = []
        for t in self.turns:
            ids += t.prompt_token_ids
            logprobs += [0.0] * len(t.prompt_token_ids)
            versions += [-1] * len(t.prompt_token_ids)
            owner += [None] * len(t.prompt_token_ids)
            n = len(t.completion_token_ids)
            ids += t.completion_token_ids
            lp = list(t.completion_logprobs) if len(t.completion_logprobs) == n else [0.0] * n
            logprobs += lp
            wv = t.weight_version
            versions += list(wv) if isinstance(wv, list) else [wv] * n
            owner += [t.policy_id] * n
        policies = sorted({t.policy_id for t in self.turns})
        masks: dict[str, list[int]] = {}
        for p in policies:
            if zero_truncated and self.truncated:
                masks[p] = [0] * len(ids)
            else:
                masks[p] = [1 if o == p else 0 for o in owner]
        return TrainingView(token_ids=ids, loss_masks=masks, logprobs=logprobs, versions=versions)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["turns"] = [Turn.from_dict(t) for t in d.get("turns", [])]
        return cls(**kw)


def is_message_list(obj: Any) -> bool:
    """True if ``obj`` is a list of well-formed :class:`Message` dicts."""
    if not isinstance(obj, list):
        return False
    return all(is_message(m) for m in obj)


_ROLES = frozenset({"system", "user", "assistant", "tool"})
_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})


def is_message(m: Any) -> bool:
    if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
        return False
    if not _KEYS.issuperset(m.keys()):
        return False
    tcs = m.get("tool_calls")
    if tcs is not None and not (isinstance(tcs, list) and all(isinstance(tc, dict) for tc in tcs)):
        return False
    return all(isinstance(m[k], str) for k in ("tool_call_id", "name") if k in m)


def messages_text(messages: Sequence[Message]) -> str:
    """Join the contents of messages with blank lines (for display and logging)."""
    return "\n\n".join(m["content"] for m in messages)

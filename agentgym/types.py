"""Core data types shared by envs, policies, rollout and trainers.

Envs and policies exchange :class:`Message` lists and nothing else; those go straight into
``tokenizer.apply_chat_template(messages, tools=...)``. A :class:`Trajectory` is what the rollout
engine hands to the dataflow layer and the trainers, which never see envs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from typing_extensions import NotRequired

from agentgym.errors import TrainingDataError

__all__ = [
    "FunctionSpec",
    "Message",
    "Role",
    "Segment",
    "TaskSpec",
    "ToolCall",
    "ToolSpec",
    "Trajectory",
    "TrajectoryGroup",
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
        prompt_token_ids: The prompt tokens this turn added to its policy's context: the whole rendered
            prompt on the first turn of a session (``new_session``), else the delta since that policy's
            previous turn in the same session (the observation and the template's glue). Env/tool
            tokens: never trained on.
        completion_token_ids: Tokens the policy generated.
        completion_logprobs: Behaviour logprob of each completion token (``[len(completion)]``), or
            empty when the backend reports none.
        weight_version: The weight version of every completion token: one int, or one per token
            (``[len(completion)]``) when a weight update landed mid-turn.
        text: Decoded completion text.
        tool_calls: Tool calls parsed from the completion (by the env).
        observation: The messages that followed this turn (env output, or another role's feedback).
        finish_reason: ``"stop"``, ``"length"``, ...
        new_session: True if this turn starts a new token context for its policy: the first turn of the
            policy in the episode, or a restart after the chat template could not be continued
            token-exactly (or a message-mode backend re-tokenized the history). A restart starts a
            new training :class:`Segment`.
        parse_error: Why the env could not parse this turn's action (its ``info["parse_error"]``), else
            ``None``.
        timing: Seconds this turn took: ``policy_s`` (the policy call) and ``env_s`` (the env step).
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
    new_session: bool = False
    parse_error: str | None = None
    timing: dict[str, float] = field(default_factory=dict)

    def token_versions(self) -> list[int]:
        """``[len(completion)]`` the weight version of each completion token.

        Raises:
            TrainingDataError: a per-token version list whose length is not the completion's.
        """
        n = len(self.completion_token_ids)
        wv = self.weight_version
        if isinstance(wv, list):
            if len(wv) != n:
                raise TrainingDataError(f"turn of {self.policy_id!r} has {len(wv)} weight versions for {n} tokens")
            return [int(v) for v in wv]
        return [int(wv)] * n

    @property
    def min_version(self) -> int | None:
        """The oldest weight version among this turn's tokens (``None`` for an empty completion)."""
        if not self.completion_token_ids:
            return None
        wv = self.weight_version
        return min(wv) if isinstance(wv, list) and wv else int(wv) if not isinstance(wv, list) else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Turn:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Segment:
    """One training sequence: the exact token ids one policy's model saw in one session, in order.

    A single-policy episode with no restart has one segment. A multi-policy episode has one per policy
    (each policy keeps its own session); a session restarted after a template mismatch starts a new one.

    Attributes:
        policy_id: The policy that generated the masked tokens.
        token_ids: ``[L]`` prompt and completion tokens of the session, in order.
        loss_mask: ``[L]`` 1 on tokens this policy generated, 0 on prompt, env and tool tokens.
        logprobs: ``[L]`` behaviour logprob on generated tokens, 0.0 elsewhere; ``None`` when the
            backend reported no logprobs (usable for SFT, not for importance ratios).
        versions: ``[L]`` weight version of generated tokens, -1 elsewhere.
        turns: Indices (into ``Trajectory.turns``) of the turns this segment covers.
    """

    policy_id: str
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float] | None
    versions: list[int]
    turns: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        lens = {"loss_mask": len(self.loss_mask), "versions": len(self.versions)}
        if self.logprobs is not None:
            lens["logprobs"] = len(self.logprobs)
        bad = {k: v for k, v in lens.items() if v != n}
        if bad:
            raise TrainingDataError(f"segment of {self.policy_id!r} has {n} tokens but {bad}")

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)

    @property
    def min_version(self) -> int | None:
        """Oldest weight version of any generated token (``None`` if none was generated)."""
        vs = [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]
        return min(vs) if vs else None


@dataclass
class Trajectory:
    """One episode: the turns, the outcome and the typed bookkeeping the trainer and eval need.

    ``terminated`` (the task ended) and ``truncated`` (a limit was hit) are never merged.
    ``early_stopped`` marks a member of a group cut short by a gate; the trainer excludes it from
    the loss. Gate records live once per group, on :class:`TrajectoryGroup`.

    Attributes:
        task_id / env_id: What was run.
        group_id / member: The group (G samples of one task) and this episode's index in it.
        turns: Every policy call, in order, tagged with its policy.
        messages: The whole conversation as the env saw it (for transcripts).
        reward / success: The env's total reward and success flag.
        policy_rewards: Per-policy reward where roles are rewarded differently (a verifier);
            empty means every policy gets ``reward`` (see :meth:`reward_for`).
        truncated_reason: Which limit ended a truncated episode (``max_turns``, ``policy_timeout``...).
        error / error_source: A failure that lost the episode, and where (``env``, ``policy``...).
    """

    task_id: str
    env_id: str
    group_id: str = ""
    member: int = 0
    turns: list[Turn] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    truncated_reason: str | None = None
    early_stopped: bool = False
    policy_rewards: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    error_source: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(t.completion_token_ids) for t in self.turns)

    @property
    def policy_ids(self) -> list[str]:
        """The policies that acted, in order of first appearance."""
        return list(dict.fromkeys(t.policy_id for t in self.turns))

    @property
    def min_version(self) -> int | None:
        """The oldest weight version of any generated token (``None`` if nothing was generated)."""
        vs = [v for t in self.turns if (v := t.min_version) is not None]
        return min(vs) if vs else None

    def reward_for(self, policy_id: str) -> float:
        """The reward ``policy_id`` is trained on for this episode."""
        return float(self.policy_rewards.get(policy_id, self.reward))

    def segments(self, policy_id: str | None = None, *, zero_truncated: bool = False) -> list[Segment]:
        """The training view: one :class:`Segment` per (policy, session), in order of first turn.

        Per turn the segment grows by ``prompt_token_ids`` (mask 0) then ``completion_token_ids``
        (mask 1). A turn with ``new_session`` (or a policy's first turn) opens a new segment.

        Args:
            policy_id: Only that policy's segments.
            zero_truncated: A truncated episode gets all-zero loss masks (kept out of the loss).

        Raises:
            TrainingDataError: logprobs or weight versions whose length is not the completion's, or a
                segment mixing turns with and without logprobs.
        """
        open_seg: dict[str, int] = {}
        parts: list[dict[str, Any]] = []
        for i, t in enumerate(self.turns):
            if policy_id is not None and t.policy_id != policy_id:
                continue
            k = open_seg.get(t.policy_id)
            if k is None or t.new_session:
                k = len(parts)
                open_seg[t.policy_id] = k
                parts.append({"policy_id": t.policy_id, "ids": [], "mask": [], "lps": [], "vers": [],
                              "turns": [], "has_lp": None})
            p = parts[k]
            n = len(t.completion_token_ids)
            lp = list(t.completion_logprobs)
            if lp and len(lp) != n:
                raise TrainingDataError(
                    f"turn {i} of {t.policy_id!r} has {len(lp)} logprobs for {n} completion tokens")
            has = bool(lp) or n == 0
            if n and p["has_lp"] is not None and p["has_lp"] != has:
                raise TrainingDataError(f"turn {i} of {t.policy_id!r}: some turns of a segment have logprobs, "
                                        "others none")
            if n:
                p["has_lp"] = has
            versions = t.token_versions()
            m = len(t.prompt_token_ids)
            p["ids"] += list(t.prompt_token_ids) + list(t.completion_token_ids)
            p["mask"] += [0] * m + [1] * n
            p["lps"] += [0.0] * m + (lp if lp else [0.0] * n)
            p["vers"] += [-1] * m + versions
            p["turns"].append(i)
        out = []
        for p in parts:
            mask = [0] * len(p["mask"]) if zero_truncated and self.truncated else p["mask"]
            out.append(Segment(policy_id=p["policy_id"], token_ids=p["ids"], loss_mask=mask,
                               logprobs=p["lps"] if p["has_lp"] is not False else None, versions=p["vers"],
                               turns=p["turns"]))
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["turns"] = [Turn.from_dict(t) for t in d.get("turns", [])]
        return cls(**kw)


@dataclass
class TrajectoryGroup:
    """The G episodes of one task that a GRPO-style trainer compares, with the group's gate records.

    Attributes:
        group_id / task_id / env_id: What was run.
        trajectories: ``[G]`` the members, in member order.
        early_stopped: An enforced gate stopped the group (every member is ``early_stopped``).
        stop_reason: ``"gate:reason"`` of that stop.
        gate_records: Every gate decision on this group (``GateRecord.to_dict()``), stored once here.
        info: The request's info (split, eval keys...).
    """

    group_id: str
    task_id: str
    env_id: str
    trajectories: list[Trajectory] = field(default_factory=list)
    early_stopped: bool = False
    stop_reason: str | None = None
    gate_records: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(self.trajectories)

    def __getitem__(self, i: int) -> Trajectory:
        return self.trajectories[i]

    def rewards(self, policy_id: str | None = None) -> list[float]:
        return [t.reward_for(policy_id) if policy_id else t.reward for t in self.trajectories]

    def zero_variance(self, policy_id: str | None = None, tol: float = 1e-9) -> bool:
        """True if every member got the same reward (no group-relative signal)."""
        r = self.rewards(policy_id)
        return not r or max(r) - min(r) <= tol

    @property
    def errors(self) -> int:
        return sum(1 for t in self.trajectories if t.error is not None)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrajectoryGroup:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["trajectories"] = [Trajectory.from_dict(t) for t in d.get("trajectories", [])]
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

"""Early-termination gates: pluggable checks called after each env step of a group.

A *group* is the G episodes of one task that a GRPO-style trainer compares. After every env step
of any member, the group's :class:`GroupState` is shown to each gate; a gate may return a
:class:`GateDecision`. ``"stop"`` ends the whole group (every member is marked
``early_stopped`` so the trainer keeps it out of the loss); ``"flag"`` only annotates it.

Two gates ship:

* :class:`SelectiveRolloutGate` ("Selective Rollout": K=10, d=0.12). Once every member has taken
  ``k`` steps (or ended earlier), it computes the mean pairwise normalised edit distance of the
  members' ``k``-step *action prefixes*. A near-identical group will almost surely end with the
  same reward for everyone (zero advantage, no gradient), so below ``threshold`` it stops the group.
* :class:`ZeroVarianceDetector`: flags completed groups whose rewards are all equal.

**The action sequence, concretely.** Each step contributes one *action string*. With
``view="action"`` (the default) it is :func:`canonical_action`: the parsed tool calls as canonical
JSON (``{"arguments":...,"name":...}`` with sorted keys, ``;``-joined), else the parsed text command
(whitespace collapsed), else the whitespace-collapsed raw text. With ``view="tool_calls"`` it is
:func:`canonical_calls`: the parsed tool calls only (names and canonical arguments, string values
whitespace-collapsed); a step without a parsed call is the one symbol ``"<no_call>"``, whatever
its text. So a model that thinks aloud, or writes free text that parses to nothing, is compared on
what it *did*: two members whose turns parse to no call behave alike for the env (an error
observation each), and free text no longer makes them look diverse. ``view="action"`` suits
text-command envs (ALFWorld); ``view="tool_calls"`` suits tool-calling envs.

An episode's action sequence is the list of its action strings; the prefix is its first ``k``
items (fewer if it ended earlier). The distance between two prefixes ``a`` and ``b`` is the
Levenshtein distance over *sequences* (each action is one symbol; insert/delete/substitute cost 1;
two actions are equal only when their strings are identical), divided by ``max(len(a), len(b))``
(0 if both are empty). The group score is the mean over all ``G(G-1)/2`` pairs. ``level="char"``
instead joins each prefix with newlines and uses character-level Levenshtein normalised by the
longer string. Distances are computed by ``rapidfuzz`` (``rapidfuzz.distance.Levenshtein``); action
strings are mapped to integer symbols first, so sequence equality is exact.

**Audit mode.** With ``audit=True`` (see :class:`GateMonitor`) decisions are recorded but not
enforced, the group runs to the end, and the final rewards are written into the
:class:`GateRecord`; :func:`gate_precision` then gives the fraction of would-be stops whose group
really ended with zero reward variance, and the recall (the share of zero-variance groups stopped).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Hashable, MutableSequence, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from rapidfuzz.distance import Levenshtein as _Lev

from agentgym.types import ToolCall

__all__ = [
    "Gate",
    "GateDecision",
    "GateMonitor",
    "GateRecord",
    "GroupState",
    "SelectiveRolloutGate",
    "ZeroVarianceDetector",
    "canonical_action",
    "canonical_calls",
    "gate_precision",
    "levenshtein",
    "mean_pairwise_distance",
    "normalized_distance",
]

DecisionKind = Literal["stop", "continue", "flag"]
View = Literal["action", "tool_calls"]
NO_CALL = "<no_call>"


def canonical_action(tool_calls: Sequence[ToolCall] | None, command: str | None, text: str) -> str:
    """The action string of one step (see the module docstring)."""
    if tool_calls:
        return ";".join(
            json.dumps({"name": c.get("name"), "arguments": c.get("arguments")}, sort_keys=True,
                       separators=(",", ":"), default=str)
            for c in tool_calls
        )
    if command is not None and command.strip():
        return " ".join(command.split())
    return " ".join(text.split())


def _canonical_value(v: Any) -> Any:
    if isinstance(v, str):
        return " ".join(v.split())
    if isinstance(v, dict):
        return {str(k): _canonical_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_canonical_value(x) for x in v]
    return v


def canonical_calls(tool_calls: Sequence[ToolCall] | None) -> str:
    """The ``view="tool_calls"`` action string of one step: the parsed calls' names and arguments
    (sorted keys, string values whitespace-collapsed, call ids dropped), ``;``-joined; ``"<no_call>"``
    when nothing parsed to a call."""
    if not tool_calls:
        return NO_CALL
    return ";".join(
        json.dumps({"name": c.get("name"), "arguments": _canonical_value(c.get("arguments"))}, sort_keys=True,
                   separators=(",", ":"), default=str)
        for c in tool_calls
    )


def _symbols(a: Sequence[Hashable], b: Sequence[Hashable]) -> tuple[Sequence[Hashable], Sequence[Hashable]]:
    """Strings stay strings (characters); other sequences become integer symbols (exact equality)."""
    if isinstance(a, str) and isinstance(b, str):
        return a, b
    ids: dict[Hashable, int] = {}
    return [ids.setdefault(x, len(ids)) for x in a], [ids.setdefault(x, len(ids)) for x in b]


def levenshtein(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Edit distance between two sequences (strings or lists), unit costs (``rapidfuzz``)."""
    x, y = _symbols(a, b)
    return int(_Lev.distance(x, y))


def normalized_distance(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """``levenshtein(a, b) / max(len(a), len(b))``; 0.0 when both are empty."""
    n = max(len(a), len(b))
    return levenshtein(a, b) / n if n else 0.0


def mean_pairwise_distance(prefixes: Sequence[Sequence[str]], level: Literal["step", "char"] = "step") -> float:
    """Mean normalised edit distance over all pairs of action prefixes (0.0 for fewer than 2)."""
    if level == "step":  # one integer symbol per distinct action string, shared by the whole group
        ids: dict[str, int] = {}
        seqs: list[Sequence[Hashable]] = [[ids.setdefault(x, len(ids)) for x in p] for p in prefixes]
    elif level == "char":
        seqs = ["\n".join(p) for p in prefixes]
    else:
        raise ValueError(f"level must be 'step' or 'char', got {level!r}")
    pairs = list(itertools.combinations(range(len(seqs)), 2))
    if not pairs:
        return 0.0
    total = 0.0
    for i, j in pairs:
        n = max(len(seqs[i]), len(seqs[j]))
        total += _Lev.distance(seqs[i], seqs[j]) / n if n else 0.0
    return total / len(pairs)


@dataclass
class GroupState:
    """What gates see of a group: one entry per member, updated after each env step.

    Attributes:
        actions: ``[G][steps]`` action strings (:func:`canonical_action`).
        calls: ``[G][steps]`` tool-call strings (:func:`canonical_calls`), for ``view="tool_calls"``.
        rewards: ``[G]`` reward accumulated so far.
        done: ``[G]`` True once the member ended (terminated, truncated, errored or stopped).
        success: ``[G]`` the member's success flag (final once ``done``).
        tokens: ``[G]`` tokens generated so far.
        stopped: True once an enforced gate stopped the group (rewards are then partial).
    """

    group_id: str
    task_id: str
    env_id: str
    size: int
    actions: list[list[str]] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)
    success: list[bool] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    stopped: bool = False

    def __post_init__(self) -> None:
        g = self.size
        self.actions = self.actions or [[] for _ in range(g)]
        self.calls = self.calls or [[] for _ in range(g)]
        self.rewards = self.rewards or [0.0] * g
        self.done = self.done or [False] * g
        self.success = self.success or [False] * g
        self.tokens = self.tokens or [0] * g

    @property
    def steps(self) -> list[int]:
        return [len(a) for a in self.actions]

    @property
    def all_done(self) -> bool:
        return all(self.done)

    def reached(self, k: int) -> bool:
        """True when every member has taken ``k`` steps or ended."""
        return all(d or len(a) >= k for a, d in zip(self.actions, self.done, strict=True))


@dataclass
class GateDecision:
    """A gate's verdict on a group.

    Attributes:
        action: ``"stop"`` (end the group), ``"continue"`` (checked, keep going) or ``"flag"``.
        reason: Short machine-readable reason (``"low_diversity"``, ``"zero_variance"``...).
        score: The statistic the gate computed (e.g. the mean pairwise distance).
        details: Anything else worth logging.
    """

    action: DecisionKind
    reason: str = ""
    score: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Gate(Protocol):
    """An early-termination check over a group.

    ``hold_at``: if set, members pause after that many steps until the gate has decided, so a
    ``stop`` takes effect at exactly that step (members release their concurrency slot while they
    wait). ``after_step`` runs after every env step of any member until it returns a decision
    (a gate decides at most once per group there; gates hold no per-group state, so one instance
    serves many groups); ``on_group_end`` runs once, when all members are done. Either may return
    ``None`` (nothing to say yet).
    """

    name: str
    hold_at: int | None

    def after_step(self, group: GroupState) -> GateDecision | None: ...

    def on_group_end(self, group: GroupState) -> GateDecision | None: ...


class SelectiveRolloutGate:
    """Stop a group whose first ``k`` actions are nearly identical across members.

    Args:
        k: Number of steps in the compared prefix.
        threshold: Stop when the mean pairwise normalised distance is strictly below this.
        level: ``"step"`` (sequence of action strings, default) or ``"char"``.
        view: ``"action"`` (:func:`canonical_action`, default) or ``"tool_calls"``
            (:func:`canonical_calls`: parsed calls only, free text ignored).
        hold: Pause members at step ``k`` until every member got there (exact stop at step k).
    """

    name = "selective_rollout"

    def __init__(self, k: int = 10, threshold: float = 0.12, level: Literal["step", "char"] = "step",
                 hold: bool = True, view: View = "action") -> None:
        if k < 1:
            raise ValueError("SelectiveRolloutGate needs k >= 1")
        if level not in ("step", "char"):
            raise ValueError(f"SelectiveRolloutGate level must be 'step' or 'char', got {level!r}")
        if view not in ("action", "tool_calls"):
            raise ValueError(f"SelectiveRolloutGate view must be 'action' or 'tool_calls', got {view!r}")
        self.k = int(k)
        self.threshold = float(threshold)
        self.level: Literal["step", "char"] = level
        self.view: View = view
        self.hold_at: int | None = self.k if hold else None

    def after_step(self, group: GroupState) -> GateDecision | None:
        if not group.reached(self.k) or group.all_done:
            return None
        seqs = group.calls if self.view == "tool_calls" else group.actions
        prefixes = [a[: self.k] for a in seqs]
        if group.size < 2:
            return GateDecision("continue", "group_too_small", None, {"k": self.k})
        d = mean_pairwise_distance(prefixes, self.level)
        details = {"k": self.k, "threshold": self.threshold, "level": self.level, "view": self.view,
                   "prefix_lengths": [len(p) for p in prefixes]}
        if d < self.threshold:
            return GateDecision("stop", "low_diversity", d, details)
        return GateDecision("continue", "diverse", d, details)

    def on_group_end(self, group: GroupState) -> GateDecision | None:
        return None


class ZeroVarianceDetector:
    """Flag a completed group whose members all got the same reward (no GRPO signal)."""

    name = "zero_variance"
    hold_at: int | None = None

    def __init__(self, tol: float = 1e-9) -> None:
        self.tol = tol

    def after_step(self, group: GroupState) -> GateDecision | None:
        return None

    def on_group_end(self, group: GroupState) -> GateDecision | None:
        if not group.rewards or group.stopped:
            return None
        spread = max(group.rewards) - min(group.rewards)
        if spread <= self.tol:
            return GateDecision("flag", "zero_variance", spread, {"reward": group.rewards[0]})
        return GateDecision("continue", "has_variance", spread)


@dataclass
class GateRecord:
    """One logged gate decision, completed with the group's outcome when the group ends.

    ``enforced`` is False in audit mode. ``final_rewards`` / ``final_zero_variance`` are filled in
    at group end, so precision can be computed afterwards (:func:`gate_precision`).
    ``tokens_at_decision`` / ``final_tokens`` give the tokens a stop saved (or would have saved).
    """

    gate: str
    group_id: str
    task_id: str
    env_id: str
    action: DecisionKind
    reason: str
    score: float | None
    step: int
    enforced: bool
    elapsed_s: float
    details: dict[str, Any] = field(default_factory=dict)
    tokens_at_decision: int = 0
    final_rewards: list[float] | None = None
    final_success: list[bool] | None = None
    final_zero_variance: bool | None = None
    final_tokens: int | None = None
    final_elapsed_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GateRecord:
        return cls(**d)


def gate_precision(records: Sequence[GateRecord], gate: str = SelectiveRolloutGate.name) -> dict[str, Any]:
    """Precision of ``stop`` decisions against the audited outcomes.

    A stop is *correct* when the group, allowed to finish, ended with zero reward variance.
    Only records with ``final_zero_variance`` known (audit mode, or enforced=False) count.

    Returns:
        ``{"stops", "correct", "precision", "decisions", "recall"}``; recall is the share of
        zero-variance groups (among decided ones) that the gate stopped. ``None`` where undefined.
    """
    audited = [r for r in records if r.gate == gate and r.final_zero_variance is not None and r.action != "flag"]
    stops = [r for r in audited if r.action == "stop"]
    correct = sum(1 for r in stops if r.final_zero_variance)
    zv = [r for r in audited if r.final_zero_variance]
    return {
        "decisions": len(audited),
        "stops": len(stops),
        "correct": correct,
        "precision": correct / len(stops) if stops else None,
        "recall": sum(1 for r in zv if r.action == "stop") / len(zv) if zv else None,
    }


class GateMonitor:
    """Runs the gates of one group and coordinates its members.

    Episodes call :meth:`after_step` after each env step and :meth:`member_done` when they end.
    ``stopped`` becomes True once an enforced gate says ``stop``; members then end as
    ``early_stopped``. With ``audit=True`` nothing is enforced; every decision is still logged.
    """

    def __init__(self, group: GroupState, gates: Sequence[Gate], *, audit: bool = False,
                 log: MutableSequence[GateRecord] | None = None, tol: float = 1e-9) -> None:
        self.group = group
        self.gates = list(gates)
        self.audit = audit
        self.log: MutableSequence[GateRecord] = log if log is not None else []
        self.records: list[GateRecord] = []
        self.stopped = False
        self.stop_reason: str | None = None
        self.tol = tol
        self._decided: dict[str, asyncio.Event] = {g.name: asyncio.Event() for g in self.gates}
        self._ended = False

    # ----------------------------------------------------------------- member hooks
    def record_step(self, member: int, action: str, reward: float, tokens: int, call: str | None = None) -> None:
        """One env step of ``member``: its action string, its tool-call string (default: ``action``),
        the step's reward and the tokens it has generated so far."""
        g = self.group
        g.actions[member].append(action)
        g.calls[member].append(action if call is None else call)
        g.rewards[member] += reward
        g.tokens[member] = tokens

    def after_step(self) -> None:
        """Show the group to every gate (call after :meth:`record_step`)."""
        for gate in self.gates:
            ev = self._decided[gate.name]
            if ev.is_set():
                continue
            dec = gate.after_step(self.group)
            if dec is not None:
                self._log(gate, dec)
                ev.set()
            elif gate.hold_at is not None and self.group.all_done:
                ev.set()

    def member_done(self, member: int, success: bool = False) -> None:
        self.group.done[member] = True
        self.group.success[member] = success
        self.after_step()
        if self.group.all_done:
            for ev in self._decided.values():
                ev.set()

    def must_hold(self, steps: int) -> bool:
        """True if a member that has taken ``steps`` steps must wait for an undecided gate."""
        return not self.stopped and any(
            g.hold_at == steps and not self._decided[g.name].is_set() for g in self.gates
        )

    async def hold(self, steps: int, timeout: float | None = None) -> None:
        """Wait until every gate holding at ``steps`` has decided (or the group stopped)."""
        for gate in self.gates:
            if gate.hold_at == steps and not self.stopped:
                await asyncio.wait_for(self._decided[gate.name].wait(), timeout)

    def finish(self, final_tokens: int | None = None) -> list[GateRecord]:
        """Call once when all members ended: runs ``on_group_end`` and completes the records."""
        if self._ended:
            return self.records
        self._ended = True
        for gate in self.gates:
            dec = gate.on_group_end(self.group)
            if dec is not None:
                self._log(gate, dec)
        g = self.group
        zero_var = (max(g.rewards) - min(g.rewards) <= self.tol) if g.rewards else True
        elapsed = time.monotonic() - g.started
        for r in self.records:
            r.final_rewards = list(g.rewards)
            r.final_success = list(g.success)
            r.final_zero_variance = None if (self.stopped and not self.audit) else zero_var
            r.final_tokens = sum(g.tokens) if final_tokens is None else final_tokens
            r.final_elapsed_s = elapsed
        return self.records

    # ----------------------------------------------------------------- internals
    def _log(self, gate: Gate, dec: GateDecision) -> None:
        g = self.group
        enforced = dec.action == "stop" and not self.audit
        rec = GateRecord(
            gate=gate.name, group_id=g.group_id, task_id=g.task_id, env_id=g.env_id, action=dec.action,
            reason=dec.reason, score=dec.score, step=max(g.steps) if g.actions else 0,
            enforced=enforced, elapsed_s=time.monotonic() - g.started, details=dict(dec.details),
            tokens_at_decision=sum(g.tokens),
        )
        self.records.append(rec)
        self.log.append(rec)
        if enforced and not self.stopped:
            self.stopped = True
            g.stopped = True
            self.stop_reason = f"{gate.name}:{dec.reason}"

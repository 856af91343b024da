"""Exactly-once accounting of submitted tasks.

Every task the dataflow layer submits gets a :class:`Ticket` and a ledger entry. The invariant the
dataflow layer keeps, under any interleaving of submits, service joins, leaves and kills:

    every submitted ticket ends, for every policy it feeds, in exactly one terminal state:
    ``trained``, ``filtered`` (with a reason) or ``expired`` (with a reason).

Non-terminal states: ``queued`` (waiting for a service), ``dispatched`` (running on a service,
with an attempt number), ``buffered`` (its group waits in a policy's buffer). A service that dies
puts its dispatched tickets back in the queue with the next attempt number; a late result of an
older attempt is refused (:meth:`Ledger.accept` returns False), so nothing is counted twice.
Illegal transitions raise :class:`LedgerError` at once: the tests drive random operation sequences
against the real runtime and any double count or loss fails loudly.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from agentgym.dataflow.tasks import TaskRef
from agentgym.errors import AgentGymError

__all__ = ["Ledger", "LedgerError", "Ticket"]

State = Literal["queued", "dispatched", "buffered", "trained", "filtered", "expired"]
TERMINAL = ("trained", "filtered", "expired")


class LedgerError(AgentGymError, RuntimeError):
    """The exactly-once invariant would be broken (a bug in the dataflow layer, never a user error)."""


@dataclass
class Ticket:
    """One submitted task.

    Attributes:
        ticket_id: Unique within a run.
        task: What to run.
        workflow: The name of the workflow the services run it with.
        policies: The trained policies this task feeds.
        attempt: 0 for the first dispatch; +1 each time a dead service's work is resubmitted.
        versions: Weight version of each policy when it was (last) dispatched.
    """

    ticket_id: str
    task: TaskRef
    workflow: str
    policies: tuple[str, ...]
    attempt: int = 0
    versions: dict[str, int] = field(default_factory=dict)


@dataclass
class _Entry:
    ticket: Ticket
    state: dict[str, State]  # per policy
    reason: dict[str, str] = field(default_factory=dict)
    service: str | None = None
    history: list[str] = field(default_factory=list)


class Ledger:
    """Per (ticket, policy) states with checked transitions (see the module docstring)."""

    def __init__(self) -> None:
        self.entries: dict[str, _Entry] = {}
        self.resubmitted = 0
        self.refused_late = 0

    # ------------------------------------------------------------------ transitions
    def open(self, ticket: Ticket) -> None:
        if ticket.ticket_id in self.entries:
            raise LedgerError(f"ticket {ticket.ticket_id} opened twice")
        if not ticket.policies:
            raise LedgerError(f"ticket {ticket.ticket_id} feeds no policy")
        self.entries[ticket.ticket_id] = _Entry(ticket, {p: "queued" for p in ticket.policies})

    def dispatch(self, ticket_id: str, service: str) -> int:
        """Mark queued -> dispatched on ``service``; returns the attempt number."""
        e = self._get(ticket_id)
        self._expect(e, ("queued",))
        for p in e.state:
            e.state[p] = "dispatched"
        e.service = service
        e.history.append(f"dispatch {service} attempt {e.ticket.attempt}")
        return e.ticket.attempt

    def requeue(self, ticket_id: str, why: str) -> None:
        """A dispatched ticket whose service died goes back to the queue with the next attempt."""
        e = self._get(ticket_id)
        self._expect(e, ("dispatched",))
        for p in e.state:
            e.state[p] = "queued"
        e.ticket.attempt += 1
        e.service = None
        e.history.append(f"requeue ({why})")
        self.resubmitted += 1

    def accept(self, ticket_id: str, attempt: int) -> bool:
        """A result arrived for ``attempt``: True if it is the live attempt (then the caller resolves
        or buffers it), False for a late result of a resubmitted attempt (refused, counted)."""
        e = self.entries.get(ticket_id)
        if e is None:
            raise LedgerError(f"result for unknown ticket {ticket_id}")
        if attempt != e.ticket.attempt or any(s != "dispatched" for s in e.state.values()):
            self.refused_late += 1
            e.history.append(f"refused late result of attempt {attempt}")
            return False
        return True

    def buffer(self, ticket_id: str, policy: str) -> None:
        e = self._get(ticket_id)
        self._expect_one(e, policy, ("dispatched",))
        e.state[policy] = "buffered"

    def resolve(self, ticket_id: str, policy: str, state: State, reason: str = "") -> None:
        """A terminal state for (ticket, policy): trained, filtered or expired."""
        if state not in TERMINAL:
            raise LedgerError(f"{state!r} is not terminal")
        e = self._get(ticket_id)
        allowed = ("buffered",) if state == "trained" else ("dispatched", "buffered", "queued")
        self._expect_one(e, policy, allowed)
        e.state[policy] = state
        if reason:
            e.reason[policy] = reason
        e.history.append(f"{policy}: {state} {reason}".rstrip())

    # ------------------------------------------------------------------ queries
    def state(self, ticket_id: str, policy: str) -> State:
        return self._get(ticket_id).state[policy]

    def in_state(self, state: State, policy: str | None = None) -> list[str]:
        return [tid for tid, e in self.entries.items()
                if any(s == state and (policy is None or p == policy) for p, s in e.state.items())]

    def describe(self, ticket_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Plain-data record of each ticket: states per policy, last service, attempt and history."""
        out: dict[str, dict[str, Any]] = {}
        for tid in ticket_ids:
            e = self._get(tid)
            out[tid] = {"states": dict(e.state), "reasons": dict(e.reason), "service": e.service,
                        "attempt": e.ticket.attempt, "history": list(e.history)}
        return out

    def counts(self) -> dict[str, Any]:
        """``{state: n}`` over (ticket, policy) pairs, reasons per terminal state, resubmits, late results."""
        states: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        for e in self.entries.values():
            for p, s in e.state.items():
                states[s] += 1
                if s in ("filtered", "expired"):
                    reasons[f"{s}:{e.reason.get(p, '?')}"] += 1
        return {"tickets": len(self.entries), "states": dict(states), "reasons": dict(reasons),
                "resubmitted": self.resubmitted, "refused_late_results": self.refused_late}

    def check(self, *, drained: bool = False) -> None:
        """Assert the invariant: states are legal; with ``drained``, every pair is terminal.

        Raises:
            LedgerError: a pair in an unknown state, or (drained) a pair not terminal.
        """
        legal = ("queued", "dispatched", "buffered", *TERMINAL)
        for tid, e in self.entries.items():
            for p, s in e.state.items():
                if s not in legal:
                    raise LedgerError(f"ticket {tid} policy {p}: unknown state {s!r}")
                if drained and s not in TERMINAL:
                    raise LedgerError(f"ticket {tid} policy {p} ended {s}, not trained/filtered/expired: {e.history}")

    # ------------------------------------------------------------------ internals
    def _get(self, ticket_id: str) -> _Entry:
        try:
            return self.entries[ticket_id]
        except KeyError:
            raise LedgerError(f"unknown ticket {ticket_id}") from None

    @staticmethod
    def _expect(e: _Entry, states: tuple[str, ...]) -> None:
        bad = {p: s for p, s in e.state.items() if s not in states}
        if bad:
            raise LedgerError(f"ticket {e.ticket.ticket_id}: expected {states}, found {bad}; history {e.history}")

    @staticmethod
    def _expect_one(e: _Entry, policy: str, states: tuple[str, ...]) -> None:
        if policy not in e.state:
            raise LedgerError(f"ticket {e.ticket.ticket_id} does not feed policy {policy!r}")
        if e.state[policy] not in states:
            raise LedgerError(f"ticket {e.ticket.ticket_id} policy {policy}: expected {states}, found "
                              f"{e.state[policy]!r}; history {e.history}")

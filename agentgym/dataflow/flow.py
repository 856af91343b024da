"""DataFlow: owns the task stream and the per-policy buffers; feeds services and trainers.

Its control loop, independent of any trainer:

* **dispatch**: while the staleness budget allows (below), take the next task (a resubmitted one
  first), open a :class:`~agentgym.dataflow.ledger.Ticket` and submit it to the least-loaded live,
  ready service with spare capacity;
* **collect**: one poll loop per service; a poll is also the service's heartbeat. A service whose
  poll fails, or that misses heartbeats for ``dead_after_s``, is dead: its in-flight tickets are
  resubmitted (next attempt) and a late result of an old attempt is refused. A watcher ticks on the same
  event loop: while the loop itself was blocked no heartbeat could be heard, so a timeout then is not
  held against the service. A trainer waiting for a batch when every service has been dead for
  ``dead_after_s`` gets :class:`~agentgym.dataflow.service.NoLiveService` instead of waiting forever;
* **filter**: each finished group goes, per policy it feeds, through the group filters (errors,
  early-stopped, zero-variance / DAPO dynamic sampling); what passes waits in that policy's buffer;
* **serve**: :meth:`DataFlow.get_batch` hands a trainer ``groups_per_step`` groups (plus replayed
  ones, ``replay_ratio``), after expiring those whose oldest token is more than ``max_staleness``
  versions behind the policy's current version. A trainer waits only when its buffer cannot fill a
  batch.

**Replay** (:class:`~agentgym.dataflow.replay.GroupReplay`): trained informative groups are kept per
policy; ``replay_ratio`` adds that share of replayed groups to every batch, and ``replay_fill``
(POPO) puts a replayed group in the place of every filtered one instead of rolling a new group for
it (a filtered group then counts as consumed, so nothing is refilled; ``refill=False`` does the same
without replay: the batch comes back short). ``replay_priority`` picks the
groups (``"latest"``, or ``"recency"`` with importance weights, :attr:`Batch.replay_weights`).

**Outcomes.** :meth:`DataFlow.stats` counts every finished group by outcome (trained, or filtered
with its reason: ``errors``, ``early_stopped`` (a gate), ``pilot`` (pilot-then-commit), ``no_tokens``,
``zero_variance``), the tokens generated in them, and each gate's decisions against the groups'
outcomes (audited decisions give precision and recall). ``group_observers`` see every finished group.

**Staleness budget.** With ``d`` trainer steps done for a policy (:meth:`DataFlow.step_done`, also
implied by :meth:`DataFlow.set_version`) and ``c`` groups already handed to its trainer, the groups in
the pipeline (queued, running, buffered) are capped at ``(d + max_staleness + 1) * groups_per_step - c``:
a group generated after step ``d`` is consumed by step ``d + max_staleness`` at the latest, and since a
step publishes at most one new version, no trained token is more than ``max_staleness`` versions old. ``max_staleness = 0`` *is* the synchronous
recipe (roll out one batch, train, publish, repeat): the same runtime, not a second code path.
Filtered groups leave the pipeline and are refilled, which is dynamic sampling.

**Exactly once.** Every submitted ticket ends, per policy, ``trained``, ``filtered`` or ``expired``
(:class:`~agentgym.dataflow.ledger.Ledger`); :meth:`DataFlow.drain` + ``ledger.check(drained=True)``
proves it in the tests, including under service faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.dataflow.config import DataflowConfig, FlowParams, check_combination
from agentgym.dataflow.ledger import Ledger, Ticket
from agentgym.dataflow.replay import GroupReplay
from agentgym.dataflow.service import NoLiveService, ServiceDead, ServiceHandle, ServiceResult
from agentgym.dataflow.tasks import TaskRef, TaskStream
from agentgym.errors import ConfigurationError
from agentgym.types import TrajectoryGroup

__all__ = ["Batch", "DataFlow", "GroupFilter", "default_filters"]

log = logging.getLogger(__name__)

GroupFilter = Callable[[TrajectoryGroup, str], "str | None"]
"""``filter(group, policy_id) -> reason`` to drop the group for that policy, or ``None`` to keep it."""


def filter_errors(min_valid: int = 2) -> GroupFilter:
    """Drop a group with fewer than ``min_valid`` members that finished without an error."""

    def f(group: TrajectoryGroup, policy: str) -> str | None:
        ok = sum(1 for t in group if t.error is None)
        return "errors" if ok < min(min_valid, len(group)) or ok == 0 else None

    return f


def filter_early_stopped(group: TrajectoryGroup, policy: str) -> str | None:
    """Early-stopped groups stay out of the loss (``"pilot"``: a pilot-then-commit group that never committed)."""
    if not group.early_stopped:
        return None
    return "pilot" if (group.stop_reason or "").startswith("pilot_commit") else "early_stopped"


def filter_zero_variance(group: TrajectoryGroup, policy: str) -> str | None:
    """DAPO dynamic sampling: a group whose members all got the same reward carries no signal."""
    return "zero_variance" if len(group) > 1 and group.zero_variance(policy) else None


def filter_no_tokens(group: TrajectoryGroup, policy: str) -> str | None:
    """The policy generated nothing in this group (e.g. every member failed before its first turn)."""
    return None if any(tu.policy_id == policy and tu.completion_token_ids for t in group for tu in t.turns) else "no_tokens"


def default_filters(zero_variance: bool = True) -> list[GroupFilter]:
    out = [filter_errors(), filter_early_stopped, filter_no_tokens]
    if zero_variance:
        out.append(filter_zero_variance)
    return out


@dataclass
class _Item:
    ticket_id: str
    group: TrajectoryGroup
    min_version: int
    arrived: float


@dataclass
class Batch:
    """What a trainer gets: fresh groups (now ``trained`` in the ledger) and replayed ones."""

    policy_id: str
    groups: list[TrajectoryGroup]
    tickets: list[str]
    replayed: list[TrajectoryGroup] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # oldest token version of each fresh group
    replay_weights: list[float] = field(default_factory=list)  # importance weight of each replayed group
    expired: int = 0  # groups expired as stale while this batch was assembled
    wait_s: float = 0.0
    filtered: int = 0  # groups filtered for this policy since its previous batch
    short: bool = False  # fewer groups than asked: max_filtered_per_batch was reached

    @property
    def all_groups(self) -> list[TrajectoryGroup]:
        return self.groups + self.replayed

    @property
    def group_weights(self) -> list[float]:
        """``[len(all_groups)]``: 1 for fresh groups, the importance weight for replayed ones."""
        w = self.replay_weights or [1.0] * len(self.replayed)
        return [1.0] * len(self.groups) + list(w)


@dataclass
class _Svc:
    handle: ServiceHandle
    capacity: int
    ready: bool
    alive: bool = True
    draining: bool = False
    in_flight: set[str] = field(default_factory=set)
    last_ok: float = field(default_factory=time.monotonic)
    completed: int = 0
    task: asyncio.Task[None] | None = None


class DataFlow:
    """The dataflow control loop (see the module docstring).

    Args:
        stream: Where tasks come from.
        config: The ``[dataflow]`` table: staleness budget, replay, ordering.
        params: What the run derives: batch shape, trained policies, filter switches, fault detection.
        filters: Group filters (default: :func:`default_filters`).
    """

    def __init__(self, stream: TaskStream, config: DataflowConfig | None = None, params: FlowParams | None = None, *,
                 filters: Sequence[GroupFilter] | None = None) -> None:
        self.stream = stream
        self.config = config or DataflowConfig()
        self.params = params or FlowParams()
        check_combination(self.config, self.params)
        self.filters = list(filters) if filters is not None else default_filters(self.params.filter_zero_variance)
        self.ledger = Ledger()
        self.services: dict[str, _Svc] = {}
        self.versions: dict[str, int] = {p: 0 for p in self.params.policies}
        self.served: dict[str, int] = {p: 0 for p in self.params.policies}  # batches handed to trainers
        self.filtered_since: dict[str, int] = {p: 0 for p in self.params.policies}
        self.consumed: dict[str, int] = {p: 0 for p in self.params.policies}  # fresh groups handed to trainers
        self.done: dict[str, int] = {p: 0 for p in self.params.policies}  # trainer steps finished
        self.buffers: dict[str, deque[_Item]] = {p: deque() for p in self.params.policies}
        c = self.config
        self.replay: dict[str, GroupReplay] = {
            p: GroupReplay(p, c.replay_size, priority=c.replay_priority, half_life=c.replay_half_life,
                           beta=c.replay_beta, max_age=c.replay_max_age, seed=self.params.replay_seed)
            for p in self.params.policies}
        self.outcomes: dict[str, dict[str, int]] = {p: {} for p in self.params.policies}  # outcome -> groups
        self.generated_tokens = 0  # in every finished group, kept or not
        self.finished_groups = 0
        self.finished_episodes = 0
        self.finished_successes = 0  # episodes of every finished group, kept or filtered, that succeeded
        self.gate_stats: dict[str, dict[str, float]] = {}
        self.group_observers: list[Callable[[TrajectoryGroup, dict[str, str | None]], None]] = []
        self.queue: deque[str] = deque()  # requeued ticket ids, submitted before new tasks
        self.tickets: dict[str, Ticket] = {}
        self._ids = itertools.count()
        self._cond: asyncio.Condition | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._tick = time.monotonic()  # the watcher's last tick: this process's event loop was running then
        self._stall_end = float("-inf")  # when the loop last came back from being blocked
        self._no_live_since: float | None = None  # every registered service dead since then
        self._running = False
        self.paused = False
        self.events: list[tuple[float, str]] = []  # joins, deaths, resubmits (for logs and tests)
        self.group_walls: list[float] = []

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._start_collectors()
        self._tick = time.monotonic()
        self._watcher = asyncio.ensure_future(self._watch_loop())
        self._dispatcher = asyncio.ensure_future(self._dispatch_loop())

    def _start_collectors(self) -> None:
        for sid, s in self.services.items():
            if s.task is None and s.alive:
                s.task = asyncio.ensure_future(self._collect_loop(sid))

    async def stop(self, *, stop_services: bool = True) -> None:
        """Stop the loops (and the services); what is in flight stays unresolved (see :meth:`drain`)."""
        self._running = False
        tasks = [t for t in [self._dispatcher, self._watcher, *(s.task for s in self.services.values())]
                 if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if stop_services:
            for s in self.services.values():
                with contextlib.suppress(Exception):
                    await s.handle.stop()

    async def drain(self, timeout: float | None = None) -> None:
        """Stop dispatching, wait for everything in flight, then expire what no trainer took.

        Afterwards every ticket is terminal: ``ledger.check(drained=True)`` holds.
        """
        self.paused = True
        deadline = None if timeout is None else time.monotonic() + timeout
        cond = self._condition()
        async with cond:
            while self.ledger.in_state("dispatched") or (self.queue and self._live_ready()):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(cond.wait(), 0.5 if left is None else min(0.5, left))
        for tid in list(self.ledger.in_state("queued")) + list(self.ledger.in_state("dispatched")):
            for p, st in self.ledger.entries[tid].state.items():
                if st in ("queued", "dispatched"):
                    self.ledger.resolve(tid, p, "expired", "run_ended")
        for p, buf in self.buffers.items():
            while buf:
                self.ledger.resolve(buf.popleft().ticket_id, p, "expired", "run_ended")
        self.queue.clear()

    # ------------------------------------------------------------------ services (elastic)
    def add_service(self, handle: ServiceHandle, capacity: int = 4, *, ready: bool = True) -> None:
        """Register a service (any time). ``ready=False`` holds dispatch until :meth:`mark_ready`
        (e.g. until the trainer has sent it the current weights)."""
        if handle.service_id in self.services and self.services[handle.service_id].alive:
            raise ConfigurationError(f"a live service is already registered as {handle.service_id!r}")
        svc = _Svc(handle, max(1, capacity), ready)
        self.services[handle.service_id] = svc
        self.events.append((time.monotonic(), f"join {handle.service_id}"))
        self._notify()  # the dispatch loop starts the service's collector

    def mark_ready(self, service_id: str) -> None:
        self.services[service_id].ready = True
        self._notify()

    async def remove_service(self, service_id: str, *, drain: bool = True, timeout: float | None = None) -> None:
        """Deregister a service: with ``drain``, let its in-flight groups finish first; else resubmit them."""
        svc = self.services[service_id]
        svc.draining = True
        if drain:
            deadline = None if timeout is None else time.monotonic() + timeout
            while svc.in_flight and svc.alive and (deadline is None or time.monotonic() < deadline):
                await asyncio.sleep(0.05)
        self._mark_dead(service_id, "removed")
        if svc.task is not None:
            svc.task.cancel()
            await asyncio.gather(svc.task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await svc.handle.stop()

    def _check_live(self, policy_id: str) -> None:
        """A trainer waits for a batch only while some service can still make one: once every registered service
        has been dead for ``dead_after_s`` (time for a replacement to join), raise instead of waiting forever.

        Raises:
            NoLiveService: with the services' deaths, as the flow's events recorded them.
        """
        if not self.services or any(s.alive for s in self.services.values()):
            self._no_live_since = None
            return
        now = time.monotonic()
        if self._no_live_since is None:
            self._no_live_since = now
        if now - self._no_live_since > self.params.dead_after_s:
            deaths = "; ".join(e for _, e in self.events if e.startswith("dead "))
            raise NoLiveService(f"no batch for {policy_id!r} can come: every rollout service is dead ({deaths}) "
                                f"and none joined within {self.params.dead_after_s:g} s")

    def live_services(self) -> list[str]:
        return [sid for sid, s in self.services.items() if s.alive]

    # ------------------------------------------------------------------ trainers
    def set_version(self, policy_id: str, version: int, *, step_done: bool = True) -> None:
        """The policy's trainer published ``version`` to the services (and, by default, finished a step)."""
        if version < self.versions[policy_id]:
            raise ConfigurationError(f"version of {policy_id!r} went back from {self.versions[policy_id]} to {version}")
        self.versions[policy_id] = version
        if step_done:
            self.done[policy_id] += 1
        self._notify()

    def step_done(self, policy_id: str) -> None:
        """The policy's trainer finished a step without publishing (e.g. every group was filtered)."""
        self.done[policy_id] += 1
        self._notify()

    async def get_batch(self, policy_id: str, n_groups: int | None = None, timeout: float | None = None) -> Batch:
        """The next batch for ``policy_id`` (waits until its buffer can fill it).

        Raises:
            asyncio.TimeoutError: no batch within ``timeout``.
            NoLiveService: every service is dead and none joined within ``dead_after_s``.
        """
        if policy_id not in self.buffers:
            raise ConfigurationError(f"the dataflow layer trains {list(self.buffers)}, not {policy_id!r}")
        n = n_groups or self.params.groups_per_step
        fill = self.config.replay_fill
        n_replay = int(n * self.config.replay_ratio) if self.replay[policy_id] else 0
        if self.config.replay_priority == "latest":
            n_replay = min(n_replay, len(self.replay[policy_id]))
        n_fresh = n - n_replay
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        expired = 0
        cond = self._condition()
        async with cond:
            while True:
                expired += self._expire(policy_id)
                have = len(self.buffers[policy_id])
                if have >= n_fresh:
                    break
                if (fill or not self.params.refill) and have + self.filtered_since[policy_id] >= n_fresh:
                    break  # every group of this round is in (filtered ones are not refilled)
                cap = self.params.max_filtered_per_batch
                if cap is not None and self.filtered_since[policy_id] >= cap:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise asyncio.TimeoutError(f"no batch for {policy_id!r} within {timeout} s")
                self._check_live(policy_id)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(cond.wait(), 1.0 if left is None else min(1.0, left))
            items = self._take(policy_id, n_fresh)
            for it in items:
                self.ledger.resolve(it.ticket_id, policy_id, "trained")
            holes = n_fresh - len(items) if fill else 0
            draws = self.replay[policy_id].sample(n_replay + holes, self.versions[policy_id])
            replayed = [g for g, _ in draws]
            for it in items:
                self.replay[policy_id].add(it.group, it.min_version)
            self.served[policy_id] += 1
            self.consumed[policy_id] += len(items)
            filtered, self.filtered_since[policy_id] = self.filtered_since[policy_id], 0
            cond.notify_all()
        return Batch(policy_id, [it.group for it in items], [it.ticket_id for it in items], replayed,
                     [it.min_version for it in items], [w for _, w in draws], expired, time.monotonic() - t0,
                     filtered, short=len(items) + len(replayed) < n)

    # ------------------------------------------------------------------ state
    def stats(self) -> dict[str, Any]:
        return {"ledger": self.ledger.counts(), "versions": dict(self.versions), "served": dict(self.served),
                "buffered": {p: len(b) for p, b in self.buffers.items()}, "requeued_waiting": len(self.queue),
                "services": {sid: {"alive": s.alive, "ready": s.ready, "in_flight": len(s.in_flight),
                                   "in_flight_tickets": sorted(s.in_flight, key=_ticket_no),
                                   "completed": s.completed} for sid, s in self.services.items()},
                "task_stream": {"epoch": self.stream.epoch, "skipped": self.stream.skipped},
                "groups": {"finished": self.finished_groups, "episodes": self.finished_episodes,
                           "successes": self.finished_successes,
                           "generated_tokens": self.generated_tokens,
                           "outcomes": {p: dict(o) for p, o in self.outcomes.items()}},
                "gates": {g: dict(v) for g, v in self.gate_stats.items()},
                "replay": {p: {"kept": len(r), "added": r.added, "refused": r.refused} for p, r in self.replay.items()}}

    def state_dict(self) -> dict[str, Any]:
        """What a training checkpoint needs to resume the data position.

        Tickets not yet trained, filtered or expired (in flight, buffered) are recorded with their ids,
        so a resumed run submits the same tasks again (same ids, so the same derived sampling seeds)
        before drawing new ones: no task is skipped by a crash. The replay buffers are saved with their
        groups, so a resumed run replays what the interrupted one kept. The outcome counters (groups,
        episodes, successes, generated tokens, per-policy outcomes, the gates' decisions) carry over too, so a
        resumed run's totals cover the whole run; they count work done, so a group an interruption threw away
        and its resubmission both count.
        """
        open_tickets = [{"ticket_id": t.ticket_id, "env_id": t.task.env_id, "task_id": t.task.task_id,
                         "seed": t.task.seed, "info": t.task.info}
                        for tid, t in self.tickets.items()
                        if any(st not in ("trained", "filtered", "expired") for st in self.ledger.entries[tid].state.values())]
        n = next(self._ids)
        self._ids = itertools.count(n)  # peeking must not skip an id
        return {"stream": self.stream.state_dict(), "versions": dict(self.versions), "served": dict(self.served),
                "consumed": dict(self.consumed), "done": dict(self.done), "next_id": n, "open": open_tickets,
                "replay": {p: r.state_dict() for p, r in self.replay.items() if r.added},  # kept groups <= added
                "totals": {"groups": self.finished_groups, "episodes": self.finished_episodes,
                           "successes": self.finished_successes, "generated_tokens": self.generated_tokens,
                           "outcomes": {p: dict(o) for p, o in self.outcomes.items()},
                           "gates": {g: dict(v) for g, v in self.gate_stats.items()}}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state["stream"])
        self.versions.update(state["versions"])
        self.served.update(state["served"])
        self.consumed.update(state.get("consumed", {}))
        self.done.update(state.get("done", {}))
        self._ids = itertools.count(int(state.get("next_id", 0)))
        for p, rs in (state.get("replay") or {}).items():
            if p in self.replay:
                self.replay[p].load_state_dict(rs)
        totals = state.get("totals") or {}  # absent in checkpoints written before the counters were saved
        self.finished_groups = int(totals.get("groups", 0))
        self.finished_episodes = int(totals.get("episodes", 0))
        self.finished_successes = int(totals.get("successes", 0))
        self.generated_tokens = int(totals.get("generated_tokens", 0))
        for p, o in (totals.get("outcomes") or {}).items():
            if p in self.outcomes:
                self.outcomes[p] = {str(k): int(v) for k, v in o.items()}
        self.gate_stats = {str(g): {str(k): float(v) for k, v in st.items()}
                           for g, st in (totals.get("gates") or {}).items()}
        for o in sorted(state.get("open", []), key=lambda o: _ticket_no(o["ticket_id"])):
            task = TaskRef(o["env_id"], o["task_id"], o["seed"], dict(o.get("info") or {}))
            ticket = Ticket(o["ticket_id"], task, self.params.workflow, tuple(self.params.policies))
            self.tickets[ticket.ticket_id] = ticket
            self.ledger.open(ticket)
            self.queue.append(ticket.ticket_id)

    # ------------------------------------------------------------------ the loops
    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    def _notify(self) -> None:
        cond = self._cond
        if cond is None:
            return

        async def _n() -> None:
            async with cond:
                cond.notify_all()

        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(_n())

    def _live_ready(self) -> list[_Svc]:
        return [s for s in self.services.values() if s.alive and s.ready and not s.draining]

    def _pipeline(self, policy: str) -> int:
        return sum(1 for e in self.ledger.entries.values() if e.state.get(policy) in ("queued", "dispatched", "buffered"))

    def budget(self) -> int:
        """How many more groups may enter the pipeline now (see the staleness budget)."""
        k, n = self.config.max_staleness, self.params.groups_per_step
        room = min((self.done[p] + k + 1) * n - self.consumed[p] - self._pipeline(p) for p in self.params.policies)
        return max(0, room)

    @property
    def stall_s(self) -> float:
        """A gap between the watcher's ticks longer than this means this process's event loop was blocked."""
        return max(1.0, 10 * self.params.poll_s)

    async def _watch_loop(self) -> None:
        """Ticks every ``poll_s``; a late tick means the event loop was blocked (a trainer step or a checkpoint
        run on it), and for that long no heartbeat could be heard, however healthy the services were."""
        while self._running:
            await asyncio.sleep(self.params.poll_s)
            now = time.monotonic()
            if now - self._tick > self.stall_s:
                self._stall_end = now
            self._tick = now

    def loop_stalled_since(self, t0: float) -> bool:
        """Was this process's event loop blocked at some point since ``t0`` (or is it just coming back)?"""
        return self._stall_end >= t0 or time.monotonic() - self._tick > self.stall_s

    async def _dispatch_loop(self) -> None:
        cond = self._condition()
        while self._running:
            async with cond:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(cond.wait(), self.params.poll_s)
            await self._dispatch_some()

    async def _dispatch_some(self) -> None:
        self._start_collectors()
        while self._running:
            svcs = [s for s in self._live_ready() if len(s.in_flight) < s.capacity]
            if not svcs:
                return
            if self.queue:  # resubmitted work goes first, even while draining
                tid = self.queue.popleft()
            elif not self.paused and self.budget() > 0:
                tid = self._new_ticket()
            else:
                return
            svc = min(svcs, key=lambda s: (len(s.in_flight) / s.capacity, s.completed))
            ticket = self.tickets[tid]
            ticket.versions = dict(self.versions)
            self.ledger.dispatch(tid, svc.handle.service_id)
            svc.in_flight.add(tid)
            try:
                await svc.handle.submit(ticket)
            except ServiceDead as e:
                self._mark_dead(svc.handle.service_id, str(e))
            except Exception as e:  # a service that refuses a submit is treated as dead
                log.warning("service %s refused a submit: %s", svc.handle.service_id, e)
                self._mark_dead(svc.handle.service_id, f"submit failed: {e}")

    def _new_ticket(self) -> str:
        task = self.stream.next()
        tid = f"t{next(self._ids)}"
        ticket = Ticket(tid, task, self.params.workflow, tuple(self.params.policies))
        self.tickets[tid] = ticket
        self.ledger.open(ticket)
        return tid

    async def _collect_loop(self, service_id: str) -> None:
        svc = self.services[service_id]
        while self._running and svc.alive:
            t0 = time.monotonic()
            try:
                results = await asyncio.wait_for(svc.handle.collect(self.params.poll_s),
                                                 self.params.poll_s + self.params.dead_after_s)
            except asyncio.CancelledError:
                raise
            except asyncio.TimeoutError as e:
                if self.loop_stalled_since(t0):  # our loop was blocked, not the service silent: poll again
                    continue
                self._mark_dead(service_id, f"{type(e).__name__}: no heartbeat for {self.params.dead_after_s:g} s")
                return
            except Exception as e:  # ServiceDead, or a transport error: the service is unreachable
                self._mark_dead(service_id, f"{type(e).__name__}: {e}")
                return
            svc.last_ok = time.monotonic()
            for res in results:
                self._on_result(svc, res)
            if results:
                self._notify()

    def _on_result(self, svc: _Svc, res: ServiceResult) -> None:
        svc.in_flight.discard(res.ticket_id)
        svc.completed += 1
        if not self.ledger.accept(res.ticket_id, res.attempt):
            return
        ticket = self.tickets[res.ticket_id]
        group = res.group
        if group is None:  # the workflow itself failed: resubmit (bounded)
            self._retry(res.ticket_id, res.error or "workflow failed")
            return
        self.group_walls.append(res.wall_s)
        rewards = group.rewards()
        self.stream.feedback(ticket.task, group.zero_variance(), sum(rewards) / len(rewards) if rewards else 0.0)
        self._count(group)
        outcome: dict[str, str | None] = {}
        for p in ticket.policies:
            reason = next((r for f in self.filters if (r := f(group, p))), None)
            outcome[p] = reason
            key = f"filtered:{reason}" if reason else "kept"
            self.outcomes[p][key] = self.outcomes[p].get(key, 0) + 1
            if reason:
                self.ledger.resolve(res.ticket_id, p, "filtered", reason)
                self.filtered_since[p] += 1
                if self.config.replay_fill or not self.params.refill:  # no new rollout takes its place
                    self.consumed[p] += 1
                continue
            self.ledger.buffer(res.ticket_id, p)
            self.buffers[p].append(_Item(res.ticket_id, group, _min_version(group, p, ticket.versions.get(p, 0)),
                                         time.monotonic()))
        for obs in self.group_observers:
            try:
                obs(group, outcome)
            except Exception as e:  # an observer (a logger) must not stop the data
                log.warning("group observer %r failed: %s", obs, e)

    def _count(self, group: TrajectoryGroup) -> None:
        """Outcome counters: tokens generated, and each gate's decisions against the group's outcome."""
        self.finished_groups += 1
        self.finished_episodes += len(group)
        self.finished_successes += sum(1 for t in group if t.success)
        self.generated_tokens += sum(t.num_generated_tokens for t in group)
        for r in group.gate_records:
            if r.get("action") == "flag":
                continue
            st = self.gate_stats.setdefault(r["gate"], {})

            def inc(k: str, v: float = 1.0, st: dict[str, float] = st) -> None:
                st[k] = st.get(k, 0.0) + v

            stop = r.get("action") == "stop"
            zv = r.get("final_zero_variance")
            inc("decisions")
            inc("stops", float(stop))
            inc("enforced_stops", float(stop and bool(r.get("enforced"))))
            if stop:  # tokens spent when it decided vs. the group's tokens at the end (audit: would-be savings)
                inc("stop_tokens_at_decision", float(r.get("tokens_at_decision") or 0))
                inc("stop_final_tokens", float(r.get("final_tokens") or 0))
            if zv is not None:
                inc("audited")
                inc("audited_zero_variance", float(zv))
                inc("audited_stops", float(stop))
                inc("audited_correct_stops", float(stop and zv))

    def _retry(self, ticket_id: str, why: str) -> None:
        ticket = self.tickets[ticket_id]
        if ticket.attempt + 1 >= self.params.max_attempts:
            for p in ticket.policies:
                self.ledger.resolve(ticket_id, p, "filtered", "attempts")
            return
        self.ledger.requeue(ticket_id, why)
        self.queue.appendleft(ticket_id)

    def _mark_dead(self, service_id: str, why: str) -> None:
        svc = self.services.get(service_id)
        if svc is None or not svc.alive:
            return
        svc.alive = False
        self.events.append((time.monotonic(), f"dead {service_id}: {why}"))
        for tid in sorted(svc.in_flight):
            if self.ledger.entries[tid].service == service_id and self.ledger.state(tid, self.tickets[tid].policies[0]) == "dispatched":
                self._retry(tid, f"service {service_id} died: {why}")
        svc.in_flight.clear()
        self._notify()

    def _expire(self, policy: str) -> int:
        floor = self.versions[policy] - self.config.max_staleness
        buf = self.buffers[policy]
        keep: deque[_Item] = deque()
        n = 0
        while buf:
            it = buf.popleft()
            if it.min_version < floor:
                self.ledger.resolve(it.ticket_id, policy, "expired", "stale")
                n += 1
            else:
                keep.append(it)
        self.buffers[policy] = keep
        return n

    def _take(self, policy: str, n: int) -> list[_Item]:
        buf = self.buffers[policy]
        if self.config.ordering == "oldest_first":
            items = sorted(buf, key=lambda it: (it.min_version, it.arrived))
        else:
            items = list(buf)
        chosen, rest = items[:n], items[n:]
        self.buffers[policy] = deque(sorted(rest, key=lambda it: it.arrived))
        return chosen


def _ticket_no(ticket_id: str) -> int:
    digits = ticket_id.lstrip("t")
    return int(digits) if digits.isdigit() else 0


def _min_version(group: TrajectoryGroup, policy: str, default: int) -> int:
    vs = [v for t in group for tu in t.turns if tu.policy_id == policy and (v := tu.min_version) is not None]
    return min(vs) if vs else default

"""RolloutService: an autonomous rollout worker that the dataflow layer submits tasks to.

A service hosts named workflows (and so their policies) on its own
:class:`~agentgym.rollout.RolloutEngine`, runs what it is submitted up to ``max_groups`` groups at
once, and hands back finished groups whose tokens carry the weight versions that produced them.
It takes weight updates for the policies it hosts between requests (the policy applies them without
dropping in-flight episodes: drain, abort-and-resume or in-flight, with per-token versions).

The same class runs in-process (the embedded runtime) or inside a Ray actor
(:mod:`agentgym.dataflow.ray_runtime`); the dataflow layer talks to either through a
:class:`ServiceHandle`, and its :meth:`~ServiceHandle.collect` poll doubles as the heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentgym.dataflow.ledger import Ticket
from agentgym.errors import AgentGymError, ConfigurationError, PolicyNotHosted, WeightUpdateRejected
from agentgym.rollout.engine import RolloutEngine
from agentgym.rollout.runtime import RolloutRuntime
from agentgym.rollout.workflow import GroupRequest, Workflow
from agentgym.types import TrajectoryGroup
from agentgym.weights import WeightUpdate, crc32, decode, shared_key

logger = logging.getLogger(__name__)

__all__ = ["LocalService", "NoLiveService", "RolloutService", "ServiceDead", "ServiceHandle", "ServiceResult"]


class ServiceDead(AgentGymError, RuntimeError):
    """A rollout service stopped answering (killed, crashed, or removed)."""


class NoLiveService(AgentGymError, RuntimeError):
    """Every rollout service of the run is dead and none joined in time: no batch can come (a trainer waiting for
    one would wait forever)."""


@dataclass
class ServiceResult:
    """One finished (or failed) submission."""

    ticket_id: str
    attempt: int
    group: TrajectoryGroup | None = None
    error: str | None = None
    service_id: str = ""
    wall_s: float = 0.0


class RolloutService:
    """Runs submitted tickets on a rollout engine (see the module docstring).

    Args:
        service_id: Unique name.
        workflows: name -> workflow. Every policy the workflows act with is hosted here (ids unique).
        max_groups: Groups in flight at once (the service's capacity).
        runtime: The rollout runtime (created with ``max_concurrency`` if not given).
        max_concurrency: Episodes in flight, when the runtime is created here.
        env_factory: For the runtime created here.
        close_policies: Close the hosted policies when the service stops (the service built them).
        weights_key: Verifies signed weight payloads (updates that crossed a process boundary);
            default: the process's ``AGENTGYM_WEIGHTS_KEY``.
    """

    def __init__(self, service_id: str, workflows: Mapping[str, Workflow], *, max_groups: int = 8,
                 runtime: RolloutRuntime | None = None, max_concurrency: int = 32,
                 env_factory: Callable[[str], Any] | None = None, close_policies: bool = False,
                 weights_key: bytes | None = None) -> None:
        if not workflows:
            raise ConfigurationError("a rollout service needs at least one workflow")
        if max_groups < 1:
            raise ConfigurationError(f"max_groups must be >= 1, got {max_groups}")
        self.service_id = service_id
        self.workflows = dict(workflows)
        self.max_groups = max_groups
        self.policies: dict[str, Any] = {}
        for wf in self.workflows.values():
            for pol in getattr(wf, "policies", []):
                other = self.policies.setdefault(pol.policy_id, pol)
                if other is not pol:
                    raise ConfigurationError(f"two different policies share the id {pol.policy_id!r} on one service")
        self.close_policies = close_policies
        self.weights_key = weights_key or shared_key()
        self._own_runtime = runtime is None
        self.runtime = runtime or RolloutRuntime(max_concurrency=max_concurrency, env_factory=env_factory)
        self.engine = RolloutEngine(self.runtime, max_groups=max_groups)
        self._attempts: dict[str, int] = {}
        self._started: dict[str, float] = {}
        self._done: asyncio.Queue[ServiceResult] | None = None
        self._pump: asyncio.Task[None] | None = None
        self.completed = 0
        self.started_at = time.monotonic()
        self.stopped = False

    # ------------------------------------------------------------------ the service API
    async def submit(self, ticket: Ticket) -> None:
        """Start ``ticket`` (returns at once; the result comes back through :meth:`collect`)."""
        if self.stopped:
            raise ServiceDead(f"service {self.service_id} is stopped")
        wf = self.workflows.get(ticket.workflow)
        if wf is None:
            raise ConfigurationError(f"service {self.service_id} has no workflow {ticket.workflow!r}; "
                                     f"it has {sorted(self.workflows)}")
        self._ensure_pump()
        t = ticket.task
        seed = t.info.get("sampling_seed")
        if seed is None and t.info.get("derive_sampling_seed"):  # reproducible per ticket, whoever runs it
            seed = zlib.crc32(ticket.ticket_id.encode())
        req = GroupRequest(t.env_id, t.task_id, seed=t.seed, group_id=f"{ticket.ticket_id}#{ticket.attempt}",
                           sampling_seed=seed, info={**t.info, "ticket": ticket.ticket_id})
        self._attempts[req.group_id] = ticket.attempt
        self._started[req.group_id] = time.monotonic()
        self.engine.submit_nowait(wf, req)

    async def collect(self, timeout: float = 0.0, max_items: int | None = None) -> list[ServiceResult]:
        """Finished results: waits up to ``timeout`` for the first one, then takes what is ready."""
        q = self._queue()
        out: list[ServiceResult] = []
        try:
            out.append(await asyncio.wait_for(q.get(), timeout) if timeout > 0 else q.get_nowait())
        except (asyncio.TimeoutError, asyncio.QueueEmpty):
            return out
        while not q.empty() and (max_items is None or len(out) < max_items):
            out.append(q.get_nowait())
        return out

    async def status(self) -> dict[str, Any]:
        return {"service_id": self.service_id, "in_flight": self.engine.in_flight, "capacity": self.max_groups,
                "completed": self.completed, "uptime_s": time.monotonic() - self.started_at,
                "versions": {pid: int(getattr(p, "weight_version", 0)) for pid, p in self.policies.items()},
                "workflows": sorted(self.workflows)}

    async def cancel(self, ticket_id: str, attempt: int) -> bool:
        return self.engine.cancel(f"{ticket_id}#{attempt}")

    async def update_weights(self, policy_id: str, update: WeightUpdate | bytes, version: int) -> list[str]:
        """Apply a weight update to a hosted policy (without blocking the service's loop).

        A signed wire payload (an update that crossed a process boundary) is verified with the service's
        ``weights_key`` first (:func:`agentgym.weights.decode`); the policy gets the update itself.

        Raises:
            PolicyNotHosted, VersionNotNewer, ChecksumMismatch, WeightUpdateRejected: nothing was applied.
        """
        pol = self._policy(policy_id)
        if not isinstance(update, WeightUpdate):
            dec = decode(update, self.weights_key)
            if dec.version != version or dec.parts != 1:
                raise WeightUpdateRejected(f"the payload is signed for version {dec.version}, offered as {version}")
            update = dec.update
        fn = getattr(pol, "update_weights_async", None)
        if fn is not None:
            return list(await fn(update, version))
        return list(await asyncio.to_thread(pol.update_weights, update, version))

    async def weight_version(self, policy_id: str) -> int:
        return int(getattr(self._policy(policy_id), "weight_version", 0))

    async def weight_checksums(self, policy_id: str, names: list[str]) -> dict[str, int]:
        """CRC-32 of a hosted policy's tensors ``names`` (what it serves, to check a publish end to end)."""
        pol = self._policy(policy_id)
        fn = getattr(pol, "weight_checksums", None)
        if callable(fn):
            return {k: int(v) for k, v in (await asyncio.to_thread(fn, names)).items()}
        state = pol.state_dict()
        return {n: crc32(state[n]) for n in names if n in state}

    async def stop(self) -> None:
        """Cancel in-flight work and release the runtime."""
        self.stopped = True
        await self.engine.aclose()
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        if self._own_runtime:
            self.runtime.close(wait=False)
        if self.close_policies:  # the service built them: an engine must not outlive it
            for pol in self.policies.values():
                try:
                    await pol.aclose()
                except Exception:  # one policy failing to close must not keep the others open
                    logger.warning("service %s: closing policy %s failed", self.service_id, pol.policy_id,
                                   exc_info=True)

    # ------------------------------------------------------------------ internals
    def _policy(self, policy_id: str) -> Any:
        try:
            return self.policies[policy_id]
        except KeyError:
            raise PolicyNotHosted(f"service {self.service_id} hosts no policy {policy_id!r}; it hosts "
                                     f"{sorted(self.policies)}") from None

    def _queue(self) -> asyncio.Queue[ServiceResult]:
        if self._done is None:
            self._done = asyncio.Queue()
        return self._done

    def _ensure_pump(self) -> None:
        if self._pump is None or self._pump.done():
            self._pump = asyncio.ensure_future(self._pump_results())

    async def _pump_results(self) -> None:
        q = self._queue()
        while not self.stopped:
            res = await self.engine.next_result()
            gid = res.request.group_id
            ticket_id, _, _ = gid.rpartition("#")
            attempt = self._attempts.pop(gid, 0)
            started = self._started.pop(gid, time.monotonic())
            if res.status == "cancelled":
                continue  # the dataflow layer asked for it (stale work) and accounts for it itself
            self.completed += 1
            q.put_nowait(ServiceResult(ticket_id, attempt, group=res.group, error=res.error,
                                       service_id=self.service_id, wall_s=time.monotonic() - started))


@runtime_checkable
class ServiceHandle(Protocol):
    """How the dataflow layer talks to a service, wherever it runs. Any method may raise
    :class:`ServiceDead` (the service is gone: its in-flight tickets are resubmitted)."""

    service_id: str

    async def submit(self, ticket: Ticket) -> None: ...

    async def collect(self, timeout: float = 0.0) -> list[ServiceResult]: ...

    async def status(self) -> dict[str, Any]: ...

    async def update_weights(self, policy_id: str, update: WeightUpdate | bytes, version: int) -> list[str]: ...

    async def weight_version(self, policy_id: str) -> int: ...

    async def weight_checksums(self, policy_id: str, names: list[str]) -> dict[str, int]: ...

    async def stop(self) -> None: ...


class LocalService:
    """A :class:`ServiceHandle` for a service in this process (the embedded runtime).

    :meth:`kill` simulates a crash: in-flight work is dropped and every later call raises
    :class:`ServiceDead` (the fault tests use it; on Ray a killed actor behaves the same).
    """

    def __init__(self, service: RolloutService) -> None:
        self.service = service
        self.service_id = service.service_id
        self.killed = False

    async def submit(self, ticket: Ticket) -> None:
        self._alive()
        await self.service.submit(ticket)

    async def collect(self, timeout: float = 0.0) -> list[ServiceResult]:
        self._alive()
        out = await self.service.collect(timeout)
        self._alive()  # killed while waiting: its results are lost, as a crashed process's would be
        return out

    async def status(self) -> dict[str, Any]:
        self._alive()
        return await self.service.status()

    async def update_weights(self, policy_id: str, update: WeightUpdate | bytes, version: int) -> list[str]:
        self._alive()
        return await self.service.update_weights(policy_id, update, version)

    async def weight_version(self, policy_id: str) -> int:
        self._alive()
        return await self.service.weight_version(policy_id)

    async def weight_checksums(self, policy_id: str, names: list[str]) -> dict[str, int]:
        self._alive()
        return await self.service.weight_checksums(policy_id, names)

    async def cancel(self, ticket_id: str, attempt: int) -> bool:
        self._alive()
        return await self.service.cancel(ticket_id, attempt)

    async def stop(self) -> None:
        await self.service.stop()

    async def kill(self) -> None:
        """Crash the service: drop everything in flight, refuse every later call."""
        self.killed = True
        await self.service.stop()

    def _alive(self) -> None:
        if self.killed:
            raise ServiceDead(f"service {self.service_id} was killed")

"""What every runtime shares: how a service is described and built, how weights reach services, and the
driver-side API (:class:`FlowRuntime`) that the embedded and the Ray runtime both implement.

A service is described by a :class:`ServiceSpec`: a name and a *factory* that builds its workflows
(and so its policies) where the service runs: in this process, or inside a Ray actor on another
node (the factory must then be picklable by cloudpickle).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentgym.dataflow.flow import Batch, DataFlow
from agentgym.dataflow.service import RolloutService, ServiceDead
from agentgym.errors import ChecksumMismatch, PolicyError, PolicyNotHosted, WeightUpdateRejected
from agentgym.rollout.workflow import Workflow
from agentgym.weights import Publication, WeightUpdate

__all__ = ["FlowRuntime", "ServiceSpec", "build_service", "publish_to"]

log = logging.getLogger(__name__)


@dataclass
class ServiceSpec:
    """How to build one rollout service.

    Attributes:
        name: Unique service id.
        workflows: ``() -> {name: workflow}``, called where the service runs.
        capacity: Groups in flight at once.
        max_concurrency: Episodes in flight (the service's rollout runtime).
        env_factory: ``env_id -> env`` for the service's rollout runtime (default: the registry).
        resources: Ray only: custom resources that place the actor (e.g. ``{"node2": 0.01}``).
        close_policies: The service owns the policies its workflows factory builds (a vLLM engine per
            service) and closes them when it stops. Leave it ``False`` when the factory hands out
            policies that live on after the service (the recipe's own rollout policies).
    """

    name: str
    workflows: Callable[[], Mapping[str, Workflow]]
    capacity: int = 4
    max_concurrency: int = 32
    env_factory: Callable[[str], Any] | None = None
    resources: dict[str, float] | None = None
    close_policies: bool = False


def build_service(spec: ServiceSpec, *, weights_key: bytes | None = None) -> RolloutService:
    """Build the service a spec describes (in the calling process); ``weights_key`` verifies signed updates."""
    return RolloutService(spec.name, spec.workflows(), max_groups=spec.capacity, max_concurrency=spec.max_concurrency,
                          env_factory=spec.env_factory, close_policies=spec.close_policies, weights_key=weights_key)


async def publish_to(flow: DataFlow, policy_id: str, publication: Publication) -> dict[str, str]:
    """Send ``publication`` to every live service that hosts ``policy_id``; then the flow moves to its
    version. Returns ``{service: outcome}``.

    The fallback rules are the weights module's (:meth:`~agentgym.weights.Publication.choose`,
    :meth:`~agentgym.weights.Publication.fallback`): a service that is not at the delta's base version
    (it joined late, or missed an update) gets the whole state, and so does one that refuses the delta
    with :class:`~agentgym.errors.ChecksumMismatch`. Each outcome is decided by the error's type:

    * ``"ok"``, ``"full: version_gap"``, ``"full: checksum_mismatch"``: applied;
    * ``"skipped"``: the service does not host the policy (:class:`~agentgym.errors.PolicyNotHosted`);
    * ``"dead: ..."``: the service is gone (:class:`~agentgym.dataflow.service.ServiceDead`; the flow's
      heartbeat resubmits its work);
    * ``"removed: ..."``: the service cannot apply the update (:class:`~agentgym.errors.WeightUpdateRejected`,
      a checksum mismatch with no whole state to fall back to, or its engine failed:
      :class:`~agentgym.errors.PolicyError`). It keeps old weights, so it is taken out of the pool
      rather than left generating tokens tagged with a version they were not sampled from.

    Raises:
        VersionNotNewer: the version is not newer than a service's (the publisher's mistake).
    """
    out: dict[str, str] = {}
    version = publication.version

    async def take_out(sid: str, e: Exception) -> None:
        out[sid] = f"removed: {type(e).__name__}: {e}"
        log.warning("service %s cannot apply %s v%d and is taken out: %s", sid, policy_id, version, e)
        await flow.remove_service(sid, drain=False)

    async def one(sid: str) -> None:
        handle = flow.services[sid].handle
        try:
            update, how = publication.choose(await handle.weight_version(policy_id))
            try:
                await handle.update_weights(policy_id, update, version)
            except ChecksumMismatch:
                full = publication.fallback(update)
                if full is None:
                    raise
                await handle.update_weights(policy_id, full, version)
                how = "checksum_mismatch"
            out[sid] = "ok" if how == "ok" else f"full: {how}"
        except PolicyNotHosted:
            out[sid] = "skipped"
        except ServiceDead as e:
            out[sid] = f"dead: {e}"
        except (WeightUpdateRejected, ChecksumMismatch, PolicyError) as e:
            await take_out(sid, e)

    await asyncio.gather(*(one(sid) for sid in flow.live_services()))
    flow.set_version(policy_id, version)
    return out


@runtime_checkable
class FlowRuntime(Protocol):
    """What a trainer (or a test) drives, whatever the runtime."""

    async def start(self) -> None: ...

    async def add_service(self, spec: ServiceSpec, *,
                          weights: Mapping[str, tuple[WeightUpdate, int]] | None = None) -> None: ...

    async def remove_service(self, name: str, *, drain: bool = True) -> None: ...

    async def kill_service(self, name: str) -> None: ...

    async def get_batch(self, policy_id: str, n_groups: int | None = None, timeout: float | None = None) -> Batch: ...

    async def publish(self, policy_id: str, publication: Publication) -> dict[str, str]: ...

    async def step_done(self, policy_id: str) -> None: ...

    async def live_services(self) -> list[str]: ...

    async def stats(self) -> dict[str, Any]: ...

    async def drain(self, timeout: float | None = None) -> None: ...

    async def check_ledger(self, drained: bool = False) -> dict[str, Any]: ...

    async def tickets(self, ticket_ids: Sequence[str]) -> dict[str, dict[str, Any]]: ...

    async def state_dict(self) -> dict[str, Any]: ...

    async def load_state_dict(self, state: dict[str, Any]) -> None: ...

    async def stop(self) -> None: ...

"""Runtimes: where the dataflow components live. One driver-side API (:class:`~agentgym.dataflow.spec.FlowRuntime`),
two implementations, one flow wrapper (:class:`~agentgym.dataflow.host.FlowHost`) under both.

* :class:`EmbeddedRuntime` (the default): the flow and every RolloutService in this process, on one
  asyncio loop. No extra dependency.
* :class:`~agentgym.dataflow.ray_runtime.RayRuntime`: the flow and each service are Ray actors
  (services can be placed on other nodes); the trainer stays in the driver.

Both run the same :class:`~agentgym.dataflow.flow.DataFlow` code, so the contract tests run on both.
:func:`make_runtime` picks one from the ``[dataflow]`` table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.dataflow.config import DataflowConfig, FlowParams
from agentgym.dataflow.flow import Batch, DataFlow, GroupFilter
from agentgym.dataflow.host import FlowHost
from agentgym.dataflow.service import LocalService
from agentgym.dataflow.spec import FlowRuntime, ServiceSpec, build_service
from agentgym.dataflow.tasks import TaskRef, TaskStream, ZeroVarianceSkipper
from agentgym.errors import ConfigurationError
from agentgym.weights import Publication, WeightUpdate

__all__ = ["EmbeddedRuntime", "make_runtime"]


class EmbeddedRuntime:
    """The flow and its services in this process (see the module docstring).

    Args:
        stream: The task stream (order, curriculum, skipping).
        config: The ``[dataflow]`` table; ``params``: what the run derives (batch shape, filters, timings).
        filters: Group filters (default: the params' switches).
    """

    name = "embedded"

    def __init__(self, stream: TaskStream, config: DataflowConfig | None = None, params: FlowParams | None = None, *,
                 filters: Sequence[GroupFilter] | None = None) -> None:
        self.host = FlowHost(stream, config or DataflowConfig(), params or FlowParams(), filters)

    @property
    def flow(self) -> DataFlow:
        """The flow itself (this process only: e.g. to add a group observer that writes a local file)."""
        return self.host.flow

    async def start(self) -> None:
        await self.host.start()

    async def add_service(self, spec: ServiceSpec, *,
                          weights: Mapping[str, tuple[WeightUpdate, int]] | None = None) -> None:
        """Start a service; with ``weights`` (``{policy: (whole state, version)}``) it gets them before any work."""
        handle = LocalService(build_service(spec))
        await self.host.add_service(handle, spec.capacity, ready=not weights)
        if weights:
            for pid, (state, version) in weights.items():
                await handle.update_weights(pid, state, version)
            await self.host.mark_ready(spec.name)

    async def remove_service(self, name: str, *, drain: bool = True) -> None:
        await self.host.remove_service(name, drain=drain)

    async def kill_service(self, name: str) -> None:
        """Crash a service (in-flight work is dropped; the flow resubmits it elsewhere)."""
        handle = self.host.flow.services[name].handle
        assert isinstance(handle, LocalService)
        await handle.kill()

    async def get_batch(self, policy_id: str, n_groups: int | None = None, timeout: float | None = None) -> Batch:
        return await self.host.get_batch(policy_id, n_groups, timeout)

    async def publish(self, policy_id: str, publication: Publication) -> dict[str, str]:
        return await self.host.publish(policy_id, publication)

    async def step_done(self, policy_id: str) -> None:
        await self.host.step_done(policy_id)

    async def live_services(self) -> list[str]:
        return await self.host.live_services()

    async def stats(self) -> dict[str, Any]:
        return await self.host.stats()

    async def drain(self, timeout: float | None = None) -> None:
        await self.host.drain(timeout)

    async def check_ledger(self, drained: bool = False) -> dict[str, Any]:
        return await self.host.check_ledger(drained)

    async def tickets(self, ticket_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return await self.host.tickets(ticket_ids)

    async def state_dict(self) -> dict[str, Any]:
        return await self.host.state_dict()

    async def load_state_dict(self, state: dict[str, Any]) -> None:
        await self.host.load_state_dict(state)

    async def stop(self) -> None:
        await self.host.stop()


def make_runtime(config: DataflowConfig, params: FlowParams, tasks: Sequence[TaskRef], *, seed: int = 0,
                 filters: Sequence[GroupFilter] | None = None,
                 ray_init: Mapping[str, Any] | None = None) -> FlowRuntime:
    """The runtime ``config.runtime`` names, over ``tasks`` drawn in a ``seed``-ed order (GRESO skipping
    when ``config.skip_zero_variance``).

    Args:
        filters: Group filters (embedded runtime only; default: the params' switches).
        ray_init: Extra ``ray.init`` arguments (Ray runtime only).
    """
    skipper = (ZeroVarianceSkipper(config.skip_patience, config.skip_explore) if config.skip_zero_variance else None)
    if config.runtime == "ray" and filters is not None:
        raise ConfigurationError("custom group filters run in this process: use the embedded runtime, or the "
                                 "params' filter switches with the Ray runtime")
    stream = TaskStream(tasks, seed=seed, skipper=skipper)
    if config.runtime == "ray":
        from agentgym.dataflow.ray_runtime import RayRuntime

        return RayRuntime(stream, config, params, address=config.ray_address, init_kwargs=dict(ray_init or {}))
    return EmbeddedRuntime(stream, config, params, filters=filters)

"""FlowHost: the one wrapper around :class:`~agentgym.dataflow.flow.DataFlow` that runtimes drive.

Every method is async and takes and returns plain data, so the same class runs in this process (the
embedded runtime calls it directly) and as a Ray actor (the Ray runtime wraps it in ``ray.remote``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentgym.dataflow.config import DataflowConfig, FlowParams
from agentgym.dataflow.flow import Batch, DataFlow, GroupFilter
from agentgym.dataflow.service import ServiceHandle
from agentgym.dataflow.spec import publish_to
from agentgym.dataflow.tasks import TaskStream
from agentgym.weights import Publication

__all__ = ["FlowHost"]


class FlowHost:
    """A DataFlow behind the runtimes' async API (see the module docstring).

    Args:
        stream: Where tasks come from.
        config: The ``[dataflow]`` table; ``params``: what the run derives (batch shape, filters, timings).
        filters: Group filters (default: the params' switches, :func:`~agentgym.dataflow.flow.default_filters`).
    """

    def __init__(self, stream: TaskStream, config: DataflowConfig, params: FlowParams,
                 filters: Sequence[GroupFilter] | None = None) -> None:
        self.flow = DataFlow(stream, config, params, filters=filters)

    async def start(self) -> None:
        await self.flow.start()

    async def add_service(self, handle: ServiceHandle, capacity: int, ready: bool = True) -> None:
        self.flow.add_service(handle, capacity, ready=ready)

    async def mark_ready(self, name: str) -> None:
        self.flow.mark_ready(name)

    async def remove_service(self, name: str, drain: bool = True) -> None:
        await self.flow.remove_service(name, drain=drain)

    async def get_batch(self, policy_id: str, n_groups: int | None = None, timeout: float | None = None) -> Batch:
        return await self.flow.get_batch(policy_id, n_groups, timeout)

    async def publish(self, policy_id: str, publication: Publication) -> dict[str, str]:
        return await publish_to(self.flow, policy_id, publication)

    async def step_done(self, policy_id: str) -> None:
        self.flow.step_done(policy_id)

    async def live_services(self) -> list[str]:
        return self.flow.live_services()

    async def stats(self) -> dict[str, Any]:
        return self.flow.stats()

    async def drain(self, timeout: float | None = None) -> None:
        await self.flow.drain(timeout)

    async def check_ledger(self, drained: bool = False) -> dict[str, Any]:
        self.flow.ledger.check(drained=drained)
        return self.flow.ledger.counts()

    async def tickets(self, ticket_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each ticket's ledger record (states, last service, attempt, history)."""
        return self.flow.ledger.describe(list(ticket_ids))

    async def state_dict(self) -> dict[str, Any]:
        return self.flow.state_dict()

    async def load_state_dict(self, state: dict[str, Any]) -> None:
        self.flow.load_state_dict(state)

    async def stop(self) -> None:
        await self.flow.stop()

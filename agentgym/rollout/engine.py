"""The rollout engine: many groups (and so many episodes) concurrently under asyncio.

Each turn of each episode is its own policy request, so a continuous-batching backend (vLLM, an
OpenAI-compatible server, a batching HF policy) always has work queued while envs step in the
worker pool. Concurrency is capped by ``RolloutRuntime.max_concurrency`` (active episodes).

    runtime = RolloutRuntime(max_concurrency=64)
    engine = RolloutEngine(runtime)
    wf = MultiTurnWorkflow(policy, group_size=8, gates=[SelectiveRolloutGate(10, 0.12)])
    groups = await engine.run(wf, [GroupRequest("agentgym/ALFWorld-v0", tid) for tid in task_ids])
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from agentgym.rollout.runtime import RolloutRuntime
from agentgym.rollout.workflow import GroupRequest, Workflow
from agentgym.types import Trajectory

__all__ = ["GroupCallback", "RolloutEngine"]

GroupCallback = Callable[[GroupRequest, list[Trajectory]], "Awaitable[Any] | Any"]


class RolloutEngine:
    """Runs workflows over many group requests at once.

    Args:
        runtime: The shared runtime (worker pool, env pools, concurrency cap). Created (and
            closed by :meth:`close`) if not given.
        max_groups: Groups in flight at once (default: enough to fill the episode slots twice).
    """

    def __init__(self, runtime: RolloutRuntime | None = None, max_groups: int | None = None) -> None:
        self._own_runtime = runtime is None
        self.runtime = runtime or RolloutRuntime()
        self.max_groups = max_groups

    async def run(self, workflow: Workflow, requests: Iterable[GroupRequest],
                  on_group: GroupCallback | None = None) -> list[list[Trajectory]]:
        """Run every request; results come back in request order.

        ``on_group(request, trajectories)`` (sync or async) is called as each group finishes, in
        completion order; use it to stream results to disk. An exception from the callback
        propagates (and cancels the remaining groups).
        """
        reqs = list(requests)
        size = max(1, int(getattr(workflow, "group_size", 1)))
        limit = self.max_groups or max(1, 2 * self.runtime.max_concurrency // size + 1)
        gate = asyncio.Semaphore(limit)
        results: list[list[Trajectory] | None] = [None] * len(reqs)

        async def one(i: int, req: GroupRequest) -> None:
            async with gate:
                trajs = await workflow.run(self.runtime, req)
            results[i] = trajs
            if on_group is not None:
                out = on_group(req, trajs)
                if inspect.isawaitable(out):
                    await out

        tasks = [asyncio.ensure_future(one(i, r)) for i, r in enumerate(reqs)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return [r if r is not None else [] for r in results]

    def close(self) -> None:
        if self._own_runtime:
            self.runtime.close()

    async def __aenter__(self) -> RolloutEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

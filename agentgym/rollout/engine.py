"""The rollout engine: submit groups, receive them as they finish, cancel, with backpressure.

Each turn of each episode is its own policy request, so a continuous-batching backend (vLLM, an
OpenAI-compatible server, a batching HF policy) always has work queued while envs step in the
worker pool. Episode concurrency is capped by ``RolloutRuntime.max_concurrency``; groups in flight
by ``max_groups`` (:meth:`RolloutEngine.submit` waits for room: backpressure).

Streaming use (what a dataflow layer does)::

    async with RolloutEngine(RolloutRuntime(max_concurrency=64), max_groups=16) as engine:
        for req in requests:
            await engine.submit(workflow, req)          # waits while 16 groups are in flight
        async for res in engine.results():              # in completion order
            if res.ok:
                train_on(res.group)
        engine.cancel(group_id)                         # drop work that became too stale

Batch use: ``groups = await engine.run(workflow, requests)`` (results in request order).

Every submitted group produces exactly one :class:`GroupResult`: ``done``, ``cancelled`` or
``failed`` (a workflow that raised, which workflows should not do).
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from agentgym.errors import ConfigurationError
from agentgym.rollout.runtime import RolloutRuntime
from agentgym.rollout.workflow import GroupRequest, Workflow
from agentgym.types import TrajectoryGroup

__all__ = ["GroupCallback", "GroupResult", "RolloutEngine"]

GroupCallback = Callable[[GroupRequest, TrajectoryGroup], "Awaitable[Any] | Any"]
Status = Literal["done", "cancelled", "failed"]


@dataclass
class GroupResult:
    """The outcome of one submitted group.

    Attributes:
        request: The request as submitted (``group_id`` filled in).
        status: ``"done"`` (``group`` is set), ``"cancelled"`` or ``"failed"`` (``error`` is set).
        group: The finished group.
        error: Why the workflow failed.
        workflow: The workflow that ran it.
    """

    request: GroupRequest
    status: Status
    group: TrajectoryGroup | None = None
    error: str | None = None
    workflow: Workflow | None = None

    @property
    def ok(self) -> bool:
        return self.status == "done"

    @property
    def group_id(self) -> str:
        return self.request.group_id


class RolloutEngine:
    """Runs workflows over many groups at once, streaming results as they finish.

    Args:
        runtime: The shared runtime (worker pool, env pools, concurrency cap). Created (and
            closed by :meth:`aclose`) if not given.
        max_groups: Groups in flight at once (default: enough to fill the episode slots twice).
    """

    def __init__(self, runtime: RolloutRuntime | None = None, max_groups: int | None = None) -> None:
        if max_groups is not None and max_groups < 1:
            raise ConfigurationError(f"max_groups must be >= 1, got {max_groups}")
        self._own_runtime = runtime is None
        self.runtime = runtime or RolloutRuntime()
        self.max_groups = max_groups
        self._tasks: dict[str, asyncio.Task[GroupResult]] = {}
        self._streamed: set[str] = set()  # in-flight groups whose results go to results()
        self._queue: asyncio.Queue[GroupResult] | None = None
        self._room: asyncio.Condition | None = None
        self._closed = False

    # ------------------------------------------------------------------ streaming API
    @property
    def in_flight(self) -> int:
        """Groups submitted and not yet finished."""
        return len(self._tasks)

    def _limit(self, workflow: Workflow) -> int:
        if self.max_groups is not None:
            return self.max_groups
        size = max(1, int(getattr(workflow, "group_size", 1)))
        return max(1, 2 * self.runtime.max_concurrency // size + 1)

    async def submit(self, workflow: Workflow, request: GroupRequest) -> str:
        """Start a group; waits while ``max_groups`` are in flight. Returns its ``group_id``."""
        if self._closed:
            raise ConfigurationError("this RolloutEngine is closed")
        room = self._cond()
        async with room:
            await room.wait_for(lambda: len(self._tasks) < self._limit(workflow))
        return self.submit_nowait(workflow, request)

    def submit_nowait(self, workflow: Workflow, request: GroupRequest) -> str:
        """Start a group now, whatever is in flight. Returns its ``group_id``."""
        req = request if request.group_id else replace(request, group_id=uuid.uuid4().hex[:12])
        self._start(workflow, req, stream=True)
        return req.group_id

    def _start(self, workflow: Workflow, req: GroupRequest, stream: bool) -> asyncio.Task[GroupResult]:
        if self._closed:
            raise ConfigurationError("this RolloutEngine is closed")
        if req.group_id in self._tasks:
            raise ConfigurationError(f"group {req.group_id!r} is already in flight")
        task = asyncio.ensure_future(self._run_one(workflow, req, stream))
        self._tasks[req.group_id] = task
        if stream:
            self._streamed.add(req.group_id)
        return task

    def cancel(self, group_id: str) -> bool:
        """Cancel an in-flight group (its result comes back as ``cancelled``). False if not in flight."""
        task = self._tasks.get(group_id)
        if task is None or task.done():
            return False
        task.cancel()
        return True

    async def next_result(self, timeout: float | None = None) -> GroupResult:
        """The next finished group (in completion order). ``asyncio.TimeoutError`` after ``timeout``."""
        return await asyncio.wait_for(self._results().get(), timeout)

    async def results(self) -> AsyncIterator[GroupResult]:
        """Yield results as groups finish, until nothing is in flight and nothing is queued."""
        q = self._results()
        while self._streamed or not q.empty():
            yield await q.get()

    # ------------------------------------------------------------------ batch API
    async def run(self, workflow: Workflow, requests: Iterable[GroupRequest],
                  on_group: GroupCallback | None = None) -> list[TrajectoryGroup]:
        """Run every request; groups come back in request order (not through :meth:`results`).

        ``on_group(request, group)`` (sync or async) is called as each group finishes, in
        completion order; use it to stream results to disk. An exception from the callback (or a
        failed workflow) propagates and cancels the remaining groups.
        """
        reqs = [r if r.group_id else replace(r, group_id=uuid.uuid4().hex[:12]) for r in requests]
        index = {r.group_id: i for i, r in enumerate(reqs)}
        if len(index) != len(reqs):
            raise ConfigurationError("group ids must be unique within a run")
        out: list[TrajectoryGroup | None] = [None] * len(reqs)
        pending = list(reversed(reqs))
        limit = self._limit(workflow)
        mine: set[asyncio.Task[GroupResult]] = set()
        try:
            while pending or mine:
                while pending and len(mine) < limit:
                    mine.add(self._start(workflow, pending.pop(), stream=False))
                done, _ = await asyncio.wait(mine, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    mine.discard(task)
                    res = task.result()
                    if res.status == "failed":
                        raise RuntimeError(f"workflow {workflow.name!r} failed on group {res.group_id}: {res.error}")
                    if res.group is None:
                        continue
                    out[index[res.group_id]] = res.group
                    if on_group is not None:
                        ret = on_group(res.request, res.group)
                        if inspect.isawaitable(ret):
                            await ret
        finally:
            for task in mine:
                task.cancel()
            await asyncio.gather(*mine, return_exceptions=True)
        return [g if g is not None else TrajectoryGroup(r.group_id, r.task_id, r.env_id) for g, r in zip(out, reqs, strict=True)]

    # ------------------------------------------------------------------ lifecycle
    async def aclose(self) -> None:
        """Cancel what is in flight and close the runtime if the engine created it."""
        self._closed = True
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        if self._own_runtime:
            self.runtime.close()

    def close(self) -> None:
        """Synchronous close of an idle engine (closes the runtime if the engine created it)."""
        self._closed = True
        if self._own_runtime:
            self.runtime.close()

    async def __aenter__(self) -> RolloutEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ internals
    def _results(self) -> asyncio.Queue[GroupResult]:
        if self._queue is None:  # created lazily, inside the running loop
            self._queue = asyncio.Queue()
        return self._queue

    def _cond(self) -> asyncio.Condition:
        if self._room is None:
            self._room = asyncio.Condition()
        return self._room

    async def _run_one(self, workflow: Workflow, req: GroupRequest, stream: bool) -> GroupResult:
        try:
            group = await workflow.run(self.runtime, req)
            res = GroupResult(req, "done", group=group, workflow=workflow)
        except asyncio.CancelledError:
            res = GroupResult(req, "cancelled", workflow=workflow)
        except Exception as e:  # a workflow must not raise; report it instead of losing the group
            res = GroupResult(req, "failed", error=f"{type(e).__name__}: {e}", workflow=workflow)
        finally:
            self._tasks.pop(req.group_id, None)
        if stream:
            self._results().put_nowait(res)
            self._streamed.discard(req.group_id)
        room = self._cond()
        async with room:
            room.notify_all()
        return res

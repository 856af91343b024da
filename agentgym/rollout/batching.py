"""Request coalescing: many concurrent single-turn requests become batched backend calls.

The engine sends each turn of each episode as its own request. A backend with continuous batching
(vLLM, an OpenAI-compatible server) batches them itself; a static-batching backend (``HFPolicy``)
would otherwise serve them one call at a time. :func:`micro_batch` wraps such a policy: requests
that arrive while a batch is running queue up and go out together as the next batch, so the
batch size adapts to the load without turn-synchronous barriers.

If a batched call raises, each of its requests is retried alone, so one bad request loses only its
own episode. The wrapped policy's capabilities (sessions, weight updates, abort) pass through.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from agentgym.errors import ConfigurationError
from agentgym.policy import Capabilities, ChatSession, Generation, GenRequest, Policy, capabilities_of
from agentgym.rollout.runtime import RolloutRuntime
from agentgym.weights import WeightUpdate

__all__ = ["MicroBatcher", "micro_batch"]


class MicroBatcher:
    """Wrap ``policy`` so concurrent ``generate`` calls are coalesced.

    Args:
        policy: The backend.
        max_batch: Most requests per backend call.
        max_wait_s: How long the first request of an idle batcher waits for company.
        max_inflight: Backend calls running at once (1 suits a policy that serializes calls).
    """

    def __init__(self, policy: Policy, max_batch: int = 32, max_wait_s: float = 0.005, max_inflight: int = 1,
                 runtime: RolloutRuntime | None = None) -> None:
        self.policy = policy
        self.runtime = runtime
        if runtime is not None:
            runtime.add_listener(lambda _n: self._schedule())
        self.policy_id = policy.policy_id
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_inflight = max_inflight
        self._pending: list[tuple[GenRequest, asyncio.Future[list[Generation]]]] = []
        self._inflight = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.batch_sizes: list[int] = []

    @property
    def capabilities(self) -> Capabilities:
        """The wrapped policy's sessions and weight updates (batching adds none, removes env-side acting)."""
        caps = capabilities_of(self.policy)
        return Capabilities(sessions=caps.sessions, weight_updates=caps.weight_updates, abort=caps.abort)

    def new_session(self) -> ChatSession:
        session: ChatSession = self.policy.new_session()  # type: ignore[attr-defined]
        return session

    def update_weights(self, update: WeightUpdate | bytes, version: int, **kwargs: Any) -> Any:
        return self.policy.update_weights(update, version, **kwargs)  # type: ignore[attr-defined]

    def abort(self, request_ids: Any = None) -> Any:
        return self.policy.abort(request_ids)  # type: ignore[attr-defined]

    @property
    def weight_version(self) -> int:
        return int(getattr(self.policy, "weight_version", 0))

    @property
    def tokenizer(self) -> Any:
        return getattr(self.policy, "tokenizer", None)

    def describe(self) -> dict[str, Any]:
        return {**self.policy.describe(), "micro_batched": True, "max_batch": self.max_batch}

    async def aclose(self) -> None:
        await self.policy.aclose()

    async def __aenter__(self) -> MicroBatcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[list[Generation]]] = []
        for r in requests:
            fut: asyncio.Future[list[Generation]] = loop.create_future()
            self._pending.append((r, fut))
            futs.append(fut)
        self._schedule()
        results = await asyncio.gather(*futs)
        return [g for res in results for g in res]

    def _want(self) -> int:
        """Flush as soon as this many requests wait: every active episode (with a runtime), else a full batch."""
        if self.runtime is not None:
            return max(1, min(self.max_batch, self.runtime.active))
        return self.max_batch

    def _schedule(self) -> None:
        if not self._pending or self._inflight >= self.max_inflight:
            return  # the running batch's completion schedules the queue
        if len(self._pending) >= self._want() or self.max_wait_s <= 0:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.max_wait_s, self._flush)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending and self._inflight < self.max_inflight:
            batch = [(r, f) for r, f in self._pending[: self.max_batch]]
            del self._pending[: self.max_batch]
            batch = [(r, f) for r, f in batch if not f.done()]  # callers that gave up (timeouts)
            if not batch:
                continue
            self._inflight += 1
            task = asyncio.ensure_future(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[GenRequest, asyncio.Future[list[Generation]]]]) -> None:
        try:
            self.batch_sizes.append(len(batch))
            try:
                gens = await self.policy.generate([r for r, _ in batch])
                if len(gens) != sum(r.n for r, _ in batch):
                    raise RuntimeError(f"policy returned {len(gens)} generations for {len(batch)} requests")
            except Exception as e:
                if len(batch) == 1:
                    if not batch[0][1].done():
                        batch[0][1].set_exception(e)
                    return
                for r, f in batch:  # isolate the failing request
                    try:
                        one = await self.policy.generate([r])
                    except Exception as e1:
                        if not f.done():
                            f.set_exception(e1)
                    else:
                        if not f.done():
                            f.set_result(list(one))
                return
            i = 0
            for r, f in batch:
                if not f.done():
                    f.set_result(list(gens[i : i + r.n]))
                i += r.n
        finally:
            self._inflight -= 1
            self._schedule()


def micro_batch(policy: Policy, max_batch: int = 32, max_wait_s: float | None = None, max_inflight: int = 1,
                runtime: RolloutRuntime | None = None) -> MicroBatcher:
    """Wrap ``policy`` in the right batcher (token-exact sessions preserved).

    With ``runtime``, a batch goes out as soon as every active episode of the runtime is waiting
    for a generation (or ``max_batch`` are), else after ``max_wait_s`` (default 50 ms; 5 ms without
    a runtime, when a batch goes out after the wait or once ``max_batch`` requests queue).
    """
    if capabilities_of(policy).env_side:
        raise ConfigurationError(f"{policy.policy_id!r} acts on the env; there is nothing to batch")
    wait = max_wait_s if max_wait_s is not None else (0.05 if runtime is not None else 0.005)
    return MicroBatcher(policy, max_batch, wait, max_inflight, runtime)

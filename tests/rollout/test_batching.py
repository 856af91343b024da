"""The micro-batcher coalesces concurrent requests and isolates failures."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from rollout_fakes import FakePolicy, FakeTokenPolicy, TickPolicy

from agentgym.errors import PolicyError
from agentgym.policy import Generation, GenRequest, capabilities_of
from agentgym.rollout import GroupRequest, MultiTurnWorkflow, RolloutEngine, RolloutRuntime, micro_batch


class Echo(FakePolicy):
    """Echoes each request's tag; one call at a time (like HFPolicy's lock); fails on tag 'bad'."""

    policy_id = "echo"

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.busy = False

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        assert not self.busy
        self.busy = True
        try:
            self.calls.append(len(requests))
            await asyncio.sleep(0.05)
            if any(r.metadata.get("tag") == "bad" for r in requests):
                raise PolicyError("bad request")
            return [Generation(f"{r.metadata['tag']}#{i}") for r in requests for i in range(r.n)]
        finally:
            self.busy = False


async def test_concurrent_requests_are_coalesced_in_order() -> None:
    echo = Echo()
    b = micro_batch(echo, max_batch=8)
    outs = await asyncio.gather(*(b.generate([GenRequest(metadata={"tag": str(i)}, n=1 + i % 2)]) for i in range(12)))
    assert [[g.text for g in o] for o in outs] == [[f"{i}#{k}" for k in range(1 + i % 2)] for i in range(12)]
    assert echo.calls == [8, 4]  # two backend calls instead of twelve, never overlapping
    assert b.batch_sizes == [8, 4]


async def test_failure_is_isolated_to_its_request() -> None:
    b = micro_batch(Echo())
    res = await asyncio.gather(*(b.generate([GenRequest(metadata={"tag": t})]) for t in ("a", "bad", "c")),
                               return_exceptions=True)
    assert [r[0].text if isinstance(r, list) else type(r).__name__ for r in res] == ["a#0", "PolicyError", "c#0"]


async def test_engine_with_batcher_keeps_token_sessions() -> None:
    inner = FakeTokenPolicy()
    b = micro_batch(inner)
    assert capabilities_of(b).sessions and b.policy_id == "tok"
    with RolloutRuntime(max_concurrency=8) as rt:
        [trajs] = await RolloutEngine(rt).run(MultiTurnWorkflow(b, group_size=6), [GroupRequest("agentgym/TestCounter-v0", "ok-2")])
    assert all(t.success for t in trajs)
    assert sorted(t.segments()[0].token_ids for t in trajs) == sorted(s.token_ids for s in inner.sessions)
    assert max(b.batch_sizes) > 1


async def test_capabilities_and_lifecycle_pass_through() -> None:
    pol = TickPolicy(version=5)
    b = micro_batch(pol)
    assert not capabilities_of(b).sessions and b.describe()["micro_batched"] is True
    async with b:
        pass
    assert pol.closed
    with pytest.raises(AttributeError):
        _ = b.no_such_attribute  # type: ignore[attr-defined]


async def test_runtime_aware_batches_wait_for_every_active_episode() -> None:
    import agentgym

    rt = RolloutRuntime(max_concurrency=4, env_factory=lambda eid: agentgym.make(eid, step_sleep=0.03))
    pol = TickPolicy(latency=0.02)
    b = micro_batch(pol, max_batch=4, runtime=rt, max_wait_s=1.0)
    with rt:
        groups = await RolloutEngine(rt).run(MultiTurnWorkflow(b), [GroupRequest("agentgym/TestCounter-v0", "ok-2")
                                                                    for _ in range(4)])
    assert all(g[0].success for g in groups)
    # 4 episodes x 3 turns: every batch holds all 4 active episodes (the 1 s cap never fires)
    assert b.batch_sizes == [4, 4, 4] and pol.calls == 3
    assert rt.active == 0

"""Property: every submitted task is trained on, filtered or expired exactly once, under any
interleaving of submits, service joins, leaves, kills and trainer steps (the real embedded runtime)."""

from __future__ import annotations

import asyncio
import contextlib

from dataflow_fakes import ENV, configs, make_service
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agentgym.dataflow.flow import DataFlow
from agentgym.dataflow.service import ServiceDead
from agentgym.dataflow.tasks import TaskRef, TaskStream
from agentgym.weights import WeightUpdate


class DataflowMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        tasks = [TaskRef(ENV, f"ok-{n}", seed=0) for n in (1, 2, 3)]
        self.flow = DataFlow(TaskStream(tasks, seed=0),
                             *configs(groups_per_step=2, max_staleness=1, poll_s=0.02, dead_after_s=2.0))
        self.n = 0
        self.trained: list[str] = []
        self.run(self.flow.start())

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def live(self) -> list[str]:
        """Services that can still work (the flow may not have noticed a kill yet)."""
        return [sid for sid in self.flow.live_services() if not self.flow.services[sid].handle.killed]  # type: ignore[attr-defined]

    @precondition(lambda self: len(self.live()) < 3)
    @rule(capacity=st.integers(1, 3), latency=st.sampled_from([0.0, 0.01, 0.05]))
    def join(self, capacity: int, latency: float) -> None:
        # as a trainer does: a service joins not ready, gets the current weights, then takes work
        handle = make_service(f"s{self.n}", group_size=2, max_groups=capacity, latency=latency)
        self.flow.add_service(handle, capacity=capacity, ready=False)
        v = self.flow.versions["policy"]
        if v:
            self.run(handle.update_weights("policy", WeightUpdate.full({}), v))
        self.flow.mark_ready(handle.service_id)
        self.n += 1

    @precondition(lambda self: len(self.live()) > 0)
    @rule(pick=st.integers(0, 10))
    def kill(self, pick: int) -> None:
        sid = self.live()[pick % len(self.live())]
        self.run(self.flow.services[sid].handle.kill())  # type: ignore[attr-defined]

    @precondition(lambda self: len(self.live()) > 0)
    @rule(pick=st.integers(0, 10), drain=st.booleans())
    def leave(self, pick: int, drain: bool) -> None:
        sid = self.live()[pick % len(self.live())]
        self.run(self.flow.remove_service(sid, drain=drain, timeout=5))

    @precondition(lambda self: len(self.live()) > 0)
    @rule()
    def train_step(self) -> None:
        async def step() -> None:
            batch = await self.flow.get_batch("policy", timeout=30)
            self.trained += batch.tickets
            v = self.flow.versions["policy"] + 1
            for sid in self.live():
                with contextlib.suppress(ServiceDead):
                    await self.flow.services[sid].handle.update_weights("policy", WeightUpdate.full({}), v)
            self.flow.set_version("policy", v)

        self.run(step())

    @rule(seconds=st.sampled_from([0.0, 0.02, 0.1]))
    def wait(self, seconds: float) -> None:
        self.run(asyncio.sleep(seconds))

    @invariant()
    def accounting_is_consistent(self) -> None:
        led = self.flow.ledger
        led.check()
        assert len(self.trained) == len(set(self.trained))  # nothing trained twice
        assert sorted(led.in_state("trained")) == sorted(self.trained)
        buffered = [it.ticket_id for it in self.flow.buffers["policy"]]
        assert len(buffered) == len(set(buffered)) and sorted(buffered) == sorted(led.in_state("buffered"))
        for sid, s in self.flow.services.items():
            assert all(led.entries[t].service == sid for t in s.in_flight) or not s.alive

    def teardown(self) -> None:
        try:
            if not self.live():
                self.join(2, 0.0)
            self.run(self.flow.drain(timeout=30))
            self.flow.ledger.check(drained=True)  # every ticket terminal: trained, filtered or expired
            c = self.flow.ledger.counts()
            assert c["states"].get("trained", 0) == len(self.trained)
            assert sum(c["states"].values()) == c["tickets"]
        finally:
            self.run(self.flow.stop())
            self.loop.close()


TestDataflowExactlyOnce = DataflowMachine.TestCase
# no shrinking: a failure prints the whole operation sequence at once instead of minutes of shrinking
TestDataflowExactlyOnce.settings = settings(max_examples=12, stateful_step_count=12, deadline=None,
                                            phases=[Phase.explicit, Phase.reuse, Phase.generate])

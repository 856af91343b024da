"""The dataflow layer, embedded runtime: staleness budget, filters, faults and exactly-once accounting."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from dataflow_fakes import ENV, configs, make_service

from agentgym.dataflow.config import DataflowConfig, FlowParams
from agentgym.dataflow.flow import DataFlow
from agentgym.dataflow.ledger import LedgerError
from agentgym.dataflow.service import LocalService, NoLiveService, ServiceDead
from agentgym.dataflow.tasks import TaskRef, TaskStream, ZeroVarianceSkipper
from agentgym.errors import ConfigurationError
from agentgym.weights import WeightUpdate

TASKS = [TaskRef(ENV, f"ok-{n}", seed=0) for n in (1, 2, 3)]


async def train(flow: DataFlow, steps: int, policy: str = "policy", train_s: float = 0.0) -> dict:
    """A stand-in trainer: take a batch, 'train', publish v+1 to every live service, repeat."""
    staleness: list[int] = []
    tickets: list[str] = []
    for _ in range(steps):
        batch = await flow.get_batch(policy, timeout=60)
        assert len(batch.groups) == flow.params.groups_per_step
        staleness += [flow.versions[policy] - v for v in batch.versions]
        tickets += batch.tickets
        await asyncio.sleep(train_s)
        v = flow.versions[policy] + 1
        for sid in flow.live_services():
            with contextlib.suppress(ServiceDead):
                await flow.services[sid].handle.update_weights(policy, WeightUpdate.full({}), v)
        flow.set_version(policy, v)
    return {"staleness": staleness, "tickets": tickets}


def _flow(**kw: object) -> DataFlow:
    return DataFlow(TaskStream(TASKS, seed=0), *configs(**{"groups_per_step": 3, "poll_s": 0.05, **kw}))


async def test_synchronous_is_max_staleness_zero_and_accounts_every_ticket() -> None:
    flow = _flow(max_staleness=0)
    for i in range(2):
        flow.add_service(make_service(f"s{i}"), capacity=3)
    await flow.start()
    try:
        out = await train(flow, 4)
    finally:
        await flow.drain(timeout=30)
        await flow.stop()
    assert out["staleness"] == [0] * 12  # every trained token came from the current weights
    flow.ledger.check(drained=True)
    c = flow.ledger.counts()
    assert c["states"]["trained"] == 12 and len(set(out["tickets"])) == 12
    # zero-variance groups were filtered and refilled (dynamic sampling), never trained
    assert c["states"].get("filtered", 0) == sum(v for k, v in c["reasons"].items() if k.startswith("filtered"))
    assert sum(c["states"].values()) == c["tickets"]


async def test_asynchronous_staleness_is_bounded() -> None:
    flow = _flow(max_staleness=2)
    flow.add_service(make_service("s0", max_groups=6), capacity=6)
    await flow.start()
    try:
        out = await train(flow, 6, train_s=0.3)  # a slow trainer: rollouts run ahead, up to the bound
    finally:
        await flow.drain(timeout=30)
        await flow.stop()
    assert max(out["staleness"]) <= 2 and max(out["staleness"]) >= 1
    flow.ledger.check(drained=True)


async def test_killed_service_loses_no_task_and_counts_none_twice() -> None:
    flow = _flow(max_staleness=1)
    victim, survivor = make_service("victim", latency=0.05), make_service("survivor", latency=0.05)
    flow.add_service(victim, capacity=3)
    flow.add_service(survivor, capacity=3)
    await flow.start()
    try:
        first = await train(flow, 1)
        while not flow.services["victim"].in_flight:  # kill it mid-episode
            await asyncio.sleep(0.01)
        await victim.kill()
        rest = await train(flow, 3)
    finally:
        await flow.drain(timeout=30)
        await flow.stop()
    assert not flow.services["victim"].alive and flow.services["survivor"].alive
    c = flow.ledger.counts()
    assert c["resubmitted"] >= 1
    flow.ledger.check(drained=True)
    trained = first["tickets"] + rest["tickets"]
    assert len(trained) == len(set(trained)) == 12 == c["states"]["trained"]


async def test_service_joining_later_takes_work() -> None:
    flow = _flow(max_staleness=3)
    flow.add_service(make_service("s0", latency=0.05), capacity=2)
    await flow.start()
    try:
        await train(flow, 1)
        flow.add_service(make_service("late", latency=0.05), capacity=2)
        await train(flow, 3)
    finally:
        await flow.drain(timeout=30)
        await flow.stop()
    assert flow.services["late"].completed > 0
    flow.ledger.check(drained=True)


async def test_dead_service_detected_by_missed_heartbeats() -> None:
    """A service that hangs (its poll never returns) is declared dead after dead_after_s."""
    flow = _flow(max_staleness=1, dead_after_s=0.5)
    hung, ok = make_service("hung"), make_service("ok")

    async def never(timeout: float = 0.0) -> list:
        await asyncio.sleep(3600)
        return []

    hung.collect = never  # type: ignore[method-assign]
    flow.add_service(hung, capacity=2)
    flow.add_service(ok, capacity=2)
    await flow.start()
    t0 = time.monotonic()
    try:
        await train(flow, 2)
    finally:
        await flow.drain(timeout=30)
        await flow.stop(stop_services=True)
    assert not flow.services["hung"].alive and time.monotonic() - t0 < 30
    assert any("dead hung" in e for _, e in flow.events)
    flow.ledger.check(drained=True)


async def test_a_blocked_event_loop_does_not_kill_a_healthy_service() -> None:
    """A long step run on the flow's own event loop (a trainer update, a checkpoint) stops every heartbeat from
    being heard: that is this process's stall, not the service's silence. (A 653 s update once marked the only
    rollout service dead and the run waited forever.)"""
    flow = _flow(max_staleness=0, dead_after_s=0.3)
    flow.add_service(make_service("s0", latency=0.02), capacity=3)
    await flow.start()
    try:
        await train(flow, 1)
        time.sleep(5 * 0.3)  # blocks the loop itself, as an update run on it would: five dead_after_s unheard
        out = await train(flow, 2)
    finally:
        await flow.drain(timeout=30)
        await flow.stop()
    assert flow.services["s0"].alive, flow.events
    assert not any(e.startswith("dead ") for _, e in flow.events)
    assert len(out["tickets"]) == 6
    flow.ledger.check(drained=True)


async def _trained_once_on(name: str, dead_after_s: float) -> tuple[DataFlow, LocalService]:
    """A synchronous flow with one service, after one trainer step on it."""
    flow = _flow(max_staleness=0, dead_after_s=dead_after_s)
    svc = make_service(name, latency=0.02)
    flow.add_service(svc, capacity=3)
    await flow.start()
    await train(flow, 1)
    return flow, svc


async def test_a_trainer_is_told_when_every_service_is_dead() -> None:
    """No service left to make a batch: ``get_batch`` (no timeout of its own) raises a clear error once a
    replacement has had ``dead_after_s`` to join, instead of waiting forever."""
    flow, only = await _trained_once_on("only", dead_after_s=0.3)
    try:
        await only.kill()
        with pytest.raises(NoLiveService, match=r"every rollout service is dead \(dead only: .*killed\)"):
            await asyncio.wait_for(flow.get_batch("policy"), 20)  # the bound only turns a hang into a failure
    finally:
        await flow.stop()


async def test_a_replacement_that_joins_in_time_keeps_the_trainer_waiting() -> None:
    flow, first = await _trained_once_on("first", dead_after_s=5.0)
    try:
        await first.kill()
        while flow.services["first"].alive:  # its collector sees the crash
            await asyncio.sleep(0.01)
        second = make_service("second", latency=0.02)
        await second.update_weights("policy", WeightUpdate.full({}), flow.versions["policy"])  # joins current
        flow.add_service(second, capacity=3)
        out = await train(flow, 1)
    finally:
        await flow.drain(timeout=30)
        await flow.stop()
    assert len(out["tickets"]) == 3 and flow.services["second"].completed >= 3
    flow.ledger.check(drained=True)


def test_config_errors_are_reported_together() -> None:
    with pytest.raises(ConfigurationError) as e:
        DataflowConfig(max_staleness=-1, replay_ratio=1.5, runtime="spark")  # type: ignore[arg-type]
    msg = str(e.value)
    assert "max_staleness" in msg and "replay_ratio" in msg and "runtime" in msg
    with pytest.raises(ConfigurationError) as e:
        FlowParams(groups_per_step=0, poll_s=0)
    assert "groups_per_step" in str(e.value) and "poll_s" in str(e.value)
    with pytest.raises(ConfigurationError, match="at least one policy"):
        FlowParams(policies=())
    with pytest.raises(ConfigurationError, match="groups_per_step: unknown key"):
        DataflowConfig(groups_per_step=3)  # type: ignore[call-arg]  (a FlowParams field: one model per concern)


def test_ledger_refuses_double_counting() -> None:
    from agentgym.dataflow.ledger import Ledger, Ticket

    led = Ledger()
    t = Ticket("t0", TASKS[0], "default", ("policy",))
    led.open(t)
    led.dispatch("t0", "s")
    assert led.accept("t0", 0)
    led.buffer("t0", "policy")
    led.resolve("t0", "policy", "trained")
    with pytest.raises(LedgerError):
        led.resolve("t0", "policy", "expired", "stale")
    with pytest.raises(LedgerError):
        led.open(t)


def test_zero_variance_skipper_has_an_exploration_floor() -> None:
    stream = TaskStream(TASKS[:1] + TASKS[1:2], seed=3, skipper=ZeroVarianceSkipper(patience=2, explore=0.25))
    dull, live = TASKS[0], TASKS[1]
    for _ in range(2):
        stream.feedback(dull, True, 0.0)
    picks = [stream.next().task_id for _ in range(400)]
    share = picks.count(dull.task_id) / len(picks)
    # the dull task comes back about explore / (1 + explore) of the time, never 0 and never half
    assert 0.1 < share < 0.35 and picks.count(live.task_id) > 0
    state = stream.state_dict()
    again = TaskStream(TASKS[:2], seed=3, skipper=ZeroVarianceSkipper(patience=2, explore=0.25))
    again.load_state_dict(state)
    assert [again.next().task_id for _ in range(20)] == [stream.next().task_id for _ in range(20)]


async def test_a_service_closes_the_policies_it_built_and_only_those() -> None:
    from dataflow_fakes import coin_workflows

    from agentgym.dataflow.spec import ServiceSpec, build_service

    shared = coin_workflows()  # policies that outlive the service (the recipe's own)
    keep = build_service(ServiceSpec("shared", lambda: shared))
    own = build_service(ServiceSpec("own", coin_workflows, close_policies=True))
    for svc in (keep, own):
        await svc.status()
        await svc.stop()
    assert not any(getattr(p, "closed", False) for p in keep.policies.values())
    assert own.policies and all(p.closed for p in own.policies.values())

"""Rollout-saving strategies in the dataflow layer: prioritized group replay (recency priority and its
importance-sampling correction), POPO-style replay fill, no-refill batches, GRESO skipping's decision
rule, and the flow's outcome and gate counters."""

from __future__ import annotations

import contextlib
import json
import random

import pytest
from dataflow_fakes import ENV, configs, make_service

from agentgym.dataflow.config import DataflowConfig, FlowParams
from agentgym.dataflow.flow import DataFlow
from agentgym.dataflow.replay import GroupReplay
from agentgym.dataflow.service import ServiceDead
from agentgym.dataflow.tasks import TaskRef, TaskStats, TaskStream, ZeroVarianceSkipper
from agentgym.errors import ConfigurationError
from agentgym.types import Trajectory, TrajectoryGroup
from agentgym.weights import WeightUpdate


def _group(gid: str, rewards: list[float], early_stopped: bool = False) -> TrajectoryGroup:
    return TrajectoryGroup(gid, "t", "e", [Trajectory("t", "e", gid, i, reward=r) for i, r in enumerate(rewards)],
                           early_stopped=early_stopped)


# ----------------------------------------------------------------------------- the replay buffer
def test_replay_keeps_only_informative_groups() -> None:
    r = GroupReplay(size=3)
    assert r.add(_group("a", [0.0, 1.0]), 0)
    assert not r.add(_group("zv", [1.0, 1.0]), 0)  # zero advantage: replaying it trains nothing
    assert not r.add(_group("stopped", [0.0, 1.0], early_stopped=True), 0)
    assert not r.add(_group("one", [1.0]), 0)
    assert (len(r), r.added, r.refused) == (1, 1, 3)
    for i in range(4):
        r.add(_group(f"g{i}", [0.0, 1.0]), i)
    assert [e.group.group_id for e in r.entries] == ["g1", "g2", "g3"]  # size 3: oldest out first


def test_latest_priority_replays_the_newest_groups_with_weight_one() -> None:
    r = GroupReplay(size=8, priority="latest")
    for i in range(5):
        r.add(_group(f"g{i}", [0.0, 1.0]), i)
    assert [(g.group_id, w) for g, w in r.sample(3, now=5)] == [("g4", 1.0), ("g3", 1.0), ("g2", 1.0)]
    assert len(r.sample(9, now=5)) == 5  # no more than it holds
    assert r.sample(0, now=5) == [] and GroupReplay().sample(3, now=0) == []


def test_recency_priority_and_importance_weights_follow_the_formula() -> None:
    r = GroupReplay(size=8, priority="recency", half_life=2.0, beta=1.0)
    for v in (0, 2, 4):
        r.add(_group(f"v{v}", [0.0, 1.0]), v)
    q = [0.25, 0.5, 1.0]  # 0.5 ** (age / 2) at now = 4
    p = [x / sum(q) for x in q]
    assert r.probabilities(4) == pytest.approx(p)
    raw = [(3 * x) ** -1.0 for x in p]
    assert r.weights(4) == pytest.approx([x / max(raw) for x in raw])
    assert max(r.weights(4)) == 1.0 and r.weights(4)[-1] == pytest.approx(0.25)  # newest: most drawn, least weight
    # beta = 1: P_i * w_i is the same for every group, so the weighted draw is uniform replay in expectation
    pw = [a * b for a, b in zip(r.probabilities(4), r.weights(4), strict=True)]
    assert max(pw) == pytest.approx(min(pw))
    # beta = 0: no correction; beta = 0.5: in between
    assert GroupReplay(priority="recency", beta=0.0).weights(0) == []
    r0 = GroupReplay(size=8, priority="recency", half_life=2.0, beta=0.0)
    r5 = GroupReplay(size=8, priority="recency", half_life=2.0, beta=0.5)
    for v in (0, 2, 4):
        r0.add(_group(f"v{v}", [0.0, 1.0]), v)
        r5.add(_group(f"v{v}", [0.0, 1.0]), v)
    assert r0.weights(4) == [1.0, 1.0, 1.0]
    assert r5.weights(4) == pytest.approx([w ** 0.5 for w in r.weights(4)])


def test_importance_weighted_replay_estimates_the_uniform_mean() -> None:
    # a per-group quantity f (think: its gradient); recency draws over-sample new groups, the IS weights undo it
    r = GroupReplay(size=16, priority="recency", half_life=1.5, beta=1.0, seed=7)
    f = {}
    for v in range(8):
        g = _group(f"v{v}", [0.0, 1.0])
        r.add(g, v)
        f[g.group_id] = float(v)
    uniform = sum(f.values()) / len(f)
    draws = r.sample(40_000, now=8)
    weighted = sum(w * f[g.group_id] for g, w in draws) / sum(w for _, w in draws)
    biased = sum(f[g.group_id] for g, _ in draws) / len(draws)
    assert weighted == pytest.approx(uniform, abs=0.1)
    assert biased > uniform + 1.5  # without the correction the estimate leans towards recent groups


def test_replay_max_age_drops_old_groups() -> None:
    r = GroupReplay(size=8, priority="recency", max_age=2)
    for v in range(5):
        r.add(_group(f"v{v}", [0.0, 1.0]), v)
    got = {g.group_id for g, _ in r.sample(200, now=5)}
    assert got == {"v3", "v4"} and len(r) == 2


def test_replay_buffer_round_trips_through_a_json_checkpoint() -> None:
    r = GroupReplay(size=4, priority="recency", half_life=2.0, seed=3)
    for i in range(6):
        g = _group(f"g{i}", [0.0, 1.0, 0.5])
        g.trajectories[0].info["note"] = f"kept {i}"
        r.add(g, i)
    r.add(_group("zv", [1.0, 1.0]), 6)
    r.sample(2, now=6)  # advance the RNG: the restored one must continue from here
    state = json.loads(json.dumps(r.state_dict()))  # what a checkpoint's state.json holds
    back = GroupReplay(size=4, priority="recency", half_life=2.0, seed=99)
    back.load_state_dict(state)
    assert [(e.group.group_id, e.version) for e in back.entries] == [(f"g{i}", i) for i in range(2, 6)]
    assert back.entries[0].group.trajectories[0].info["note"] == "kept 2"
    assert [t.reward for t in back.entries[-1].group.trajectories] == [0.0, 1.0, 0.5]
    assert (back.added, back.refused) == (6, 1)
    # the same draws, in the same order, as the buffer that was saved
    assert [(g.group_id, w) for g, w in back.sample(5, now=7)] == [(g.group_id, w) for g, w in r.sample(5, now=7)]


def test_replay_configuration_errors_are_reported_together() -> None:
    with pytest.raises(ConfigurationError) as e:
        GroupReplay(size=0, priority="lifo", half_life=0, beta=2.0, max_age=-1)  # type: ignore[arg-type]
    msg = str(e.value)
    assert all(w in msg for w in ("size", "priority", "half_life", "beta", "max_age"))
    with pytest.raises(ConfigurationError, match="replay_fill"):
        DataFlow(TaskStream(TASKS, seed=0), DataflowConfig(replay_fill=True), FlowParams(filter_zero_variance=False))


# ----------------------------------------------------------------------------- GRESO decision rule
def test_skipper_decision_rule_patience_and_exploration_floor() -> None:
    sk = ZeroVarianceSkipper(patience=2, explore=0.2)

    def stats(*flags: bool) -> TaskStats:
        st = TaskStats()
        st.zero_variance.extend(flags)
        return st

    assert not sk.skippable(stats())  # never seen: run it
    assert not sk.skippable(stats(True))  # one zero-variance group is not yet a pattern
    assert sk.skippable(stats(False, True, True))
    assert not sk.skippable(stats(True, True, False))  # the latest group had signal: back in
    rng = random.Random(0)
    skips = sum(sk.skip(stats(True, True), rng) for _ in range(20_000))
    assert 1 - skips / 20_000 == pytest.approx(0.2, abs=0.015)  # the floor: submitted anyway 20% of the time
    assert not any(sk.skip(stats(True, False), rng) for _ in range(1000))
    assert all(not ZeroVarianceSkipper(1, explore=1.0).skip(stats(True), rng) for _ in range(100))
    for bad in ((0, 0.1), (1, 0.0), (1, 1.5)):
        with pytest.raises(ConfigurationError):
            ZeroVarianceSkipper(*bad)


# ----------------------------------------------------------------------------- in the dataflow layer
TASKS = [TaskRef(ENV, f"ok-{n}", seed=0) for n in (1, 2, 3, 4)]


async def _run(steps: int, p_fail: float, **kw: object) -> tuple[DataFlow, list]:
    flow = DataFlow(TaskStream(TASKS, seed=0), *configs(**{"groups_per_step": 3, "poll_s": 0.05, "max_staleness": 0, **kw}))
    flow.add_service(make_service("s0", p_fail=p_fail, latency=0.001), capacity=3)
    await flow.start()
    batches = []
    try:
        for _ in range(steps):
            b = await flow.get_batch("policy", timeout=60)
            batches.append(b)
            v = flow.versions["policy"] + 1
            for sid in flow.live_services():
                with contextlib.suppress(ServiceDead):
                    await flow.services[sid].handle.update_weights("policy", WeightUpdate.full({}), v)
            flow.set_version("policy", v)
    finally:
        await flow.drain(timeout=30)
        await flow.stop()
    return flow, batches


async def test_replay_fill_puts_replayed_groups_where_filtered_ones_were() -> None:
    # p_fail 0.15: most groups of 4 all succeed (zero variance), some have signal
    flow, batches = await _run(8, 0.15, replay_fill=True, replay_priority="recency", replay_half_life=2.0)
    flow.ledger.check(drained=True)
    c = flow.ledger.counts()
    filtered = c["states"].get("filtered", 0)
    assert filtered > 0 and sum(b.filtered for b in batches) == filtered
    assert any(b.replayed for b in batches)
    for b in batches:
        assert len(b.groups) + b.filtered <= 3  # a filtered group is not refilled with a new rollout
        assert all(not g.zero_variance() for g in b.replayed)
        assert len(b.replay_weights) == len(b.replayed) and all(0 < w <= 1 for w in b.replay_weights)
        assert b.group_weights == [1.0] * len(b.groups) + b.replay_weights
    # no ticket beyond one round per step (and the one prefetched for the next step) was rolled
    assert c["tickets"] <= 3 * (len(batches) + 1)
    st = flow.stats()
    assert st["groups"]["outcomes"]["policy"].get("filtered:zero_variance", 0) == filtered
    assert st["replay"]["policy"]["added"] >= 1


async def test_a_resumed_flow_keeps_its_replay_buffer() -> None:
    flow, _ = await _run(6, 0.15, replay_ratio=0.5, replay_priority="recency")
    kept = [(e.group.group_id, e.version) for e in flow.replay["policy"].entries]
    assert kept, "the run kept no informative group to replay"
    state = flow.state_dict()
    assert "policy" in state["replay"]
    fresh = DataFlow(TaskStream(TASKS, seed=0), *configs(groups_per_step=3, replay_ratio=0.5, replay_priority="recency"))
    fresh.load_state_dict(state)
    assert [(e.group.group_id, e.version) for e in fresh.replay["policy"].entries] == kept
    assert fresh.replay["policy"].added == flow.replay["policy"].added


async def test_a_resumed_flow_keeps_its_outcome_counters() -> None:
    """A run resumed from a checkpoint reports totals over the whole run, not from the resume on (a resumed GRPO
    run reported 44,678 generated tokens where its groups held 68,767)."""
    flow, _ = await _run(3, 0.5)
    grp = _group("audited", [0.0, 0.0])
    grp.gate_records = [{"gate": "selective_rollout", "action": "stop", "enforced": False,
                         "final_zero_variance": True, "tokens_at_decision": 10, "final_tokens": 40}]
    flow._count(grp)
    before = flow.stats()["groups"] | {"gates": flow.stats()["gates"]}
    assert before["finished"] > 1 and before["generated_tokens"] > 0 and before["gates"]["selective_rollout"]
    state = json.loads(json.dumps(flow.state_dict()))  # what a checkpoint's state.json holds
    fresh = DataFlow(TaskStream(TASKS, seed=0), *configs(groups_per_step=3))
    fresh.load_state_dict(state)
    after = fresh.stats()["groups"] | {"gates": fresh.stats()["gates"]}
    assert after == before
    fresh._count(_group("next", [1.0, 0.0]))  # and they keep counting from there
    assert fresh.stats()["groups"]["finished"] == before["finished"] + 1
    assert fresh.stats()["groups"]["episodes"] == before["episodes"] + 2
    # a checkpoint written before the counters were saved still loads (they start at zero, as they did)
    old = DataFlow(TaskStream(TASKS, seed=0), *configs(groups_per_step=3))
    old.load_state_dict({k: v for k, v in state.items() if k != "totals"})
    assert old.stats()["groups"]["finished"] == 0 and old.stats()["gates"] == {}


async def test_no_refill_returns_short_batches_and_rolls_no_extra_groups() -> None:
    refill_flow, refill_batches = await _run(5, 0.1)
    short_flow, short_batches = await _run(5, 0.1, refill=False)
    for f in (refill_flow, short_flow):
        f.ledger.check(drained=True)
    assert all(len(b.groups) == 3 for b in refill_batches)
    assert any(b.short for b in short_batches)
    assert all(len(b.groups) + b.filtered == 3 or b.short for b in short_batches)
    # dynamic sampling rolled new groups for the filtered ones; without refill it did not
    assert short_flow.stats()["groups"]["finished"] < refill_flow.stats()["groups"]["finished"]


async def test_flow_counts_tokens_outcomes_and_audited_gate_decisions() -> None:
    flow, _ = await _run(2, 0.5)
    g = flow.stats()["groups"]
    assert g["finished"] == sum(g["outcomes"]["policy"].values()) and g["episodes"] == 4 * g["finished"]
    assert g["generated_tokens"] > 0 and g["generated_tokens"] % 3 == 0  # the coin player makes 3 tokens a turn
    # gate records on finished groups become counters (audited: against the group's final variance)
    flow2 = DataFlow(TaskStream(TASKS, seed=0))
    recs = [("stop", True), ("stop", False), ("continue", True), ("stop", True)]
    for i, (action, zv) in enumerate(recs):
        grp = _group(f"x{i}", [0.0, 0.0])
        grp.gate_records = [{"gate": "selective_rollout", "action": action, "enforced": False,
                             "final_zero_variance": zv, "tokens_at_decision": 10, "final_tokens": 40},
                            {"gate": "zero_variance", "action": "flag"}]
        flow2._count(grp)
    st = flow2.stats()["gates"]["selective_rollout"]
    assert st["decisions"] == 4 and st["stops"] == 3 and st["audited_stops"] == 3
    assert st["audited_correct_stops"] == 2 and st["audited_zero_variance"] == 3
    assert st["stop_tokens_at_decision"] == 30 and st["stop_final_tokens"] == 120
    assert "zero_variance" not in flow2.stats()["gates"]  # flags are not decisions

"""Early-termination gates on hand-built groups, then wired into real workflows."""

from __future__ import annotations

import itertools

import pytest
from rollout_fakes import TICK, ConstPolicy, TickPolicy

from agentgym.rollout import (
    GateMonitor,
    GateRecord,
    GroupRequest,
    GroupState,
    MultiTurnWorkflow,
    RolloutEngine,
    RolloutRuntime,
    SelectiveRolloutGate,
    ZeroVarianceDetector,
    canonical_action,
    gate_precision,
    levenshtein,
    mean_pairwise_distance,
    normalized_distance,
)


def group(actions: list[list[str]], done: list[bool] | None = None, rewards: list[float] | None = None) -> GroupState:
    g = GroupState("g", "t", "e", len(actions))
    g.actions = [list(a) for a in actions]
    if done is not None:
        g.done = list(done)
    if rewards is not None:
        g.rewards = list(rewards)
    return g


# ----------------------------------------------------------------------------- distances
@pytest.mark.parametrize(("a", "b", "d"), [
    ("", "", 0), ("abc", "", 3), ("kitten", "sitting", 3), ("flaw", "lawn", 2),
    (["go a", "take b"], ["go a", "take c"], 1), (["x", "y", "z"], ["y", "z"], 1), (["x"], ["x"], 0),
])
def test_levenshtein_known_values(a, b, d) -> None:
    assert levenshtein(a, b) == d
    assert levenshtein(b, a) == d


def test_levenshtein_brute_force_small() -> None:
    # dynamic programming vs. the recursive definition on every pair of short sequences over {a, b}
    def rec(a: str, b: str) -> int:
        if not a or not b:
            return len(a) + len(b)
        return min(rec(a[1:], b) + 1, rec(a, b[1:]) + 1, rec(a[1:], b[1:]) + (a[0] != b[0]))

    words = ["".join(p) for n in range(4) for p in itertools.product("ab", repeat=n)]
    for a, b in itertools.product(words, repeat=2):
        assert levenshtein(a, b) == rec(a, b)


def test_normalised_by_longer_prefix() -> None:
    assert normalized_distance(["a", "b", "c", "d"], ["a", "b"]) == pytest.approx(2 / 4)
    assert normalized_distance([], []) == 0.0
    assert normalized_distance(["a"], ["b"]) == 1.0


def test_mean_pairwise_distance_step_vs_char() -> None:
    p = [["go to desk 1", "open drawer 1"], ["go to desk 1", "open drawer 2"], ["go to desk 1", "open drawer 1"]]
    # pairs: (0,1) 1/2, (0,2) 0, (1,2) 1/2
    assert mean_pairwise_distance(p) == pytest.approx(1 / 3)
    # char level: one character differs out of 26
    assert mean_pairwise_distance(p, "char") == pytest.approx((1 / 26 + 0 + 1 / 26) / 3)
    assert mean_pairwise_distance([["a"]]) == 0.0


def test_canonical_action_forms() -> None:
    calls = [{"id": "c1", "name": "guess", "arguments": {"n": 3, "a": [1]}}]
    same = [{"id": "other-id", "name": "guess", "arguments": {"a": [1], "n": 3}}]
    assert canonical_action(calls, None, "blah") == canonical_action(same, None, "different text")
    assert canonical_action(None, "  go to   desk 1 ", "Think: ...\nAction: go to desk 1") == "go to desk 1"
    assert canonical_action(None, None, " hello\n  world ") == "hello world"


# ----------------------------------------------------------------------------- selective rollout gate
def test_gate_waits_until_every_member_reached_k() -> None:
    gate = SelectiveRolloutGate(k=3, threshold=0.12)
    assert gate.after_step(group([["a", "b", "c"], ["a", "b"]])) is None
    # a member that ended early counts as having reached k (its whole sequence is its prefix)
    dec = gate.after_step(group([["a", "b", "c"], ["a", "b"]], done=[False, True]))
    assert dec is not None and dec.score == pytest.approx(1 / 3)


def test_gate_stops_identical_group_and_continues_diverse_one() -> None:
    gate = SelectiveRolloutGate(k=2, threshold=0.12)
    same = group([["look", "go to desk 1", "x"], ["look", "go to desk 1"], ["look", "go to desk 1"]])
    dec = gate.after_step(same)
    assert dec is not None and dec.action == "stop" and dec.score == 0.0 and dec.reason == "low_diversity"
    diverse = group([["look", "go to desk 1"], ["look", "go to bed 1"], ["inventory", "go to desk 1"]])
    dec = gate.after_step(diverse)
    # pairs (0,1) and (0,2) differ in one of two steps, (1,2) in both: (1/2 + 1/2 + 1) / 3
    assert dec is not None and dec.action == "continue" and dec.score == pytest.approx(2 / 3)


def test_gate_threshold_is_strict_and_prefix_is_cut_at_k() -> None:
    # 8 members, one differs in 1 of 10 steps: mean distance = 7 pairs * 0.1 / 28 pairs = 0.025
    base = [f"a{i}" for i in range(10)]
    odd = [*base[:9], "zzz"]
    g = group([list(base) for _ in range(7)] + [odd])
    dec = SelectiveRolloutGate(10, 0.0249).after_step(g)
    assert dec is not None and dec.action == "continue" and dec.score == pytest.approx(0.025)
    assert SelectiveRolloutGate(10, 0.0251).after_step(g).action == "stop"  # type: ignore[union-attr]
    # strictly below: a score equal to the threshold continues
    assert SelectiveRolloutGate(10, dec.score).after_step(g).action == "continue"  # type: ignore[arg-type,union-attr]
    # the difference at step 10 is invisible to a K=9 gate
    assert SelectiveRolloutGate(9, 0.001).after_step(g).score == 0.0  # type: ignore[union-attr]


def test_gate_ignores_finished_groups_and_singletons() -> None:
    gate = SelectiveRolloutGate(k=1)
    assert gate.after_step(group([["a"], ["a"]], done=[True, True])) is None
    dec = gate.after_step(group([["a"]]))
    assert dec is not None and dec.action == "continue" and dec.reason == "group_too_small"
    with pytest.raises(ValueError):
        SelectiveRolloutGate(k=0)


def test_zero_variance_detector() -> None:
    z = ZeroVarianceDetector()
    assert z.on_group_end(group([[], []], rewards=[1.0, 1.0])).reason == "zero_variance"  # type: ignore[union-attr]
    assert z.on_group_end(group([[], []], rewards=[0.0, 1.0])).action == "continue"  # type: ignore[union-attr]
    stopped = group([[], []], rewards=[0.0, 0.0])
    stopped.stopped = True  # partial rewards of a stopped group say nothing
    assert z.on_group_end(stopped) is None


def test_gate_precision_from_records() -> None:
    def rec(action: str, zv: bool | None) -> GateRecord:
        return GateRecord("selective_rollout", "g", "t", "e", action, "", 0.0, 10, False, 0.0,  # type: ignore[arg-type]
                          final_zero_variance=zv)

    recs = [rec("stop", True), rec("stop", True), rec("stop", False), rec("continue", True), rec("continue", False),
            rec("stop", None)]
    p = gate_precision(recs)
    assert p["stops"] == 3 and p["correct"] == 2 and p["precision"] == pytest.approx(2 / 3)
    assert p["recall"] == pytest.approx(2 / 3)  # 3 zero-variance groups, 2 stopped
    assert gate_precision([])["precision"] is None


def test_monitor_logs_once_and_completes_records() -> None:
    g = group([[], []])
    log: list[GateRecord] = []
    mon = GateMonitor(g, [SelectiveRolloutGate(k=1, threshold=0.5)], audit=True, log=log)
    mon.record_step(0, "a", 0.0, 5)
    mon.after_step()
    assert not log
    mon.record_step(1, "a", 1.0, 7)
    mon.after_step()
    mon.after_step()
    assert len(log) == 1 and log[0].action == "stop" and not log[0].enforced and not mon.stopped
    assert log[0].tokens_at_decision == 12
    mon.member_done(0)
    mon.member_done(1, True)
    mon.finish()
    assert log[0].final_rewards == [0.0, 1.0] and log[0].final_zero_variance is False
    assert GateRecord.from_dict(log[0].to_dict()) == log[0]


# ----------------------------------------------------------------------------- in a workflow
async def test_enforced_gate_stops_group_exactly_at_k() -> None:
    policy = ConstPolicy(TICK, tokens_per_turn=3)  # everyone ticks forever: identical actions
    log: list[GateRecord] = []
    wf = MultiTurnWorkflow(policy, group_size=4, gates=[SelectiveRolloutGate(k=3, threshold=0.12)], gate_log=log)
    with RolloutRuntime(max_concurrency=2) as rt:  # fewer slots than members: holding must not deadlock
        [trajs] = await RolloutEngine(rt).run(wf, [GroupRequest("agentgym/TestCounter-v0", "ok-8")])
    assert len(trajs) == 4
    assert all(t.early_stopped and not t.terminated and not t.truncated for t in trajs)
    assert [t.num_turns for t in trajs] == [3, 3, 3, 3]
    assert trajs.early_stopped and trajs.stop_reason == "selective_rollout:low_diversity"
    assert len(log) == 1 and log[0].enforced and log[0].step == 3 and log[0].tokens_at_decision == 4 * 3 * 3
    assert trajs.gate_records[0]["action"] == "stop" and "gate_records" not in trajs[0].info


async def test_audit_mode_lets_group_finish_and_records_outcome() -> None:
    log: list[GateRecord] = []
    wf = MultiTurnWorkflow(TickPolicy(), group_size=3, audit=True, gate_log=log,
                           gates=[SelectiveRolloutGate(k=2, threshold=0.12), ZeroVarianceDetector()])
    with RolloutRuntime(max_concurrency=8) as rt:
        [trajs] = await RolloutEngine(rt).run(wf, [GroupRequest("agentgym/TestCounter-v0", "ok-4")])
    assert all(t.terminated and t.success and not t.early_stopped for t in trajs)
    sel = [r for r in log if r.gate == "selective_rollout"]
    assert len(sel) == 1 and sel[0].action == "stop" and not sel[0].enforced
    assert sel[0].final_rewards == [1.0, 1.0, 1.0] and sel[0].final_zero_variance is True
    assert sel[0].final_tokens is not None and sel[0].final_tokens > sel[0].tokens_at_decision
    assert any(r.reason == "zero_variance" for r in log)
    assert trajs.zero_variance() and not trajs.early_stopped
    assert gate_precision(log)["precision"] == 1.0

"""Rollout-saving strategies in the rollout engine: the gate's rapidfuzz distances and tool-call view,
and pilot then commit (its decision rule, then the workflow on the counter env)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest
from rollout_fakes import SUBMIT, TICK, FakePolicy, counter_action, messages_of

from agentgym.errors import ConfigurationError
from agentgym.policy import Generation, GenRequest
from agentgym.rollout import (
    GateRecord,
    GroupRequest,
    GroupState,
    MultiTurnWorkflow,
    RolloutEngine,
    RolloutRuntime,
    SelectiveRolloutGate,
    gate_precision,
    levenshtein,
    mean_pairwise_distance,
)
from agentgym.rollout.gates import NO_CALL, canonical_calls
from agentgym.rollout.pilot import PILOT_GATE, PilotCommitWorkflow, pilot_decision
from agentgym.types import ToolCall, Trajectory

ENV = "agentgym/TestCounter-v0"


# ----------------------------------------------------------------------------- rapidfuzz distances
def _dp(a: Sequence[object], b: Sequence[object]) -> int:
    """The textbook dynamic programme, as the reference the library must agree with."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def test_rapidfuzz_levenshtein_agrees_with_the_textbook_dp_on_strings_and_action_lists() -> None:
    rng = random.Random(0)
    actions = ["go to desk 1", "take mug 1 from desk 1", "open drawer 2", "look", "go to desk 10"]
    for _ in range(300):
        a = [rng.choice(actions) for _ in range(rng.randint(0, 7))]
        b = [rng.choice(actions) for _ in range(rng.randint(0, 7))]
        assert levenshtein(a, b) == _dp(a, b)
        sa, sb = "".join(rng.choice("abc") for _ in range(rng.randint(0, 9))), "".join(
            rng.choice("abc") for _ in range(rng.randint(0, 9)))
        assert levenshtein(sa, sb) == _dp(sa, sb)


def test_step_level_compares_whole_actions_not_their_characters() -> None:
    # the same characters split differently are two different actions each
    assert levenshtein(["ab", "c"], ["a", "bc"]) == 2
    assert mean_pairwise_distance([["ab", "c"], ["a", "bc"]], "step") == 1.0
    assert mean_pairwise_distance([["ab", "c"], ["a", "bc"]], "char") == pytest.approx(2 / 4)  # "ab\nc" vs "a\nbc"
    # a prefix of identical actions, one member a step behind: 1 edit over the longer prefix
    assert mean_pairwise_distance([["x", "y", "z"], ["x", "y"]], "step") == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="level"):
        mean_pairwise_distance([["x"], ["y"]], "word")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the tool-call view
def test_canonical_calls_drop_ids_sort_keys_and_collapse_whitespace() -> None:
    a: list[ToolCall] = [{"id": "c1", "name": "search", "arguments": {"q": "red  fox", "k": 3}}]
    b: list[ToolCall] = [{"id": "zz", "name": "search", "arguments": {"k": 3, "q": " red fox "}}]
    assert canonical_calls(a) == canonical_calls(b)
    assert canonical_calls(a) != canonical_calls([{"id": "c1", "name": "search", "arguments": {"q": "red", "k": 3}}])
    assert canonical_calls(None) == canonical_calls([]) == NO_CALL


def _state(actions: list[list[str]], calls: list[list[str]]) -> GroupState:
    g = GroupState("g", "t", "e", len(actions))
    g.actions, g.calls = actions, calls
    return g


def test_tool_call_view_gates_members_that_think_aloud_differently_but_act_alike() -> None:
    call = canonical_calls([{"id": "1", "name": "lookup", "arguments": {}}])
    # four members: different free text before the same call at each of their 2 steps
    actions = [[f"Let me think ({m}, {s}) ... lookup[]" for s in range(2)] for m in range(4)]
    calls = [[call, call] for _ in range(4)]
    text_gate = SelectiveRolloutGate(k=2, threshold=0.12, view="action")
    call_gate = SelectiveRolloutGate(k=2, threshold=0.12, view="tool_calls")
    d_text = text_gate.after_step(_state(actions, calls))
    d_call = call_gate.after_step(_state(actions, calls))
    assert d_text is not None and d_text.action == "continue"
    assert d_call is not None and d_call.action == "stop" and d_call.score == 0.0
    assert d_call.details["view"] == "tool_calls"
    # and when the calls themselves differ, the tool-call view sees it
    calls[1] = [call, canonical_calls([{"id": "2", "name": "rumor", "arguments": {}}])]
    calls[2] = [canonical_calls([{"id": "3", "name": "answer", "arguments": {"v": "red"}}]), NO_CALL]
    d = call_gate.after_step(_state(actions, calls))
    assert d is not None and d.action == "continue" and d.score == pytest.approx((1 / 2 + 2 / 2 + 1 / 2 + 2 / 2 + 2 / 2) / 6)
    with pytest.raises(ValueError, match="view"):
        SelectiveRolloutGate(view="text")  # type: ignore[arg-type]


def test_gate_precision_and_recall_count_audited_decisions_only() -> None:
    def rec(action: str, zv: bool | None, gate: str = "selective_rollout") -> GateRecord:
        return GateRecord(gate=gate, group_id="g", task_id="t", env_id="e", action=action,  # type: ignore[arg-type]
                          reason="r", score=0.0, step=1, enforced=False, elapsed_s=0.0,
                          final_zero_variance=zv)

    log = [rec("stop", True), rec("stop", True), rec("stop", False), rec("continue", True), rec("continue", False),
           rec("stop", None), rec("stop", True, gate="pilot_commit")]
    p = gate_precision(log)
    assert p["decisions"] == 5 and p["stops"] == 3 and p["correct"] == 2
    assert p["precision"] == pytest.approx(2 / 3) and p["recall"] == pytest.approx(2 / 3)
    assert gate_precision(log, gate="pilot_commit")["precision"] == 1.0


# ----------------------------------------------------------------------------- pilot then commit
def _traj(reward: float, error: str | None = None) -> Trajectory:
    return Trajectory("t", "e", reward=reward, error=error)


@pytest.mark.parametrize(("rewards", "errors", "commit", "spread"), [
    ([0.0, 0.0], [None, None], False, 0.0),  # the pilot agrees: no variance, do not commit
    ([1.0, 1.0, 1.0], [None] * 3, False, 0.0),
    ([0.0, 1.0], [None, None], True, 1.0),  # variance: commit
    ([0.5, 0.5 + 1e-12], [None, None], False, pytest.approx(1e-12)),  # within tolerance
    ([0.0, 1.0], [None, "PolicyError"], True, None),  # one valid member: nothing to judge, commit
    ([0.0, 0.0, 1.0], [None, None, "EnvError"], False, 0.0),  # the errored member's reward does not count
])
def test_pilot_decision_rule(rewards: list[float], errors: list[str | None], commit: bool, spread: object) -> None:
    assert pilot_decision([_traj(r, e) for r, e in zip(rewards, errors, strict=True)]) == (commit, spread)


class MemberPolicy(FakePolicy):
    """Plays the counter env right, except that the members in ``fail`` submit at once (reward 0)."""

    policy_id = "policy"

    def __init__(self, fail: set[int]) -> None:
        self.fail = fail
        self.members: list[int] = []

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        out = []
        for r in requests:
            m = int(r.metadata.get("member", -1))
            self.members.append(m)
            text = SUBMIT if m in self.fail else counter_action(messages_of(r))
            out.append(Generation(text=text, token_ids=[1, 2, 3], logprobs=[-0.1] * 3))
        return out


async def _pilot_run(fail: set[int], audit: bool) -> tuple[object, list[GateRecord], MemberPolicy]:
    pol = MemberPolicy(fail)
    log: list[GateRecord] = []
    wf = PilotCommitWorkflow(MultiTurnWorkflow(pol, group_size=4), pilot_size=2, audit=audit, gate_log=log)
    with RolloutRuntime(max_concurrency=8) as rt:
        [group] = await RolloutEngine(rt).run(wf, [GroupRequest(ENV, "ok-1", seed=0)])
    return group, log, pol


async def test_pilot_without_variance_returns_the_pilot_only_marked_early_stopped() -> None:
    group, log, pol = await _pilot_run(fail=set(), audit=False)
    assert [t.member for t in group] == [0, 1] and set(pol.members) == {0, 1}  # members 2, 3 never ran
    assert group.early_stopped and group.stop_reason == f"{PILOT_GATE}:pilot_zero_variance"
    assert [t.success for t in group] == [True, True]
    [rec] = log
    assert rec.action == "stop" and rec.enforced and rec.final_zero_variance is None
    assert rec.tokens_at_decision == rec.final_tokens == 2 * 2 * 3  # 2 members x (tick, submit) x 3 tokens
    assert group.gate_records == [rec.to_dict()]


async def test_pilot_with_variance_commits_the_whole_group_in_member_order() -> None:
    group, log, pol = await _pilot_run(fail={1}, audit=False)
    assert [t.member for t in group] == [0, 1, 2, 3] and len({t.group_id for t in group}) == 1
    assert [t.reward for t in group] == [1.0, 0.0, 1.0, 1.0]
    assert not group.early_stopped
    [rec] = log
    assert rec.action == "continue" and rec.reason == "pilot_has_variance" and rec.final_zero_variance is False
    assert rec.final_tokens is not None and rec.tokens_at_decision is not None
    assert rec.final_tokens > rec.tokens_at_decision


async def test_pilot_audit_runs_every_group_whole_and_scores_the_pilot() -> None:
    # the pilot (0, 1) agrees but member 3 fails: a would-be stop the full group proves wrong
    wrong, log_wrong, _ = await _pilot_run(fail={3}, audit=True)
    right, log_right, _ = await _pilot_run(fail=set(), audit=True)
    for g in (wrong, right):
        assert [t.member for t in g] == [0, 1, 2, 3] and not g.early_stopped
    assert log_wrong[0].action == "stop" and not log_wrong[0].enforced and log_wrong[0].final_zero_variance is False
    assert log_right[0].action == "stop" and log_right[0].final_zero_variance is True
    p = gate_precision(log_wrong + log_right, gate=PILOT_GATE)
    assert p["precision"] == 0.5 and p["recall"] == 1.0


def test_pilot_configuration_errors() -> None:
    from rollout_fakes import ConstPolicy

    inner = MultiTurnWorkflow(ConstPolicy(TICK), group_size=4)
    for bad in (0, 4, 5):
        with pytest.raises(ConfigurationError, match="pilot_size"):
            PilotCommitWorkflow(inner, bad)
    gated = MultiTurnWorkflow(ConstPolicy(TICK), group_size=4, gates=[SelectiveRolloutGate(k=1)])
    with pytest.raises(ConfigurationError, match="gates"):
        PilotCommitWorkflow(gated, 2)


def test_every_pair_counts_once_in_the_group_score() -> None:
    prefixes = [["a"], ["b"], ["a"], ["a"]]
    pairs = list(itertools.combinations(prefixes, 2))
    assert mean_pairwise_distance(prefixes) == pytest.approx(sum(a != b for a, b in pairs) / len(pairs))

"""The solver + verifier workflow: role tagging, one retry on rejection, per-role rewards."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from rollout_fakes import SUBMIT, TICK, FakePolicy, FakeTokenPolicy, TickPolicy

from agentgym.errors import ConfigurationError
from agentgym.policy import Generation, GenRequest
from agentgym.rollout import (
    GroupRequest,
    RolloutEngine,
    RolloutRuntime,
    SolverVerifierWorkflow,
    parse_verdict,
    split_by_policy,
)

ENV = "agentgym/TestCounter-v0"


class Verifier(FakePolicy):
    """Rejects every proposal to submit the first time it sees it; approves everything else."""

    def __init__(self, policy_id: str = "verifier", reject_all: bool = False) -> None:
        self.policy_id = policy_id
        self.reject_all = reject_all
        self.seen: list[str] = []

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        out = []
        for r in requests:
            last = (r.messages or [])[-1]["content"]
            self.seen.append(last)
            proposal = last.split("Proposed action:\n", 1)[1]
            reject = self.reject_all or '"submit"' in proposal
            out.append(Generation("REJECT: too early to submit." if reject else "APPROVE", token_ids=[1, 2]))
        return out


def test_parse_verdict() -> None:
    assert parse_verdict("APPROVE") == (True, "")
    assert parse_verdict("I REJECT: wrong tool") == (False, "wrong tool")
    assert parse_verdict("approve, do not reject")[0] is True
    assert parse_verdict("hmm") == (True, "")
    assert parse_verdict("reject") == (False, "no reason given")


async def test_turns_tagged_retry_once_and_role_rewards() -> None:
    solver, verifier = TickPolicy(policy_id="solver"), Verifier()
    wf = SolverVerifierWorkflow(solver, verifier, group_size=2)
    with RolloutRuntime() as rt:
        [trajs] = await RolloutEngine(rt).run(wf, [GroupRequest(ENV, "ok-2")])
    for t in trajs:
        assert t.success and t.terminated and t.error is None
        pids = [x.policy_id for x in t.turns]
        # tick (approved), tick (approved), submit (rejected) -> retry submit (unreviewed)
        assert pids == ["solver", "verifier", "solver", "verifier", "solver", "verifier", "solver"]
        assert t.turns[4].text == SUBMIT and t.turns[4].observation[0]["content"].startswith("A reviewer rejected")
        assert t.turns[6].text == SUBMIT and t.turns[6].observation[0]["content"] == "ok"
        assert t.info["verdicts"] == [True, True, False]
        # solver: env reward; verifier: share of verdicts agreeing with the outcome (success -> approvals)
        assert t.reward_for("solver") == 1.0 and t.reward_for("verifier") == pytest.approx(2 / 3)
        assert t.metrics["env_steps"] == 3 and t.metrics["rejections"] == 1
        parts = split_by_policy(t)
        assert set(parts) == {"solver", "verifier"}
        assert [x.policy_id for x in parts["verifier"].turns] == ["verifier"] * 3
        assert parts["verifier"].reward == pytest.approx(2 / 3) and parts["solver"].reward == 1.0
        assert {seg.policy_id for seg in parts["solver"].segments()} == {"solver"}
        assert [seg.policy_id for seg in t.segments()] == ["solver", "verifier"]
    assert len(verifier.seen) == 6 and "Proposed action:\n" + TICK in verifier.seen[0]


async def test_rejected_retry_goes_to_env_and_failure_is_scored() -> None:
    wf = SolverVerifierWorkflow(TickPolicy(policy_id="s"), Verifier(reject_all=True))
    with RolloutRuntime() as rt:
        [[t]] = await RolloutEngine(rt).run(wf, [GroupRequest(ENV, "ok-1")])
    # every step: proposal, reject, retry (sent anyway); the oracle still solves the task
    assert t.success and t.info["verdicts"] == [False, False]
    assert t.reward_for("verifier") == 0.0


async def test_token_mode_per_role_sessions_chain() -> None:
    solver = FakeTokenPolicy("solver-tok")
    wf = SolverVerifierWorkflow(solver, Verifier())
    with RolloutRuntime() as rt:
        [[t]] = await RolloutEngine(rt).run(wf, [GroupRequest(ENV, "ok-1")])
    assert t.success
    [seg] = split_by_policy(t)["solver-tok"].segments()
    assert seg.token_ids == solver.sessions[0].token_ids


async def test_multi_policy_segments_are_what_each_model_saw() -> None:
    """One segment per (policy, session): never the join of two policies' turns."""
    solver, verifier = FakeTokenPolicy("solver-tok"), FakeTokenPolicy("verifier-tok")
    wf = SolverVerifierWorkflow(solver, verifier)
    with RolloutRuntime() as rt:
        [[t]] = await RolloutEngine(rt).run(wf, [GroupRequest(ENV, "ok-2")])
    assert t.success and [x.policy_id for x in t.turns][:2] == ["solver-tok", "verifier-tok"]
    segs = t.segments()
    assert [s.policy_id for s in segs] == ["solver-tok", "verifier-tok"]
    assert segs[0].token_ids == solver.sessions[0].token_ids
    assert segs[1].token_ids == verifier.sessions[0].token_ids
    for seg, pol in zip(segs, (solver, verifier), strict=True):
        assert seg.num_generated == sum(len(x.completion_token_ids) for x in t.turns if x.policy_id == pol.policy_id)
        # every prompt the model received is a prefix of its segment (the whole context, never a delta)
        assert all(seg.token_ids[: len(p)] == p for p in pol.prompts)
    assert [s.policy_id for s in t.segments("verifier-tok")] == ["verifier-tok"]


def test_roles_need_distinct_ids() -> None:
    with pytest.raises(ConfigurationError, match="distinct"):
        SolverVerifierWorkflow(TickPolicy(policy_id="x"), Verifier(policy_id="x"))

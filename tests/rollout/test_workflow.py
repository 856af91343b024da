"""MultiTurnWorkflow and the runtime: groups, token bookkeeping, limits, concurrency, error isolation."""

from __future__ import annotations

import asyncio
import time

import pytest
from agentgym.policies.scripted import ExpertPolicy
from rollout_fakes import TICK, ConstPolicy, FailingPolicy, FakeTokenPolicy, TickPolicy

from agentgym.errors import ConfigurationError
from agentgym.rollout import GroupRequest, MultiTurnWorkflow, RolloutEngine, RolloutLimits, RolloutRuntime
from agentgym.types import TrajectoryGroup

ENV = "agentgym/TestCounter-v0"


async def run(wf: MultiTurnWorkflow, reqs: list[GroupRequest], **rt_kw: object) -> list[TrajectoryGroup]:
    with RolloutRuntime(**rt_kw) as rt:  # type: ignore[arg-type]
        return await RolloutEngine(rt).run(wf, reqs)


async def test_group_replays_one_task_with_expert_on_demo() -> None:
    wf = MultiTurnWorkflow(ExpertPolicy(), group_size=4)
    [trajs] = await run(wf, [GroupRequest("agentgym/Demo-v0", "guess-37", seed=5, group_id="g1")])
    assert len(trajs) == 4
    assert {t.task_id for t in trajs} == {"guess-37"} and {t.group_id for t in trajs} == {"g1"}
    assert [t.member for t in trajs] == [0, 1, 2, 3] and trajs.group_id == "g1" and not trajs.early_stopped
    for t in trajs:
        assert t.terminated and t.success and t.reward == 1.0 and not t.truncated and t.error is None
        assert t.turns[-1].observation[0]["content"] == "correct"
        assert t.turns[0].tool_calls[0]["name"] == "guess"
        assert all(turn.policy_id == "expert" for turn in t.turns)
        # the history alternates env messages and the policy's turns
        assert [m["role"] for m in t.messages[:4]] == ["system", "user", "assistant", "tool"]
        assert t.info["task_type"] == "guess" and t.info["parser"] == "hermes"
        assert t.timing["wall_s"] >= t.timing["env_s"] > 0


async def test_turn_records_tokens_logprobs_versions() -> None:
    pol = TickPolicy(version=11)
    [trajs] = await run(MultiTurnWorkflow(pol), [GroupRequest(ENV, "ok-2")])
    t = trajs[0]
    assert t.success and t.num_turns == 3  # tick, tick, submit
    for turn in t.turns:
        assert turn.weight_version == 11 and len(turn.completion_token_ids) == 5
        assert turn.completion_logprobs == [-0.5] * 5
    assert t.metrics["generated_tokens"] == 15
    # message mode: every request carried the history and the env's tool specs
    assert [len(r.messages or []) for r in pol.requests] == [2, 4, 6]
    assert {s["function"]["name"] for s in pol.requests[0].tools or []} == {"tick", "submit"}


async def test_token_mode_sends_the_whole_conversation_each_turn() -> None:
    """Defect: from turn 2 on the engine sent only the newest observation's ids, so the model answered
    without the conversation. Each request must carry the session's whole token sequence."""
    pol = FakeTokenPolicy()
    [trajs] = await run(MultiTurnWorkflow(pol, group_size=2), [GroupRequest(ENV, "ok-3")])
    assert all(t.success for t in trajs)  # the fake reads the task from the ids: needs the whole context
    prompts = {tuple(p) for p in pol.prompts}
    for t, session in zip(trajs, pol.sessions, strict=True):
        [seg] = t.segments()
        assert seg.token_ids == session.token_ids  # prompt deltas + completions == the session's ids
        assert seg.num_generated == sum(len(x.completion_token_ids) for x in t.turns)
        assert [v for v, m in zip(seg.versions, seg.loss_mask, strict=True) if m] == [7] * seg.num_generated
        assert len(session.starts) == 1 and [turn.new_session for turn in t.turns] == [True, False, False, False]
        # what the policy received on turn k == every token of the conversation before turn k's completion
        context: list[int] = []
        for turn in t.turns:
            context += turn.prompt_token_ids
            assert tuple(context) in prompts
            assert len(context) > len(turn.prompt_token_ids) or turn.new_session
            context += turn.completion_token_ids
    assert len(pol.prompts) == sum(t.num_turns for t in trajs)


async def test_token_mode_restarts_session_on_template_drift() -> None:
    pol = FakeTokenPolicy(drift_on="ticks=2")
    [[t]] = await run(MultiTurnWorkflow(pol), [GroupRequest(ENV, "ok-3")])
    assert t.success
    assert [turn.new_session for turn in t.turns] == [True, False, True, False] and t.metrics["session_restarts"] == 1
    assert len(pol.sessions) == 2
    # the restarted session was started from the full conversation so far
    assert [m["role"] for m in pol.sessions[1].starts[0]] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    # two training segments, each exactly the ids of one session
    segs = t.segments()
    assert [s.turns for s in segs] == [[0, 1], [2, 3]]
    assert segs[1].token_ids == pol.sessions[1].token_ids
    assert segs[0].token_ids == pol.sessions[0].token_ids[: len(segs[0].token_ids)]


async def test_max_turns_truncates_never_terminates() -> None:
    wf = MultiTurnWorkflow(TickPolicy(), limits=RolloutLimits(max_turns=3))
    [[t]] = await run(wf, [GroupRequest(ENV, "ok-8")])
    assert t.truncated and not t.terminated and t.num_turns == 3
    assert t.truncated_reason == "max_turns" and not t.success


async def test_env_time_limit_is_reported_as_env_limit() -> None:
    # TestCounter-v0 is registered with max_episode_steps=20: ticking forever hits gymnasium's TimeLimit
    [[t]] = await run(MultiTurnWorkflow(ConstPolicy(TICK)), [GroupRequest(ENV, "ok-1")])
    assert t.truncated and not t.terminated and t.num_turns == 20 and t.truncated_reason == "env_limit"


async def test_token_budget_truncates() -> None:
    wf = MultiTurnWorkflow(ConstPolicy(TICK, tokens_per_turn=10), limits=RolloutLimits(max_total_tokens=25))
    [[t]] = await run(wf, [GroupRequest(ENV, "ok-8")])
    assert t.truncated and t.truncated_reason == "max_total_tokens" and t.num_turns == 3


async def test_wall_time_truncates_slow_policy() -> None:
    wf = MultiTurnWorkflow(TickPolicy(latency=0.2), limits=RolloutLimits(max_wall_s=0.5))
    t0 = time.monotonic()
    [[t]] = await run(wf, [GroupRequest(ENV, "ok-8")])
    assert time.monotonic() - t0 < 2.0
    assert t.truncated and not t.terminated and t.truncated_reason == "max_wall_s"
    assert 1 <= t.num_turns <= 3


async def test_episodes_run_concurrently_up_to_the_limit() -> None:
    pol = TickPolicy(latency=0.1)
    wf = MultiTurnWorkflow(pol, group_size=2)
    reqs = [GroupRequest(ENV, f"ok-{n}") for n in (2, 2, 2, 2, 2, 2)]  # 12 episodes x 3 turns
    t0 = time.monotonic()
    groups = await run(wf, reqs, max_concurrency=4)
    elapsed = time.monotonic() - t0
    assert all(t.success for g in groups for t in g)
    assert pol.max_in_flight == 4  # never more than the limit, and the limit was used
    # sequentially this is 36 * 0.1 s; with 4 in flight about 9 * 0.1 s
    assert elapsed < 2.5


async def test_blocking_env_steps_do_not_stall_the_event_loop() -> None:
    ticks = 0
    stop = False

    async def heartbeat() -> None:
        nonlocal ticks
        while not stop:
            ticks += 1
            await asyncio.sleep(0.01)

    hb = asyncio.create_task(heartbeat())
    wf = MultiTurnWorkflow(TickPolicy(), group_size=4)
    rt = RolloutRuntime(max_concurrency=4, env_factory=lambda eid: __import__("agentgym").make(eid, step_sleep=0.1))
    t0 = time.monotonic()
    with rt:
        [trajs] = await RolloutEngine(rt).run(wf, [GroupRequest(ENV, "ok-3")])
    elapsed = time.monotonic() - t0
    stop = True
    await hb
    assert all(t.success for t in trajs)
    # 4 episodes x 4 blocking steps of 0.1 s ran in parallel threads (~0.4 s, not 1.6 s) ...
    assert elapsed < 1.2
    # ... and the loop kept running meanwhile
    assert ticks >= 0.5 * elapsed / 0.01


async def test_policy_error_loses_only_that_episode() -> None:
    pol = FailingPolicy({"ok-3"})
    reqs = [GroupRequest(ENV, t) for t in ("ok-1", "ok-3", "ok-2")]
    groups = await run(MultiTurnWorkflow(pol, group_size=2), reqs)
    ok1, bad, ok2 = groups
    assert all(t.success for t in [*ok1, *ok2])
    assert all(t.error == "PolicyError: backend exploded" and not t.success for t in bad)
    assert bad[0].error_source == "policy" and bad[0].timing["wall_s"] >= 0


async def test_env_error_loses_only_that_episode_and_discards_the_env() -> None:
    made: list[object] = []

    def factory(eid: str) -> object:
        import agentgym

        env = agentgym.make(eid)
        made.append(env)
        return env

    wf = MultiTurnWorkflow(TickPolicy())
    reqs = [GroupRequest(ENV, "boom"), GroupRequest(ENV, "ok-1"), GroupRequest(ENV, "ok-2")]
    with RolloutRuntime(max_concurrency=1, env_factory=factory) as rt:  # type: ignore[arg-type]
        groups = await RolloutEngine(rt).run(wf, reqs)
        pooled = rt._pools[ENV]
    assert groups[0][0].error == "RuntimeError: the env broke" and groups[0][0].error_source == "env"
    assert groups[1][0].success and groups[2][0].success
    # the broken env was closed and replaced; the healthy one was reused for the third episode
    assert len(made) == 2 and pooled == [made[1]]


async def test_env_construction_failure_is_an_error_trajectory() -> None:
    def factory(eid: str) -> object:
        raise ConfigurationError("no such dataset")

    with RolloutRuntime(env_factory=factory) as rt:  # type: ignore[arg-type]
        [trajs] = await RolloutEngine(rt).run(MultiTurnWorkflow(TickPolicy(), group_size=2), [GroupRequest(ENV, "ok-1")])
    assert [t.error for t in trajs] == ["ConfigurationError: no such dataset"] * 2


async def test_env_step_timeout_is_an_env_error() -> None:
    rt = RolloutRuntime(env_factory=lambda eid: __import__("agentgym").make(eid, step_sleep=0.5))
    wf = MultiTurnWorkflow(TickPolicy(), limits=RolloutLimits(env_timeout_s=0.1))
    with rt:
        [[t]] = await RolloutEngine(rt).run(wf, [GroupRequest(ENV, "ok-1")])
    assert t.error is not None and t.info["error_kind"] == "env_timeout"


def test_bad_configuration_raises_clear_errors() -> None:
    with pytest.raises(ConfigurationError, match="group_size"):
        MultiTurnWorkflow(TickPolicy(), group_size=0)
    with pytest.raises(ConfigurationError, match="max_turns"):
        RolloutLimits(max_turns=0)
    with pytest.raises(ConfigurationError, match="max_concurrency"):
        RolloutRuntime(max_concurrency=0)


async def test_sampling_seeds_differ_per_member_and_turn() -> None:
    pol = TickPolicy()
    await run(MultiTurnWorkflow(pol, group_size=2), [GroupRequest(ENV, "ok-1", sampling_seed=42)])
    seeds = [r.sampling.seed for r in pol.requests]
    assert None not in seeds and len(set(seeds)) == len(seeds) == 4

"""MultiTurnWorkflow and the runtime: groups, token bookkeeping, limits, concurrency, error isolation."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import gymnasium
import pytest
from agentgym.policies.scripted import ExpertPolicy
from rollout_fakes import TICK, ConstPolicy, FailingPolicy, FakeTokenPolicy, TickPolicy

import agentgym
from agentgym.errors import ConfigurationError
from agentgym.policy import Generation, GenRequest
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


BOUND_S = 120.0  # a generous upper bound on waiting for an event; reaching it means the mechanism is broken


class HangAfterFirstTurn(TickPolicy):
    """Answers the first call at once; every later call hangs until it is cancelled (``cancelled`` set)."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = asyncio.Event()

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        if self.calls == 0:
            return await super().generate(requests)
        self.calls += 1
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")


async def test_wall_time_truncates_a_hung_policy_call() -> None:
    """The wall-clock limit cuts the policy call in flight at the deadline (the policy never answers)."""
    pol = HangAfterFirstTurn()
    wf = MultiTurnWorkflow(pol, limits=RolloutLimits(max_wall_s=1.0))
    [[t]] = await asyncio.wait_for(run(wf, [GroupRequest(ENV, "ok-8")]), BOUND_S)
    assert t.truncated and not t.terminated and t.truncated_reason == "max_wall_s" and not t.success
    assert t.num_turns <= 1 and t.error is None  # the turn that hung is not recorded
    if pol.calls > 1:  # the hung call was reached (on a loaded machine the deadline may pass before it)
        assert pol.cancelled.is_set()


class GatePolicy(TickPolicy):
    """Holds every call until ``width`` calls are in flight at once (then lets everything through)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
        self.full = asyncio.Event()

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.in_flight >= self.width:
                self.full.set()
            await self.full.wait()
        finally:
            self.in_flight -= 1
        return await super().generate(requests)


async def test_episodes_run_concurrently_up_to_the_limit() -> None:
    """Four episodes reach the policy at once (the gate opens only then), and never more than four."""
    pol = GatePolicy(width=4)
    wf = MultiTurnWorkflow(pol, group_size=2)
    reqs = [GroupRequest(ENV, "ok-2") for _ in range(6)]  # 12 episodes x 3 turns
    groups = await asyncio.wait_for(run(wf, reqs, max_concurrency=4), BOUND_S)
    assert all(t.success for g in groups for t in g)
    assert pol.full.is_set() and pol.max_in_flight == 4


async def test_blocking_env_steps_do_not_stall_the_event_loop() -> None:
    """Four blocking env steps run at once in worker threads, and the event loop keeps running meanwhile:
    each first step waits (in its thread) for the other three, then for a callback that only a free event
    loop can run."""
    loop = asyncio.get_running_loop()
    together = threading.Barrier(4)

    class BlockingStep(gymnasium.Wrapper):  # type: ignore[type-arg]
        def reset(self, **kw: Any) -> Any:
            self.first = True
            return self.env.reset(**kw)

        def step(self, action: Any) -> Any:
            if self.first:
                self.first = False
                together.wait(BOUND_S)  # BrokenBarrierError unless four steps block at the same time
                answered = threading.Event()
                loop.call_soon_threadsafe(answered.set)
                if not answered.wait(BOUND_S):
                    raise RuntimeError("the event loop did not run while env steps blocked")
            return self.env.step(action)

    rt = RolloutRuntime(max_concurrency=4, env_factory=lambda eid: BlockingStep(agentgym.make(eid)))
    wf = MultiTurnWorkflow(TickPolicy(), group_size=4)
    with rt:
        [trajs] = await asyncio.wait_for(RolloutEngine(rt).run(wf, [GroupRequest(ENV, "ok-3")]), 2 * BOUND_S)
    assert [t.error for t in trajs] == [None] * 4 and all(t.success for t in trajs)


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
    """A step that never returns ends its episode as an env error at ``env_timeout_s``."""
    release = threading.Event()

    class HangingStep(gymnasium.Wrapper):  # type: ignore[type-arg]
        def step(self, action: Any) -> Any:
            release.wait(BOUND_S)
            return self.env.step(action)

    rt = RolloutRuntime(env_factory=lambda eid: HangingStep(agentgym.make(eid)))
    wf = MultiTurnWorkflow(TickPolicy(), limits=RolloutLimits(env_timeout_s=3.0))
    with rt:
        try:
            [[t]] = await asyncio.wait_for(RolloutEngine(rt).run(wf, [GroupRequest(ENV, "ok-1")]), BOUND_S)
        finally:
            release.set()  # let the abandoned worker thread finish before the runtime closes
    assert t.error is not None and t.info["error_kind"] == "env_timeout" and "step" in t.error


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

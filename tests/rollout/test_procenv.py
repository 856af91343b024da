"""Envs in their own processes: same results as threads, and a hung step is killed, not abandoned."""

from __future__ import annotations

import os
import time

import pytest
from agentgym.policies.scripted import ExpertPolicy
from rollout_fakes import TickPolicy, counter_env, hanging_counter_env

from agentgym.rollout import GroupRequest, MultiTurnWorkflow, RolloutEngine, RolloutLimits, RolloutRuntime
from agentgym.rollout.procenv import EnvProcessDied, ProcessEnv

ENV = "agentgym/TestCounter-v0"
pytestmark = pytest.mark.slow  # spawning interpreters costs ~1 s each


def _summary(groups: list) -> list[tuple]:
    return [(t.task_id, t.member, t.success, t.reward, t.num_turns, [x.text for x in t.turns]) for g in groups for t in g]


async def test_process_envs_give_the_same_results_as_threads() -> None:
    reqs = [GroupRequest(ENV, f"ok-{n}", seed=n) for n in (1, 2, 3)] + [GroupRequest("agentgym/Demo-v0", "guess-37", seed=5)]
    out = {}
    for mode in ("thread", "process"):
        factory = counter_env if mode == "process" else None
        with RolloutRuntime(max_concurrency=4, env_workers=mode, env_factory=factory) as rt:
            out[mode] = _summary(await RolloutEngine(rt).run(MultiTurnWorkflow(ExpertPolicy(), group_size=2), reqs))
    assert out["process"] == out["thread"]
    assert all(success for _, _, success, *_ in out["process"])


async def test_hung_step_is_killed_and_the_run_goes_on() -> None:
    wf = MultiTurnWorkflow(TickPolicy(), limits=RolloutLimits(env_timeout_s=1.5))
    reqs = [GroupRequest(ENV, "ok-7"), GroupRequest(ENV, "ok-2"), GroupRequest(ENV, "ok-3")]
    with RolloutRuntime(max_concurrency=3, env_workers="process", env_factory=hanging_counter_env) as rt:
        t0 = time.monotonic()
        hung, ok2, ok3 = await RolloutEngine(rt).run(wf, reqs)
        elapsed = time.monotonic() - t0
    [t] = hung
    assert t.error is not None and t.info["error_kind"] == "env_timeout" and "killed" in t.error
    assert ok2[0].success and ok3[0].success
    assert elapsed < 30  # not the minute the step would have slept


def test_process_env_proxy_speaks_the_public_api() -> None:
    env = ProcessEnv(ENV, counter_env)
    try:
        assert env.get_wrapper_attr("splits") == ("train", "test")
        tasks = env.get_wrapper_attr("tasks")("test")
        assert tasks[0].task_id == "ok-1"
        obs, info = env.reset(seed=0, options={"task_id": "ok-1"})
        assert info["task_id"] == "ok-1" and [t["function"]["name"] for t in info["tools"]] == ["tick", "submit"]
        action = env.get_wrapper_attr("expert_action")()
        _, _, _, _, info = env.step(action)
        assert info["tool_calls"][0]["name"] == "tick"
        with pytest.raises(AttributeError):
            env.get_wrapper_attr("no_such_thing")
        pid = env.pid
        assert pid is not None
        env.kill()
        assert not env.alive
        with pytest.raises(EnvProcessDied):
            env.step(action)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        env.close()


async def test_eval_runs_envs_in_processes(tmp_path: object) -> None:
    from pathlib import Path

    from agentgym.eval import EvalConfig, arun_eval

    # envs registered at import of a package module are known in the child (TestCounter is registered
    # by this test module at run time, so it is not)
    cfg = EvalConfig(["agentgym/Demo-v0", "agentgym/SQL-v0"], tasks=3, env_workers="process", concurrency=4)
    s = await arun_eval(ExpertPolicy(), cfg, Path(str(tmp_path)))
    assert s["overall"]["success"]["mean"] == 1.0 and s["finished_episodes"] == 6
    from agentgym.errors import UnknownEnvError

    with pytest.raises(UnknownEnvError, match=r"^No env registered as 'agentgym/TestCounter-v0'\. Did you mean"):
        await arun_eval(ExpertPolicy(), EvalConfig([ENV], tasks=1, env_workers="process"), Path(str(tmp_path)) / "x")

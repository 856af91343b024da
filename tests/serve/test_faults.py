"""Faults and load: 500 concurrent sessions, a server killed mid-episode under the rollout engine,
pooling over several servers that skips dead ones."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import httpx
import pytest
from agentgym.envs.demo import expert_reply
from agentgym.policies.scripted import ScriptedPolicy

from agentgym.errors import EnvServerError
from agentgym.rollout import GroupRequest, MultiTurnWorkflow, RolloutEngine, RolloutLimits, RolloutRuntime
from agentgym.serve.client import RemoteEnv, remote_env_factory
from agentgym.serve.pool import RemotePool

pytestmark = pytest.mark.slow


def test_500_concurrent_sessions_do_not_mix(serve_process: Any) -> None:
    n = 500
    srv = serve_process(["agentgym/Demo-v0"], "--max-sessions", str(n))
    envs: list[RemoteEnv] = []
    with ThreadPoolExecutor(32) as pool:
        try:
            # default retries: under load a keep-alive connection can close as a request goes out;
            # session creation carries a request_id, so its retry gets the same session
            futs = [pool.submit(RemoteEnv, srv.url) for _ in range(n)]
            wait(futs)
            envs += [f.result() for f in futs if f.exception() is None]
            assert len(envs) == n, [f.exception() for f in futs if f.exception() is not None][:3]
            assert httpx.get(srv.url + "/agentgym/spec").json()["limits"]["max_sessions"] == n

            def play(i: int) -> tuple[str, float, bool, str]:
                secret = 2 * (i % 32) + 1  # test-split secrets are odd
                env = envs[i]
                _, info = env.reset(seed=i, options={"task_id": f"guess-{secret}"})
                obs, reward, term, _, _ = env.step(f'<tool_call>{{"name": "guess", "arguments": {{"n": {secret}}}}}</tool_call>')
                return info["task_id"], reward, term, obs[0]["content"]

            results = list(pool.map(play, range(n)))  # all 500 sessions are open meanwhile
            with pytest.raises(EnvServerError, match="capacity"):
                RemoteEnv(srv.url, retries=0, capacity_wait_s=0)
        finally:  # every env that was opened is closed, whatever failed (an unclosed one leaks its socket)
            list(pool.map(lambda e: e.close(), envs))
    assert all(r == (f"guess-{2 * (i % 32) + 1}", 1.0, True, "correct") for i, r in enumerate(results))
    RemoteEnv(srv.url, retries=0).close()  # closed sessions free their slots


async def test_server_killed_mid_episode_ends_those_episodes_and_the_run_goes_on(serve_process: Any) -> None:
    a, b = serve_process(["agentgym/Demo-v0"]), serve_process(["agentgym/Demo-v0"])
    pool = RemotePool([a.url, b.url], cooldown_s=30)
    started: list[int] = []
    everyone_started = asyncio.Event()
    killed: list[float] = []

    async def policy(messages: list[dict[str, Any]]) -> str:
        if len(messages) == 2:
            started.append(1)
            if len(started) == 8:
                everyone_started.set()
        else:  # a second turn: once all 8 episodes are under way, server A dies
            await everyone_started.wait()
            if not killed:
                a.kill()
                killed.append(time.monotonic())
        return expert_reply(messages)

    runtime = RolloutRuntime(max_concurrency=8, env_factory=remote_env_factory(pool))
    wf = MultiTurnWorkflow(ScriptedPolicy(policy), limits=RolloutLimits(env_timeout_s=60))
    reqs = [GroupRequest("agentgym/Demo-v0", f"guess-{2 * i + 1}", seed=i) for i in range(8)]
    t0 = time.monotonic()
    async with RolloutEngine(runtime) as engine:
        groups = await engine.run(wf, reqs)
        trajs = [t for g in groups for t in g.trajectories]
        assert killed and len(trajs) == 8
        lost = [t for t in trajs if t.error is not None]
        done = [t for t in trajs if t.error is None]
        assert lost and done, [(t.error, t.success) for t in trajs]
        for t in lost:  # a clear error from the env side, naming the dead server
            assert t.error_source == "env" and t.error.startswith("EnvServerError") and str(a.port) in t.error
            assert not t.success and t.info["error_kind"] == "EnvServerError"
        assert all(t.success and t.terminated for t in done)
        assert time.monotonic() - t0 < 30  # no hang: the dead server is detected at once
        # the run goes on: new episodes go to the live server
        more = await engine.run(wf, [GroupRequest("agentgym/Demo-v0", f"guess-{2 * i + 1}", seed=i) for i in range(4)])
        assert all(t.success for g in more for t in g.trajectories)
    runtime.close()
    assert pool.stats()[a.url]["failures"] >= 1 and pool.stats()[a.url]["dead_for_s"] > 0


def test_pool_skips_dead_servers(serve_process: Any) -> None:
    from serve_helpers import free_port

    live = serve_process(["agentgym/Demo-v0"])
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    pool = RemotePool([dead, live.url], cooldown_s=60)
    make = remote_env_factory(pool, retries=0)
    envs = [make("agentgym/Demo-v0") for _ in range(4)]
    assert all(e.url == live.url for e in envs)
    st = pool.stats()
    assert st[live.url]["sessions"] == 4 and st[dead]["failures"] == 1 and st[dead]["dead_for_s"] > 50
    assert pool.candidates()[0] == live.url  # the dead one is tried last until its cool-down ends
    for e in envs:
        e.close()
    assert pool.stats()[live.url]["sessions"] == 0
    # the same through the registry: a comma-separated url list (a pool of the env's own)
    import gymnasium

    env = gymnasium.make("agentgym/Remote-v0", url=f"{dead},{live.url}", retries=0)
    assert env.unwrapped.url == live.url
    env.close()
    live.kill()
    t = time.monotonic()
    with pytest.raises(EnvServerError, match="no env server could be reached") as e:
        remote_env_factory(RemotePool([dead, live.url]), retries=0)()
    assert e.value.retryable and time.monotonic() - t < 10

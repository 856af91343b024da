"""The harness workflow on the rollout engine: external agents (callables, commands, containers) solve the
real TinyLookup env through the endpoint; failures end their rollout, never the run; rewards come from
the env, a reward call, or a final-state function, and cannot be forged.

The policy is scripted (it plays the task from the context it is sent) over the tiny model's real
tokenizer and template: these tests are about the harness's own bookkeeping; the model-backed tests are
in ``test_harness_models.py``.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import harness_agents
import pytest
import tiny_lookup
from harness_fakes import ScriptedTokenPolicy

from agentgym.harness.agents import CallableAgent, CommandAgent, ContainerAgent
from agentgym.harness.workflow import HarnessWorkflow
from agentgym.policy import SamplingParams
from agentgym.rollout import GroupRequest, RolloutEngine, RolloutLimits, RolloutRuntime
from agentgym.types import TrajectoryGroup

HERE = Path(__file__).resolve().parent
ENV = tiny_lookup.ENV_ID


def workflow(policy: Any, agent: Any, g: int = 2, **kw: Any) -> HarnessWorkflow:
    return HarnessWorkflow(policy, agent, g, sampling=SamplingParams(temperature=1.0, max_tokens=16),
                           limits=RolloutLimits(max_turns=3), **{"timeout_s": 300.0, **kw})


async def run(wf: Any, tasks: list[str], concurrency: int = 16) -> list[TrajectoryGroup]:
    rt = RolloutRuntime(concurrency)
    try:
        return await RolloutEngine(rt).run(wf, [GroupRequest(ENV, t, seed=0) for t in tasks])
    finally:
        rt.close()


def check_exact(traj: Any, policy: ScriptedTokenPolicy) -> None:
    """Every segment is one of the policy's (prompt + generated) contexts, token for token."""
    contexts = [p + g for p, g in policy.calls]
    for seg in traj.segments():
        assert seg.token_ids in contexts
        assert sum(seg.loss_mask) == sum(len(t.completion_token_ids) for t in traj.turns if seg.turns)


@pytest.mark.parametrize("agent", [harness_agents.tool_agent, harness_agents.async_tool_agent],
                         ids=["openai-sync", "openai-async-streaming"])
async def test_an_openai_agent_solves_the_task_through_the_endpoint(tiny_tokenizer: Any, agent: Any) -> None:
    policy = ScriptedTokenPolicy(tiny_tokenizer)
    groups = await run(workflow(policy, CallableAgent(agent), g=3), ["owl-red", "elk-tan"])
    for g in groups:
        assert len(g) == 3
        for t in g:
            assert t.error is None, t.error
            assert (t.reward, t.success, t.terminated, t.truncated) == (1.0, True, True, False)
            assert t.metrics["env_steps"] == 2 and t.metrics["requests"] == 2 and t.metrics["segments"] == 1
            assert t.metrics["prompt_mismatches"] == 0 and t.metrics["reused_completions"] == 1
            assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant", "tool"]
            assert t.messages[-1]["content"] == "correct"
            assert t.info["parser"] == "react" and t.info["rollout_id"].startswith(g.group_id)
            check_exact(t, policy)
    assert len(policy.calls) == 2 * 3 * 2


async def test_a_command_agent(tiny_tokenizer: Any) -> None:
    policy = ScriptedTokenPolicy(tiny_tokenizer)
    agent = CommandAgent([sys.executable, str(HERE / "harness_agents.py")])
    [g] = await run(workflow(policy, agent, g=2), ["owl-red"])
    assert [(t.error, t.reward) for t in g] == [(None, 1.0), (None, 1.0)]


async def test_failing_agents_end_their_rollout_and_the_run_goes_on(tiny_tokenizer: Any) -> None:
    """Crashes, hangs (async, sync, a process) and silence each end one rollout with an error; a good
    agent in the same engine run is unaffected."""
    import asyncio

    policy = ScriptedTokenPolicy(tiny_tokenizer)
    release = threading.Event()

    def hanging_sync_agent(task: dict[str, Any]) -> None:
        release.wait(600)

    cases = {
        "good": (CallableAgent(harness_agents.tool_agent), 300.0, None),
        "crash": (CallableAgent(harness_agents.crashing_agent), 300.0, "agent_crashed"),
        "silent": (CallableAgent(harness_agents.silent_agent), 300.0, "agent_silent"),
        "hang-async": (CallableAgent(harness_agents.hanging_async_agent), 3.0, "agent_timeout"),
        "hang-sync": (CallableAgent(hanging_sync_agent), 3.0, "agent_timeout"),
        "hang-cmd": (CommandAgent([sys.executable, str(HERE / "harness_agents.py"), "hang"]), 3.0, "agent_timeout"),
        "crash-cmd": (CommandAgent([sys.executable, str(HERE / "harness_agents.py"), "crash"]), 300.0,
                      "agent_crashed"),
    }
    rt = RolloutRuntime(32)
    try:
        engine = RolloutEngine(rt)
        wfs = {k: workflow(policy, a, g=1, timeout_s=t) for k, (a, t, _) in cases.items()}
        results = await asyncio.gather(*(engine.run(wf, [GroupRequest(ENV, "owl-red", seed=0)]) for wf in wfs.values()))
    finally:
        release.set()
        rt.close()
    for (name, (_, _, kind)), [group] in zip(cases.items(), results, strict=True):
        [t] = group.trajectories
        if kind is None:
            assert t.error is None and t.reward == 1.0, name
            continue
        assert t.error is not None and t.error_source == "agent", name
        assert t.info["error_kind"] == kind, (name, t.error)
    assert "exited with code 3" in results[-1][0].trajectories[0].error
    assert "bad things happened" in results[-1][0].trajectories[0].error
    for wf in wfs.values():  # every rollout was closed, every server stopped
        assert not wf.endpoint.rollouts and wf._server is None


async def test_reward_from_a_reward_call_a_returned_value_or_the_final_state(tiny_tokenizer: Any) -> None:
    policy = ScriptedTokenPolicy(tiny_tokenizer, reply=lambda prompt: "answer[red]")
    posted = workflow(policy, CallableAgent(harness_agents.reward_posting_agent), g=1, reward="call")
    returned = workflow(policy, CallableAgent(harness_agents.self_scoring_agent), g=1, reward="call", task_data=True,
                        env_access=False)
    final = workflow(policy, CallableAgent(harness_agents.tool_agent), g=1, reward="final",
                     reward_fn=harness_agents.final_answer)
    p, r, f = [(await run(wf, ["owl-red"]))[0].trajectories[0] for wf in (posted, returned, final)]
    assert (p.reward, p.success, p.error) == (0.25, True, None)
    assert (r.reward, r.success, r.error) == (1.0, True, None)
    assert (f.reward, f.success, f.error) == (1.0, True, None)
    assert r.info["rewards"] == [{"value": 1.0, "success": None, "source": "return"}]


async def test_an_agent_cannot_forge_its_reward(tiny_tokenizer: Any) -> None:
    """With the reward from the env, reward calls and Agent Lightning reward events are refused (403)."""
    policy = ScriptedTokenPolicy(tiny_tokenizer)
    [g] = await run(workflow(policy, CallableAgent(harness_agents.forging_agent), g=1), ["owl-red"])
    [t] = g.trajectories
    assert t.error is None, t.error  # the agent checks it got 403 twice
    assert (t.reward, t.success, t.truncated_reason) == (0.0, False, "agent_stopped")
    assert t.info["rewards"] == []


def test_configuration_mistakes_are_refused(tiny_tokenizer: Any) -> None:
    from agentgym.errors import ConfigurationError

    policy = ScriptedTokenPolicy(tiny_tokenizer)
    agent = CallableAgent(harness_agents.tool_agent)
    with pytest.raises(ConfigurationError, match="gold answers"):
        HarnessWorkflow(policy, agent, reward="env", task_data=True)
    with pytest.raises(ConfigurationError, match="reward_fn"):
        HarnessWorkflow(policy, agent, reward="final")
    with pytest.raises(ConfigurationError, match=r"package\.module"):
        CallableAgent("not a path")


async def test_the_env_can_live_behind_an_env_server(tiny_tokenizer: Any) -> None:
    """The harness drives any env the runtime makes: here a RemoteEnv on ``agentgym serve``."""
    from agentgym.serve.client import RemoteEnv
    from agentgym.serve.server import EnvServer

    policy = ScriptedTokenPolicy(tiny_tokenizer)
    with EnvServer([ENV]) as srv:
        rt = RolloutRuntime(8, env_factory=lambda env_id: RemoteEnv(srv.url, env_id=env_id))
        try:
            [g] = await RolloutEngine(rt).run(workflow(policy, CallableAgent(harness_agents.tool_agent), g=2),
                                              [GroupRequest(ENV, "owl-red", seed=0)])
        finally:
            rt.close()
    assert [(t.error, t.reward, t.success) for t in g] == [(None, 1.0, True), (None, 1.0, True)]


@pytest.mark.slow
@pytest.mark.docker
async def test_a_container_agent_without_a_network(tiny_tokenizer: Any) -> None:
    """``--network none``: the container reaches the endpoint only through the mounted Unix socket."""
    from agentgym.sandbox.docker import docker_available

    if not docker_available():
        pytest.skip("Docker engine not reachable (start it with scripts/dockerd-start.sh)")
    from agentgym.envs.code.os_image import ensure_os_image
    from agentgym.envs.code.os_shell import docker_client

    image = ensure_os_image(docker_client())
    policy = ScriptedTokenPolicy(tiny_tokenizer)
    agent = ContainerAgent(image, ["python3", "/agent/urllib_agent.py"], extra_args=["-v", f"{HERE}:/agent:ro"])
    [g] = await run(workflow(policy, agent, g=2), ["owl-red"])
    assert [(t.error, t.reward) for t in g] == [(None, 1.0), (None, 1.0)]
    assert all(t.metrics["segments"] == 1 for t in g)


async def test_an_openai_agents_sdk_agent_runs_an_episode(tiny_tokenizer: Any) -> None:
    """The Agents SDK re-sends the assistant's tool call in its own shape; the recorded ids are reused."""
    policy = ScriptedTokenPolicy(tiny_tokenizer)
    [g] = await run(workflow(policy, CallableAgent(harness_agents.agents_sdk_agent), g=2), ["owl-red"])
    for t in g:
        assert t.error is None, t.error
        assert (t.reward, t.success, t.metrics["env_steps"]) == (1.0, True, 2)
        assert t.metrics["segments"] == 1 and t.metrics["reused_completions"] == 1
        check_exact(t, policy)


async def test_a_harness_that_rewrites_its_context_gets_a_new_segment(tiny_tokenizer: Any) -> None:
    policy = ScriptedTokenPolicy(tiny_tokenizer)
    [g] = await run(workflow(policy, CallableAgent(harness_agents.summarising_agent), g=1), ["owl-red"])
    [t] = g.trajectories
    assert t.error is None and t.reward == 1.0
    assert (t.metrics["segments"], t.metrics["mismatch_context_rewritten"], t.metrics["reused_completions"]) == (2, 1, 0)
    assert [s.token_ids for s in t.segments()] == [p + gen for p, gen in policy.calls]


def test_one_workflow_serves_one_event_loop_after_another(tiny_tokenizer: Any) -> None:
    """A trainer may run a workflow's groups on one loop, then (eval, the next step) on a new one: the
    endpoint's lock must not stay bound to the first loop. Two groups per run contend for it."""
    import asyncio

    policy = ScriptedTokenPolicy(tiny_tokenizer)
    wf = workflow(policy, CallableAgent(harness_agents.tool_agent))
    for _ in range(2):
        groups = asyncio.run(run(wf, ["owl-red", "elk-tan"]))
        assert [t.error for g in groups for t in g] == [None] * 4
        assert all(t.success for g in groups for t in g)

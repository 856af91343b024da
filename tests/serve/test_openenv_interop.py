"""Interop both ways with the real ``openenv-core``: its clients drive ``agentgym serve``, and
``RemoteEnv`` drives servers built with ``openenv-core`` (OpenEnv envs become AgentGym envs)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import pytest

import agentgym
from agentgym.eval import EvalConfig, arun_eval
from agentgym.serve.client import RemoteEnv
from agentgym.serve.server import EnvServer

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("openenv") is None,
                                 reason="needs openenv-core (pip install agentgym[openenv])")]


@pytest.fixture(scope="module", autouse=True)
def _start_openenv_early(openenv_server: Any) -> None:
    """Start the OpenEnv server first, so its start-up overlaps the client tests' imports."""


@pytest.fixture(scope="module")
def served() -> Iterator[EnvServer]:
    with EnvServer(["agentgym/Demo-v0", "agentgym/ALFWorld-v0"], token="tok") as srv:
        yield srv


def test_openenv_generic_client_drives_agentgym_serve(served: EnvServer) -> None:
    from openenv.core.generic_client import GenericEnvClient

    url = f"http://openenv:tok@127.0.0.1:{served.port}"  # the token rides in the URL (HTTP Basic)
    with GenericEnvClient(base_url=url).sync() as c:
        r = c.reset(seed=0, task_id="guess-31")
        assert r.observation["info"]["task_id"] == "guess-31" and not r.done
        assert [t["function"]["name"] for t in r.observation["info"]["tools"]] == ["guess", "give_up"]
        r = c.step({"message": '<tool_call>{"name": "guess", "arguments": {"n": 20}}</tool_call>'})
        assert r.observation["messages"][0]["content"] == "higher" and r.reward == 0.0 and not r.done
        r = c.step({"type": "call_tool", "tool_name": "guess", "arguments": {"n": 31}})
        assert r.done and r.reward == 1.0 and r.observation["info"]["success"] is True
        state = c.state()
        assert state["step_count"] == 2 and state["status"] == "done"
    # a text-command env: ALFWorld's commands are plain actions
    with GenericEnvClient(base_url=url + "/envs/ALFWorld-v0").sync() as c:
        r = c.reset(seed=0)
        adm = r.observation["info"]["admissible_actions"]
        r = c.step({"message": adm[0]})
        assert r.observation["messages"][0]["role"] == "user" and r.observation["info"]["command"] == adm[0]
    assert served.service.sessions == {}  # close ended the sessions


def test_openenv_mcp_client_drives_agentgym_serve(served: EnvServer) -> None:
    from openenv.core.mcp_client import MCPToolClient

    url = f"http://openenv:tok@127.0.0.1:{served.port}"
    with MCPToolClient(base_url=url).sync() as c:  # over /ws, step-based
        r = c.reset(seed=0, task_id="guess-31")
        assert "guessing game" in r.observation.metadata["prompt"]  # the task is visible to MCP clients
        assert r.observation.metadata["task_id"] == "guess-31"
        tools = c.list_tools()
        assert [t.name for t in tools] == ["guess", "give_up"] and tools[0].input_schema["required"] == ["n"]
        assert c.call_tool("guess", n=40) == "lower"
        assert c.call_tool("guess", n=31) == "correct"
        with pytest.raises(RuntimeError, match="reset"):
            c.call_tool("guess", n=31)  # after the end
    prod = MCPToolClient(base_url=url)
    prod.use_production_mode = True  # MCP JSON-RPC over HTTP /mcp with OpenEnv's session methods
    with prod.sync() as c:
        assert [t.name for t in c.list_tools()] == ["guess", "give_up"]
        assert c.call_tool("guess", n=0) in ("higher", "correct")
    assert served.service.sessions == {}


def test_remote_env_drives_openenv_echo(openenv_server: Any) -> None:
    env = gymnasium.make("agentgym/Remote-v0", url=openenv_server.url + "/echo")
    obs, info = env.reset(seed=4)
    assert info["task_id"] == "seed-4" and info["tools"] == [] and info["parser"] == "react"
    assert "Echo Env environment ready!" in obs[0]["content"]
    obs, reward, term, trunc, info = env.step("hello world")
    assert "echoed_message: hello world" in obs[0]["content"] and reward == pytest.approx(1.1) and not term
    assert env.get_wrapper_attr("remote_state")()["step_count"] == 1
    env.close()


def test_remote_env_drives_openenv_mcp_tools(openenv_server: Any) -> None:
    env = RemoteEnv(openenv_server.url + "/mcp_echo")
    _, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["echo_message", "echo_with_length"]
    assert info["tools"][0]["function"]["parameters"]["required"] == ["message"]
    obs, *_ = env.step('<tool_call>{"name": "echo_with_length", "arguments": {"message": "abc"}}</tool_call>')
    assert obs[0]["role"] == "tool" and '"length":3' in obs[0]["content"].replace(" ", "")
    obs, *_ = env.step({"role": "assistant", "content": "", "tool_calls": [
        {"id": "c9", "name": "echo_message", "arguments": {"message": "hi"}}]})
    assert obs == [{"role": "tool", "tool_call_id": "c9", "name": "echo_message", "content": "hi"}]
    obs, _, _, _, info = env.step("no tool call here")  # bad agent output: an observation
    assert info["parse_error"] and obs[0]["content"].startswith("Error:")
    env.close()


def test_remote_env_counts_metrics_per_openenv_episode(openenv_server: Any) -> None:
    env = RemoteEnv(openenv_server.url + "/mcp_echo")
    call = '<tool_call>{"name": "echo_message", "arguments": {"message": "hi"}}</tool_call>'
    env.reset(seed=0)
    env.step(call)
    *_, info = env.step(call)
    assert info["metrics"]["tool_calls"] == 2
    env.reset(seed=1)
    *_, info = env.step(call)
    assert info["metrics"]["tool_calls"] == 1  # not 3: a new episode starts its counts afresh
    env.close()


def test_remote_env_waits_for_an_openenv_server_at_capacity(openenv_server: Any) -> None:
    """4 episodes against an OpenEnv server with one session: each waits its turn (3 of 4 failed)."""
    from concurrent.futures import ThreadPoolExecutor

    from agentgym.errors import EnvServerAtCapacity

    def episode(i: int) -> float:
        env = RemoteEnv(openenv_server.url + "/echo_one", capacity_wait_s=120)
        try:
            env.reset(seed=i)
            return env.step(f"hello {i}")[1]
        finally:
            env.close()

    with ThreadPoolExecutor(4) as pool:
        rewards = list(pool.map(episode, range(4)))
    assert all(r > 0 for r in rewards)
    blocker = RemoteEnv(openenv_server.url + "/echo_one")
    try:  # while the one slot is held, the wait is bounded and the error says why
        with pytest.raises(EnvServerAtCapacity, match="at capacity"):
            RemoteEnv(openenv_server.url + "/echo_one", capacity_wait_s=0.5)
    finally:
        blocker.close()


def test_remote_env_lets_the_openenv_server_close_first(openenv_server: Any) -> None:
    """RemoteEnv closed its WebSocket right after ``{"type": "close"}``; openenv-core's server then
    failed its own close and logged a ~5 KB traceback per session (its stderr, unread, filled a pipe
    and blocked the server). Now the server closes first: nothing is logged."""
    def tracebacks() -> int:
        return openenv_server.stderr().count("Traceback")

    before = tracebacks()
    for i in range(3):  # one slot: each env waits until the previous session is gone
        env = RemoteEnv(openenv_server.url + "/echo_one", capacity_wait_s=120)
        env.reset(seed=i)
        env.close()
    assert tracebacks() == before, openenv_server.stderr()[-3000:]


async def test_eval_against_openenv_coding_env(openenv_server: Any, tmp_path: Path) -> None:
    from agentgym.policies.scripted import ScriptedPolicy

    def solve(messages: list[dict[str, str]]) -> str:
        return "```python\nprint(6 * 7)\n```" if len(messages) > 2 else "print('thinking')"

    cfg = EvalConfig(["agentgym/Remote-v0"], split="test", tasks=3, concurrency=3, max_turns=4,
                     env_kwargs={"url": openenv_server.url + "/coding"})
    s = await arun_eval(ScriptedPolicy(solve), cfg, tmp_path)
    b = s["envs"]["agentgym/Remote-v0"]
    assert b["errors"] == 0 and b["success"]["mean"] == 1.0 and b["turns"]["mean"] == 2.0
    assert agentgym.env_entry("agentgym/Remote-v0").family == "remote"


@pytest.mark.slow
def test_train_on_an_openenv_env(openenv_server: Any, tmp_path: Path) -> None:
    """GRPO on an env served by openenv-core's own server, through RemoteEnv: the trainer needs no change."""
    import sys

    from agentgym.recipes import run_training
    from agentgym.trainers.config import validate_config

    trainers_dir = str(Path(__file__).resolve().parents[1] / "trainers")
    if trainers_dir not in sys.path:
        sys.path.insert(0, trainers_dir)
    import tiny_lookup

    model = tiny_lookup.build_tiny_model(tmp_path / "model", init=0.1)
    cfg = validate_config({
        "run": {"out_dir": str(tmp_path / "run"), "steps": 2, "seed": 0, "threads": 1},
        "model": {"path": str(model)},
        "rollout": {"env": "agentgym/Remote-v0", "env_kwargs": {"url": openenv_server.url + "/echo"},
                    "group_size": 4, "groups_per_step": 2, "max_tokens": 8, "max_turns": 2, "concurrency": 8},
        "filter": {"dynamic_sampling": False},
        "optim": {"lr": 1e-3},
        "eval": {"before": False, "after": False},
        "log": {"progress": False, "plot": False},
    })
    res = run_training(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert res["steps"] == 2 and [r["step"] for r in rows] == [0, 1]
    assert all(r["rollout/episodes"] == 8 and r["rollout/reward_mean"] > 0 for r in rows)  # echo rewards arrived
    assert sum(r["train/optimizer_steps"] for r in rows) >= 1  # echo rewards vary with what the model wrote

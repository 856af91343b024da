"""The registry: gymnasium ids, did-you-mean, and the checker over every registered env."""

from __future__ import annotations

import gymnasium
import pytest

import agentgym
from agentgym.errors import UnknownEnvError

# Envs that need a dataset path or an optional package are checked in their own test modules.
NEEDS_SETUP = {"agentgym/SQL-Spider-v0", "agentgym/SQL-AgentBench-v0", "agentgym/ALFWorld-TW-v0", "agentgym/OS-v0",
               "agentgym/Remote-v0"}  # Remote-v0 needs a server: tests/serve


def test_builtins_are_gymnasium_ids() -> None:
    ids = {e.id for e in agentgym.list_envs()}
    assert {"agentgym/Demo-v0", "agentgym/SQL-v0", "agentgym/ALFWorld-v0", "agentgym/Search-v0",
            "agentgym/Code-v0", "agentgym/Bash-v0"} <= ids
    assert all(i in gymnasium.registry for i in ids)
    assert gymnasium.spec("agentgym/ALFWorld-v0").max_episode_steps == 50


def test_unknown_id_suggests() -> None:
    with pytest.raises(UnknownEnvError, match="Did you mean 'agentgym/Demo-v0'"):
        agentgym.make("agentgym/Demo-v1")
    with pytest.raises(UnknownEnvError, match="agentgym list"):
        agentgym.make("Totally-Unknown")
    assert agentgym.env_entry("demo-v0").id == "agentgym/Demo-v0"


def test_register_custom_env_class() -> None:
    from agentgym.envs.demo import GuessNumberEnv

    agentgym.register_env("MyGuess-v3", GuessNumberEnv, family="mine", kwargs={"high": 7}, max_episode_steps=4)
    env = gymnasium.make("agentgym/MyGuess-v3")
    assert env.unwrapped.high == 7 and env.spec.max_episode_steps == 4
    assert agentgym.env_entry("MyGuess-v3").family == "mine"


@pytest.mark.parametrize("env_id", sorted(e.id for e in agentgym.list_envs()
                                           if e.id not in NEEDS_SETUP and e.family != "test"))  # not the tests' fakes
def test_check_env_every_registered_env(env_id: str) -> None:
    report = agentgym.check_env(agentgym.make(env_id))
    assert "gymnasium.utils.env_checker.check_env" in report.passed
    assert not report.skipped, report.skipped


@pytest.mark.parametrize("env_id", sorted(e.id for e in agentgym.list_envs() if e.id not in NEEDS_SETUP))
def test_hostile_tool_arguments_are_observations_in_every_env(env_id: str) -> None:
    """An integer past Python's 4,300-digit limit, in every call form, never makes step() raise."""
    import json
    import sys

    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    huge = int("8" * 5000)
    sys.set_int_max_str_digits(old)
    digits = "8" * 5000
    env = agentgym.make(env_id)
    try:
        env.reset(seed=0)
        tools = env.unwrapped.tools
        if not len(tools):
            pytest.skip(f"{env_id} has no tools")
        name = tools.names[0]
        param = tools[name].primary_param or "x"
        actions: list[object] = [
            f'<tool_call>{{"name": "{name}", "arguments": {{"{param}": {digits}}}}}</tool_call>',
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
                "name": name, "arguments": f'{{"{param}": {digits}}}'}}]},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": name, "arguments": {param: huge}}]},
        ]
        for action in actions:
            env.reset(seed=0)
            obs, reward, terminated, truncated, info = env.step(action)
            assert obs and all(isinstance(m.get("content"), str) for m in obs)
            json.dumps(obs)
    finally:
        env.close()

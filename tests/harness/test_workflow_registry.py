"""Workflows selectable from the training config: ``[multi] workflow`` names a registered workflow (the
built-in ``harness``, one a user registers, an entry point) or a ``package.module:factory`` path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from agentgym.recipes.components import workflow
from agentgym.trainers.config import validate_config
from harness_fakes import ScriptedTokenPolicy

from agentgym.errors import ConfigurationError
from agentgym.harness.agents import AgentLightningAgent, CallableAgent, CommandAgent, ContainerAgent
from agentgym.harness.registry import (
    HarnessOptions,
    register_workflow,
    registered_workflows,
    workflow_factory,
)
from agentgym.harness.workflow import HarnessWorkflow
from agentgym.rollout import MultiTurnWorkflow


def cfg(name: str, options: dict[str, Any] | None = None, **rollout: Any) -> Any:
    return validate_config({"rollout": {"env": "agentgym/TinyLookup-v0", "group_size": 3, "max_tokens": 12,
                                        "max_turns": 4, "temperature": 0.7, **rollout},
                            "multi": {"workflow": name, "options": options or {}}})


def make_workflow(c: Any, policies: Mapping[str, Any]) -> Any:
    """The recipe's workflow for config ``c`` (as a rollout service builds it)."""
    return workflow(c.rollout, c.multi, c.gate, c.pilot, policies)


def my_workflow(c: Mapping[str, Any], policies: Mapping[str, Any]) -> MultiTurnWorkflow:
    """A user's workflow factory: the one-policy workflow with the group size doubled."""
    return MultiTurnWorkflow(policies["policy"], 2 * c["rollout"]["group_size"])


def test_the_harness_is_built_from_the_config(tiny_tokenizer: Any) -> None:
    policy = ScriptedTokenPolicy(tiny_tokenizer)
    wf = make_workflow(cfg("harness", {"agent": "harness_agents:tool_agent", "timeout_s": 42}), {"policy": policy})
    assert isinstance(wf, HarnessWorkflow) and isinstance(wf.agent, CallableAgent)
    assert (wf.group_size, wf.timeout_s, wf.sampling.temperature, wf.sampling.max_tokens) == (3, 42, 0.7, 12)
    assert wf.limits.max_turns == 4 and wf.policies == [policy]


def test_registered_entry_point_and_path_workflows(tiny_tokenizer: Any) -> None:
    policy = ScriptedTokenPolicy(tiny_tokenizer)
    register_workflow("doubled", my_workflow)
    assert "doubled" in registered_workflows() and "harness" in registered_workflows()
    for name in ("doubled", f"{__name__}:my_workflow"):
        wf = make_workflow(cfg(name), {"policy": policy})
        assert isinstance(wf, MultiTurnWorkflow) and wf.group_size == 6
    with pytest.raises(ConfigurationError, match="already registered"):
        register_workflow("doubled", lambda c, p: my_workflow(c, p))
    with pytest.raises(ConfigurationError, match="cannot register"):
        register_workflow("solver_verifier", my_workflow)


def test_unknown_and_malformed_names() -> None:
    with pytest.raises(ConfigurationError, match=r"no workflow named 'nope'.*harness"):
        workflow_factory("nope")
    with pytest.raises(ConfigurationError, match=r"multi\.workflow"):
        validate_config({"multi": {"workflow": "not a name!"}})
    with pytest.raises(ConfigurationError, match="cannot import"):
        workflow_factory("no_such_module_xyz:factory")


@pytest.mark.parametrize(("options", "needle"), [
    ({}, "exactly one agent"),
    ({"agent": "a:b", "command": ["x"]}, "exactly one agent"),
    ({"agent": "a:b", "image": "img"}, "image runs command"),
    ({"agent": "a:b", "reward": "final"}, "reward_fn"),
    ({"agent": "a:b", "timeout_s": 0}, "timeout_s"),
    ({"agent": "a:b", "typo": 1}, "unknown key"),
])
def test_harness_options_are_checked(options: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        HarnessOptions(**options)


def test_each_agent_kind_from_options() -> None:
    assert isinstance(HarnessOptions(command=["python", "a.py"]).build_agent(), CommandAgent)
    assert isinstance(HarnessOptions(command=["python3", "a.py"], image="img").build_agent(), ContainerAgent)
    agl = HarnessOptions(agentlightning="pkg.mod:Agent", env_map={"Q": "input.prompt"}).build_agent()
    assert isinstance(agl, AgentLightningAgent) and agl.env_map == {"Q": "input.prompt"}

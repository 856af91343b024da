"""Env-author hooks: the public names (``reset_task``, ``on_command``, ``on_text``, ``run_tool_calls``,
``format_error``), and the pre-0.2 underscore names still working for one release with a DeprecationWarning."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import pytest
from agentgym.envs.demo import GuessNumberEnv

from agentgym.core import RENAMED_HOOKS, AgentEnv, StepResult
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec, ToolCall


class _Base(AgentEnv):
    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        return [TaskSpec("t0", split)]

    @tool
    def ping(self) -> str:
        """Answer pong."""
        return "pong"


def test_public_hooks_need_no_warning_and_drive_the_episode() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class NewStyle(_Base):
            def reset_task(self, task: TaskSpec) -> list[Message]:
                return [{"role": "user", "content": "go"}]

            def on_text(self, text: str) -> StepResult:
                return StepResult([{"role": "user", "content": f"heard {text}"}])

            def on_command(self, command: str) -> StepResult:
                return self.format_error(f"no commands here ({command})")

            def run_tool_calls(self, calls: list[ToolCall]) -> StepResult:
                result = super().run_tool_calls(calls)
                result.info["n_calls"] = len(calls)
                return result

    env = NewStyle()
    assert env.reset(seed=0)[0] == [{"role": "user", "content": "go"}]
    assert env.step("hello")[0] == [{"role": "user", "content": "heard hello"}]
    obs, _, _, _, info = env.step('<tool_call>{"name": "ping", "arguments": {}}</tool_call>')
    assert obs[0]["content"] == "pong" and info["n_calls"] == 1


def test_old_hook_names_still_work_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"Legacy overrides _reset_task\(\).*rename it reset_task\(\)") as rec:

        class Legacy(_Base):
            def _reset_task(self, task: TaskSpec) -> list[Message]:
                return [{"role": "user", "content": "legacy"}]

            def _on_text(self, text: str) -> StepResult:
                if text == "fallback":
                    return super()._on_text(text)  # the base behaviour, through the old name
                return StepResult([{"role": "user", "content": "legacy text"}])

            def _run_tool_calls(self, calls: list[ToolCall]) -> StepResult:
                result = super()._run_tool_calls(calls)
                result.info["legacy"] = True
                return result

    assert {str(w.message).split()[2].rstrip(",") for w in rec} == {"_reset_task()", "_on_text()", "_run_tool_calls()"}
    assert rec[0].filename == __file__  # attributed to the class statement, not to agentgym
    env = Legacy()
    assert env.reset(seed=0)[0] == [{"role": "user", "content": "legacy"}]
    assert env.step("hi")[0] == [{"role": "user", "content": "legacy text"}]
    _, _, _, _, info = env.step("fallback")
    assert info["parse_error"] == "no tool call found" and env.metrics["parse_errors"] == 1
    _, _, _, _, info = env.step('<tool_call>{"name": "ping", "arguments": {}}</tool_call>')
    assert info["legacy"] is True


def test_a_legacy_subclass_of_a_renamed_env_reaches_its_parent() -> None:
    """``super()._on_command`` in an old-style subclass of a renamed env (Demo-v0) runs the parent's on_command."""
    with pytest.warns(DeprecationWarning):

        class Shouting(GuessNumberEnv):
            def _on_command(self, command: str) -> StepResult:
                return super()._on_command(command.strip("!"))

    env = Shouting(parser="react")
    env.reset(options={"task_id": "guess-10"})
    obs, *_ = env.step("10!")  # the demo's on_command turns a bare number into a guess
    assert obs[0]["content"] == "correct"


def test_every_renamed_hook_exists_under_both_names() -> None:
    for old, new in RENAMED_HOOKS.items():
        assert getattr(AgentEnv, old) is getattr(AgentEnv, new)

"""``check_env``: gymnasium's checker plus the checks an LLM env needs.

The LLM checks (STYLE.md, principle 5):

* the same seed gives the same first observation (and a different seed may give another task);
* every observation is a valid list of chat messages;
* malformed tool calls, unknown tools and junk text come back as observations (with
  ``info["parse_error"]``), never as exceptions;
* ``step`` before ``reset`` and after the end raise :class:`~agentgym.errors.ResetNeeded`;
* every split lists tasks, and ``reset(options={"task_id": ...})`` reproduces a task;
* the env's expert (where it has one) finishes an episode within the turn limit.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium
from gymnasium.utils.env_checker import check_env as gym_check_env

from agentgym.core import AgentEnv
from agentgym.errors import EnvError, ResetNeeded
from agentgym.spaces import ChatSpace

__all__ = ["CheckReport", "check_env"]

BAD_ACTIONS: list[Any] = [
    "",
    "<tool_call>{not json</tool_call>",
    '<tool_call>{"name": "no_such_tool_xyz", "arguments": {}}</tool_call>',
    "<tool_call><tool_call>{}</tool_call>",
    "Action: no_such_tool_xyz[42]",
    '{"name": "no_such_tool_xyz", "arguments": 3}',
    "\x00\ud7ff" + "🙂" * 50,
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "no_such_tool_xyz", "arguments": "{"}}]},
    {"role": "assistant", "content": None},
    12345,
]


@dataclass
class CheckReport:
    """What ``check_env`` ran. ``passed`` lists check names; ``skipped`` maps name -> reason."""

    env_id: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"{self.env_id}: {len(self.passed)} checks passed"]
        lines += [f"  ok    {p}" for p in self.passed]
        lines += [f"  skip  {k}: {v}" for k, v in self.skipped.items()]
        return "\n".join(lines)


class CheckFailed(AssertionError):
    """A check failed; the message names the check and what was wrong."""


def _expect(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


def check_env(
    env: gymnasium.Env[Any, Any] | Callable[[], gymnasium.Env[Any, Any]],
    *,
    gym_checks: bool = True,
    expert_episodes: int = 1,
    max_expert_steps: int = 200,
) -> CheckReport:
    """Run gymnasium's ``check_env`` and the LLM checks. Raises ``CheckFailed`` on the first failure.

    Args:
        env: An env (wrapped or not), or a zero-arg factory.
        gym_checks: Also run ``gymnasium.utils.env_checker.check_env`` on the unwrapped env.
        expert_episodes: Episodes to play with the env's expert, if it has one.
        max_expert_steps: Bound on each expert episode.
    """
    if callable(env) and not isinstance(env, gymnasium.Env):
        env = env()
    base = env.unwrapped
    name = getattr(getattr(env, "spec", None), "id", None) or type(base).__name__
    report = CheckReport(str(name))
    _expect(isinstance(base, AgentEnv), f"{name}: not an agentgym.AgentEnv")
    assert isinstance(base, AgentEnv)
    space = ChatSpace()

    # step before reset
    try:
        fresh = type(base)(**_init_kwargs(env))
        try:
            fresh.step("look")
        except ResetNeeded:
            report.passed.append("step before reset raises ResetNeeded")
        else:
            raise CheckFailed(f"{name}: step() before reset() did not raise ResetNeeded")
        finally:
            fresh.close()
    except TypeError as e:
        report.skipped["step before reset raises ResetNeeded"] = f"could not rebuild env: {e}"

    if gym_checks:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gym_check_env(base, skip_render_check=True, skip_close_check=True)
        report.passed.append("gymnasium.utils.env_checker.check_env")

    # splits and tasks
    for split in base.splits:
        tasks = base.tasks(split)
        _expect(len(tasks) > 0, f"{name}: split {split!r} has no tasks")
        ids = [t.task_id for t in tasks]
        _expect(len(set(ids)) == len(ids), f"{name}: duplicate task ids in split {split!r}")
    report.passed.append(f"splits {list(base.splits)} list tasks with unique ids")

    # seeding
    o1, i1 = base.reset(seed=1234)
    o2, i2 = base.reset(seed=1234)
    _expect(o1 == o2 and i1.get("task_id") == i2.get("task_id"), f"{name}: reset(seed=1234) twice gave different observations")
    _expect(space.contains(o1), f"{name}: reset() observation is not a list of chat messages: {o1!r:.200}")
    _expect("task_id" in i1, f"{name}: reset() info lacks 'task_id'")
    o3, _ = base.reset(options={"task_id": i1["task_id"]})
    _expect(o3 == o1, f"{name}: reset(options={{'task_id': ...}}) did not reproduce the seeded observation")
    report.passed.append("same seed -> same first observation; task_id reproduces it")

    # bad actions become observations
    for bad in BAD_ACTIONS:
        base.reset(seed=7)
        try:
            obs, reward, term, trunc, info = base.step(bad)
        except EnvError:
            raise
        except Exception as e:
            raise CheckFailed(f"{name}: bad action {bad!r:.80} raised {type(e).__name__}: {e}") from e
        _expect(space.contains(obs) and len(obs) > 0, f"{name}: bad action {bad!r:.80} gave no valid observation")
        _expect(isinstance(reward, (int, float)), f"{name}: reward is not a number")
        _expect(isinstance(term, bool) and isinstance(trunc, bool), f"{name}: terminated/truncated must be bools")
        _expect("metrics" in info and "task_id" in info, f"{name}: step() info lacks 'metrics'/'task_id'")
    base.reset(seed=7)
    _, _, _, _, info = base.step("<tool_call>{not json</tool_call>")
    if base.parser.name in ("hermes", "json"):
        _expect(bool(info.get("parse_error")), f"{name}: malformed tool call did not set info['parse_error']")
    report.passed.append(f"{len(BAD_ACTIONS)} malformed/unknown actions come back as observations")

    # expert episodes, then step-after-end
    probe = base.expert_action() if base._state == "running" else None
    if probe is None:
        base.reset(seed=0)
        probe = base.expert_action()
    if probe is None:
        report.skipped["expert finishes; step after end raises"] = "env has no expert_action()"
    else:
        for ep in range(expert_episodes):
            obs, info = base.reset(seed=ep)
            done = False
            for _ in range(max_expert_steps):
                action = base.expert_action()
                _expect(action is not None, f"{name}: expert_action() returned None mid-episode")
                assert action is not None
                obs, reward, term, trunc, info = base.step(copy.deepcopy(action))
                _expect(space.contains(obs), f"{name}: step() observation is not a list of chat messages")
                if term or trunc:
                    done = True
                    break
            _expect(done, f"{name}: expert did not finish within {max_expert_steps} steps")
            _expect("success" in info, f"{name}: final info lacks 'success'")
        try:
            base.step("look")
        except ResetNeeded:
            pass
        else:
            raise CheckFailed(f"{name}: step() after the episode ended did not raise ResetNeeded")
        report.passed.append("expert finishes an episode; step after end raises ResetNeeded")
    return report


def _init_kwargs(env: gymnasium.Env[Any, Any]) -> dict[str, Any]:
    spec = getattr(env, "spec", None)
    return dict(spec.kwargs) if spec is not None and spec.kwargs else {}

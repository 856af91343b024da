"""``check_env``: gymnasium's checker plus the checks an LLM env needs, one function per check.

The checks (STYLE.md, principle 5), each a function that raises :class:`CheckFailed` with a
message saying what was wrong (as gymnasium's ``utils/env_checker.py`` does):

* :func:`check_step_before_reset`: ``step`` before ``reset`` raises :class:`~agentgym.errors.ResetNeeded`;
* :func:`check_gymnasium_api`: gymnasium's own ``check_env`` (spaces, reset/step types, determinism);
* :func:`check_splits`: every split lists tasks, with unique ids;
* :func:`check_seeding`: the same seed gives the same first observation, a list of valid chat
  messages, and ``reset(options={"task_id": ...})`` reproduces it;
* :func:`check_bad_actions`: malformed tool calls, unknown tools and junk text come back as
  observations (with ``info["parse_error"]``), never as exceptions;
* :func:`check_expert`: the env's expert (where it has one) finishes an episode within the turn
  limit, and ``step`` after the end raises :class:`~agentgym.errors.ResetNeeded`.

:func:`check_env` runs them all, whatever fails, and reports every outcome in a :class:`CheckReport`;
an exception inside a check (an env that crashes, gymnasium's own assertions) is that check's
failure, never a traceback. The checks use only the env's public API, so an env served over HTTP
(``agentgym/Remote-v0``) is checked exactly like a local one.
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
from agentgym.errors import ResetNeeded
from agentgym.spaces import ChatSpace

__all__ = [
    "BAD_ACTIONS",
    "CheckFailed",
    "CheckReport",
    "CheckSkipped",
    "check_bad_actions",
    "check_env",
    "check_expert",
    "check_gymnasium_api",
    "check_seeding",
    "check_splits",
    "check_step_before_reset",
]

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

_SPACE = ChatSpace()


class CheckFailed(AssertionError):
    """A check failed; the message says what was wrong. From :func:`check_env`, ``report`` holds every outcome."""

    def __init__(self, message: str, report: CheckReport | None = None) -> None:
        super().__init__(message)
        self.report = report


class CheckSkipped(Exception):
    """A check cannot run on this env (no expert, cannot be rebuilt); the message says why."""


@dataclass
class CheckReport:
    """What :func:`check_env` ran.

    Attributes:
        env_id: The env's registered id (or class name).
        passed: Names of the checks that passed.
        failed: Check name -> what was wrong.
        skipped: Check name -> why it could not run.
    """

    env_id: str
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No check failed."""
        return not self.failed

    def __str__(self) -> str:
        head = f"{self.env_id}: {len(self.passed)} checks passed"
        if self.failed:
            head += f", {len(self.failed)} failed"
        lines = [head]
        lines += [f"  ok    {p}" for p in self.passed]
        lines += [f"  FAIL  {k}: {v}" for k, v in self.failed.items()]
        lines += [f"  skip  {k}: {v}" for k, v in self.skipped.items()]
        return "\n".join(lines)


def _expect(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


# ---------------------------------------------------------------------------------------------- the checks


def check_step_before_reset(env: AgentEnv, init_kwargs: dict[str, Any] | None = None) -> None:
    """A fresh env (built like ``env``) raises ``ResetNeeded`` when stepped before ``reset``.

    Raises:
        CheckSkipped: the env cannot be rebuilt from its class and ``init_kwargs``.
    """
    try:
        fresh = type(env)(**(init_kwargs or {}))
    except TypeError as e:
        raise CheckSkipped(f"could not rebuild env: {e}") from None
    try:
        fresh.step("look")
    except ResetNeeded:
        return
    else:
        raise CheckFailed("step() before reset() did not raise ResetNeeded")
    finally:
        fresh.close()


def check_gymnasium_api(env: AgentEnv) -> None:
    """Gymnasium's own ``check_env`` on the unwrapped env; its assertions become this check's failure."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            gym_check_env(env, skip_render_check=True, skip_close_check=True)
        except AssertionError as e:
            raise CheckFailed(f"gymnasium's check_env: {e or type(e).__name__}") from e


def check_splits(env: AgentEnv) -> None:
    """Every split lists at least one task, with unique task ids."""
    for split in env.splits:
        tasks = env.tasks(split)
        _expect(len(tasks) > 0, f"split {split!r} has no tasks")
        ids = [t.task_id for t in tasks]
        _expect(len(set(ids)) == len(ids), f"duplicate task ids in split {split!r}")


def check_seeding(env: AgentEnv, seed: int = 1234) -> None:
    """``reset(seed)`` twice gives the same observation and task, a valid chat; the task id reproduces it."""
    o1, i1 = env.reset(seed=seed)
    o2, i2 = env.reset(seed=seed)
    _expect(o1 == o2 and i1.get("task_id") == i2.get("task_id"),
            f"reset(seed={seed}) twice gave different observations")
    _expect(_SPACE.contains(o1), f"reset() observation is not a list of chat messages: {o1!r:.200}")
    _expect("task_id" in i1, "reset() info lacks 'task_id'")
    o3, _ = env.reset(options={"task_id": i1["task_id"]})
    _expect(o3 == o1, "reset(options={'task_id': ...}) did not reproduce the seeded observation")


def check_bad_actions(env: AgentEnv, actions: list[Any] = BAD_ACTIONS) -> None:
    """Each malformed or unknown action comes back as an observation, and a malformed tool call sets
    ``info["parse_error"]`` (hermes and json parsers)."""
    for bad in actions:
        env.reset(seed=7)
        try:
            obs, reward, term, trunc, info = env.step(bad)
        except Exception as e:
            raise CheckFailed(f"bad action {bad!r:.80} raised {type(e).__name__}: {e}") from e
        _expect(_SPACE.contains(obs) and len(obs) > 0, f"bad action {bad!r:.80} gave no valid observation")
        _expect(isinstance(reward, (int, float)), "reward is not a number")
        _expect(isinstance(term, bool) and isinstance(trunc, bool), "terminated/truncated must be bools")
        _expect("metrics" in info and "task_id" in info, "step() info lacks 'metrics'/'task_id'")
    env.reset(seed=7)
    _, _, _, _, info = env.step("<tool_call>{not json</tool_call>")
    if env.parser.name in ("hermes", "json"):
        _expect(bool(info.get("parse_error")), "malformed tool call did not set info['parse_error']")


def check_expert(env: AgentEnv, episodes: int = 1, max_steps: int = 200) -> None:
    """The expert finishes ``episodes`` episodes within ``max_steps`` with ``success`` in the final info;
    then ``step`` raises ``ResetNeeded``.

    Raises:
        CheckSkipped: the env has no expert.
    """
    env.reset(seed=0)
    if env.expert_action() is None:
        raise CheckSkipped("env has no expert_action()")
    for ep in range(episodes):
        obs, info = env.reset(seed=ep)
        done = False
        for _ in range(max_steps):
            action = env.expert_action()
            if action is None:
                raise CheckFailed("expert_action() returned None mid-episode")
            obs, _, term, trunc, info = env.step(copy.deepcopy(action))
            _expect(_SPACE.contains(obs), "step() observation is not a list of chat messages")
            if term or trunc:
                done = True
                break
        _expect(done, f"expert did not finish within {max_steps} steps")
        _expect("success" in info, "final info lacks 'success'")
    try:
        env.step("look")
    except ResetNeeded:
        return
    raise CheckFailed("step() after the episode ended did not raise ResetNeeded")


# ---------------------------------------------------------------------------------------------- all of them


def check_env(
    env: gymnasium.Env[Any, Any] | Callable[[], gymnasium.Env[Any, Any]],
    *,
    gym_checks: bool = True,
    expert_episodes: int = 1,
    max_expert_steps: int = 200,
) -> CheckReport:
    """Run every check; each failure is recorded with its reason, and the other checks still run.

    Args:
        env: An env (wrapped or not), or a zero-arg factory.
        gym_checks: Also run gymnasium's ``check_env`` on the unwrapped env.
        expert_episodes: Episodes to play with the env's expert, if it has one.
        max_expert_steps: Bound on each expert episode.

    Returns:
        The report (``passed``, ``skipped``), when every check that ran passed.

    Raises:
        CheckFailed: a check failed; the message lists every failure and ``report`` holds all outcomes.
    """
    if callable(env) and not isinstance(env, gymnasium.Env):
        env = env()
    base = env.unwrapped
    name = str(getattr(getattr(env, "spec", None), "id", None) or type(base).__name__)
    report = CheckReport(name)
    if not isinstance(base, AgentEnv):
        report.failed["an agentgym.AgentEnv"] = f"{type(base).__name__} is not an agentgym.AgentEnv"
        raise CheckFailed(f"{name}: not an agentgym.AgentEnv", report)
    spec = getattr(env, "spec", None)
    init_kwargs = dict(spec.kwargs) if spec is not None and spec.kwargs else {}
    checks: list[tuple[str, Callable[[], None]]] = [
        ("step before reset raises ResetNeeded", lambda: check_step_before_reset(base, init_kwargs)),
    ]
    if gym_checks:
        checks.append(("gymnasium.utils.env_checker.check_env", lambda: check_gymnasium_api(base)))
    checks += [
        (f"splits {list(base.splits)} list tasks with unique ids", lambda: check_splits(base)),
        ("same seed -> same first observation; task_id reproduces it", lambda: check_seeding(base)),
        (f"{len(BAD_ACTIONS)} malformed/unknown actions come back as observations", lambda: check_bad_actions(base)),
        ("expert finishes an episode; step after end raises ResetNeeded",
         lambda: check_expert(base, expert_episodes, max_expert_steps)),
    ]
    for check_name, run in checks:
        try:
            run()
        except CheckSkipped as e:
            report.skipped[check_name] = str(e)
        except CheckFailed as e:
            report.failed[check_name] = str(e)
        except Exception as e:  # the env crashed inside the check: that check failed, the others still run
            report.failed[check_name] = f"raised {type(e).__name__}: {e}"
        else:
            report.passed.append(check_name)
    if report.failed:
        raise CheckFailed(f"{name}: {len(report.failed)} check(s) failed: "
                          + "; ".join(f"{k}: {v}" for k, v in report.failed.items()), report)
    return report

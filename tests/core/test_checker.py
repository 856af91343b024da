"""The checker: one function per check, every failure reported as a failed check (never a traceback),
locally and against a real env served over HTTP."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import gymnasium
import pytest
from agentgym.envs.demo import GuessNumberEnv

import agentgym
from agentgym.checker import (
    CheckFailed,
    CheckSkipped,
    check_bad_actions,
    check_env,
    check_expert,
    check_gymnasium_api,
    check_seeding,
    check_splits,
    check_step_before_reset,
)
from agentgym.core import AgentEnv, StepResult
from agentgym.serve.server import EnvServer
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec

GYM_CHECK = "gymnasium.utils.env_checker.check_env"


class StampEnv(GuessNumberEnv):
    """Demo-v0 whose step info carries the wall-clock time: not deterministic, as many served envs are."""

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = super().step(action)
        info["served_at"] = time.time()
        return obs, reward, terminated, truncated, info


class GlobalRandomEnv(AgentEnv):
    """Draws its task from the global ``random`` module, so the same seed does not give the same task
    (and never the same task twice in a row, so the failure is certain rather than likely)."""

    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        return [TaskSpec(f"t{i}", split) for i in range(50)]

    def reset_task(self, task: TaskSpec) -> list[Message]:
        return [{"role": "user", "content": f"task {random.random()}"}]

    def _select_task(self, options: dict[str, Any] | None) -> TaskSpec:
        if options and options.get("task_id"):
            return self.get_task(options["task_id"])
        # Never the previous task, so every check that compares two resets sees the bug (a plain draw from
        # 50 repeats one time in 50, and gymnasium's step-determinism check then passed by chance).
        last = getattr(self, "_last_index", None)
        index = random.choice([i for i in range(50) if i != last])
        self._last_index = index
        return self.tasks("train")[index]

    @tool
    def stop(self) -> str:
        """Stop."""
        self.finish(0.0, False)
        return "stopped"


class CrashingEnv(GuessNumberEnv):
    """Raises on any text that is not a tool call (a broken env, not a bad action)."""

    def on_text(self, text: str) -> StepResult:
        raise RuntimeError("the env broke on plain text")


def test_each_check_passes_on_demo() -> None:
    env = GuessNumberEnv()
    check_step_before_reset(env)
    check_gymnasium_api(env)
    check_splits(env)
    check_seeding(env)
    check_bad_actions(env)
    check_expert(env, episodes=2)


def test_each_check_reports_what_is_wrong() -> None:
    with pytest.raises(CheckFailed, match=r"info are not equivalent for the same seed"):
        check_gymnasium_api(StampEnv())
    with pytest.raises(CheckFailed, match=r"reset\(seed=1234\) twice gave different observations"):
        check_seeding(GlobalRandomEnv())
    with pytest.raises(CheckFailed, match="raised RuntimeError: the env broke"):
        check_bad_actions(CrashingEnv())
    with pytest.raises(CheckSkipped, match="no expert"):
        check_expert(GlobalRandomEnv())


def test_check_env_runs_every_check_and_reports_all_failures() -> None:
    with pytest.raises(CheckFailed) as err:
        check_env(GlobalRandomEnv())
    report = err.value.report
    assert report is not None and not report.ok
    assert set(report.failed) == {GYM_CHECK, "same seed -> same first observation; task_id reproduces it"}
    assert "splits ['train', 'test'] list tasks with unique ids" in report.passed  # later checks still ran
    assert report.skipped == {"expert finishes an episode; step after end raises ResetNeeded": "env has no expert_action()"}
    assert "FAIL  same seed" in str(report) and "2 failed" in str(report)
    assert "same seed -> same first observation" in str(err.value)


@pytest.fixture(scope="module")
def stamp_server() -> Iterator[EnvServer]:
    agentgym.register_env("agentgym/TestStamp-v0", StampEnv, family="test", max_episode_steps=12)
    with EnvServer(["agentgym/TestStamp-v0"]) as srv:
        yield srv


def test_nondeterministic_info_over_http_is_a_failed_check(stamp_server: EnvServer) -> None:
    """Defect (issue 26): gymnasium's assertion escaped as an uncaught AssertionError."""
    env = gymnasium.make("agentgym/Remote-v0", url=stamp_server.url)
    try:
        with pytest.raises(CheckFailed) as err:
            check_env(env)
    finally:
        env.close()
    report = err.value.report
    assert report is not None
    assert list(report.failed) == [GYM_CHECK]
    assert "Deterministic step info are not equivalent" in report.failed[GYM_CHECK]
    assert len(report.passed) == 5 and not report.skipped  # the LLM checks all ran over HTTP


def test_agentgym_check_cli_reports_the_failed_check_without_a_traceback(stamp_server: EnvServer) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "agentgym", "check", "agentgym/Remote-v0", "--kw", f"url={stamp_server.url}"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    assert f"FAIL  {GYM_CHECK}: gymnasium's check_env: Deterministic step info are not equivalent" in r.stdout
    assert "ok    expert finishes an episode" in r.stdout
    assert "1 check(s) failed" in " ".join(r.stderr.split())
    ok = subprocess.run([sys.executable, "-m", "agentgym", "check", "agentgym/Demo-v0"],
                        capture_output=True, text=True, timeout=300, env=env)
    assert ok.returncode == 0 and "6 checks passed" in ok.stdout, (ok.stdout, ok.stderr)

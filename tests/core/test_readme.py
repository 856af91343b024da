"""The README's env and eval examples run as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import gymnasium
import pytest

import agentgym

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_env_example_works() -> None:
    text = README.read_text()
    section = text[text.index("## Write and register a new env"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None
    ns: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(code.group(1), "README.md", "exec"), ns)
    env = gymnasium.make("agentgym/Countdown-v0")
    report = agentgym.check_env(env)
    assert not report.skipped and len(report.passed) >= 6
    obs, info = env.reset(seed=3)
    total = 0.0
    for _ in range(10):
        obs, r, term, trunc, info = env.step(env.unwrapped.expert_action())
        total += r
        if term or trunc:
            break
    assert term and info["success"] and total == 1.0


def test_readme_eval_example_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = README.read_text()
    section = text[text.index("### Evaluate from Python"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None
    monkeypatch.chdir(tmp_path)
    ns: dict[str, object] = {"__name__": "readme_eval"}
    exec(compile(code.group(1), "README.md", "exec"), ns)
    summary = ns["summary"]
    assert isinstance(summary, dict) and summary["complete"] and summary["finished_episodes"] == 32
    assert summary["envs"]["agentgym/Demo-v0"]["success"]["mean"] == 1.0
    assert os.path.exists(tmp_path / "runs" / "demo-expert" / "episodes.jsonl")

"""The README's env example runs as written and passes the checker."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium

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

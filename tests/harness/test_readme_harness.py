"""The README's harness example works as written: its agent solves a task through the harness, and its
config selects the harness workflow with that agent."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import tiny_lookup
import tomllib
from agentgym.trainers.config import validate_config
from harness_fakes import ScriptedTokenPolicy

from agentgym.harness.registry import workflow_factory
from agentgym.harness.workflow import HarnessWorkflow
from agentgym.rollout import GroupRequest, RolloutEngine, RolloutRuntime

README = Path(__file__).resolve().parents[2] / "README.md"


def blocks() -> tuple[str, str]:
    text = README.read_text()
    section = text[text.index("## Training agents AgentGym does not run"):]
    section = section[:section.index("\n## ", 5)]
    py = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    toml = re.search(r"```toml\n(.*?)```", section, re.DOTALL)
    assert py is not None and toml is not None
    return py.group(1), toml.group(1)


async def test_the_readme_agent_and_config(tmp_path: Path, tiny_tokenizer: Any, monkeypatch: Any) -> None:
    code, toml = blocks()
    (tmp_path / "my_agent.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    raw = tomllib.loads(toml)
    cfg = validate_config({**raw, "rollout": {"env": tiny_lookup.ENV_ID, "group_size": 2, "max_tokens": 16,
                                              "max_turns": 3}}).to_dict()
    policy = ScriptedTokenPolicy(tiny_tokenizer)
    wf = workflow_factory(cfg["multi"]["workflow"])(cfg, {"policy": policy})
    assert isinstance(wf, HarnessWorkflow) and wf.reward == "env" and wf.timeout_s == 300
    rt = RolloutRuntime(4)
    try:
        [g] = await RolloutEngine(rt).run(wf, [GroupRequest(tiny_lookup.ENV_ID, "owl-red", seed=0)])
    finally:
        rt.close()
        sys.modules.pop("my_agent", None)
    assert [(t.error, t.reward) for t in g] == [(None, 1.0), (None, 1.0)]

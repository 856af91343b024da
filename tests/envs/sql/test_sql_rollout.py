"""The SQL env through the real eval/rollout stack: the expert policy wins, a wrong policy scores 0."""

from __future__ import annotations

import json
from pathlib import Path

from agentgym.policies.scripted import ExpertPolicy, ScriptedPolicy

from agentgym.eval import EvalConfig, run_eval
from agentgym.types import Message


def test_expert_policy_scores_100_percent(tmp_path: Path) -> None:
    cfg = EvalConfig(["agentgym/SQL-v0"], split="test", tasks=24, concurrency=4)
    summary = run_eval(ExpertPolicy(), cfg, tmp_path / "expert")
    env_sum = summary["envs"]["agentgym/SQL-v0"]
    assert env_sum["success"]["mean"] == 1.0
    lines = (tmp_path / "expert").glob("*.jsonl")
    episodes = [json.loads(x) for f in lines for x in f.read_text().splitlines() if x.strip()]
    assert len(episodes) >= 24


def test_wrong_policy_scores_zero(tmp_path: Path) -> None:
    def wrong(messages: list[Message]) -> str:
        # explores once, then submits a query that returns no rows (and makes no change)
        if len(messages) <= 2:
            return '<tool_call>{"name": "execute_sql", "arguments": {"query": "SELECT 1"}}</tool_call>'
        return '<tool_call>{"name": "submit", "arguments": {"query": "SELECT 1 WHERE 0"}}</tool_call>'

    cfg = EvalConfig(["agentgym/SQL-v0"], split="test", tasks=12, concurrency=4)
    summary = run_eval(ScriptedPolicy(wrong), cfg, tmp_path / "wrong")
    env_sum = summary["envs"]["agentgym/SQL-v0"]
    assert env_sum["success"]["mean"] == 0.0

"""A real SmolLM2-135M run of `agentgym eval` on a small slice (CPU, token-in/token-out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym.rollout import read_jsonl


@pytest.mark.slow
def test_smollm2_eval_small_slice(tmp_path: Path) -> None:
    out = tmp_path / "smol"
    envs = "agentgym/Demo-v0,agentgym/SQL-v0"
    args = [sys.executable, "-m", "agentgym", "eval", "--env", envs, "--policy", "hf:smollm2-135m-instruct",
            "--split", "test", "--tasks", "1", "--samples", "2", "--seeds", "0", "--max-turns", "2",
            "--max-tokens", "32", "--temperature", "0.7", "--no-sampling-seeds", "--out", str(out), "-q"]
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    r = subprocess.run(args, capture_output=True, text=True, timeout=1200, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["finished_episodes"] == 4
    assert summary["protocol"]["token_mode"] == "token-exact session"
    assert summary["protocol"]["policy"]["spec"] == "hf:smollm2-135m-instruct"
    for env_id in envs.split(","):
        b = summary["envs"][env_id]
        assert b["episodes"] == 2 and b["errors"] == 0, b["error_examples"]
        assert b["tokens"]["generated_total"] > 0 and 0.0 <= b["success"]["mean"] <= 1.0
    trajs = read_jsonl(out / "episodes.jsonl")
    for t in trajs:
        assert 1 <= t.num_turns <= 2 and (t.terminated or t.truncated) and not (t.terminated and t.truncated)
        first = t.turns[0]
        assert len(first.prompt_token_ids) > 20 and 0 < len(first.completion_token_ids) <= 32
        assert len(first.completion_logprobs) == len(first.completion_token_ids)
        assert all(lp <= 0.0 for lp in first.completion_logprobs)
        if t.num_turns == 2:  # the second prompt is a delta: the observation, not the whole history again
            assert 0 < len(t.turns[1].prompt_token_ids) < len(first.prompt_token_ids) + len(first.completion_token_ids)
    assert "Demo-v0" in r.stdout and "SQL-v0" in r.stdout

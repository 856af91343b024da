"""``agentgym serve`` from the command line; ``agentgym check`` and ``agentgym eval`` against an env
served from another process (the README example)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from serve_helpers import VENV_BIN

pytestmark = pytest.mark.slow
AGENTGYM = str(VENV_BIN / "agentgym")


def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AGENTGYM, *args], capture_output=True, text=True, timeout=timeout)


def test_serve_refuses_public_address_without_token_and_keeps_serve_retriever() -> None:
    r = run("serve", "agentgym/Demo-v0", "--host", "0.0.0.0")
    assert r.returncode == 2 and "without a token" in r.stderr
    r = run("serve", "agentgym/Nope-v0")
    assert r.returncode == 2 and "No env registered" in r.stderr
    # one --kw for every env that one of them does not take: a clear error, no traceback (issue 26)
    r = run("serve", "agentgym/SQL-v0", "agentgym/ALFWorld-v0", "--kw", "action_mode=tool")
    assert r.returncode == 2 and "SQL-v0 does not take the env kwarg action_mode" in r.stderr
    assert "--kw SQL-v0:key=value" in r.stderr and "Traceback" not in r.stderr
    helps = run("--help").stdout
    assert "serve-retriever" in helps and " serve " in helps


def test_check_and_expert_eval_against_a_served_env(serve_process: Any, tmp_path: Path) -> None:
    srv = serve_process(["agentgym/ALFWorld-v0", "agentgym/SQL-v0"], "--token", "t0k")
    env = {"AGENTGYM_TOKEN": "t0k"}
    import os

    env = {**os.environ, **env}
    r = subprocess.run([AGENTGYM, "check", "agentgym/Remote-v0", "--kw", f"url={srv.url}", "--kw", "env_id=agentgym/SQL-v0"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "6 checks passed" in r.stdout
    out = tmp_path / "remote-alfworld"
    r = subprocess.run([AGENTGYM, "eval", "--env", "agentgym/Remote-v0", "--env-kwarg", f"url={srv.url}",
                        "--env-kwarg", "env_id=agentgym/ALFWorld-v0", "--policy", "expert", "--tasks", "4",
                        "--concurrency", "4", "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    b = s["envs"]["agentgym/Remote-v0"]
    assert b["episodes"] == 4 and b["errors"] == 0 and b["success"]["mean"] == 1.0
    assert s["protocol"]["splits_used"]["agentgym/Remote-v0"] == "valid_unseen"  # the served env's held-out split
    # without the token the server refuses, with a message that says what to do
    r = run("check", "agentgym/Remote-v0", "--kw", f"url={srv.url}")
    assert r.returncode == 2 and "token" in r.stderr

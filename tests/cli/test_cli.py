"""The CLI, run as a user would: in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys


def run(*args: str, stdin: str = "", timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentgym", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": "/root"})


def test_version() -> None:
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith("agentgym 0.")


def test_list_json_has_demo_with_counts() -> None:
    out = run("list", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["id"]: r for r in json.loads(out.stdout)}
    assert rows["agentgym/Demo-v0"]["tools"] == "guess, give_up"
    assert rows["agentgym/Demo-v0"]["splits"] == "train:32, test:32"


def test_list_table() -> None:
    out = run("list")
    assert out.returncode == 0 and "agentgym/Demo-v0" in out.stdout and "guess, give_up" in out.stdout


def test_play_through_stdin_wins() -> None:
    script = "/tools\nnot a tool call\n" + "/expert\n" * 8
    out = run("play", "Demo-v0", "--task-id", "guess-20", stdin=script)
    assert out.returncode == 0, out.stderr
    assert "no tool call found" in out.stdout
    assert "episode terminated: success=True" in out.stdout


def test_play_call_syntax_and_eof() -> None:
    out = run("play", "Demo-v0", "--task-id", "guess-20", stdin='/call guess {"n": 20}\n')
    assert "correct" in out.stdout and "success=True" in out.stdout
    out = run("play", "Demo-v0", stdin='/call guess {"n": 1}\n')
    assert out.returncode == 0 and "(end of input)" in out.stdout


def test_check_and_errors() -> None:
    out = run("check", "Demo-v0")
    assert out.returncode == 0 and "6 checks passed" in out.stdout
    out = run("check", "Demo-v9")
    assert out.returncode == 2 and "Did you mean 'agentgym/Demo-v0'" in out.stderr
    out = run("play", "Demo-v0", "--task-id", "nope")
    assert out.returncode == 2 and "no task" in out.stderr

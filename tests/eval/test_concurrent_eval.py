"""Concurrency changes nothing: the code envs' expert scores the same at --concurrency 1 and 32, on
every sandbox backend, through ``agentgym eval`` run as a user would (issue 11: sandboxes used to
kill each other's runs, so concurrent evals silently lost episodes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)


def _eval(env_id: str, concurrency: int, out: Path, extra: list[str]) -> dict[str, tuple[bool, float]]:
    """Per-episode (success, reward) of the expert: 18 test tasks, two samples each (36 episodes: more than
    --concurrency 32, so late episodes overlap the cleanup of early ones)."""
    args = [sys.executable, "-m", "agentgym", "eval", "--env", env_id, "--policy", "expert", "--split", "test",
            "--tasks", "18", "--samples", "2", "--concurrency", str(concurrency), "--out", str(out), "-q", *extra]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-3000:]
    episodes: dict[str, tuple[bool, float]] = {}
    for line in (out / "episodes.jsonl").read_text().splitlines():
        d = json.loads(line)
        assert d.get("error") is None, d.get("error")
        episodes[d["info"]["eval_key"]] = (bool(d["success"]), float(d["reward"]))
    return episodes


def _backend_args(backend: str) -> list[str]:
    if backend == "docker":
        from agentgym.sandbox.docker import docker_available

        if not docker_available():
            pytest.skip("Docker engine not reachable")
        return ["--env-kwarg", "sandbox=docker", "--env-kwarg", 'sandbox_kwargs={"pool_size": 1}']
    if backend != "auto":
        return ["--env-kwarg", f"sandbox={backend}"]
    return []


SLOW = pytest.mark.slow
DOCKER = [pytest.mark.slow, pytest.mark.docker]


# Docker runs Bash-v0 in one container per episode (per session), so episodes cannot share anything but
# the uid lease, which the sandbox suite's many-instances test covers; Code-v0 exercises its warm pool.
@pytest.mark.parametrize(("env_id", "backend"), [
    pytest.param("agentgym/Code-v0", "auto", id="bwrap-Code-v0"),
    pytest.param("agentgym/Bash-v0", "auto", id="bwrap-Bash-v0"),
    pytest.param("agentgym/Code-v0", "process", id="process-Code-v0", marks=SLOW),
    pytest.param("agentgym/Bash-v0", "process", id="process-Bash-v0", marks=SLOW),
    pytest.param("agentgym/Code-v0", "docker", id="docker-Code-v0", marks=DOCKER),
])
def test_scores_are_identical_at_concurrency_1_and_32(env_id: str, backend: str, tmp_path: Path) -> None:
    extra = _backend_args(backend)
    one = _eval(env_id, 1, tmp_path / "c1", extra)
    many = _eval(env_id, 32, tmp_path / "c32", extra)
    assert len(one) >= 36 and one.keys() == many.keys()
    assert many == one, {k: (one[k], many[k]) for k in one if one[k] != many[k]}
    assert all(success and reward == 1.0 for success, reward in one.values()), "the expert must solve every task"

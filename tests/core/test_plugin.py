"""A third-party env package registers itself through the agentgym.envs entry-point group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_example_plugin_installs_and_is_found(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target),
         str(ROOT / "examples" / "agentgym-echo")],
        check=True, timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-m", "agentgym", "list", "--json"], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    rows = {r["id"]: r for r in json.loads(out.stdout)}
    assert rows["agentgym/Echo-v0"]["plugin"] == "agentgym-echo"
    assert rows["agentgym/Echo-v0"]["status"] == "ok" and rows["agentgym/Echo-v0"]["tools"] == "echo"
    assert rows["agentgym/EchoLoud-v0"]["family"] == "example"
    code = (
        "import gymnasium, agentgym\n"
        "env = gymnasium.make('agentgym/EchoLoud-v0')\n"
        "print(agentgym.check_env(env))\n"
        "obs, info = env.reset(seed=0)\n"
        "print(env.step(env.unwrapped.expert_action())[1])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().endswith("1.0") and "checks passed" in out.stdout


@pytest.mark.slow
def test_non_editable_install_maps_the_namespace(tmp_path: Path) -> None:
    """`pip install .` (not editable) installs envs/, policies/, trainers/ as agentgym.* and nothing else."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target),
         str(ROOT)],
        check=True, timeout=600, cwd=tmp_path,
    )
    top = sorted(p.name for p in target.iterdir() if not p.name.endswith((".dist-info", ".egg-info")) and p.name != "bin")
    assert top == ["agentgym"], top
    assert (target / "agentgym" / "py.typed").exists()
    assert (target / "agentgym" / "envs" / "demo" / "__init__.py").exists()
    code = "import agentgym, agentgym.envs.demo as d; print(agentgym.__file__, d.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)},
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.count(str(target)) == 2

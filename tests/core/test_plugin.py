"""A third-party env package registers itself through the agentgym.envs entry-point group, loaded lazily."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ECHO = ROOT / "examples" / "agentgym-echo"


def _echo_on_path(tmp_path: Path) -> dict[str, str]:
    """``examples/agentgym-echo`` importable with its entry points declared, as an install leaves it
    (a dist-info folder beside the package), without running pip."""
    site = tmp_path / "site"
    info = site / "agentgym_echo-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentgym-echo\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text('[agentgym.envs]\nEcho-v0 = agentgym_echo.env:EchoEnv\n'
                                           'register = agentgym_echo:register\n')
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ECHO)])}


def test_plugins_load_on_first_lookup_not_at_import(tmp_path: Path) -> None:
    """Defect: `import agentgym` imported every plugin (a slow or broken one cost every import)."""
    code = (
        "import sys, gymnasium, agentgym\n"
        "print('at import:', 'agentgym_echo' in sys.modules, 'agentgym/Echo-v0' in gymnasium.registry)\n"
        "env = agentgym.make('agentgym/EchoLoud-v0')\n"
        "print('after make:', 'agentgym_echo' in sys.modules, env.unwrapped.loud)\n"
        "print('gymnasium sees:', gymnasium.make('agentgym/Echo-v0').unwrapped.loud)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=_echo_on_path(tmp_path), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["at import: False False", "after make: True True", "gymnasium sees: False"]


def test_agentgym_list_and_load_plugins_see_the_example(tmp_path: Path) -> None:
    env = _echo_on_path(tmp_path)
    out = subprocess.run([sys.executable, "-m", "agentgym", "list", "--json"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = {r["id"]: r for r in json.loads(out.stdout)}
    assert rows["agentgym/Echo-v0"]["plugin"] == "agentgym-echo" and rows["agentgym/Echo-v0"]["tools"] == "echo"
    assert rows["agentgym/EchoLoud-v0"]["family"] == "example"
    code = ("import gymnasium, agentgym\n"
            "print(sorted(agentgym.load_plugins()))\n"
            "print(gymnasium.make('agentgym/EchoLoud-v0').unwrapped.loud, agentgym.load_plugins())\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["['agentgym/Echo-v0', 'agentgym/EchoLoud-v0']", "True []"]


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
        "import agentgym\n"
        "env = agentgym.make('agentgym/EchoLoud-v0')\n"
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

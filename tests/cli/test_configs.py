"""Every shipped config validates without running (STYLE.md, principle 11), and --config works."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from agentgym.cli.eval import load_eval_config
from agentgym.eval.runner import EvalConfig
from agentgym.registration import env_entry

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "eval").rglob("*.toml"))


def test_there_are_configs() -> None:
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_validates(path: Path) -> None:
    c = load_eval_config(path)
    assert {"env", "policy", "out"} <= set(c)
    envs = c["env"].split(",")
    for e in envs:
        env_entry(e)  # raises UnknownEnvError for a typo
    seeds = [int(s) for s in c.get("seeds", "0").split(",")]
    cfg = EvalConfig(envs=envs, seeds=seeds, tasks=c.get("tasks"), samples=c.get("samples", 1),
                     max_turns=c.get("max_turns"), parser=c.get("parser"), split=c.get("split", "test"))
    cfg.validate()


def test_bad_configs_are_clear(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('env = "agentgym/Demo-v0"\nsampels = 3\n')
    with pytest.raises(typer.BadParameter, match="unknown key 'sampels'"):
        load_eval_config(bad)
    bad.write_text('tasks = "ten"\n')
    with pytest.raises(typer.BadParameter, match="tasks must be int"):
        load_eval_config(bad)
    bad.write_text("tasks = [\n")
    with pytest.raises(typer.BadParameter, match="not valid TOML"):
        load_eval_config(bad)


def test_eval_with_config_and_override(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'env = ["agentgym/Demo-v0"]\npolicy = "expert"\nout = "{tmp_path / "ignored"}"\ntasks = 4\n'
                   'seeds = [0, 1]\nquiet = true\n')
    out_dir = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "agentgym", "eval", "--config", str(cfg), "--out", str(out_dir),
                          "--tasks", "3"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "ignored").exists()
    summary = json.loads((out_dir / "summary.json").read_text())
    lines = (out_dir / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 6  # 3 tasks (command line wins over 4) x 2 seeds (from the file)
    assert "success" in json.dumps(summary)
    res = subprocess.run([sys.executable, "-m", "agentgym", "eval", "--config", str(tmp_path / "nope.toml")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "does not exist" in " ".join(res.stderr.split())

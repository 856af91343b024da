"""Training configs: every shipped config validates without running; errors are reported at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from agentgym.trainers.config import TrainConfig, apply_overrides, load_train_config, validate_config

from agentgym.errors import ConfigurationError
from agentgym.registration import env_entry

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "train").glob("*.toml"))


def test_there_are_train_configs() -> None:
    assert len(CONFIGS) >= 4


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_train_config_validates(path: Path) -> None:
    cfg = load_train_config(path)
    env_entry(cfg.rollout.env)  # raises UnknownEnvError for a typo
    assert cfg.run.out_dir.startswith("runs/")
    if cfg.run.algorithm == "sft":
        assert cfg.data.paths


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[run]\nalgoritm = "grpo"\nsteps = -1\n[optim]\nlr = "fast"\n[loss]\naggregation = "mean"\n'
                   '[rollout]\ngroup_size = 0\n')
    with pytest.raises(ConfigurationError) as e:
        load_train_config(bad)
    msg = str(e.value)
    assert "5 problem(s)" in msg
    for key in ("run.algoritm", "run.steps", "optim.lr", "loss.aggregation", "rollout.group_size"):
        assert key in msg
    assert "unknown key" in msg


def test_cross_section_checks() -> None:
    with pytest.raises(ConfigurationError, match=r"data\.paths"):
        validate_config({"run": {"algorithm": "sft"}})
    with pytest.raises(ConfigurationError, match="shared_base"):
        validate_config({"multi": {"workflow": "solver_verifier", "shared_base": True}})


def test_overrides() -> None:
    d = apply_overrides({"optim": {"lr": 1.0}}, ["optim.lr=1e-5", "run.name=x", "eval.seeds=[0, 1]",
                                                  "rollout.tasks=null", "filter.dynamic_sampling=false"])
    cfg = TrainConfig.model_validate(d)
    assert cfg.optim.lr == 1e-5 and cfg.run.name == "x" and cfg.eval.seeds == [0, 1]
    assert cfg.rollout.tasks is None and cfg.filter.dynamic_sampling is False
    with pytest.raises(ConfigurationError, match="KEY=VALUE"):
        apply_overrides({}, ["optim.lr"])
    with pytest.raises(ConfigurationError, match="not a table"):
        apply_overrides({"optim": 3}, ["optim.lr=1"])


def test_cli_check_and_bad_config() -> None:
    ok = subprocess.run([sys.executable, "-m", "agentgym", "train", "--config", str(CONFIGS[0]), "--set",
                         "optim.lr=3e-6", "--check"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert '"lr": 3e-06' in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "agentgym", "train", "--config", str(CONFIGS[0]), "--set",
                          "optim.lr=-1", "--set", "run.nope=1", "--check"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    err = " ".join(bad.stderr.split())
    assert "optim.lr" in err and "run.nope" in err

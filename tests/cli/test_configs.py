"""Every shipped config validates without running (STYLE.md, principle 11), and --config works."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym.cli.eval import EvalOptions
from agentgym.errors import ConfigurationError, UnknownEnvError
from agentgym.eval.runner import EvalConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "eval").rglob("*.toml"))


def test_there_are_configs() -> None:
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_validates(path: Path) -> None:
    """Each file becomes the full eval protocol (env ids resolved, every field checked) without running."""
    given = EvalOptions.load(path)
    assert {"env", "policy", "out"} <= set(given)
    opts = EvalOptions.from_sources({}, path)
    cfg = opts.eval_config()
    assert isinstance(cfg, EvalConfig) and cfg.envs == opts.env and cfg.policy_spec == given["policy"]
    assert cfg.seeds == given.get("seeds", [0]) and cfg.tasks == given.get("tasks")


def test_bad_configs_are_clear(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('env = "agentgym/Demo-v0"\nsampels = 3\n')
    with pytest.raises(ConfigurationError, match="sampels: unknown key"):
        EvalOptions.load(bad)
    bad.write_text('tasks = "ten"\nseeds = [0, "x"]\n')
    with pytest.raises(ConfigurationError, match=r"(?s)bad.toml: 2 problem.*tasks: Input should be a valid integer.*seeds"):
        EvalOptions.load(bad)
    bad.write_text("tasks = [\n")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        EvalOptions.load(bad)
    bad.write_text('env = "agentgym/Demo-v9"\n')
    with pytest.raises(UnknownEnvError, match="Did you mean"):
        EvalOptions.from_sources({}, bad).eval_config()


def test_options_from_a_file_and_the_command_line_merge() -> None:
    """The command line wins key by key; lists, ranges and tables parse into the protocol's types."""
    opts = EvalOptions.from_sources({"env": "agentgym/Demo-v0,agentgym/SQL-v0", "seeds": "0-2", "history": "3",
                                     "env_kwarg": ["high=15", "name=x"], "split": "test,agentgym/SQL-v0=train"})
    cfg = opts.eval_config()
    assert cfg.envs == ["agentgym/Demo-v0", "agentgym/SQL-v0"] and cfg.seeds == [0, 1, 2]
    assert cfg.history_window == 3 and cfg.env_kwargs == {"high": 15, "name": "x"}
    assert cfg.split == "test" and cfg.split_overrides == {"agentgym/SQL-v0": "train"}
    assert EvalOptions.from_sources({"history": "full"}).history is None


def test_eval_config_is_a_typed_model() -> None:
    """The protocol is one pydantic model: positional envs, every problem at once, assignments checked."""
    cfg = EvalConfig(["agentgym/Demo-v0"], tasks=3)
    assert cfg == EvalConfig(envs=["agentgym/Demo-v0"], tasks=3)
    with pytest.raises(ConfigurationError, match=r"(?s)2 problem.*samples.*seeds: seeds must be distinct"):
        EvalConfig(["agentgym/Demo-v0"], samples=0, seeds=[1, 1])
    with pytest.raises(ConfigurationError, match="sampels: unknown key"):
        EvalConfig(["agentgym/Demo-v0"], sampels=2)
    with pytest.raises(ConfigurationError, match="envs: give at least one env id"):
        EvalConfig([])
    with pytest.raises(ConfigurationError, match="top_p"):
        cfg.top_p = 0.0
    assert cfg.top_p == 1.0


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


def test_the_help_shows_the_protocol_defaults() -> None:
    """The defaults `agentgym eval --help` shows are EvalConfig's (the one place they are set)."""
    import typer.main

    from agentgym.cli import app

    cmd = typer.main.get_command(app).commands["eval"]  # type: ignore[attr-defined]
    shown = {p.name: p.show_default for p in cmd.params if isinstance(p.show_default, str)}
    assert {"split", "samples", "seeds", "max_tokens", "temperature", "top_p", "concurrency", "history",
            "retry_errors", "sampling_seeds", "batch_requests", "env_workers"} <= set(shown)
    words = {"retry": True, "on": True, "off": False}
    opts = EvalOptions.from_sources({"env": "agentgym/Demo-v0", **{k: words.get(v, v) for k, v in shown.items()}})
    assert opts.eval_config() == EvalConfig(["agentgym/Demo-v0"])

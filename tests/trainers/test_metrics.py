"""Run logging: JSONL (flattened, appended), TensorBoard event files, PNG curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentgym.trainers.metrics import MetricsLogger, flatten, plot_curves, read_metrics


def test_jsonl_tensorboard_and_png(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    log = MetricsLogger(tmp_path, 3, tensorboard=True, progress=True)
    for step in range(3):
        log.log(step, {"rollout": {"reward_mean": 0.1 * step, "success_rate": 0.2 * step}, "train": {"loss": 1.0 / (step + 1),
                       "grad_norm": float("nan")}, "version": step + 1})
    log.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[2]["rollout/reward_mean"] == pytest.approx(0.2) and rows[0]["train/grad_norm"] == "nan"
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())
    drawn = plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curves.png")
    assert drawn is not None and drawn[0].stat().st_size > 1000
    with open(tmp_path / "metrics.jsonl", "a") as fh:  # a torn last line (crash mid-write) is skipped
        fh.write('{"step": 3, "rollout/rew')
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 3
    assert flatten({"a": {"b": {"c": 1}}, "d": 2}) == {"a/b/c": 1, "d": 2}
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])["version"] == 2

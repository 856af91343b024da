"""`agentgym train --runtime ray`: the same recipe with DataFlow and the rollout services as Ray actors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


def test_train_cli_on_the_ray_runtime(tiny_sft_model: str, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    out = tmp_path / "run"
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(f"""
[run]
out_dir = "{out}"
steps = 3
threads = 1
[model]
path = "{tiny_sft_model}"
[rollout]
env = "agentgym/TinyLookup-v0"
imports = ["tiny_lookup"]
group_size = 4
groups_per_step = 3
max_tokens = 6
max_turns = 2
concurrency = 8
[filter]
dynamic_sampling = false
[optim]
lr = 1e-2
[dataflow]
services = 2
[eval]
before = false
after = false
[log]
progress = false
plot = false
""")
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RAY_USAGE_STATS_ENABLED": "0"}
    r = subprocess.run([sys.executable, "-m", "agentgym", "train", "--config", str(cfg), "--runtime", "ray"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [0, 1, 2]
    assert all(x["rollout/episodes"] == 12 for x in rows)
    assert json.loads((out / "config.json").read_text())["dataflow"]["runtime"] == "ray"
    # the trained weights went to both services (actors) each step
    pub = [x for x in rows if x.get("publish/services/rollout-0")]
    assert pub and all(x["publish/services/rollout-1"] in ("ok", "full") for x in pub)

"""The viewer on real run folders, made the way ``make quickstart`` makes them but tiny: ``agentgym eval --policy
expert`` on Demo-v0, and ``agentgym train`` on the tiny model and ``agentgym/TinyLookup-v0`` (SFT on demonstrations,
then GRPO from the SFT model; held-out evals before, during and after). Everything is read back through the
viewer's own HTTP server and checked against the files the CLI wrote (``metrics.jsonl``, ``summary.json``,
``result.json``, ``episodes.jsonl``), so a metric, interval or stage the trainer renames shows up here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentgym.view import Site, ViewServer

pytestmark = pytest.mark.slow  # three real CLI runs (a tiny model: about a minute on a loaded 2-core machine)

TRAINERS = Path(__file__).resolve().parent.parent / "trainers"  # tiny_lookup.py: the tiny model and task
if str(TRAINERS) not in sys.path:
    sys.path.insert(0, str(TRAINERS))


def _cli(*args: str, cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{TRAINERS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "COLUMNS": "200"}
    res = subprocess.run([sys.executable, "-m", "agentgym", *args], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, (args, res.stderr[-4000:])


def _train(root: Path, name: str, toml: str) -> Path:
    cfg = root / f"{name}.toml"
    cfg.write_text(toml)
    _cli("train", "--config", str(cfg), cwd=root)
    return root / name


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import tiny_lookup

    root = tmp_path_factory.mktemp("view-real")
    model = tiny_lookup.build_tiny_model(root / "model", init=0.1)
    demos = tiny_lookup.protocol_demos(root / "demos.jsonl")
    _cli("eval", "--env", "agentgym/Demo-v0", "--policy", "expert", "--tasks", "4", "--seeds", "0,1",
         "--out", str(root / "expert"), cwd=root)
    common = """
[rollout]
env = "agentgym/TinyLookup-v0"
imports = ["tiny_lookup"]
max_turns = 3
max_tokens = 8
group_size = 4
groups_per_step = 4
[eval]
split = "test"
seeds = [0, 1]
"""
    # the quickstart's stage: SFT on demonstrations (the untrained model never answers: 0% before, some after)
    sft = _train(root, "sft", f"""
[run]
algorithm = "sft"
out_dir = "{root / 'sft'}"
steps = 60
threads = 1
[model]
path = "{model}"
[data]
paths = ["{demos}"]
batch_size = 16
[optim]
lr = 1e-2
[log]
progress = false
{common}
every = 30
""")
    grpo = _train(root, "grpo", f"""
[run]
out_dir = "{root / 'grpo'}"
steps = 2
threads = 1
[model]
path = "{sft / 'final'}"
[optim]
lr = 1e-3
[log]
groups = true
{common}
every = 1
""")
    return {"expert": root / "expert", "sft": sft, "grpo": grpo}


@pytest.fixture(scope="module")
def srv(real: dict[str, Path]) -> Iterator[ViewServer]:
    with ViewServer(Site([real["expert"], real["sft"], real["grpo"]])) as s:
        yield s


def get(srv: ViewServer, path: str) -> Any:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        conn.request("GET", f"/data/{path}.json", headers={"Host": f"127.0.0.1:{srv.port}", "Sec-Fetch-Site": "same-origin"})
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200, (path, body[:500])
        return json.loads(body)
    finally:
        conn.close()


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(index: dict[str, Any], path: Path) -> dict[str, Any]:
    hits = [r for r in index["runs"] if Path(r["path"]).resolve() == path.resolve()]
    assert len(hits) == 1, (path, [r["path"] for r in index["runs"]])
    return hits[0]


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def test_expert_eval_summary_and_episodes(srv: ViewServer, real: dict[str, Path]) -> None:
    index = get(srv, "index")
    entry = _run(index, real["expert"])
    summary = json.loads((real["expert"] / "summary.json").read_text())
    ov = summary["overall"]["success"]
    assert entry["kind"] == "eval" and entry["envs"] == ["agentgym/Demo-v0"] and entry["episodes"] == 8
    assert entry["success"]["mean"] == ov["mean"] == 1.0 and entry["success"]["ci95"] == ov["ci95"]
    # the interval is named as eval.stats computed it (and as the trainer prints it), not as an older summary's
    assert ov["method"] == "wilson" and entry["success"]["interval"] == "Wilson 95% over episodes"
    doc = get(srv, f"run/{entry['id']}")
    eps = _jsonl(real["expert"] / "episodes.jsonl")
    assert doc["summary"] == summary and doc["run_json"] is not None
    assert doc["episodes"] == len(eps) == 8 and doc["skipped_lines"] == 0
    assert sorted(zip(doc["table"]["task"], doc["table"]["seed"], strict=True)) == sorted(
        (e["task_id"], e["info"]["seed"]) for e in eps)
    assert doc["breakdown"][0]["env"] == "agentgym/Demo-v0" and doc["breakdown"][0]["successes"] == 8
    chunk = get(srv, f"run/{entry['id']}/chunk/0")["episodes"]
    assert len(chunk) == 8 and all(e["success"] for e in chunk)
    calls = [c["name"] for e in chunk for t in e["turns"] for c in t["tool_calls"]]
    assert "guess" in calls
    assert any(m["role"] == "tool" for e in chunk for t in e["turns"] for m in t["observation"])


@pytest.mark.parametrize("name", ["sft", "grpo"])
def test_training_curves_and_held_out_evals(srv: ViewServer, real: dict[str, Path], name: str) -> None:
    path = real[name]
    index = get(srv, "index")
    entry = _run(index, path)
    doc = get(srv, f"run/{entry['id']}")
    # every numeric series the trainer wrote, value for value in file order
    recs = _jsonl(path / "metrics.jsonl")
    written = {k for r in recs for k, v in r.items() if k != "step" and _finite(v)}
    series = doc["metrics"]["series"]
    assert set(series) == written and doc["metrics"]["skipped"] == 0
    assert doc["metrics"]["steps"] == [r["step"] for r in recs]
    for k in written:
        assert series[k] == [r[k] if _finite(r.get(k)) else None for r in recs], k
    expected = {"train/loss", "eval/success", "eval/success_lo", "eval/success_hi"}
    if name == "grpo":
        expected |= {"rollout/reward_mean", "rollout/success_rate", "train/clip_frac", "dataflow/staleness_max"}
    assert expected <= written
    # the held-out evals: one per stage folder, in training order, linked to the stage's eval run
    stages = sorted(p.name for p in (path / "eval").iterdir())
    held = doc["heldout"]
    assert sorted(p["stage"] for p in held) == stages and held[0]["stage"] == "before" and held[-1]["stage"] == "after"
    assert len(held) == 3 and held[1]["stage"].startswith("step-")
    assert [p["run"] for p in held] == entry["children"] == doc["stages"]
    logged = [(r["step"], r["eval/success"], [r["eval/success_lo"], r["eval/success_hi"]]) for r in recs
              if "eval/success" in r]
    result = json.loads((path / "result.json").read_text())
    for p in held:
        child = _run(index, path / "eval" / p["stage"])
        assert child["id"] == p["run"] and child["parent"] == entry["id"] and child["stage"] == p["stage"]
        summary = json.loads((path / "eval" / p["stage"] / "summary.json").read_text())
        assert p["success"] == summary["overall"]["success"]["mean"] and p["episodes"] == summary["overall"]["episodes"]
        # the point sits where metrics.jsonl logged this eval, with the interval the trainer logged there
        assert any(s == p["step"] and v == p["success"] and math.isclose(p["ci95"][0], lo) and math.isclose(p["ci95"][1], hi)
                   for s, v, (lo, hi) in logged), (p, logged)
        assert get(srv, f"run/{p['run']}")["episodes"] == len(_jsonl(path / "eval" / p["stage"] / "episodes.jsonl"))
    for stage in ("before", "after"):
        point = next(p for p in held if p["stage"] == stage)
        assert point["interval"] == result[stage]["interval_kind"]  # the words the trainer printed
    if name == "grpo":
        assert doc["groups"] == len(_jsonl(path / "groups.jsonl")) > 0


def _flips(before: Path, after: Path) -> tuple[dict[str, str], int]:
    """From the two episodes.jsonl files alone: per task gained/lost, and the episodes flipped by seed."""
    def outcomes(p: Path) -> dict[tuple[str, int], bool]:
        return {(e["task_id"], e["info"]["seed"]): bool(e["success"]) for e in _jsonl(p / "episodes.jsonl")}

    a, b = outcomes(before), outcomes(after)
    assert a.keys() == b.keys()
    tasks = {t for t, _ in a}
    status = {}
    for t in tasks:
        was, now = any(v for (u, _), v in a.items() if u == t), any(v for (u, _), v in b.items() if u == t)
        if was != now:
            status[t] = "gained" if now else "lost"
    return status, sum(1 for k in a if a[k] != b[k])


@pytest.mark.parametrize("name", ["sft", "grpo"])
def test_before_after_comparison_lists_the_flipped_tasks(srv: ViewServer, real: dict[str, Path], name: str) -> None:
    index = get(srv, "index")
    entry = _run(index, real[name])
    first, last = entry["children"][0], entry["children"][-1]
    assert [first, last] in index["comparisons"]  # offered on the page
    doc = get(srv, f"compare/{first},{last}")
    status, episode_flips = _flips(real[name] / "eval" / "before", real[name] / "eval" / "after")
    assert {t["task"]: t["status"] for t in doc["tasks"] if t["status"] in ("gained", "lost")} == status
    assert sum(t["episode_flips"] for t in doc["tasks"]) == episode_flips
    assert doc["totals"]["status"].get("partial", 0) == 0 and doc["totals"]["shared_tasks"] == 10
    if name == "sft":  # the untrained model never answers; after SFT it does: tasks were gained
        assert status and set(status.values()) == {"gained"}
    # a flipped task's two transcripts, side by side, are the episodes of that task in each stage
    for t in (t for t in doc["tasks"] if t["status"] in ("gained", "lost")):
        for j, rid in enumerate((first, last)):
            chunk = get(srv, f"run/{rid}/chunk/0")["episodes"]
            assert {chunk[i]["task"] for i in t["runs"][j]["ids"]} == {t["task"]}

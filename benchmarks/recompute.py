"""Per-episode outcomes of the learning benchmarks, and every interval the README quotes, recomputed from them.

The learning benchmarks (``bench_real_run.py``, ``bench_imitation.py``, ``bench_strategies.py``) export the
held-out episodes of every arm and stage to ``benchmarks/results/episodes/<bench>/<arm>.jsonl.gz``, one line
per episode::

    {"bench", "arm", "stage", "env", "task", "seed", "sample", "run_seed", "success", "reward", "turns", "error"}

(``stage``: ``before``/``after`` a training run; ``run_seed``: the training seed of the run the episode
evaluates, ``null`` for a single run.) From those files alone, this script recomputes each arm's success
with its 95% interval (:func:`agentgym.eval.stats.success_interval`: a bootstrap over tasks, a task's
seeds, samples and training seeds kept together; Wilson where every task scores the same) and each paired
comparison (:func:`agentgym.eval.stats.paired_difference`: the (task, seed, sample, run seed) episodes both
arms ran, bootstrap over tasks). The benchmarks compute the figures they write with these same functions.

Run: ``python benchmarks/recompute.py [--bench real_run,imitation,strategies] [--results DIR] [--check]``;
``--check`` exits 1 if a benchmark JSON's recorded figure differs from the recomputed one.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentgym.eval.stats import paired_difference, success_interval

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ("bench", "arm", "stage", "env", "task", "seed", "sample", "run_seed", "success", "reward", "turns", "error")

# Which comparisons each benchmark reports: (label, arm a, stage a, arm b, stage b) for b - a.
PAIRS: dict[str, list[tuple[str, str, str, str, str]]] = {
    "real_run": [("grpo_vs_sft", "sft", "after", "grpo", "after"), ("sft_vs_base", "sft", "before", "sft", "after")],
    "imitation": [("search/dagger_vs_plain", "search-plain", "after", "search-dagger", "after"),
                  ("search/plain_2n_vs_plain", "search-plain", "after", "search-plain_2n", "after"),
                  ("search/dagger_vs_plain_2n", "search-plain_2n", "after", "search-dagger", "after"),
                  ("alfworld/relabelled_vs_plain", "alfworld-plain", "after", "alfworld-relabelled", "after")],
    "strategies": [(f"{arm}_vs_{ref}", ref, "after", arm, "after") for arm, ref in
                   (("gate", "baseline"), ("dapo", "baseline"), ("greso", "baseline"), ("pilot", "baseline"),
                    ("replay", "baseline"), ("gate_swept", "baseline"), ("greso_slice4", "baseline_slice4"))],
}


def episode_rows(eval_dir: Path, bench: str, arm: str, stage: str, run_seed: int | None = None) -> list[dict[str, Any]]:
    """An ``agentgym eval`` folder's episodes (the last record of each episode wins) as outcome rows."""
    last: dict[str, dict[str, Any]] = {}
    with open(Path(eval_dir) / "episodes.jsonl") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                last[r.get("info", {}).get("eval_key") or r["group_id"]] = r
    rows = []
    for r in last.values():
        info = r.get("info", {})
        rows.append({"bench": bench, "arm": arm, "stage": stage, "env": r["env_id"], "task": r["task_id"],
                     "seed": info.get("seed"), "sample": info.get("sample", r.get("member", 0)), "run_seed": run_seed,
                     "success": bool(r["success"]), "reward": float(r["reward"]), "turns": len(r.get("turns") or []),
                     "error": r.get("error")})
    rows.sort(key=lambda x: (x["env"], x["task"], x["seed"] if x["seed"] is not None else -1, x["sample"]))
    return rows


def episodes_file(bench: str, arm: str, results: Path = RESULTS) -> Path:
    return results / "episodes" / bench / f"{arm}.jsonl.gz"


def write_episodes(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Write ``rows`` gzip-compressed (no timestamp in the header, so the same rows give the same bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        for r in rows:
            gz.write((json.dumps({k: r.get(k) for k in FIELDS}) + "\n").encode())
    path.write_bytes(buf.getvalue())
    return path


def export(eval_dir: Path, bench: str, arm: str, stage: str, run_seed: int | None = None,
           results: Path = RESULTS) -> Path:
    """Add one eval folder's episodes to ``<results>/episodes/<bench>/<arm>.jsonl.gz`` (replacing the rows of the
    same stage and run seed, so rerunning an arm's eval replaces it)."""
    path = episodes_file(bench, arm, results)
    keep = [r for r in read_episodes(path) if (r["stage"], r["run_seed"]) != (stage, run_seed)]
    return write_episodes(path, keep + episode_rows(eval_dir, bench, arm, stage, run_seed))


def read_episodes(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with gzip.open(path, "rt") as f:
        return [json.loads(x) for x in f if x.strip()]


def arm_rows(bench: str, arm: str, stage: str, results: Path = RESULTS) -> list[dict[str, Any]]:
    return [r for r in read_episodes(episodes_file(bench, arm, results)) if r["stage"] == stage]


def arm_interval(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Success and its 95% interval over tasks (a task's seeds, samples and training seeds together)."""
    return success_interval([((r["env"], r["task"]), float(r["success"])) for r in rows])


def _key(r: dict[str, Any]) -> tuple[Any, Any]:
    return (r["env"], r["task"]), (r["seed"], r["sample"], r["run_seed"])


def paired(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """``b - a`` in success over the episodes both ran, paired bootstrap over tasks."""
    fa = {(k[0], k[1]): float(r["success"]) for r in a for k in [_key(r)]}
    fb = {(k[0], k[1]): float(r["success"]) for r in b for k in [_key(r)]}
    return paired_difference(fa, fb)


def recompute(bench: str, results: Path = RESULTS) -> dict[str, Any]:
    """Every arm's interval and every paired comparison of ``bench`` from its episode files."""
    folder = results / "episodes" / bench
    arms: dict[str, Any] = {}
    for path in sorted(folder.glob("*.jsonl.gz")):
        arm = path.name[: -len(".jsonl.gz")]
        rows = read_episodes(path)
        for stage in sorted({r["stage"] for r in rows}):
            arms.setdefault(arm, {})[stage] = arm_interval([r for r in rows if r["stage"] == stage])
    pairs = {}
    for label, arm_a, st_a, arm_b, st_b in PAIRS.get(bench, []):
        a, b = arm_rows(bench, arm_a, st_a, results), arm_rows(bench, arm_b, st_b, results)
        if a and b:
            pairs[label] = paired(a, b)
    return {"arms": arms, "paired": pairs}


def _fmt(x: dict[str, Any]) -> str:
    if x.get("mean") is None:
        return "-"
    ci = x["ci95"]
    return f"{100 * x['mean']:.1f}% [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _differs(recorded: Any, fresh: Any, tol: float = 1e-9) -> bool:
    """Whether two recomputable sections disagree (intervals compared on mean and ci95 only)."""
    if isinstance(recorded, dict) and isinstance(fresh, dict):
        keys = ("mean", "ci95") if "mean" in fresh else set(recorded) | set(fresh)
        return any(_differs(recorded.get(k), fresh.get(k), tol) for k in keys)
    if isinstance(recorded, list) and isinstance(fresh, list):
        return len(recorded) != len(fresh) or any(_differs(x, y, tol) for x, y in zip(recorded, fresh, strict=True))
    if isinstance(recorded, (int, float)) and isinstance(fresh, (int, float)):
        return abs(float(recorded) - float(fresh)) > tol
    return recorded != fresh


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default="real_run,imitation,strategies")
    ap.add_argument("--results", default=str(RESULTS), help="the folder holding <bench>.json and episodes/")
    ap.add_argument("--check", action="store_true", help="fail if a benchmark JSON's recorded figures differ")
    args = ap.parse_args()
    results = Path(args.results)
    bad = 0
    for bench in [b.strip() for b in args.bench.split(",") if b.strip()]:
        fresh = recompute(bench, results)
        print(f"== {bench}")
        if not fresh["arms"]:
            print(f"  no per-episode files in {results / 'episodes' / bench} (figures pending a rerun)")
            continue
        for arm, stages in fresh["arms"].items():
            for stage, x in stages.items():
                print(f"  {arm:>20} {stage:>6}: {_fmt(x)}  ({x['episodes']} episodes, {x['tasks']} tasks, {x['method']})")
        for label, x in fresh["paired"].items():
            ci = x["ci95"]
            print(f"  {label:>28}: {100 * x['mean']:+.1f} pp [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]  "
                  f"({x['pairs']} paired episodes, {x['tasks']} tasks)")
        recorded_file = results / f"{bench}.json"
        if args.check and recorded_file.exists():
            recorded = json.loads(recorded_file.read_text()).get("recomputable")
            if recorded is None:
                print(f"  {recorded_file.name} has no 'recomputable' section (written before per-episode export)")
                bad += 1
            elif _differs(recorded, fresh):
                print(f"  MISMATCH: {recorded_file.name}'s recorded figures differ from the recomputed ones")
                bad += 1
            else:
                print(f"  {recorded_file.name}: every recorded interval matches")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

"""What the viewer computes from the index rows: summaries, comparisons and training curves.

* :func:`breakdown`: per env and task type, success with its Wilson 95% interval, pass@k where a task was
  sampled more than once per seed, reward, turns, tokens, parse errors, truncations and errors
  (``summary.json`` has the per-env figures with intervals over seeds and pass@k; per task type it has only
  the success rate).
* :func:`compare`: two or more runs on the same tasks, task by task: which tasks flipped between the
  first and the last run, and the episodes of each task paired by (seed, sample) for side-by-side reading.
* :func:`metric_series` and :func:`heldout_curve`: a training run's ``metrics.jsonl`` as columns, and its
  held-out evals with their intervals at the steps ``metrics.jsonl`` logged them.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.eval.stats import pass_at_k, wilson_interval

__all__ = ["breakdown", "compare", "heldout_curve", "metric_series", "success_interval"]


def _natural(s: str) -> list[tuple[int, int | str]]:
    """Sort key that puts ``guess-9`` before ``guess-17``."""
    return [(0, int(x)) if x.isdigit() else (1, x) for x in re.split(r"(\d+)", s)]


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _pass_at_k(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Unbiased pass@k as ``summary.json`` computes it (``agentgym.eval.runner``): per seed, the mean over tasks
    with at least k episodes, then the mean over seeds; k = 1, 2, 4, ... up to the most episodes a task has in
    one seed, and that number itself. Empty when no task has two episodes in a seed (pass@1 is the success)."""
    per_seed: dict[Any, dict[tuple[str, str], list[bool]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        per_seed[r["seed"]][(r["env"], r["task"])].append(bool(r["success"]))
    most = max((len(v) for tasks in per_seed.values() for v in tasks.values()), default=0)
    if most < 2:
        return {}
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= most]
    if most not in ks:
        ks.append(most)
    out: dict[str, float] = {}
    for k in ks:
        vals = []
        for tasks in per_seed.values():
            scores = [pass_at_k(len(v), sum(v), k) for v in tasks.values() if len(v) >= k]
            if scores:
                vals.append(sum(scores) / len(scores))
        if vals:
            out[f"pass@{k}"] = sum(vals) / len(vals)
    return out


def _block(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    succ = sum(1 for r in rows if r["success"])
    turns = sum(r["turns"] for r in rows)
    perr = sum(r["parse_errors"] or 0 for r in rows)
    return {
        "episodes": n,
        "successes": succ,
        "success": succ / n if n else None,
        "wilson95": wilson_interval(succ, n),
        "pass_at_k": _pass_at_k(rows),
        "reward_mean": _mean([r["reward"] for r in rows if r["reward"] is not None]),
        "turns_mean": turns / n if n else None,
        "gen_tokens_mean": _mean([r["gen_tokens"] for r in rows if r["gen_tokens"] is not None]),
        "prompt_tokens_mean": _mean([r["prompt_tokens"] for r in rows if r["prompt_tokens"] is not None]),
        "parse_errors": perr,
        "parse_errors_per_turn": perr / turns if turns else None,
        "truncated": sum(1 for r in rows if r["truncated"]),
        "errors": sum(1 for r in rows if r["error"]),
        "wall_s_mean": _mean([r["wall_s"] for r in rows if r["wall_s"] is not None]),
    }


def breakdown(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One block per env (``type`` = None: all its episodes) followed by one per (env, task type)."""
    by_env: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_env[r["env"]].append(r)
    out = []
    for env in sorted(by_env):
        out.append({"env": env, "type": None, **_block(by_env[env])})
        by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in by_env[env]:
            by_type[r["type"]].append(r)
        if len(by_type) > 1:
            out += [{"env": env, "type": t, **_block(by_type[t])} for t in sorted(by_type)]
    return out


# the summary's ``success.method`` (agentgym.eval.stats.success_interval), worded as the trainer prints it
_INTERVAL_KINDS = {"wilson": "Wilson 95% over episodes", "bootstrap over tasks": "95% bootstrap over tasks"}


def success_interval(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """Success of an eval summary's ``overall`` block: mean with its 95% interval, labelled by the summary's
    ``method`` (a bootstrap over tasks, or Wilson over the episodes), or the Wilson interval of the pooled rate
    where an older summary had none. ``None`` without a summary."""
    ov = (summary or {}).get("overall")
    if not isinstance(ov, dict):
        return None
    s: dict[str, Any] = ov["success"] if isinstance(ov.get("success"), dict) else {}
    mean = s.get("mean")
    if not isinstance(mean, (int, float)):
        return None
    ci, kind = s.get("ci95"), _INTERVAL_KINDS.get(str(s.get("method")), "95% CI over seeds")  # no method: older summaries
    if not ci:
        ci, kind = s.get("wilson95"), "Wilson 95% (one seed)"
    return {"mean": float(mean), "ci95": ci if isinstance(ci, list) and len(ci) == 2 else None, "interval": kind,
            "episodes": ov.get("episodes")}


# ------------------------------------------------------------------------------------------------ compare
def compare(tables: Sequence[tuple[int, Sequence[dict[str, Any]]]]) -> dict[str, Any]:
    """Compare runs task by task.

    Args:
        tables: ``(run id, episode rows)`` per run, in order (the first is the baseline, the last the
            comparison; a task *flipped* when it was solved in one of those and not in the other).

    Returns:
        ``runs``; ``tasks``: one entry per (env, task) with, per run, episodes, successes and episode ids,
        ``status`` (``gained``, ``lost``, ``changed`` (first and last agree, a run between differs),
        ``same``, or ``partial`` (missing from a run)), ``episode_flips`` (paired episodes whose success
        differs between the first and last run) and ``pairs`` (episode ids and successes per run, paired by
        seed and sample); ``totals``: per run success over the tasks every run has, and the status counts.
    """
    ids = [rid for rid, _ in tables]
    n_runs = len(ids)
    cells: dict[tuple[str, str], list[list[dict[str, Any]]]] = {}
    types: dict[tuple[str, str], str] = {}
    for j, (_rid, rows) in enumerate(tables):
        for r in rows:
            k = (r["env"], r["task"])
            cells.setdefault(k, [[] for _ in range(n_runs)])[j].append(r)
            types.setdefault(k, r["type"])
    tasks = []
    counts: dict[str, int] = defaultdict(int)
    shared_succ = [0] * n_runs
    shared_n = [0] * n_runs
    for (env, task), per_run in sorted(cells.items(), key=lambda kv: (kv[0][0], _natural(kv[0][1]))):
        runs: list[dict[str, Any]] = []
        for rows in per_run:
            rows = sorted(rows, key=lambda r: (r["seed"] is None, r["seed"] or 0, r["sample"] or 0, r["id"]))
            runs.append({"episodes": len(rows), "successes": sum(1 for r in rows if r["success"]),
                         "ids": [r["id"] for r in rows]})
        # pair episodes across runs by (seed, sample); a key seen twice in one run pairs by order
        slots: dict[tuple[Any, Any, int], list[int | None]] = {}
        success: dict[tuple[Any, Any, int], list[bool | None]] = {}
        for j, rows in enumerate(per_run):
            seen: dict[tuple[Any, Any], int] = defaultdict(int)
            for r in rows:
                base = (r["seed"], r["sample"])
                key = (*base, seen[base])
                seen[base] += 1
                slots.setdefault(key, [None] * n_runs)[j] = r["id"]
                success.setdefault(key, [None] * n_runs)[j] = r["success"]
        order = sorted(slots, key=lambda k: (k[0] is None, k[0] if isinstance(k[0], int) else 0,
                                             k[1] if isinstance(k[1], int) else 0, k[2]))
        pairs = [{"seed": k[0], "sample": k[1], "eps": slots[k], "success": success[k]} for k in order]
        flips = sum(1 for v in success.values() if v[0] is not None and v[-1] is not None and v[0] != v[-1])
        present = [x["episodes"] > 0 for x in runs]
        solved = [x["successes"] > 0 for x in runs]
        if not all(present):
            status = "partial"
        elif solved[0] != solved[-1]:
            status = "gained" if solved[-1] else "lost"
        elif len(set(solved)) > 1:
            status = "changed"
        else:
            status = "same"
        counts[status] += 1
        if all(present):
            for j, x in enumerate(runs):
                shared_succ[j] += x["successes"]
                shared_n[j] += x["episodes"]
        tasks.append({"env": env, "task": task, "type": types[(env, task)], "runs": runs, "status": status,
                      "episode_flips": flips if n_runs > 1 else 0, "pairs": pairs})
    totals = {"status": dict(counts),
              "shared_tasks": sum(1 for t in tasks if t["status"] != "partial"),
              "runs": [{"run": rid, "episodes": shared_n[j], "successes": shared_succ[j],
                        "success": shared_succ[j] / shared_n[j] if shared_n[j] else None,
                        "wilson95": wilson_interval(shared_succ[j], shared_n[j])}
                       for j, rid in enumerate(ids)]}
    return {"runs": ids, "tasks": tasks, "totals": totals}


# ------------------------------------------------------------------------------------------------ training
def metric_series(path: Path) -> dict[str, Any]:
    """``metrics.jsonl`` as columns: ``steps`` (one per record) and ``series`` (numeric keys, ``None`` where a
    record lacks the key). Records are kept in file order; a step may appear twice (the before-eval record
    and the first training record are both logged at step 0). Torn or non-object lines are counted in
    ``skipped``."""
    records: list[dict[str, Any]] = []
    skipped = 0
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if not isinstance(rec, dict) or isinstance(rec.get("step"), bool) or not isinstance(rec.get("step"), (int, float)):
            skipped += 1
            continue
        records.append(rec)
    keys: dict[str, None] = {}
    for rec in records:
        for k, v in rec.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                keys[k] = None
    series = {k: [v if isinstance(v := rec.get(k), (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                  else None for rec in records] for k in keys}
    return {"steps": [rec["step"] for rec in records], "series": series, "records": len(records),
            "skipped": skipped}


def heldout_curve(stages: Sequence[tuple[int, str, dict[str, Any] | None]], metrics: dict[str, Any],
                  result: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The held-out evals of a training run as points: ``(run id, stage, step, success, ci95)``.

    The step is where ``metrics.jsonl`` logged the stage's ``eval/success`` (``before`` at 0, ``step-N``
    with the record of step N-1, ``after`` at the end), so the points sit on the same axis as the curves.
    """
    eval_steps = [s for s, v in zip(metrics.get("steps", []), metrics.get("series", {}).get("eval/success", []),
                                    strict=False) if v is not None]
    steps_done = result.get("steps") if isinstance(result, dict) and isinstance(result.get("steps"), int) else None
    last_logged = max(metrics.get("steps") or [0])
    out = []
    for rid, stage, summary in stages:
        if stage == "before":
            step: float | None = 0
        elif stage.startswith("step-") and stage[5:].isdigit():
            step = max(int(stage[5:]) - 1, 0)
        elif stage == "after":
            step = eval_steps[-1] if eval_steps else (steps_done if steps_done is not None else last_logged + 1)
        else:
            step = None
        s = success_interval(summary)
        out.append({"run": rid, "stage": stage, "step": step,
                    "success": s["mean"] if s else None, "ci95": s["ci95"] if s else None,
                    "interval": s["interval"] if s else None, "episodes": s["episodes"] if s else None})
    return out

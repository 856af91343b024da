"""The real run: SmolLM2-135M-Instruct learns Search-v0, imitate then reinforce, on this CPU machine.

Stage 1 (SFT, ``configs/train/search-sft.toml``) trains on expert transcripts collected through the
rollout engine; stage 2 (GRPO, ``configs/train/search-grpo.toml``) reinforces the SFT model with
rollouts through vLLM and a time budget. Every stage is the user's own command, run as a subprocess:

    agentgym collect --env agentgym/Search-v0 --policy expert --tasks 96 --out runs/real/expert.jsonl
    agentgym train --config configs/train/search-sft.toml
    agentgym train --config configs/train/search-grpo.toml

Held-out success (60 test tasks x 5 seeds, sampled at T=0.7) is measured for the base model, after SFT
and after GRPO, with the same protocol. Every held-out episode is exported to
``benchmarks/results/episodes/real_run/{sft,grpo}.jsonl.gz`` (``sft``: stage ``before`` is the base model,
``after`` the SFT model; ``grpo``: ``after``), and every interval in the JSON is computed from those files
by ``benchmarks/recompute.py``'s functions (95% bootstrap over tasks, Wilson where every task ties; the
GRPO gain paired over the same (task, seed) episodes), so ``python benchmarks/recompute.py --check``
reproduces them. Writes ``benchmarks/results/real_run.json`` and ``real_run.png`` (training reward per
GRPO step and the three held-out points).
Run: ``python benchmarks/bench_real_run.py [--skip-sft]`` (about an hour on 2 cores). A tiny end-to-end
check of the whole path: ``--collect-tasks 8 --sft-set data.epochs=1 --sft-set eval.tasks=2 ... --runs /tmp/r
--results /tmp/res`` (see ``make bench-smoke``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BIN = Path(sys.executable).parent
RUN = ROOT / "runs" / "real"

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recompute  # noqa: E402
from provenance import Provenance  # noqa: E402


def sh(*args: str) -> float:
    print("$", " ".join(args), flush=True)
    t0 = time.monotonic()
    subprocess.run([str(BIN / "agentgym"), *args], cwd=ROOT, check=True)
    return time.monotonic() - t0


def stage(result: dict[str, Any], key: str, interval: dict[str, Any]) -> dict[str, Any]:
    """One held-out point: the interval recomputed from the exported episodes, and the eval's wall-clock."""
    ev = result.get(key) or {}
    wall = ev.get("wall_s")
    return {"success": interval["mean"], "ci95": interval["ci95"], "ci_method": interval["method"],
            "episodes": interval["episodes"], "tasks": interval["tasks"],
            "eval_wall_s": round(wall, 1) if isinstance(wall, (int, float)) and wall == wall else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-sft", action="store_true", help="reuse runs/real/sft (stage 1 already ran)")
    ap.add_argument("--summarize", action="store_true", help="run nothing: build the JSON from runs/real")
    ap.add_argument("--note", default="", help="recorded in the JSON")
    ap.add_argument("--grpo-step", type=int, default=None, help="the GRPO checkpoint step --grpo-eval evaluated")
    ap.add_argument("--grpo-eval", default=None, help="an `agentgym eval` folder of a GRPO checkpoint, run with the "
                    "same protocol, used when the GRPO stage did not reach its own final eval")
    ap.add_argument("--resume-grpo", action="store_true", help="run only stage 2 again, resuming from its latest "
                    "checkpoint (with --skip-sft implied), then summarize")
    ap.add_argument("--grpo-budget-s", type=float, default=None, help="with --resume-grpo: the resumed stage's "
                    "run.time_budget_s (what is left of the hour)")
    ap.add_argument("--collect-tasks", type=int, default=96, help="expert transcripts for the SFT stage")
    ap.add_argument("--sft-set", action="append", default=[], help="extra --set for the SFT stage (repeatable)")
    ap.add_argument("--grpo-set", action="append", default=[], help="extra --set for the GRPO stage (repeatable)")
    ap.add_argument("--runs", default=str(RUN), help="run folder (default runs/real)")
    ap.add_argument("--results", default=str(RESULTS), help="where the JSON, plot and episodes/ go")
    args = ap.parse_args()
    run_dir, results = Path(args.runs), Path(args.results)
    prov = Provenance.start()
    if args.resume_grpo:
        args.skip_sft = True
    walls: dict[str, float] = {}
    sft_dir, grpo_dir = run_dir / "sft", run_dir / "grpo"
    sft_sets = [f"run.out_dir={sft_dir}", f"data.paths={json.dumps([str(run_dir / 'expert.jsonl')])}", *args.sft_set]
    grpo_sets = [f"run.out_dir={grpo_dir}", f"model.path={sft_dir / 'final'}", *args.grpo_set]
    if not args.skip_sft and not args.summarize:
        walls["collect_s"] = sh("collect", "--env", "agentgym/Search-v0", "--policy", "expert", "--tasks",
                                str(args.collect_tasks), "--out", str(run_dir / "expert.jsonl"))
        walls["sft_stage_s"] = sh("train", "--config", "configs/train/search-sft.toml", "--set", "run.resume=false",
                                  *_sets(sft_sets))
    if args.resume_grpo:  # continue the GRPO stage from its latest checkpoint (a killed or budgeted run)
        extra = [f"run.time_budget_s={args.grpo_budget_s}"] if args.grpo_budget_s else []
        walls["grpo_resumed_stage_s"] = sh("train", "--config", "configs/train/search-grpo.toml", "--set", "run.resume=true",
                                           *_sets(grpo_sets + extra))
    elif not args.summarize:
        walls["grpo_stage_s"] = sh("train", "--config", "configs/train/search-grpo.toml", "--set", "run.resume=false",
                                   *_sets(grpo_sets))
    sft = json.loads((sft_dir / "result.json").read_text())
    rl_file = grpo_dir / "result.json"
    rl = json.loads(rl_file.read_text()) if rl_file.exists() else {}
    # every held-out episode, exported; the intervals below come from these files alone
    recompute.export(sft_dir / "eval" / "before", "real_run", "sft", "before", results=results)
    recompute.export(sft_dir / "eval" / "after", "real_run", "sft", "after", results=results)
    recompute.export(Path(args.grpo_eval) if args.grpo_eval else grpo_dir / "eval" / "after", "real_run", "grpo",
                     "after", results=results)
    fresh = recompute.recompute("real_run", results)
    rows = [json.loads(x) for x in (grpo_dir / "metrics.jsonl").read_text().splitlines()]
    # reward: the groups the step trained on (zero-variance groups filtered out); success_all: every finished episode
    curve = [{"step": r["step"], "reward": r.get("rollout/reward_mean"),
              "success_all": r.get("rollout_all/success_rate"), "elapsed_s": r.get("elapsed_s")}
             for r in rows if r.get("rollout/reward_mean") is not None]
    out = {
        "env": "agentgym/Search-v0", "model": "SmolLM2-135M-Instruct",
        "protocol": ("held-out test split, 60 tasks x 5 seeds, T=0.7 with per-turn sampling seeds; 95% CI: bootstrap "
                     "over tasks (Wilson where every task ties), from benchmarks/results/episodes/real_run/"),
        "base": stage(sft, "before", fresh["arms"]["sft"]["before"]), "sft": stage(sft, "after", fresh["arms"]["sft"]["after"]),
        "sft_plus_grpo": stage(rl, "after", fresh["arms"]["grpo"]["after"]),
        "paired_difference": fresh["paired"]["grpo_vs_sft"],
        "recomputable": fresh,
        "grpo_eval_source": args.grpo_eval or "the GRPO run's own final eval",
        "note": args.note,
        "sft_train_s": round(sft.get("train_wall_s", 0.0), 1), "sft_steps": sft.get("steps"),
        "grpo_train_s": round(_elapsed_at(rows, args.grpo_step) if args.grpo_step else _train_seconds(rows), 1),
        # the SFT stage's loop time less its two evals (base model, then the SFT model)
        "sft_training_only_s": round(sft.get("train_wall_s", 0.0) - sft["before"].get("wall_s", 0.0)
                                     - sft["after"].get("wall_s", 0.0), 1),
        "grpo_steps": rl.get("steps") or args.grpo_step,
        "grpo_steps_logged": max((r["step"] for r in rows if "rollout/reward_mean" in r), default=-1) + 1,
        "grpo_stopped_by_time_budget_at_step": rl.get("stopped_by_time_budget_at_step"),
        "stage_wall_s": {k: round(v, 1) for k, v in walls.items()},
        "grpo_training_reward_curve": curve,
        "configs": ["configs/train/search-sft.toml", "configs/train/search-grpo.toml"],
        "extra_sets": {"sft": args.sft_set, "grpo": args.grpo_set},
        "provenance": prov.finish(),
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / "real_run.json").write_text(json.dumps(out, indent=1))
    _plot(out, results / "real_run.png")
    for k in ("base", "sft", "sft_plus_grpo"):
        s = out[k]
        print(f"{k:>14}: {100 * s['success']:.1f}% [{100 * s['ci95'][0]:.1f}, {100 * s['ci95'][1]:.1f}] ({s['episodes']} episodes)")
    print(f"SFT {out['sft_train_s']} s, GRPO {out['grpo_train_s']} s ({out['grpo_steps']} steps); wrote {results / 'real_run.json'}")


def _sets(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def _train_seconds(rows: list[dict[str, Any]]) -> float:
    """Training-loop seconds over every invocation of a run (a resumed run restarts ``elapsed_s``): the sum of
    each segment's last ``elapsed_s``. The final eval is not included; a ``before`` eval is (subtract it)."""
    total = last = 0.0
    for r in rows:
        e = r.get("elapsed_s")
        if not isinstance(e, (int, float)):
            continue
        if e < last:  # a new invocation
            total += last
        last = e
    return total + last


def _elapsed_at(rows: list[dict[str, Any]], step: int | None) -> float:
    """Training-loop seconds when step ``step`` had finished (from metrics.jsonl)."""
    hits = [r["elapsed_s"] for r in rows if step is not None and r.get("step") == step - 1 and "elapsed_s" in r]
    return float(hits[0]) if hits else 0.0


def _plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    c = out["grpo_training_reward_curve"]
    a.plot([r["step"] for r in c], [r["reward"] for r in c], marker=".", alpha=0.5, label="per step (T=1.0)")
    ys = [r["reward"] for r in c]
    win = 8
    if len(ys) >= win:
        a.plot([r["step"] for r in c][win - 1:], [sum(ys[i - win + 1:i + 1]) / win for i in range(win - 1, len(ys))],
               lw=2, label=f"mean of the last {win} steps")
    every = [(r["step"], r["success_all"]) for r in c if r.get("success_all") is not None]
    if every:  # beside it, what the filtered mean hides: success over every episode the step rolled out
        a.plot([x for x, _ in every], [y for _, y in every], marker=".", color="#888", alpha=0.8,
               label="success, every episode (unfiltered)")
    a.legend(fontsize=8)
    a.set_xlabel("GRPO step")
    a.set_ylabel("rollout/reward_mean, rollout_all/success_rate")
    a.set_title("training reward of the groups each step trained on (zero-variance\ngroups excluded), and success over "
                "every episode", fontsize=9)
    a.grid(alpha=0.3)
    names = ["base", "sft", "sft_plus_grpo"]
    ys = [100 * out[n]["success"] for n in names]
    lo = [y - 100 * out[n]["ci95"][0] for y, n in zip(ys, names, strict=True)]
    hi = [100 * out[n]["ci95"][1] - y for y, n in zip(ys, names, strict=True)]
    b.bar(["base", "SFT", "SFT + GRPO"], ys, yerr=[lo, hi], capsize=6, color=["#bbb", "#6a9fd8", "#2a6fb8"])
    b.set_ylabel("held-out success (%)")
    b.set_title("Search-v0 test, 95% CI (bootstrap over tasks)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

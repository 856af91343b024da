"""The real run: SmolLM2-135M-Instruct learns Search-v0, imitate then reinforce, on this CPU machine.

Stage 1 (SFT, ``configs/train/search-sft.toml``) trains on expert transcripts collected through the
rollout engine; stage 2 (GRPO, ``configs/train/search-grpo.toml``) reinforces the SFT model with
rollouts through vLLM and a time budget. Every stage is the user's own command, run as a subprocess:

    agentgym collect --env agentgym/Search-v0 --policy expert --tasks 96 --out runs/real/expert.jsonl
    agentgym train --config configs/train/search-sft.toml
    agentgym train --config configs/train/search-grpo.toml

Held-out success (60 test tasks x 5 seeds, sampled at T=0.7, 95% CI over seeds) is measured for the
base model, after SFT and after GRPO, with the same protocol. Writes ``benchmarks/results/real_run.json``
and ``benchmarks/results/real_run.png`` (training reward per GRPO step and the three held-out points).
Run: ``python benchmarks/bench_real_run.py [--skip-sft]`` (about an hour on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BIN = Path(sys.executable).parent
RUN = ROOT / "runs" / "real"


def sh(*args: str) -> float:
    print("$", " ".join(args), flush=True)
    t0 = time.monotonic()
    subprocess.run([str(BIN / "agentgym"), *args], cwd=ROOT, check=True)
    return time.monotonic() - t0


def stage(result: dict[str, Any], key: str) -> dict[str, Any]:
    ev = result[key]
    return {"success": ev["success"], "ci95": ev["success_ci95"], "episodes": ev["episodes"], "eval_wall_s": round(ev["wall_s"], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-sft", action="store_true", help="reuse runs/real/sft (stage 1 already ran)")
    args = ap.parse_args()
    walls: dict[str, float] = {}
    if not args.skip_sft:
        walls["collect_s"] = sh("collect", "--env", "agentgym/Search-v0", "--policy", "expert", "--tasks", "96",
                                "--out", str(RUN / "expert.jsonl"))
        walls["sft_stage_s"] = sh("train", "--config", "configs/train/search-sft.toml", "--set", "run.resume=false")
    walls["grpo_stage_s"] = sh("train", "--config", "configs/train/search-grpo.toml", "--set", "run.resume=false")
    sft = json.loads((RUN / "sft" / "result.json").read_text())
    rl = json.loads((RUN / "grpo" / "result.json").read_text())
    rows = [json.loads(x) for x in (RUN / "grpo" / "metrics.jsonl").read_text().splitlines()]
    curve = [{"step": r["step"], "reward": r.get("rollout/reward_mean"), "elapsed_s": r.get("elapsed_s")}
             for r in rows if r.get("rollout/reward_mean") is not None]
    out = {
        "env": "agentgym/Search-v0", "model": "SmolLM2-135M-Instruct",
        "protocol": "held-out test split, 60 tasks x 5 seeds, T=0.7 with per-turn sampling seeds; 95% CI over seeds",
        "base": stage(sft, "before"), "sft": stage(sft, "after"), "sft_plus_grpo": stage(rl, "after"),
        "sft_train_s": round(sft.get("train_wall_s", 0.0), 1), "sft_steps": sft.get("steps"),
        "grpo_train_s": round(rl.get("train_wall_s", 0.0), 1), "grpo_steps": rl.get("steps"),
        "grpo_stopped_by_time_budget_at_step": rl.get("stopped_by_time_budget_at_step"),
        "stage_wall_s": {k: round(v, 1) for k, v in walls.items()},
        "grpo_training_reward_curve": curve,
        "configs": ["configs/train/search-sft.toml", "configs/train/search-grpo.toml"],
        "command": "python benchmarks/bench_real_run.py",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "real_run.json").write_text(json.dumps(out, indent=1))
    _plot(out, RESULTS / "real_run.png")
    for k in ("base", "sft", "sft_plus_grpo"):
        s = out[k]
        print(f"{k:>14}: {100 * s['success']:.1f}% [{100 * s['ci95'][0]:.1f}, {100 * s['ci95'][1]:.1f}] ({s['episodes']} episodes)")
    print(f"SFT {out['sft_train_s']} s, GRPO {out['grpo_train_s']} s ({out['grpo_steps']} steps); wrote {RESULTS / 'real_run.json'}")


def _plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    c = out["grpo_training_reward_curve"]
    a.plot([r["step"] for r in c], [r["reward"] for r in c], marker=".", label="GRPO rollouts (T=1.0)")
    a.set_xlabel("GRPO step")
    a.set_ylabel("mean reward")
    a.set_title("training reward")
    a.grid(alpha=0.3)
    names = ["base", "sft", "sft_plus_grpo"]
    ys = [100 * out[n]["success"] for n in names]
    lo = [y - 100 * out[n]["ci95"][0] for y, n in zip(ys, names, strict=True)]
    hi = [100 * out[n]["ci95"][1] - y for y, n in zip(ys, names, strict=True)]
    b.bar(["base", "SFT", "SFT + GRPO"], ys, yerr=[lo, hi], capsize=6, color=["#bbb", "#6a9fd8", "#2a6fb8"])
    b.set_ylabel("held-out success (%)")
    b.set_title("Search-v0 test, 95% CI over 5 seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

"""SFT trained tokens/s with sequence packing against one padded sample per row, SmolLM2-135M on CPU.

Workload: the real run's SFT stage (``configs/train/search-sft.toml``): ``--episodes`` expert transcripts of
``--env`` (default Search-v0, whose samples vary most in length among the shipped envs: 625..942 SmolLM2 tokens;
Demo-v0's are all ~630, SQL-v0's ~1,000), collected through the rollout engine (``CollectWorkflow`` with the
env's expert, as ``agentgym collect`` does), rendered with SmolLM2's own chat template (loss on assistant tokens
only), in batches of ``--batch-size`` samples; bf16 weights, AdamW, token budget 4096 per micro-batch.

* **unpacked**: ``optim.pack_sequences = false``: samples sorted by length, each in its own row, padded to the
  longest of its micro-batch.
* **packed**: ``optim.pack_sequences = true``, rows of ``--pack-len`` tokens holding several samples with a
  block-diagonal causal attention (per-sample ``position_ids``).

Both arms train the same batches (the same samples in the same order) from the same initial weights with
learning rate 0 (AdamW still does its whole step), so every repeat sees the same model and the same work.
Per repeat each arm trains every batch once; the arms alternate which goes first; one warm-up batch per arm
before the first repeat is not timed. Reported: trained (assistant) tokens/s and all tokens/s per arm, the
packed/unpacked ratio per repeat, means and 95% t-intervals over repeats, padding efficiency, and the largest
difference in the reported loss between the arms (the two must agree up to bf16 rounding).
Writes ``benchmarks/results/packing.json``.

Run: ``python benchmarks/bench_packing.py [--repeats 3] [--episodes 32] [--pack-len 2048] [--env agentgym/Search-v0]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "packing.json"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def interval(xs: list[float]) -> dict[str, Any]:
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return {"mean": m, "ci95": None, "n": len(xs)}
    h = T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))
    return {"mean": m, "ci95": [m - h, m + h], "n": len(xs)}


def transcripts(env_id: str, episodes: int) -> list[Any]:
    from agentgym.policies.scripted import ExpertPolicy

    from agentgym.eval.runner import select_tasks
    from agentgym.registration import make
    from agentgym.rollout import GroupRequest, RolloutEngine, RolloutLimits, RolloutRuntime
    from agentgym.rollout.collect import CollectWorkflow

    env = make(env_id)
    tasks = select_tasks(list(env.get_wrapper_attr("tasks")("train")), episodes)
    env.close()

    async def run() -> list[Any]:
        with RolloutRuntime(8) as rt:
            wf = CollectWorkflow(ExpertPolicy(), 1, limits=RolloutLimits(max_turns=30))
            return await RolloutEngine(rt).run(wf, [GroupRequest(env_id, t.task_id, seed=0) for t in tasks])

    return [t for g in asyncio.run(run()) for t in g]


def trainer(model_path: str, pack: bool, pack_len: int) -> Any:
    import torch
    from agentgym.trainers.config import OptimConfig
    from agentgym.trainers.model import load_causal_lm
    from agentgym.trainers.trainer import PolicyTrainer

    torch.manual_seed(0)
    model = load_causal_lm(model_path, "bfloat16")
    return PolicyTrainer("policy", model, algorithm="sft",
                         optim=OptimConfig(lr=0.0, token_budget=4096, grad_clip=1.0, pack_sequences=pack,
                                           pack_len=pack_len))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--pack-len", type=int, default=2048)
    ap.add_argument("--env", default="agentgym/Search-v0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    import torch
    import transformers
    from agentgym.policies.models import load_tokenizer, resolve_model
    from agentgym.trainers.sft import sft_samples

    torch.set_num_threads(args.threads)
    prov = Provenance.start()
    load_start = os.getloadavg()
    model_path = str(resolve_model("smollm2-135m-instruct"))
    samples, counts = sft_samples(transcripts(args.env, args.episodes), load_tokenizer(model_path))
    bs = args.batch_size
    batches = [samples[k:k + bs] for k in range(0, len(samples), bs)]
    print(f"{len(samples)} samples ({counts['trained_tokens']} trained tokens), lengths "
          f"{min(len(s) for s in samples)}..{max(len(s) for s in samples)}, {len(batches)} batches", flush=True)
    arms = {"unpacked": trainer(model_path, False, args.pack_len), "packed": trainer(model_path, True, args.pack_len)}
    for name, tr in arms.items():  # warm-up: one batch each, not timed
        tr.train_on(batches[0])
        print(f"  warm-up {name} done", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    loss_diff = 0.0
    for rep in range(args.repeats):
        order = list(arms) if rep % 2 == 0 else list(reversed(arms))
        losses: dict[str, list[float]] = {}
        for name in order:
            tr = arms[name]
            trained = total = 0
            padded = real = 0.0
            t0 = time.perf_counter()
            losses[name] = []
            for b in batches:
                m = tr.train_on(b)
                trained += m["trained_tokens"]
                total += sum(len(s) for s in b)
                losses[name].append(float(m["loss"]))
                real += sum(len(s) for s in b)
                padded += sum(len(s) for s in b) / m["padding_efficiency"]
            wall = time.perf_counter() - t0
            runs[name].append({"repeat": rep, "wall_s": wall, "trained_tokens_per_s": trained / wall,
                               "tokens_per_s": total / wall, "padding_efficiency": real / padded})
            print(f"  repeat {rep} {name}: {wall:.1f} s, {trained / wall:.1f} trained tokens/s", flush=True)
        loss_diff = max(loss_diff, *(abs(a - b) for a, b in zip(losses["packed"], losses["unpacked"], strict=True)))
    ratios = [p["trained_tokens_per_s"] / u["trained_tokens_per_s"]
              for p, u in zip(runs["packed"], runs["unpacked"], strict=True)]
    result: dict[str, Any] = {
        "argv": sys.argv, "workload": {"env": args.env, "episodes": args.episodes, "samples": len(samples),
                                       "batch_size": bs, "batches": len(batches), "trained_tokens": counts["trained_tokens"],
                                       "sample_lengths": sorted(len(s) for s in samples), "pack_len": args.pack_len,
                                       "token_budget": 4096, "dtype": "bfloat16", "model": "smollm2-135m-instruct"},
        "arms": {name: {"runs": rs, "trained_tokens_per_s": interval([r["trained_tokens_per_s"] for r in rs]),
                        "tokens_per_s": interval([r["tokens_per_s"] for r in rs]),
                        "padding_efficiency": rs[0]["padding_efficiency"]} for name, rs in runs.items()},
        "packed_over_unpacked": interval(ratios), "ratios": ratios,
        "max_loss_difference": loss_diff,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "machine": {"cpus": os.cpu_count(), "threads": args.threads, "loadavg_start": load_start,
                    "loadavg_end": os.getloadavg(), "platform": platform.platform()},
        "provenance": prov.finish(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    r = result["packed_over_unpacked"]
    print(f"packed / unpacked trained tokens/s: {r['mean']:.3f} (95% CI {r['ci95']}) over {len(ratios)} repeats; "
          f"padding efficiency {result['arms']['unpacked']['padding_efficiency']:.2f} -> "
          f"{result['arms']['packed']['padding_efficiency']:.2f}; max loss difference {loss_diff:.2e}")


if __name__ == "__main__":
    main()

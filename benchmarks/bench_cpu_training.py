"""What a SmolLM2-135M training step costs on this CPU: weight dtype and torch threads.

One forward + backward of SmolLM2-135M-Instruct on a 128-token sequence (causal-LM loss over every token), in
each setting below (``--settings`` picks a subset), each in its own subprocess (torch's thread pool is fixed per process), interleaved over
``--rounds`` rounds so a change in the machine's load hits every setting alike:

* ``fp32-1t``: float32 weights, 1 torch thread;
* ``fp32-2t``: float32 weights, 2 threads (this machine's core count);
* ``bf16-1t`` / ``bf16-2t``: bfloat16 weights, 1 or 2 threads;
* ``amp-2t``: float32 weights under ``torch.autocast("cpu", dtype=torch.bfloat16)``, 2 threads.

Each measurement is the second of two passes (the first warms up), as process CPU time and wall time, with the
1-minute load average before it. On a shared, oversubscribed 2-core machine the wall time is mostly other jobs';
CPU time is the cost that stays. Writes ``benchmarks/results/cpu_training.json``.

Run: ``python benchmarks/bench_cpu_training.py [--rounds 3] [--tokens 128] [--settings fp32-1t,fp32-2t]
[--out cpu_training.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
SETTINGS = {"fp32-1t": ("float32", 1), "fp32-2t": ("float32", 2), "bf16-1t": ("bfloat16", 1), "bf16-2t": ("bfloat16", 2),
            "amp-2t": ("amp", 2)}

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402

CHILD = r"""
import json, os, sys, time, torch
from transformers import AutoModelForCausalLM
from agentgym.policies.models import resolve_model
dtype, threads, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
torch.manual_seed(0)
amp = dtype == "amp"  # fp32 weights, bf16 autocast (matmuls in bf16: AMX where the CPU has it)
m = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m-instruct"),
                                         dtype=torch.float32 if amp else getattr(torch, dtype))
x = torch.randint(0, 40000, (1, tokens))
out = []
for _ in range(2):
    load = os.getloadavg()[0]
    t, c = time.perf_counter(), time.process_time()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        loss = m(input_ids=x, labels=x).loss
    loss.backward()
    out.append({"wall_s": time.perf_counter() - t, "cpu_s": time.process_time() - c, "load1": load})
    m.zero_grad(set_to_none=True)
print("@@" + json.dumps(out[-1]))
"""


def measure(name: str, tokens: int) -> dict[str, Any]:
    dtype, threads = SETTINGS[name]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run([sys.executable, "-c", CHILD, dtype, str(threads), str(tokens)], capture_output=True, text=True,
                       env=env, timeout=1800, check=True)
    line = next(x for x in p.stdout.splitlines() if x.startswith("@@"))
    return json.loads(line[2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"a subset of {', '.join(SETTINGS)}")
    ap.add_argument("--out", default="cpu_training.json", help="file name under benchmarks/results/")
    args = ap.parse_args()
    names = [s for s in args.settings.split(",") if s]
    if unknown := set(names) - set(SETTINGS):
        ap.error(f"unknown settings {sorted(unknown)}")
    prov = Provenance.start()
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            runs[name].append(measure(name, args.tokens))
            print(f"round {r} {name}: {runs[name][-1]}", flush=True)
    summary = {}
    for name, xs in runs.items():
        cpu = [x["cpu_s"] for x in xs]
        wall = [x["wall_s"] for x in xs]
        summary[name] = {"cpu_s_median": statistics.median(cpu), "cpu_s_range": [min(cpu), max(cpu)],
                         "wall_s_median": statistics.median(wall), "wall_s_range": [min(wall), max(wall)],
                         "tokens_per_cpu_s": args.tokens / statistics.median(cpu),
                         "tokens_per_wall_s": args.tokens / statistics.median(wall)}
    import importlib.metadata as md

    import torch

    out = {"benchmark": "SmolLM2-135M forward+backward, one sequence", "tokens": args.tokens, "rounds": args.rounds,
           "runs": runs, "summary": summary, "argv": sys.argv,
           "versions": {"torch": md.version("torch"), "transformers": md.version("transformers")},
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "cpu_capability": torch.backends.cpu.get_cpu_capability(), "load_avg_end": os.getloadavg()},
           "provenance": prov.finish()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps(out, indent=1))
    for name, s in summary.items():
        print(f"{name}: CPU {s['cpu_s_median']:.2f} s {s['cpu_s_range']}, wall {s['wall_s_median']:.1f} s, "
              f"{s['tokens_per_cpu_s']:.0f} tok/CPU-s")


if __name__ == "__main__":
    main()

"""Generation throughput of HFPolicy and VLLMPolicy on the same 64 chat prompts, vs raw vLLM.

Each backend runs in its own subprocess (one engine at a time, clean shutdown), on SmolLM2-135M
with greedy decoding so every backend generates (nearly) the same tokens:

* ``raw``: vLLM's offline ``LLM.generate`` on the prompt ids: the ceiling.
* ``VLLMPolicy.generate`` with all 64 requests in one call, and with 64 concurrent
  single-request calls (how the rollout engine uses it). Raw and policy engines live in the same
  process with the same engine arguments and are timed in alternating rounds; medians reported.
* ``hf``: ``HFPolicy.generate`` (static batches of ``--hf-batch`` rows, fp32 on CPU).

Prints a table and writes ``benchmarks/results/policies.json``. ``--quick`` generates 16 tokens
per prompt instead of 64. Run: ``python benchmarks/bench_policies.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "policies.json"
ENGINE = {"dtype": "bfloat16", "max_model_len": 2048, "max_num_seqs": 64, "enforce_eager": True, "seed": 0}

SUBJECTS = ["the Moon", "volcanoes", "honey bees", "the Roman Empire", "photosynthesis", "chess", "the Pacific Ocean",
            "electric cars"]
ASKS = ["Explain {} to a child.", "Give three facts about {}.", "Write a short poem about {}.", "Why is {} important?",
        "Summarize the history of {}.", "What are common myths about {}?", "Describe {} in one paragraph.",
        "List two questions a student might ask about {}."]


def prompts() -> list[list[dict[str, str]]]:
    """The 64 chat prompts (8 subjects x 8 asks), the same for every backend."""
    return [[{"role": "user", "content": a.format(s)}] for s in SUBJECTS for a in ASKS]


def _prompt_ids(model_path: str) -> list[list[int]]:
    from agentgym.policies.models import load_tokenizer

    tok = load_tokenizer(model_path)
    out = []
    for msgs in prompts():
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    return out


def _summary(name: str, seconds: float, tokens: int, n: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"backend": name, "seconds": round(seconds, 3), "generated_tokens": tokens, "requests": n,
            "tokens_per_s": round(tokens / seconds, 2), "requests_per_s": round(n / seconds, 3), **(extra or {})}


def run_vllm_pair(model_path: str, max_tokens: int, rounds: int) -> list[dict[str, Any]]:
    """Raw ``LLM.generate`` and VLLMPolicy side by side, timed in alternating rounds (medians).

    Alternating cancels slow drifts in machine load, which matter on a shared CPU.
    """
    from agentgym.policies.vllm import VLLMPolicy
    from vllm import LLM
    from vllm import SamplingParams as VSP
    from vllm.inputs import TokensPrompt

    from agentgym.policy import GenRequest, SamplingParams

    ids = _prompt_ids(model_path)
    llm = LLM(model=model_path, **ENGINE)
    policy = VLLMPolicy(model_path, kv_cache_gib=2, **ENGINE)
    vsp = VSP(temperature=0.0, max_tokens=max_tokens, logprobs=0)
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    reqs = [GenRequest(messages=m, sampling=sp) for m in prompts()]
    times: dict[str, list[float]] = {"raw": [], "one": [], "conc": []}
    tokens: dict[str, int] = {}

    async def policy_round() -> None:
        t0 = time.perf_counter()
        gens = await policy.generate(reqs)
        times["one"].append(time.perf_counter() - t0)
        tokens["one"] = sum(len(g.token_ids) for g in gens)
        t0 = time.perf_counter()
        per = await asyncio.gather(*(policy.generate([r]) for r in reqs))
        times["conc"].append(time.perf_counter() - t0)
        tokens["conc"] = sum(len(g[0].token_ids) for g in per)

    try:
        llm.generate([TokensPrompt(prompt_token_ids=ids[0])], vsp, use_tqdm=False)  # warm-up
        asyncio.run(policy.generate(reqs[:1]))
        for _ in range(rounds):
            t0 = time.perf_counter()
            outs = llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids], vsp, use_tqdm=False)
            times["raw"].append(time.perf_counter() - t0)
            tokens["raw"] = sum(len(o.outputs[0].token_ids) for o in outs)
            asyncio.run(policy_round())
    finally:
        policy.shutdown()
    names = {"raw": "raw vLLM LLM.generate", "one": "VLLMPolicy (one call)", "conc": "VLLMPolicy (64 concurrent calls)"}
    return [_summary(names[k], statistics.median(v), tokens[k], len(ids), {"round_seconds": [round(x, 2) for x in v]})
            for k, v in times.items()]


def run_hf(model_path: str, max_tokens: int, batch: int) -> list[dict[str, Any]]:
    import torch
    from agentgym.policies.hf import HFPolicy

    from agentgym.policy import GenRequest, SamplingParams

    policy = HFPolicy(model_path, max_batch_size=batch, dtype="float32")
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    reqs = [GenRequest(messages=m, sampling=sp) for m in prompts()]

    async def go() -> list[dict[str, Any]]:
        await policy.generate(reqs[:1])
        t0 = time.perf_counter()
        gens = await policy.generate(reqs)
        dt = time.perf_counter() - t0
        return [_summary(f"HFPolicy (fp32, batch {batch})", dt, sum(len(g.token_ids) for g in gens), len(reqs),
                         {"torch_threads": torch.get_num_threads()})]

    return asyncio.run(go())


def _child(args: argparse.Namespace) -> None:
    from agentgym.policies.models import resolve_model

    path = resolve_model(args.model)
    if args.backend == "vllm":
        res = run_vllm_pair(path, args.max_tokens, args.rounds)
    else:
        res = run_hf(path, args.max_tokens, args.hf_batch)
    print("RESULT " + json.dumps(res), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16 new tokens per prompt instead of 64")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--backends", default="vllm,hf")
    ap.add_argument("--rounds", type=int, default=None, help="alternating raw/VLLMPolicy rounds (default 3, quick 2)")
    ap.add_argument("--backend", help=argparse.SUPPRESS)  # internal: run one backend in this process
    args = ap.parse_args()
    if args.max_tokens is None:
        args.max_tokens = 16 if args.quick else 64
    if args.rounds is None:
        args.rounds = 2 if args.quick else 3
    if args.backend:
        _child(args)
        return
    from agentgym.policies.models import resolve_model

    resolve_model(args.model)  # prepare once, outside the timings
    rows: list[dict[str, Any]] = []
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_LOGGING_LEVEL": "WARNING"}
    for backend in args.backends.split(","):
        cmd = [sys.executable, __file__, "--backend", backend, "--model", args.model,
               "--max-tokens", str(args.max_tokens), "--hf-batch", str(args.hf_batch), "--rounds", str(args.rounds)]
        print(f"running {backend} ...", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"backend {backend} failed (exit {proc.returncode})")
        rows += json.loads(line[len("RESULT "):])
    raw = next((r for r in rows if r["backend"].startswith("raw")), None)
    for r in rows:
        r["ratio_vs_raw_tokens_per_s"] = round(r["tokens_per_s"] / raw["tokens_per_s"], 3) if raw else None
    print(f"\n{'backend':38s} {'tok/s':>8s} {'req/s':>7s} {'tokens':>7s} {'vs raw':>7s}")
    for r in rows:
        ratio = f"{r['ratio_vs_raw_tokens_per_s']:.0%}" if r["ratio_vs_raw_tokens_per_s"] is not None else "-"
        print(f"{r['backend']:38s} {r['tokens_per_s']:8.1f} {r['requests_per_s']:7.2f} {r['generated_tokens']:7d} {ratio:>7s}")
    out = {
        "benchmark": "policies",
        "model": args.model,
        "prompts": len(prompts()),
        "max_tokens": args.max_tokens,
        "decoding": "greedy",
        "engine": ENGINE,
        "rounds": args.rounds,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "load_average_at_end": os.getloadavg()[0],
        "note": "CPU only; measured on a shared machine, so absolute figures are noisy. Ratios are from the same run.",
        "results": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()

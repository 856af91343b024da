"""Generation throughput of VLLMPolicy and HFPolicy, each against its own engine, on the same 64 prompts.

Each backend runs in its own subprocess (one engine at a time, clean shutdown), on SmolLM2-135M
with greedy decoding so every method generates (nearly) the same tokens:

* vLLM: the policy's own ``AsyncLLM`` engine called directly (64 concurrent ``engine.generate`` on the
  prompt ids: the ceiling) vs ``VLLMPolicy.generate`` with all 64 requests in one call and with 64
  concurrent single-request calls (how the rollout engine uses it). Same engine, timed in alternating
  rounds; medians reported. A wrapper cannot beat its engine: a ratio near 1.0 is parity.
* HF: plain ``model.generate`` on the same model object (static left-padded batches of ``--hf-batch``)
  vs ``HFPolicy.generate`` (continuous batching, ``max_batch_size=--hf-batch``), alternating rounds.

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
    """The policy's own AsyncLLM engine called raw vs through VLLMPolicy, in alternating rounds (medians)."""
    import uuid

    from agentgym.policies.vllm import VLLMPolicy, vllm_sampling_params
    from vllm.inputs import TokensPrompt

    from agentgym.policy import GenRequest, SamplingParams

    ids = _prompt_ids(model_path)
    policy = VLLMPolicy(model_path, kv_cache_gib=2, **ENGINE)
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    reqs = [GenRequest(prompt_token_ids=i, sampling=sp) for i in ids]
    times: dict[str, list[float]] = {"raw": [], "one": [], "conc": []}
    tokens: dict[str, int] = {}

    async def raw_one(prompt: list[int]) -> int:
        final = None
        async for out in policy.engine.generate(TokensPrompt(prompt_token_ids=prompt),
                                                vllm_sampling_params(sp, 1, max_tokens), uuid.uuid4().hex):
            final = out
        assert final is not None
        return len(final.outputs[0].token_ids)

    async def raw_round() -> None:  # runs on the policy's engine loop, like the policy's own calls
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(raw_one(i) for i in ids))
        times["raw"].append(time.perf_counter() - t0)
        tokens["raw"] = sum(counts)

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
        asyncio.run(policy.generate(reqs[:2]))  # warm-up, through both paths
        asyncio.run_coroutine_threadsafe(raw_one(ids[0]), policy._loop).result()
        for r in range(rounds):
            order = [raw_round, policy_round] if r % 2 == 0 else [policy_round, raw_round]
            for fn in order:
                if fn is raw_round:
                    asyncio.run_coroutine_threadsafe(raw_round(), policy._loop).result()
                else:
                    asyncio.run(policy_round())
    finally:
        policy.shutdown()
    names = {"raw": "vLLM AsyncLLM engine, called directly", "one": "VLLMPolicy (one call)",
             "conc": "VLLMPolicy (64 concurrent calls)"}
    return [_summary(names[k], statistics.median(v), tokens[k], len(ids),
                     {"group": "vllm", "round_seconds": [round(x, 2) for x in v]}) for k, v in times.items()]


def run_hf(model_path: str, max_tokens: int, batch: int, rounds: int) -> list[dict[str, Any]]:
    """Plain ``model.generate`` (static batches) vs HFPolicy on the same model, alternating rounds (medians)."""
    import torch
    from agentgym.policies.hf import HFPolicy

    from agentgym.policy import GenRequest, SamplingParams

    policy = HFPolicy(model_path, max_batch_size=batch)  # dtype auto: bf16 on CPUs with native bf16
    model = policy.model
    ids = _prompt_ids(model_path)
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    reqs = [GenRequest(prompt_token_ids=i, sampling=sp) for i in ids]
    times: dict[str, list[float]] = {"plain": [], "policy": []}
    tokens: dict[str, int] = {}

    def plain_batch(batch_ids: list[list[int]]) -> int:
        w = max(len(p) for p in batch_ids)
        x = torch.full((len(batch_ids), w), policy.pad_id, dtype=torch.long)
        mask = torch.zeros_like(x)
        for b, p in enumerate(batch_ids):
            x[b, w - len(p):] = torch.tensor(p)
            mask[b, w - len(p):] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=x, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
                                 pad_token_id=policy.pad_id)
        n = 0
        for row in out[:, w:].tolist():
            cut = next((k + 1 for k, t in enumerate(row) if t in policy.eos_ids), len(row))
            n += cut
        return n

    def plain_round() -> None:
        t0 = time.perf_counter()
        tokens["plain"] = sum(plain_batch(ids[i:i + batch]) for i in range(0, len(ids), batch))
        times["plain"].append(time.perf_counter() - t0)

    def policy_round() -> None:
        t0 = time.perf_counter()
        gens = asyncio.run(policy.generate(reqs))
        times["policy"].append(time.perf_counter() - t0)
        tokens["policy"] = sum(len(g.token_ids) for g in gens)

    plain_batch(ids[:2])  # warm-up, both paths
    asyncio.run(policy.generate(reqs[:2]))
    for r in range(rounds):
        for fn in ([plain_round, policy_round] if r % 2 == 0 else [policy_round, plain_round]):
            fn()
    asyncio.run(policy.aclose())
    dtype = str(model.dtype).replace("torch.", "")
    names = {"plain": f"transformers model.generate ({dtype}, batch {batch})",
             "policy": f"HFPolicy ({dtype}, continuous batching, max {batch} rows)"}
    return [_summary(names[k], statistics.median(v), tokens[k], len(ids),
                     {"group": "hf", "round_seconds": [round(x, 2) for x in v], "torch_threads": torch.get_num_threads()})
            for k, v in times.items()]


def _child(args: argparse.Namespace) -> None:
    from agentgym.policies.models import resolve_model

    path = resolve_model(args.model)
    if args.backend == "vllm":
        res = run_vllm_pair(path, args.max_tokens, args.rounds)
    else:
        res = run_hf(path, args.max_tokens, args.hf_batch, args.rounds)
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
    for group in ("vllm", "hf"):
        base = next((r for r in rows if r.get("group") == group), None)  # the engine called directly comes first
        for r in rows:
            if base is not None and r.get("group") == group:
                r["ratio_vs_engine_tokens_per_s"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3)
    print(f"\n{'backend':52s} {'tok/s':>8s} {'req/s':>7s} {'tokens':>7s} {'vs engine':>9s}")
    for r in rows:
        ratio = f"{r['ratio_vs_engine_tokens_per_s']:.0%}" if "ratio_vs_engine_tokens_per_s" in r else "-"
        print(f"{r['backend']:52s} {r['tokens_per_s']:8.1f} {r['requests_per_s']:7.2f} {r['generated_tokens']:7d} {ratio:>9s}")
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
        "command": "python benchmarks/bench_policies.py" + (" --quick" if args.quick else ""),
        "note": "CPU only. Each ratio compares a policy with its own engine, in the same process, alternating rounds.",
        "results": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()

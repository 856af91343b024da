"""Generation throughput of VLLMPolicy and HFPolicy, each against its own engine, on the same 64 prompts.

Each backend runs in its own subprocess (one engine at a time, clean shutdown), on SmolLM2-135M
with greedy decoding so every method generates (nearly) the same tokens:

* vLLM: the policy's own ``AsyncLLM`` engine called directly (64 concurrent ``engine.generate`` on the
  prompt ids: the ceiling) vs ``VLLMPolicy.generate`` with all 64 requests in one call and with 64
  concurrent single-request calls (how the rollout engine uses it). Same engine, timed in alternating
  rounds; medians reported. A wrapper cannot beat its engine: a ratio near 1.0 is parity.
* HF: plain ``model.generate`` on the same model object (static left-padded batches of ``--hf-batch``)
  vs ``HFPolicy.generate`` (continuous batching, ``max_batch_size=--hf-batch``), alternating rounds.

Two more sections measure HFPolicy on CPU (``--sections``; each in its own subprocess):

* ``multiturn``: the prefix cache against today's behaviour (the whole conversation prefilled every
  turn) on the workload a new user runs first: ``agentgym eval`` of SmolLM2 through ``hf:`` on SQL-v0
  (``--mt-tasks`` test tasks, ``--mt-turns`` turns, ``--mt-max-tokens`` per turn, the eval's default seeded
  sampling at T=1.0). One model, two policies over it (``prefix_cache_gib`` 1 and 0), the same eval in
  alternating rounds, each round from an empty cache. Reports wall-clock per arm, the per-round speed-up
  with a 95% t-interval over rounds, prompt tokens forwarded, and whether both arms generated the same
  tokens (they should: fp32 by default, seeded sampling).
* ``dtype``: float32 against bfloat16 weights on a long prompt (SQL-v0's first prompt, 942 tokens, as a
  new user's eval sends it): prefill alone, then prefill + 32 greedy tokens, alternating rounds, medians and
  the per-round ratio's interval. ``dtype="auto"`` picks bf16 only on CPUs with native bf16 (the JSON's
  ``provenance.cpu``), since emulated bf16 matmuls are slower.

Prints a table and merges its sections into ``benchmarks/results/policies.json`` (a section not run
keeps its last result). ``--quick`` generates 16 tokens per prompt instead of 64.
Run: ``python benchmarks/bench_policies.py [--sections engines,multiturn,dtype] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance

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

def _ratio_ci(ratios: list[float]) -> dict[str, Any]:
    """Geometric mean of per-round ratios with a 95% t-interval over the rounds' logs (rounds are paired:
    adjacent, the same work)."""
    from agentgym.eval.stats import ratio_ci

    r = ratio_ci(ratios)
    return {"mean": round(r["mean"], 3), "ci95": [round(x, 3) for x in r["ci95"]] if r["ci95"] else None,
            "per_round": [round(x, 3) for x in ratios]}


def sql_first_prompt(model_path: str) -> list[int]:
    """SQL-v0's first test prompt with its tools, through SmolLM2's template (942 tokens)."""
    import gymnasium
    from agentgym.policies.models import load_tokenizer

    import agentgym  # noqa: F401  (registers the envs)

    env = gymnasium.make("agentgym/SQL-v0")
    obs, info = env.reset(seed=0, options={"split": "test"})
    env.close()
    tok = load_tokenizer(model_path)
    text = tok.apply_chat_template(obs, tools=info["tools"], tokenize=False, add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def run_multiturn(model_path: str, dtype: str, tasks: int, turns: int, max_tokens: int, rounds: int) -> dict[str, Any]:
    """``agentgym eval`` on SQL-v0 through HFPolicy, prefix cache on vs off, alternating rounds."""
    import tempfile

    import torch
    from agentgym.policies.hf import HFPolicy

    from agentgym.eval import EvalConfig, arun_eval

    on = HFPolicy(model_path, dtype=dtype, policy_id="hf")
    off = HFPolicy.from_model(on.model, on.tokenizer, policy_id="hf", prefix_cache_gib=0)
    arms = {"cache_on": on, "cache_off": off}
    cfg = EvalConfig(["agentgym/SQL-v0"], split="test", tasks=tasks, samples=1, seeds=[0], max_turns=turns,
                     max_tokens=max_tokens, concurrency=tasks)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    same: list[bool] = []

    def one(arm: str) -> dict[str, Any]:
        pol = arms[arm]
        pol.clear_prefix_cache()
        pre = pol.prefill_tokens
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            asyncio.run(arun_eval(pol, cfg, Path(tmp)))
            wall = time.perf_counter() - t0
            eps = [json.loads(x) for x in (Path(tmp) / "episodes.jsonl").read_text().splitlines()]
        eps.sort(key=lambda e: e["task_id"])
        comps = [[t["completion_token_ids"] for t in e["turns"]] for e in eps]
        return {"wall_s": round(wall, 2), "episodes": len(eps), "turns": sum(len(c) for c in comps),
                "generated_tokens": sum(len(t) for c in comps for t in c),
                "prompt_tokens_forwarded": pol.prefill_tokens - pre,
                # a Turn's prompt_token_ids are the delta since the previous turn: the context is their running sum
                "context_tokens_last_turn": [sum(len(t["prompt_token_ids"]) + len(t["completion_token_ids"])
                                                 for t in e["turns"][:-1]) + len(e["turns"][-1]["prompt_token_ids"])
                                             for e in eps if e["turns"]],
                "errors": sum(1 for e in eps if e.get("error")), "_comps": comps}

    for pol in arms.values():  # warm-up: one short generation each
        from agentgym.policy import GenRequest, SamplingParams

        asyncio.run(pol.generate([GenRequest(messages=[{"role": "user", "content": "hi"}],
                                             sampling=SamplingParams(max_tokens=4))]))
    for r in range(rounds):
        order = ["cache_off", "cache_on"] if r % 2 == 0 else ["cache_on", "cache_off"]
        res = {a: one(a) for a in order}
        same.append(res["cache_on"]["_comps"] == res["cache_off"]["_comps"])
        for a in arms:
            res[a].pop("_comps")
            runs[a].append(res[a])
        print(f"  round {r}: " + ", ".join(f"{a} {res[a]['wall_s']} s" for a in order), flush=True)
    speedups = [o["wall_s"] / n["wall_s"] for o, n in zip(runs["cache_off"], runs["cache_on"], strict=True)]
    stats = on.prefix_cache.stats() if on.prefix_cache else {}
    asyncio.run(on.aclose())
    asyncio.run(off.aclose())
    return {"workload": {"env": "agentgym/SQL-v0", "split": "test", "tasks": tasks, "max_turns": turns,
                         "max_tokens": max_tokens, "temperature": cfg.temperature, "sampling_seeds": cfg.sampling_seeds,
                         "concurrency": tasks, "dtype": str(on.model.dtype).replace("torch.", "")},
            "rounds": rounds, "torch_threads": torch.get_num_threads(), "runs": runs,
            "wall_s_median": {a: statistics.median(x["wall_s"] for x in v) for a, v in runs.items()},
            "speedup_cache_on": _ratio_ci(speedups), "same_tokens_every_round": all(same),
            "same_tokens_per_round": same, "prefix_cache_stats_last_round": stats}


def run_dtype(model_path: str, rounds: int, max_tokens: int) -> dict[str, Any]:
    """float32 vs bfloat16 weights: prefill of the 942-token SQL prompt, then prefill + ``max_tokens`` greedy."""
    import torch
    from agentgym.policies.hf import HFPolicy

    from agentgym.policy import GenRequest, SamplingParams

    ids = sql_first_prompt(model_path)
    pols = {d: HFPolicy(model_path, dtype=d, prefix_cache_gib=0) for d in ("float32", "bfloat16")}
    prefill = GenRequest(prompt_token_ids=ids, sampling=SamplingParams(temperature=0.0, max_tokens=1))
    full = GenRequest(prompt_token_ids=ids, sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens))
    times: dict[str, dict[str, list[float]]] = {d: {"prefill_s": [], "total_s": [], "decode_tok_s": []} for d in pols}
    tokens: dict[str, int] = {}

    def one(d: str) -> None:
        pol = pols[d]
        t0 = time.perf_counter()
        asyncio.run(pol.generate([prefill]))
        t1 = time.perf_counter()
        (g,) = asyncio.run(pol.generate([full]))
        t2 = time.perf_counter()
        tokens[d] = len(g.token_ids)
        times[d]["prefill_s"].append(t1 - t0)
        times[d]["total_s"].append(t2 - t1)
        times[d]["decode_tok_s"].append((len(g.token_ids) - 1) / max(1e-9, (t2 - t1) - (t1 - t0)))

    for d in pols:  # warm-up
        asyncio.run(pols[d].generate([GenRequest(prompt_token_ids=ids[:64], sampling=SamplingParams(max_tokens=2))]))
    for r in range(rounds):
        for d in (["float32", "bfloat16"] if r % 2 == 0 else ["bfloat16", "float32"]):
            one(d)
        print(f"  round {r}: " + ", ".join(f"{d} prefill {times[d]['prefill_s'][-1]:.2f} s, total "
                                          f"{times[d]['total_s'][-1]:.2f} s" for d in pols), flush=True)
    for pol in pols.values():
        asyncio.run(pol.aclose())
    med = {d: {k: round(statistics.median(v), 3) for k, v in t.items()} for d, t in times.items()}
    return {"prompt_tokens": len(ids), "max_tokens": max_tokens, "generated_tokens": tokens, "rounds": rounds,
            "torch_threads": torch.get_num_threads(), "native_bf16": _native_bf16(),
            "per_round": {d: {k: [round(x, 3) for x in v] for k, v in t.items()} for d, t in times.items()},
            "median": med,
            "bf16_over_fp32_time": {k: _ratio_ci([b / f for b, f in zip(times["bfloat16"][k], times["float32"][k],
                                                                         strict=True)])
                                    for k in ("prefill_s", "total_s")}}


def _native_bf16() -> bool:
    from agentgym.policies.hf import cpu_has_native_bf16

    return cpu_has_native_bf16()


def _child(args: argparse.Namespace) -> None:
    from agentgym.policies.models import resolve_model

    path = resolve_model(args.model)
    res: Any
    if args.backend == "vllm":
        res = run_vllm_pair(path, args.max_tokens, args.rounds)
    elif args.backend == "hf":
        res = run_hf(path, args.max_tokens, args.hf_batch, args.rounds)
    elif args.backend == "multiturn":
        res = run_multiturn(path, args.mt_dtype, args.mt_tasks, args.mt_turns, args.mt_max_tokens, args.rounds)
    else:
        res = run_dtype(path, args.rounds, args.dtype_max_tokens)
    print("RESULT " + json.dumps(res), flush=True)


def _run_child(args: argparse.Namespace, backend: str, env: dict[str, str]) -> Any:
    cmd = [sys.executable, __file__, "--backend", backend, "--model", args.model, "--max-tokens", str(args.max_tokens),
           "--hf-batch", str(args.hf_batch), "--rounds", str(args.rounds), "--mt-tasks", str(args.mt_tasks),
           "--mt-turns", str(args.mt_turns), "--mt-max-tokens", str(args.mt_max_tokens), "--mt-dtype", args.mt_dtype,
           "--dtype-max-tokens", str(args.dtype_max_tokens)]
    print(f"running {backend} ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=4 * 3600, env=env)
    for ln in proc.stdout.splitlines():
        if ln.startswith("  round"):
            print(ln, flush=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"{backend} failed (exit {proc.returncode})")
    return json.loads(line[len("RESULT "):])


def engines_section(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for backend in args.backends.split(","):
        rows += _run_child(args, backend, env)
    for group in ("vllm", "hf"):
        base = next((r for r in rows if r.get("group") == group), None)  # the engine called directly comes first
        for r in rows:
            if base is not None and r.get("group") == group:
                r["ratio_vs_engine_tokens_per_s"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3)
    print(f"\n{'backend':52s} {'tok/s':>8s} {'req/s':>7s} {'tokens':>7s} {'vs engine':>9s}")
    for r in rows:
        ratio = f"{r['ratio_vs_engine_tokens_per_s']:.0%}" if "ratio_vs_engine_tokens_per_s" in r else "-"
        print(f"{r['backend']:52s} {r['tokens_per_s']:8.1f} {r['requests_per_s']:7.2f} {r['generated_tokens']:7d} {ratio:>9s}")
    return {"prompts": len(prompts()), "max_tokens": args.max_tokens, "decoding": "greedy", "engine": ENGINE,
            "rounds": args.rounds,
            "note": "Each ratio compares a policy with its own engine, in the same process, alternating rounds.",
            "results": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="engines,multiturn,dtype")
    ap.add_argument("--quick", action="store_true", help="16 new tokens per prompt instead of 64")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--backends", default="vllm,hf", help="engines section: which engines")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds per section (default 3, quick 2)")
    ap.add_argument("--mt-tasks", type=int, default=3, help="multiturn: SQL-v0 test tasks (episodes in flight)")
    ap.add_argument("--mt-turns", type=int, default=3, help="multiturn: max turns per episode")
    ap.add_argument("--mt-max-tokens", type=int, default=128, help="multiturn: max tokens per turn")
    ap.add_argument("--mt-dtype", default="float32", help="multiturn: weights dtype of both arms")
    ap.add_argument("--dtype-max-tokens", type=int, default=32, help="dtype: greedy tokens after the long prompt")
    ap.add_argument("--out", default=str(RESULTS))
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
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_LOGGING_LEVEL": "WARNING"}
    path = Path(args.out)
    out: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if "sections" not in out:  # the layout before sections: everything was the engines comparison
        old = {k: v for k, v in out.items() if k != "benchmark"}
        out = {"benchmark": "policies", "sections": {"engines": old} if old else {}}
    out["model"] = args.model
    for section in [x.strip() for x in args.sections.split(",") if x.strip()]:
        prov = Provenance.start()
        if section == "engines":
            res = engines_section(args, env)
        elif section in ("multiturn", "dtype"):
            res = _run_child(args, section, env)
            print(json.dumps({k: v for k, v in res.items() if k not in ("runs", "per_round")}, indent=1))
        else:
            raise SystemExit(f"unknown section {section!r} (engines, multiturn, dtype)")
        res["provenance"] = prov.finish()
        out["sections"][section] = res
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")  # after each section: a later failure keeps it
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()

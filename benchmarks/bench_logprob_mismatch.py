"""How far the rollout backend's logprobs are from the trainer's on the same tokens (why TIS exists).

SmolLM2-135M-Instruct samples completions for 32 chat prompts (temperature 1, 64 tokens) in
``VLLMPolicy`` (bf16, what a real run uses on CPU) and in ``HFPolicy`` (fp32, the in-process
backend). The trainer's model (``agentgym.trainers.model``, fp32 and bf16) then scores exactly the
same prompt + completion ids, with the weights unchanged: every difference comes from numerics
(dtype, kernels, batching), not from stale weights. Reported per pair: mean and p99 of
``|logp_trainer - logp_rollout|``, the mean importance ratio ``exp(logp_trainer - logp_rollout)``
and the share of tokens whose ratio falls outside [0.8, 1.25] (where a TIS cap of 2 starts to bite
only far out). Writes ``benchmarks/results/logprob_mismatch.json``.
Run: ``python benchmarks/bench_logprob_mismatch.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from provenance import Provenance  # benchmarks/ is on sys.path when a script runs

RESULTS = Path(__file__).resolve().parent / "results" / "logprob_mismatch.json"
SUBJECTS = ["the Moon", "volcanoes", "honey bees", "chess"]
ASKS = ["Explain {} to a child.", "Give three facts about {}.", "Write a short poem about {}.", "Why is {} important?",
        "Summarize the history of {}.", "What are common myths about {}?", "Describe {} in one paragraph.",
        "List two questions a student might ask about {}."]


def _requests() -> list[Any]:
    from agentgym.policy import GenRequest, SamplingParams

    return [GenRequest(messages=[{"role": "user", "content": a.format(s)}],
                       sampling=SamplingParams(temperature=1.0, max_tokens=64, seed=i))
            for i, (s, a) in enumerate((s, a) for s in SUBJECTS for a in ASKS)]


def _score(model_path: str, dtype: str, gens: list[Any]) -> list[list[float]]:
    import torch
    from agentgym.trainers.batching import TrainSample, collate
    from agentgym.trainers.model import load_causal_lm, token_logprobs

    model = load_causal_lm(model_path, dtype).eval()
    out = []
    with torch.no_grad():
        for g in gens:
            ids = list(g.prompt_token_ids) + list(g.token_ids)
            mask = [0] * len(g.prompt_token_ids) + [1] * len(g.token_ids)
            mb = collate([TrainSample("p", ids, mask)], [0], [1.0])
            lp, _ = token_logprobs(model, mb)
            out.append(lp[0, len(g.prompt_token_ids) - 1:].tolist())
    return out


def _compare(trainer: list[list[float]], rollout: list[Any]) -> dict[str, Any]:
    import torch

    t = torch.tensor([x for row in trainer for x in row], dtype=torch.float64)
    r = torch.tensor([x for g in rollout for x in g.logprobs], dtype=torch.float64)
    assert t.shape == r.shape, (t.shape, r.shape)
    ok = torch.isfinite(r)
    d = (t - r)[ok]
    ratio = torch.exp(d)
    return {"tokens": int(ok.sum()), "mean_abs_diff": round(float(d.abs().mean()), 5),
            "p99_abs_diff": round(float(d.abs().quantile(0.99)), 5), "max_abs_diff": round(float(d.abs().max()), 4),
            "mean_ratio": round(float(ratio.mean()), 5),
            "share_ratio_outside_0.8_1.25": round(float(((ratio < 0.8) | (ratio > 1.25)).double().mean()), 5),
            "share_ratio_above_2": round(float((ratio > 2).double().mean()), 5)}


def main() -> None:
    from agentgym.policies.hf import HFPolicy
    from agentgym.policies.models import resolve_model

    prov = Provenance.start()
    path = resolve_model("smollm2-135m-instruct")
    reqs = _requests()
    out: dict[str, Any] = {"benchmark": "logprob_mismatch", "model": "SmolLM2-135M-Instruct", "prompts": len(reqs),
                           "max_tokens": 64, "temperature": 1.0, "pairs": {}}
    t0 = time.monotonic()
    hf = HFPolicy(path, dtype="float32")
    hf_gens = asyncio.run(hf.generate(reqs))
    backends = {"hf-fp32": hf_gens}
    try:
        from agentgym.policies.vllm import VLLMPolicy

        v = VLLMPolicy(path, dtype="bfloat16", kv_cache_gib=1, max_model_len=2048, max_num_seqs=32)
        try:
            backends["vllm-bf16"] = asyncio.run(v.generate(reqs))
        finally:
            v.shutdown()
    except ImportError as e:
        out["vllm"] = f"not installed: {e}"
    for tdt in ("float32", "bfloat16"):
        for name, gens in backends.items():
            out["pairs"][f"trainer-{tdt} vs {name}"] = _compare(_score(path, tdt, gens), gens)
    out["wall_s"] = round(time.monotonic() - t0, 1)
    out["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count()}
    out["provenance"] = prov.finish()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    for k, v in out["pairs"].items():
        print(f"{k:34s} mean|d| {v['mean_abs_diff']:.4f}  p99 {v['p99_abs_diff']:.4f}  "
              f"outside[0.8,1.25] {100 * v['share_ratio_outside_0.8_1.25']:.2f}%")


if __name__ == "__main__":
    main()

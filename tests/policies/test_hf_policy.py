"""HFPolicy on the real SmolLM2 (CPU): batching, logprobs, seeds, weights, deadlines, context."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agentgym.policies.weights import WeightDelta

from agentgym.errors import ConfigurationError, ContextLengthExceeded, PolicyTimeout
from agentgym.policy import GenRequest, SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France?", "Name three primary colors.", "What is 2+2?", "Say hello in Spanish."]


def _req(q: str, **sp: Any) -> GenRequest:
    sp.setdefault("max_tokens", 10)
    return GenRequest(messages=[{"role": "user", "content": q}], sampling=SamplingParams(**sp))


async def test_left_padded_batch_equals_one_by_one(hf_policy: Any) -> None:
    batch = await hf_policy.generate([_req(q, temperature=0.0) for q in QUESTIONS])
    for q, g in zip(QUESTIONS, batch, strict=True):
        (single,) = await hf_policy.generate([_req(q, temperature=0.0)])
        assert single.token_ids == g.token_ids, q


async def test_logprobs_match_a_teacher_forced_forward_pass(hf_policy: Any) -> None:
    import torch

    gens = await hf_policy.generate([_req(q, temperature=1.0, max_tokens=8) for q in QUESTIONS[:2]])
    for g in gens:
        ids = torch.tensor([g.prompt_token_ids + g.token_ids])
        with torch.no_grad():
            logits = hf_policy.model(ids).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        p = len(g.prompt_token_ids)
        expected = [lp[p - 1 + i, t].item() for i, t in enumerate(g.token_ids)]
        assert g.logprobs == pytest.approx(expected, abs=2e-3)


async def test_seeded_sampling_is_reproducible(hf_policy: Any) -> None:
    a, b, c = await hf_policy.generate([_req("Tell me a word.", seed=7, max_tokens=12)] * 2 + [_req("Tell me a word.", seed=8, max_tokens=12)])
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
    # n samples of a seeded request use seed, seed + 1, ...
    d, e = await hf_policy.generate([GenRequest(messages=[{"role": "user", "content": "Tell me a word."}],
                                                sampling=SamplingParams(seed=7, max_tokens=12), n=2)])
    assert d.token_ids == a.token_ids and e.token_ids == c.token_ids


async def test_top_k_1_and_tiny_top_p_are_greedy(hf_policy: Any) -> None:
    g1, g2, g3 = await hf_policy.generate([_req(QUESTIONS[0], temperature=0.0), _req(QUESTIONS[0], temperature=0.8, top_k=1),
                                           _req(QUESTIONS[0], temperature=1.0, top_p=1e-6)])
    assert g1.token_ids == g2.token_ids == g3.token_ids


async def test_tools_reach_the_prompt(hf_policy: Any) -> None:
    tools: Any = [{"type": "function", "function": {"name": "lookup_capital", "description": "Capital of a country.",
                                                     "parameters": {"type": "object", "properties": {}}}}]
    req = GenRequest(messages=[{"role": "user", "content": "Capital of Peru?"}], tools=tools, sampling=SamplingParams(max_tokens=2))
    (g,) = await hf_policy.generate([req])
    assert "lookup_capital" in hf_policy.tokenizer.decode(g.prompt_token_ids)


async def test_weight_updates_change_outputs_and_versions(hf_policy: Any) -> None:
    req = _req(QUESTIONS[0], temperature=0.0, max_tokens=12)
    (before,) = await hf_policy.generate([req])
    v0 = hf_policy.weight_version
    name = "model.layers.3.mlp.down_proj.weight"
    original = hf_policy.state_dict()[name].detach().clone()
    changed = original.clone()
    changed.view(-1)[::3] += 0.5
    delta = WeightDelta.from_diff({name: original}, {name: changed}, base_version=v0)
    assert 0 < delta.num_changed() < original.numel()
    try:
        assert hf_policy.update_weights(delta, v0 + 1) == [name]
        (after,) = await hf_policy.generate([req])
        assert after.weight_version == v0 + 1 and before.weight_version == v0
        assert max(abs(a - b) for a, b in zip(after.logprobs, before.logprobs, strict=False)) > 1e-2
        with pytest.raises(ConfigurationError, match="monotonic"):
            hf_policy.update_weights({name: original}, v0)
        with pytest.raises(ConfigurationError, match="does not have"):
            hf_policy.update_weights({"no.such.weight": original}, v0 + 2)
    finally:
        await hf_policy.update_weights_async({name: original}, v0 + 2)
    (restored,) = await hf_policy.generate([req])
    assert restored.token_ids == before.token_ids and restored.weight_version == v0 + 2


async def test_deadline_raises_and_policy_stays_usable(hf_policy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_policy, "timeout_s", 0.5)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(PolicyTimeout):
        await hf_policy.generate([_req("Write a very long essay about the sea.", max_tokens=400, temperature=1.0)] * 4)
    assert loop.time() - t0 < 5
    monkeypatch.setattr(hf_policy, "timeout_s", 600.0)
    (g,) = await hf_policy.generate([_req(QUESTIONS[2], max_tokens=3)])
    assert len(g.token_ids) <= 3


async def test_context_error_or_left_truncation(hf_policy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    long = _req("word " * 300, max_tokens=4)
    monkeypatch.setattr(hf_policy, "context_length", 128)
    with pytest.raises(ContextLengthExceeded, match="truncation='left'"):
        await hf_policy.generate([long])
    monkeypatch.setattr(hf_policy, "truncation", "left")
    (g,) = await hf_policy.generate([long])
    assert len(g.prompt_token_ids) + 4 <= 128 and len(g.token_ids) <= 4
    # a prompt that fits, with too big a budget: max_tokens is clipped to the room left
    (h,) = await hf_policy.generate([_req("hi", max_tokens=1000, temperature=1.0)])
    assert len(h.prompt_token_ids) + len(h.token_ids) <= 128

"""HFPolicy on the real SmolLM2 (CPU): batching, logprobs, seeds, weights, deadlines, context."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentgym.errors import ContextLengthExceeded, PolicyTimeout, VersionNotNewer, WeightUpdateRejected
from agentgym.policy import GenRequest, SamplingParams
from agentgym.weights import WeightUpdate, crc32, diff

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
    idx, vals = diff(original, changed)
    delta = WeightUpdate.delta({name: idx}, {name: vals}, {name: crc32(original)})
    assert 0 < delta.num_changed() < original.numel()
    try:
        assert hf_policy.update_weights(delta, v0 + 1) == [name]
        (after,) = await hf_policy.generate([req])
        assert after.weight_version == v0 + 1 and before.weight_version == v0
        assert max(abs(a - b) for a, b in zip(after.logprobs, before.logprobs, strict=False)) > 1e-2
        with pytest.raises(VersionNotNewer):
            hf_policy.update_weights(WeightUpdate.full({name: original}), v0 + 1)
        with pytest.raises(WeightUpdateRejected, match="does not have"):
            hf_policy.update_weights(WeightUpdate.full({"no.such.weight": original}), v0 + 2)
    finally:
        await hf_policy.update_weights_async(WeightUpdate.full({name: original}), v0 + 2)
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


async def test_concurrent_calls_join_the_running_batch(hf_policy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that arrives while a batch is decoding joins it at the next step (continuous batching)."""
    import time

    # Each decode step sleeps 50 ms (releasing the GIL), so the 40-token request is still decoding when the
    # late one is submitted even on a loaded machine: without it, a slow submission on a busy CI host could
    # arrive only as the first request was finishing, and the step count below read 41.
    decode = hf_policy._decode_step

    def slow_decode() -> Any:
        time.sleep(0.05)
        return decode()

    monkeypatch.setattr(hf_policy, "_decode_step", slow_decode)
    long_req = _req("Write a long story about a dragon.", temperature=0.0, max_tokens=40)
    first = asyncio.ensure_future(hf_policy.generate([long_req]))
    while hf_policy._active == []:  # wait until the first row is decoding
        await asyncio.sleep(0.01)
    steps0 = hf_policy.steps
    (late,) = await hf_policy.generate([_req(QUESTIONS[2], temperature=0.0, max_tokens=3)])
    (early,) = await first
    assert len(early.token_ids) == 40 and len(late.token_ids) <= 3
    # the late request finished while the first was still running: it shared decode steps
    assert hf_policy.steps - steps0 < 40 and max(hf_policy.batch_sizes[-45:]) >= 2
    monkeypatch.undo()
    (alone,) = await hf_policy.generate([_req(QUESTIONS[2], temperature=0.0, max_tokens=3)])
    assert alone.token_ids == late.token_ids  # joining mid-flight does not change a greedy result (fp32)


async def test_weight_update_mid_generation_gives_per_token_versions(hf_policy: Any) -> None:
    v0 = hf_policy.weight_version
    name = "model.norm.weight"
    original = hf_policy.state_dict()[name].detach().clone()
    task = asyncio.ensure_future(hf_policy.generate([_req("Count from one to fifty.", temperature=0.0, max_tokens=30)]))
    while not hf_policy._active or len(hf_policy._active[0].tokens) < 5:
        await asyncio.sleep(0.005)
    try:
        await hf_policy.update_weights_async({name: original}, v0 + 1)  # same values, new version
        (g,) = await task
    finally:
        pass
    assert isinstance(g.weight_version, list) and len(g.weight_version) == len(g.token_ids)
    assert g.weight_version[0] == v0 and g.weight_version[-1] == v0 + 1
    assert g.weight_version == sorted(g.weight_version)  # one switch point, never back


async def test_abort_returns_partial_tokens_and_the_rollout_can_resume(hf_policy: Any) -> None:
    req = _req("Count from one to fifty.", temperature=0.0, max_tokens=30)
    (full,) = await hf_policy.generate([req])
    task = asyncio.ensure_future(hf_policy.generate([req]))
    while not hf_policy._active or len(hf_policy._active[0].tokens) < 4:
        await asyncio.sleep(0.005)
    assert hf_policy.abort() >= 1
    (part,) = await task
    assert part.finish_reason == "abort" and 4 <= len(part.token_ids) < 30
    assert part.token_ids == full.token_ids[: len(part.token_ids)]
    # resuming: the partial ids appended to the prompt continue the same greedy completion
    rest_req = GenRequest(prompt_token_ids=list(part.prompt_token_ids or []) + part.token_ids,
                          sampling=SamplingParams(temperature=0.0, max_tokens=30 - len(part.token_ids)))
    (rest,) = await hf_policy.generate([rest_req])
    assert part.token_ids + rest.token_ids == full.token_ids

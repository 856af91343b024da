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


class Hold:
    """Holds the decode loop between two steps (outside its lock) once its first row has ``tokens`` tokens,
    until :meth:`release`: the test acts on a generation known to be in flight, whatever the machine's load."""

    def __init__(self, policy: Any, monkeypatch: pytest.MonkeyPatch, tokens: int) -> None:
        import threading

        self.reached, self._release = threading.Event(), threading.Event()
        retire = policy._retire

        def held() -> None:
            if not self._release.is_set() and policy._active and len(policy._active[0].tokens) >= tokens:
                self.reached.set()
                self._release.wait(120)
            retire()

        monkeypatch.setattr(policy, "_retire", held)

    async def wait(self) -> None:
        assert await asyncio.to_thread(self.reached.wait, 120), "the generation never reached the hold point"

    def release(self) -> None:
        self._release.set()


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


async def test_weight_update_mid_generation_gives_per_token_versions(hf_policy: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    v0 = hf_policy.weight_version
    name = "model.norm.weight"
    original = hf_policy.state_dict()[name].detach().clone()
    hold = Hold(hf_policy, monkeypatch, 5)
    task = asyncio.ensure_future(hf_policy.generate([_req("Count from one to fifty.", temperature=0.0, max_tokens=30)]))
    await hold.wait()
    try:
        await hf_policy.update_weights_async(WeightUpdate.full({name: original}), v0 + 1)  # same values, new version
    finally:
        hold.release()
    (g,) = await task
    assert isinstance(g.weight_version, list) and len(g.weight_version) == len(g.token_ids)
    assert g.weight_version[0] == v0 and g.weight_version[-1] == v0 + 1
    assert g.weight_version == sorted(g.weight_version)  # one switch point, never back


async def test_abort_returns_partial_tokens_and_the_rollout_can_resume(hf_policy: Any, uncached: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    req = _req("Count from one to fifty.", temperature=0.0, max_tokens=30)
    (full,) = await hf_policy.generate([req])
    assert len(full.token_ids) > 6
    hold = Hold(hf_policy, monkeypatch, 4)
    task = asyncio.ensure_future(hf_policy.generate([req]))
    await hold.wait()
    try:
        assert hf_policy.abort() >= 1
    finally:
        hold.release()
    (part,) = await task
    monkeypatch.undo()
    assert part.finish_reason == "abort" and 4 <= len(part.token_ids) < 30
    assert part.token_ids == full.token_ids[: len(part.token_ids)]
    # resuming: the partial ids appended to the prompt continue the same greedy completion
    rest_req = GenRequest(prompt_token_ids=list(part.prompt_token_ids or []) + part.token_ids,
                          sampling=SamplingParams(temperature=0.0, max_tokens=30 - len(part.token_ids)))
    reused = hf_policy.prefix_cache.counters["reused_tokens"]
    (rest,) = await hf_policy.generate([rest_req])
    assert part.token_ids + rest.token_ids == full.token_ids
    # the resumed turn starts from the aborted row's cached KV, and equals an uncached resume
    assert hf_policy.prefix_cache.counters["reused_tokens"] - reused == len(rest_req.prompt_token_ids or []) - 1
    (plain,) = await uncached.generate([rest_req])
    _same(rest, plain)


# ------------------------------------------------------------------------------------------ prefix cache
TURNS = ["Count from one to twenty, one number per line.", "Keep going.", "Now say it backwards."]


@pytest.fixture(scope="module")
def uncached(hf_policy: Any) -> Any:
    """The same model object served without the prefix cache (today's path: the whole context every turn)."""
    from agentgym.policies.hf import HFPolicy

    return HFPolicy.from_model(hf_policy.model, hf_policy.tokenizer, max_batch_size=8, context_length=2048,
                               prefix_cache_gib=0)


async def _conversation(policy: Any, sp: SamplingParams, turns: list[str] = TURNS) -> list[tuple[Any, int]]:
    """A token-exact multi-turn session; per turn (generation, prompt tokens the policy forwarded)."""
    session = policy.new_session()
    session.start([{"role": "user", "content": turns[0]}])
    out = []
    for k in range(len(turns)):
        before = policy.prefill_tokens
        (g,) = await policy.generate([GenRequest(prompt_token_ids=session.token_ids, sampling=sp)])
        out.append((g, policy.prefill_tokens - before))
        session.append_completion(g.token_ids)
        if k + 1 < len(turns):
            session.append_messages([{"role": "user", "content": turns[k + 1]}])
    return out


def _same(a: Any, b: Any) -> None:
    assert a.token_ids == b.token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)  # fp32: only the matmul shapes differ


@pytest.mark.parametrize("sp", [SamplingParams(temperature=0.0, max_tokens=12),
                                SamplingParams(temperature=1.0, seed=11, max_tokens=12)], ids=["greedy", "seeded"])
async def test_prefix_cache_gives_the_uncached_generations_and_prefills_only_new_tokens(
        hf_policy: Any, uncached: Any, sp: SamplingParams) -> None:
    cached = await _conversation(hf_policy, sp)
    plain = await _conversation(uncached, sp)
    for (g, _), (h, full) in zip(cached, plain, strict=True):
        _same(g, h)
        assert full == len(h.prompt_token_ids)  # without the cache every turn forwards its whole context
    for k in (1, 2):  # later turns forward only what follows the previous turn's cached tokens
        prev, (g, forwarded) = cached[k - 1][0], cached[k]
        reused = len(prev.prompt_token_ids) + len(prev.token_ids) - 1  # the last sampled token was never forwarded
        assert g.prompt_token_ids[:reused] == prev.prompt_token_ids + prev.token_ids[:-1]
        assert forwarded <= len(g.prompt_token_ids) - reused
        assert forwarded < len(g.prompt_token_ids) // 2


async def test_samples_of_one_request_share_one_prefill(hf_policy: Any, uncached: Any) -> None:
    req = GenRequest(messages=[{"role": "user", "content": "Name a fruit."}],
                     sampling=SamplingParams(temperature=1.0, seed=3, max_tokens=8), n=3)
    hf_policy.clear_prefix_cache()
    before = hf_policy.prefill_tokens
    gens = await hf_policy.generate([req])
    assert hf_policy.prefill_tokens - before == len(gens[0].prompt_token_ids)  # once, not three times
    for g, h in zip(gens, await uncached.generate([req]), strict=True):
        _same(g, h)


async def test_cached_rows_join_a_running_batch_beside_uncached_ones(hf_policy: Any, uncached: Any) -> None:
    """A prefix-cache hit and a miss prefilled together, joining a batch that is decoding: same generations."""
    sp = SamplingParams(temperature=0.0, max_tokens=10)
    long_req = _req("Write a long story about a dragon.", temperature=0.0, max_tokens=40)
    results = {}
    for name, pol in (("cached", hf_policy), ("plain", uncached)):
        session = pol.new_session()
        session.start([{"role": "user", "content": TURNS[0]}])
        (g,) = await pol.generate([GenRequest(prompt_token_ids=session.token_ids, sampling=sp)])
        session.append_completion(g.token_ids)
        session.append_messages([{"role": "user", "content": TURNS[1]}])
        with pytest.MonkeyPatch.context() as mp:
            hold = Hold(pol, mp, 2)
            running = asyncio.ensure_future(pol.generate([long_req]))
            await hold.wait()  # the long request is decoding; the next two rows arrive together and join it
            hits0 = pol.prefix_cache.counters["hits"] if pol.prefix_cache else 0
            pair_task = asyncio.ensure_future(pol.generate([GenRequest(prompt_token_ids=session.token_ids, sampling=sp),
                                                            _req("What is the capital of Peru?", temperature=0.0)]))
            while pol._inbox.qsize() < 2:
                await asyncio.sleep(0.01)
            steps0 = len(pol.batch_sizes)
            hold.release()
            pair = await pair_task
            results[name] = (*pair, (await running)[0])
        assert max(pol.batch_sizes[steps0:]) == 3  # the three rows shared decode steps
        if pol.prefix_cache:
            assert pol.prefix_cache.counters["hits"] > hits0
    for a, b in zip(results["cached"], results["plain"], strict=True):
        _same(a, b)


async def test_a_weight_update_empties_the_prefix_cache(hf_policy: Any, uncached: Any) -> None:
    """After an update, the next turn equals a fresh pass over the new weights (no KV from the old ones)."""
    sp = SamplingParams(temperature=0.0, max_tokens=12)
    name = "model.layers.3.mlp.down_proj.weight"
    original = hf_policy.state_dict()[name].detach().clone()
    changed = original.clone()
    changed.view(-1)[::3] += 0.5
    session = hf_policy.new_session()
    session.start([{"role": "user", "content": TURNS[0]}])
    (g,) = await hf_policy.generate([GenRequest(prompt_token_ids=session.token_ids, sampling=sp)])
    session.append_completion(g.token_ids)
    session.append_messages([{"role": "user", "content": TURNS[1]}])
    req = GenRequest(prompt_token_ids=session.token_ids, sampling=sp)
    assert len(hf_policy.prefix_cache) > 0
    v0 = hf_policy.weight_version
    try:
        hf_policy.update_weights(WeightUpdate.full({name: changed}), v0 + 1)  # the twin shares the model: it serves the new weights too
        assert len(hf_policy.prefix_cache) == 0
        before = hf_policy.prefill_tokens
        (after,) = await hf_policy.generate([req])
        assert hf_policy.prefill_tokens - before == len(req.prompt_token_ids or [])
        (fresh,) = await uncached.generate([req])
        _same(after, fresh)
        # and a row whose weights changed while it was generating is never cached
        task = asyncio.ensure_future(hf_policy.generate([_req("Count from one to fifty.", temperature=0.0,
                                                              max_tokens=30)]))
        while not hf_policy._active or len(hf_policy._active[0].tokens) < 5:
            await asyncio.sleep(0.005)
        stored = hf_policy.prefix_cache.counters["stored"]
        await hf_policy.update_weights_async(WeightUpdate.full({name: changed}), v0 + 2)
        await task
        assert hf_policy.prefix_cache.counters["stored"] == stored and len(hf_policy.prefix_cache) == 0
    finally:
        await hf_policy.update_weights_async(WeightUpdate.full({name: original}), v0 + 3)


async def test_the_prefix_cache_stays_under_its_budget(smollm2_path: str, hf_policy: Any) -> None:
    from agentgym.policies.hf import HFPolicy

    cfg = hf_policy.model.config
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    budget = 150 * per_token  # room for one short conversation, not two
    small = HFPolicy.from_model(hf_policy.model, hf_policy.tokenizer, prefix_cache_gib=budget / 2**30)
    sp = SamplingParams(temperature=0.0, max_tokens=20)
    for q in QUESTIONS[:3]:
        await _conversation(small, sp, [q, "Why?"])
        assert 0 < small.prefix_cache.bytes <= small.prefix_cache.budget_bytes
    c = small.prefix_cache
    assert c.counters["evicted"] >= 1 and c.tokens * per_token == c.bytes <= budget
    await small.aclose()


async def test_a_slow_cpu_policy_says_once_to_use_vllm(hf_policy: Any, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    from agentgym.policies import hf

    monkeypatch.setattr(hf, "_HINT_AFTER_S", 0.0)  # judge the rate at once
    monkeypatch.setattr(hf, "_HINT_BELOW_TOK_S", 1e9)  # and call any rate slow
    for installed in (False, True):
        monkeypatch.setattr(hf_policy, "_hinted", False)
        monkeypatch.setattr(hf, "_vllm_installed", lambda installed=installed: installed)
        caplog.clear()
        with caplog.at_level("WARNING", logger="agentgym.policies.hf"):
            await hf_policy.generate([_req(QUESTIONS[2], max_tokens=2)] * 2)
        hints = [r for r in caplog.records if "vllm:" in r.getMessage()]
        assert len(hints) == (1 if installed else 0), caplog.text

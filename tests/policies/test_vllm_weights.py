"""VLLMPolicy weight updates on the real engine: in place vs full reload, exact versions, abort and
resume through the rollout, LoRA, the worker extension under attack (forged, unsigned, replayed and
malformed payloads), and the one publisher to a real `vllm serve` (dev mode).

All tests share the session's one engine (conftest ``vllm_policy``) and server (``vllm_server``) and
leave their weights as they found them (at a higher version).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentgym.errors import ChecksumMismatch, VersionNotNewer, WeightUpdateRejected
from agentgym.policy import GenRequest, SamplingParams
from agentgym.weights import LoRAAdapter, WeightPublisher, WeightUpdate, crc32, diff

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
torch = pytest.importorskip("torch")

NORM = "model.norm.weight"


def _greedy(q: str, max_tokens: int = 16) -> GenRequest:
    return GenRequest(messages=[{"role": "user", "content": q}],
                      sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=True))


def _delta(base: dict[str, Any], new: dict[str, Any]) -> WeightUpdate:
    """The bit-pattern delta from ``base`` to ``new``, with the base checksums."""
    pairs = {n: diff(base[n], new[n]) for n in new}
    pairs = {n: p for n, p in pairs.items() if p[0].numel()}
    return WeightUpdate.delta({n: i for n, (i, _) in pairs.items()}, {n: v for n, (_, v) in pairs.items()},
                              {n: crc32(base[n]) for n in pairs})


def _collapse_norm(smollm2_path: str) -> tuple[WeightUpdate, set[int]]:
    """A 576-element update that makes every next token one of two known ids.

    The final RMSNorm weight becomes one-hot on dim d, so logits_j = h_d * E[j, d]: the argmax is
    argmax_j E[j, d] or argmin_j E[j, d] depending on the sign of h_d (tied embeddings).
    """
    from safetensors import safe_open

    with safe_open(f"{smollm2_path}/model.safetensors", framework="pt") as fh:
        emb = fh.get_tensor("model.embed_tokens.weight").float()
        norm = fh.get_tensor(NORM)
    for d in range(emb.shape[1]):
        a, b = int(emb[:, d].argmax()), int(emb[:, d].argmin())
        if a > 100 and b > 100:  # not special tokens
            break
    new = torch.zeros_like(norm)
    new[d] = 1.0
    return WeightUpdate.full({NORM: new}), {a, b}


async def _wait_tokens(policy: Any, at_least: int, timeout: float = 60.0) -> None:
    """Wait until a request in flight has produced ``at_least`` tokens (read on the engine's loop)."""
    from agentgym.policies.vllm import _tokens_so_far

    async def count() -> int:
        return max((_tokens_so_far(policy.engine, rid) for rid in list(policy._inflight)), default=0)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(count(), policy._loop)) >= at_least:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("no request reached the wanted length")


async def test_sparse_delta_in_place_equals_full_reload(vllm_policy: Any, smollm2_path: str) -> None:
    pol = vllm_policy
    req = _greedy("Write a haiku about the sea.", 24)
    (before,) = await pol.generate([req])
    names = [n for n in pol._shapes if n.startswith(("model.layers.0.", "model.layers.1.", "model.norm", "model.embed"))]
    base = pol.state_dict(names)
    g = torch.Generator().manual_seed(0)
    new = {}
    for name, t in base.items():  # ~1% of each tensor of two layers (fused q/k/v, gate/up touched in part)
        k = max(1, t.numel() // 100)
        i = torch.randint(0, t.numel(), (k,), generator=g)
        n = t.clone()
        n.view(-1)[i] = (n.view(-1)[i].float() * 1.5 + 0.01).to(t.dtype)
        new[name] = n
    delta = _delta(base, new)
    v = pol.weight_version
    pol.update_weights(delta, v + 1, verify=True)
    assert pol.last_update["reloaded"] and set(pol.last_update["crc32"]) == set(delta.indices)
    # the worker's master now holds exactly `new`
    assert pol.weight_checksums(names) == {n: crc32(t) for n, t in new.items()}
    (inplace,) = await pol.generate([req])
    assert inplace.weight_version == v + 1 and inplace.token_ids != before.token_ids
    pol.full_reload(v + 2)  # every module reloaded from the same weights
    (reloaded,) = await pol.generate([req])
    assert reloaded.token_ids == inplace.token_ids and reloaded.logprobs == inplace.logprobs  # bit-identical
    # validation happens before anything is written
    with pytest.raises(WeightUpdateRejected, match="outside"):
        pol.update_weights(WeightUpdate.delta({NORM: torch.tensor([10**6], dtype=torch.int32)},
                                              {NORM: torch.ones(1, dtype=torch.bfloat16)}, {NORM: crc32(new[NORM])}), v + 3)
    with pytest.raises(WeightUpdateRejected, match="shape"):
        pol.update_weights(WeightUpdate.full({NORM: torch.ones(3)}), v + 3)
    with pytest.raises(VersionNotNewer):
        pol.update_weights(delta, v + 2)
    pol.update_weights(WeightUpdate.full(base), v + 3)  # restore, as full tensors
    (restored,) = await pol.generate([req])
    assert restored.token_ids == before.token_ids


async def test_tied_lm_head_follows_an_embedding_delta(vllm_policy: Any, smollm2_path: str) -> None:
    """vLLM's own reload leaves the CPU-packed LM head stale; ours refreshes it."""
    from safetensors import safe_open

    pol = vllm_policy
    req = GenRequest(messages=[{"role": "user", "content": "Name a fruit."}], sampling=SamplingParams(temperature=0.0, max_tokens=4))
    (before,) = await pol.generate([req])
    with safe_open(f"{smollm2_path}/model.safetensors", framework="pt") as fh:
        emb = fh.get_tensor("model.embed_tokens.weight")
    x = 40000  # a token that is neither in the prompt nor generated
    assert x not in before.token_ids
    name = "model.embed_tokens.weight"
    idx = torch.arange(x * emb.shape[1], (x + 1) * emb.shape[1], dtype=torch.int32)
    row = (emb[before.token_ids[0]].float() * 8).to(emb.dtype)
    moved = emb.clone()
    moved[x] = row
    v = pol.weight_version
    pol.update_weights(WeightUpdate.delta({name: idx}, {name: row}, {name: crc32(emb)}), v + 1)
    (after,) = await pol.generate([req])
    assert after.token_ids[0] == x  # the head scores with the new row
    pol.update_weights(WeightUpdate.delta({name: idx}, {name: emb[x].clone()}, {name: crc32(moved)}), v + 2)
    (restored,) = await pol.generate([req])
    assert restored.token_ids == before.token_ids


async def test_abort_drain_and_inflight_versions(vllm_policy: Any, smollm2_path: str) -> None:
    pol = vllm_policy
    collapse, sink = _collapse_norm(smollm2_path)
    from safetensors import safe_open

    with safe_open(f"{smollm2_path}/model.safetensors", framework="pt") as fh:
        norm = fh.get_tensor(NORM)
    long = GenRequest(messages=[{"role": "user", "content": "Tell me a long story about a dragon."}],
                      sampling=SamplingParams(temperature=0.0, max_tokens=64), request_id="story")
    (ref,) = await pol.generate([long])
    assert not set(ref.token_ids) & sink and len(ref.token_ids) > 40

    # abort(): the call returns what it has, all on one version, resumable
    task = asyncio.ensure_future(pol.generate([long]))
    await _wait_tokens(pol, 8)
    assert pol.abort(["story"]) == 1
    (cut,) = await task
    assert cut.finish_reason == "abort" and 8 <= len(cut.token_ids) < 64
    assert cut.token_ids == ref.token_ids[: len(cut.token_ids)] and len(cut.logprobs) == len(cut.token_ids)

    # drain: the request in flight finishes on the old weights; the update waits for it
    v = pol.weight_version
    task = asyncio.ensure_future(pol.generate([long]))
    await _wait_tokens(pol, 4)
    await pol.update_weights_async(collapse, v + 1, mode="drain")
    assert task.done()
    (drained,) = await task
    assert drained.token_ids == ref.token_ids and drained.weight_version == v
    (now,) = await pol.generate([long])
    assert now.weight_version == v + 1 and set(now.token_ids) <= sink
    await pol.update_weights_async(WeightUpdate.full({NORM: norm}), v + 2)

    # inflight: tokens before the swap are old, after it new; the boundary is exact
    task = asyncio.ensure_future(pol.generate([long]))
    await _wait_tokens(pol, 8)
    await pol.update_weights_async(collapse, v + 3, mode="inflight")
    (mixed,) = await task
    versions = mixed.weight_version
    assert isinstance(versions, list) and len(versions) == len(mixed.token_ids)
    k = versions.index(v + 3)
    assert k >= 8 and versions == [v + 2] * k + [v + 3] * (len(versions) - k)
    assert mixed.token_ids[:k] == ref.token_ids[:k]  # old weights, unchanged
    assert set(mixed.token_ids[k:]) <= sink  # every token after the swap comes from the new weights
    await pol.update_weights_async(WeightUpdate.full({NORM: norm}), v + 4)

    # abort mode: the request returns early on the old version
    task = asyncio.ensure_future(pol.generate([long]))
    await _wait_tokens(pol, 8)
    await pol.update_weights_async(collapse, v + 5, mode="abort")
    (aborted,) = await task
    assert aborted.finish_reason == "abort" and aborted.weight_version == v + 4
    assert aborted.token_ids == ref.token_ids[: len(aborted.token_ids)]
    await pol.update_weights_async(WeightUpdate.full({NORM: norm}), v + 6)
    (back,) = await pol.generate([long])
    assert back.token_ids == ref.token_ids


async def test_update_mid_episode_is_resumed_with_per_token_versions(vllm_policy: Any, smollm2_path: str) -> None:
    """Two Demo-v0 episodes through the rollout stepper; an abort-mode update lands mid-turn."""
    from safetensors import safe_open

    from agentgym.rollout.episode import EpisodeSpec, run_episode
    from agentgym.rollout.runtime import RolloutLimits, RolloutRuntime

    pol = vllm_policy
    collapse, sink = _collapse_norm(smollm2_path)
    with safe_open(f"{smollm2_path}/model.safetensors", framework="pt") as fh:
        norm = fh.get_tensor(NORM)
    v = pol.weight_version
    runtime = RolloutRuntime(max_concurrency=2)

    async def one(i: int) -> Any:
        async with runtime.slot(), runtime.env("agentgym/Demo-v0") as env:
            return await run_episode(runtime, env, pol, EpisodeSpec(env_id="agentgym/Demo-v0", task_id=f"guess-{10 + 2 * i}", seed=i),
                                     sampling=SamplingParams(temperature=0.0, max_tokens=64), limits=RolloutLimits(max_turns=2))

    episodes = asyncio.ensure_future(asyncio.gather(one(0), one(1)))
    await _wait_tokens(pol, 6)
    await pol.update_weights_async(collapse, v + 1, mode="abort")
    trajs = await episodes
    pol.update_weights(WeightUpdate.full({NORM: norm}), v + 2)
    runtime.close()
    assert len(trajs) == 2 and all(t.turns for t in trajs)
    assert not any(t.metrics.get("error") or getattr(t, "error", None) for t in trajs)
    split = []
    for t in trajs:
        for turn in t.turns:
            wv = turn.weight_version
            if isinstance(wv, list) and len(set(wv)) > 1:
                split.append((turn, wv))
    assert split, [[turn.weight_version for turn in t.turns] for t in trajs]
    for turn, wv in split:
        k = wv.index(v + 1)
        assert k > 0 and wv == [v] * k + [v + 1] * (len(wv) - k) and len(wv) == len(turn.completion_token_ids)
        assert set(turn.completion_token_ids[k:]) <= sink  # resumed on the new weights


async def test_lora_adapter_served_then_dropped(vllm_policy: Any) -> None:
    pol = vllm_policy
    req = _greedy("What is the capital of France?", 12)
    (before,) = await pol.generate([req])
    g = torch.Generator().manual_seed(0)
    shapes = pol._shapes
    weights = {}
    for layer in range(0, 30, 3):
        for mod in ("self_attn.q_proj", "self_attn.v_proj"):
            out, inp = shapes[f"model.layers.{layer}.{mod}.weight"]
            weights[f"model.layers.{layer}.{mod}"] = (torch.randn(8, inp, generator=g) * 0.1, torch.randn(out, 8, generator=g) * 0.1)
    adapter = LoRAAdapter(weights, rank=8, alpha=16)
    v = pol.weight_version
    pub = WeightPublisher().publish(adapter, v + 1)
    assert pub.deliver(pol) == "ok" and pub.report is not None and pub.report.kind == "lora"
    assert pub.report.bytes_sent == adapter.num_bytes()
    (lora,) = await pol.generate([req])
    assert lora.weight_version == v + 1 and pol.describe()["lora_adapter"] == f"{pol.policy_id}-v{v + 1}"
    # the adapter's merged weights give the same greedy tokens (bf16 rounding aside: compare logprobs loosely)
    base = {n: t for n, t in pol.state_dict().items() if n.endswith(("q_proj.weight", "v_proj.weight"))}
    merged = adapter.merged_into(base)
    pol.drop_lora(v + 2)
    (dropped,) = await pol.generate([req])
    assert dropped.token_ids == before.token_ids and lora.token_ids != before.token_ids
    pol.update_weights(WeightUpdate.full(merged), v + 3)
    (m,) = await pol.generate([req])
    n = next((i for i, (a, b) in enumerate(zip(m.token_ids, lora.token_ids, strict=False)) if a != b), len(m.token_ids))
    assert n >= 3 and abs(m.logprobs[0] - lora.logprobs[0]) < 0.1
    pol.update_weights(WeightUpdate.full(base), v + 4)


async def test_worker_refuses_forged_replayed_and_malformed_payloads(vllm_policy: Any, smollm2_path: str) -> None:
    """Issue 23, against the real worker extension (the code a `vllm serve` runs behind /collective_rpc): an
    unsigned, forged or tampered payload, a replayed older version, a malformed delta (2-D values of the right
    element count, beside a whole tensor the old code wrote first), a file outside the staging folder and
    garbage are all refused as data; nothing is written, and the engine keeps serving."""
    import json as _json

    from safetensors import safe_open
    from safetensors.torch import save

    from agentgym.weights import encode, shared_key

    pol = vllm_policy
    key = shared_key()
    assert key is not None  # VLLMPolicy made one for this process; its workers inherited it

    def rpc(method: str, *args: Any) -> Any:
        (r,) = pol._run(pol.engine.collective_rpc(method, args=args), timeout=600)
        return r

    with safe_open(f"{smollm2_path}/model.safetensors", framework="pt") as fh:
        norm = fh.get_tensor(NORM)
    req = _greedy("Name a colour.", 8)
    v = pol.weight_version
    pol.update_weights(WeightUpdate.full({NORM: norm}), v + 1)
    captured = encode(WeightUpdate.full({NORM: torch.zeros_like(norm)}), v + 1, key)  # what an eavesdropper kept
    pol.update_weights(WeightUpdate.full({NORM: norm}), v + 2)
    assert rpc("agentgym_version") == v + 2
    (before,) = await pol.generate([req])
    crc_before = pol.weight_checksums()
    zero = WeightUpdate.full({NORM: torch.zeros_like(norm)})
    emb = "model.embed_tokens.weight"
    malformed = WeightUpdate.delta({emb: torch.tensor([0, 1, 2, 3], dtype=torch.int32)},
                                   {emb: torch.ones(2, 2, dtype=torch.bfloat16)}, {emb: crc_before[emb]},
                                   {NORM: torch.zeros_like(norm)})
    tampered = bytearray(encode(zero, v + 50, key))
    tampered[-7] ^= 0x01
    attacks = {
        "unsigned": (save({f"t/{NORM}": torch.zeros_like(norm)},
                          metadata={"agentgym": _json.dumps({"kind": "full", "version": v + 50})}), "UpdateNotAuthenticated"),
        "forged": (encode(zero, v + 50, b"a guessed key"), "UpdateNotAuthenticated"),
        "tampered": (bytes(tampered), "UpdateNotAuthenticated"),
        "replayed": (captured, "VersionNotNewer"),
        "malformed": (encode(malformed, v + 50, key), "WeightUpdateRejected"),
        "file": ("file:/etc/passwd", "WeightUpdateRejected"),
        "garbage": (12345, "WeightUpdateRejected"),
    }
    for what, (payload, kind) in attacks.items():
        result = rpc("agentgym_update", payload)
        assert result.get("type") == kind, (what, result)
        assert pol.weight_checksums() == crc_before, what  # the master: nothing written
    assert rpc("agentgym_version") == v + 2
    (after,) = await pol.generate([req])  # the engine: up, and serving the same weights
    assert after.token_ids == before.token_ids and after.logprobs == before.logprobs
    with pytest.raises(WeightUpdateRejected, match="1-D"):  # the same malformed delta through VLLMPolicy
        pol.update_weights(malformed, v + 3)
    pol.update_weights(WeightUpdate.full({NORM: norm}), v + 3)  # a good update still applies
    assert pol.weight_checksums([NORM]) == {NORM: crc32(norm)}


async def test_publish_to_vllm_policy_and_server(vllm_policy: Any, vllm_server: str, smollm2_path: str) -> None:
    from agentgym.policies.openai import OpenAIPolicy
    from agentgym.policies.vllm_server import VLLMServerTarget
    from safetensors.torch import load_file

    base = load_file(f"{smollm2_path}/model.safetensors")
    # a training step that moved ~1% of the elements of a few tensors (the embedding, so the tied head too)
    moved = ["model.embed_tokens.weight", "model.norm.weight",
             *(n for n in base if n.startswith(("model.layers.0.", "model.layers.29.")))]
    step = dict(base)
    g = torch.Generator().manual_seed(1)
    for name in moved:
        t = base[name].clone()
        i = torch.randint(0, t.numel(), (max(1, t.numel() // 100),), generator=g)
        t.view(-1)[i] = (t.view(-1)[i].float() + 0.02).to(t.dtype)
        step[name] = t
    expected = {k: crc32(t) for k, t in step.items()}
    req = GenRequest(prompt_token_ids=[1, 504, 3458, 282, 4649, 314, 2], sampling=SamplingParams(temperature=0.0, max_tokens=8))

    # the OpenAI-compatible server, which loaded the same checkpoint: the first publish is a delta
    client = OpenAIPolicy(vllm_server, "smollm2", timeout_s=120)
    target = VLLMServerTarget(vllm_server, policy=client)  # signs with this process's key, which the server has
    served = target.weight_version  # None on a fresh server
    v0 = served or 0
    pub = WeightPublisher()
    pub.assume(base, served)
    (s_before,) = await client.generate([req])
    p1 = pub.publish(step, v0 + 1)
    assert p1.report is not None and p1.update.kind == "delta" and p1.report.bytes_sent * 100 < p1.report.bytes_full
    assert p1.deliver(target) == "ok"
    assert target.weight_version == v0 + 1 and client.weight_version == v0 + 1
    assert target.weight_checksums(list(step)) == expected
    (s_after,) = await client.generate([req])
    assert s_after.weight_version == v0 + 1
    # someone else with the key moved the server's weights: a delta against the old base is refused (and the
    # server stays up); sent in two chunks, the refusal at commit writes neither
    target.update_weights(WeightUpdate.full({NORM: base[NORM] * 2}), v0 + 2)
    emb = "model.embed_tokens.weight"
    stale = _delta({n: step[n] for n in (emb, NORM)}, {n: base[n] for n in (emb, NORM)})
    target.chunk_bytes = 1 << 20
    with pytest.raises(ChecksumMismatch):
        target.update_weights(stale, v0 + 3)
    assert target.weight_checksums([emb]) == {emb: expected[emb]}
    assert target.weight_version == v0 + 2
    target.chunk_bytes = 32 << 20
    # ... and the publisher's next version goes whole (the server is not at its delta's base), in chunks
    p2 = pub.publish(base, v0 + 3)
    assert p2.update.kind == "delta" and p2.deliver(target) == "version_gap" and target.weight_version == v0 + 3
    assert target.weight_checksums(list(base)) == {k: crc32(t) for k, t in base.items()}
    (s_restored,) = await client.generate([req])
    assert s_restored.token_ids == s_before.token_ids
    await client.aclose()
    target.close()

    # the in-process engine: the same delta, the same outputs as the server
    pol = vllm_policy
    ppub = WeightPublisher()
    v = pol.weight_version
    ppub.assume(base, v)
    pd = ppub.publish(step, v + 1)
    assert pd.update.kind == "delta" and pd.deliver(pol) == "ok"
    assert pol.weight_checksums(moved) == {n: expected[n] for n in moved}
    (p_after,) = await pol.generate([req])
    assert p_after.token_ids == s_after.token_ids
    back = ppub.publish(base, v + 2)
    assert back.update.kind == "delta" and back.deliver(pol) == "ok"
    assert pol.weight_checksums(moved) == {n: crc32(base[n]) for n in moved}

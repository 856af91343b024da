"""PolicyTrainer, publishing, checkpoints and faults, on the tiny model (CPU, seconds)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from agentgym.trainers.batching import TrainSample
from agentgym.trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentgym.trainers.config import LossConfig, OptimConfig
from agentgym.trainers.model import add_lora, load_causal_lm
from agentgym.trainers.publish import trainable_state
from agentgym.trainers.trainer import PolicyTrainer

from agentgym.errors import TrainingDiverged, VersionNotNewer
from agentgym.weights import WeightPublisher


def _samples(tok: Any, pid: str = "policy", n: int = 4) -> list[TrainSample]:
    out = []
    for i in range(n):
        text = f"<|im_start|>user\nkey[owl]<|im_end|>\n<|im_start|>assistant\nanswer[{['red', 'tan'][i % 2]}]<|im_end|>"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        k = len(tok("<|im_start|>user\nkey[owl]<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])
        out.append(TrainSample(pid, ids, [0] * k + [1] * (len(ids) - k), 1.0 if i % 2 == 0 else -1.0,
                               [0.0] * k + [-1.5] * (len(ids) - k)))
    return out


def _params(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_a_step_changes_weights_and_reports_metrics(tiny_model: str, tiny_tokenizer: Any) -> None:
    model = load_causal_lm(tiny_model)
    before = _params(model)
    tr = PolicyTrainer("policy", model, optim=OptimConfig(lr=1e-2, token_budget=64), loss=LossConfig(tis_cap=2.0))
    m = tr.train_on(_samples(tiny_tokenizer))
    assert m["optimizer_steps"] == 1 and m["micro_batches"] >= 2  # 4 x ~20 tokens under a 64-token budget
    assert 0 < m["padding_efficiency"] <= 1 and m["trained_tokens"] > 0
    assert m["trim_s"] >= 0  # freed memory handed back after the step (tests/trainers/test_memory.py)
    for k in ("loss", "grad_norm", "entropy", "ratio", "clip_frac", "tis_weight", "behaviour_logp_abs_diff"):
        assert m[k] is not None, k
    assert m["ratio"] == pytest.approx(1.0)  # one epoch: ratio against itself
    assert any(not torch.equal(before[n], p) for n, p in _params(model).items())
    # samples of another policy, or with nothing to train, are not a step
    assert tr.train_on(_samples(tiny_tokenizer, pid="other"))["optimizer_steps"] == 0
    assert tr.train_on([])["optimizer_steps"] == 0


def test_micro_batching_equals_one_big_batch(tiny_model: str, tiny_tokenizer: Any) -> None:
    grads = []
    for budget in (10_000, 32):
        model = load_causal_lm(tiny_model)
        tr = PolicyTrainer("policy", model, optim=OptimConfig(lr=0.0, token_budget=budget, grad_clip=None))
        tr.train_on(_samples(tiny_tokenizer))
        grads.append(torch.cat([p.grad.reshape(-1) for _, p in tr.params if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_non_finite_steps_are_skipped_then_stop_the_run(tiny_model: str, tiny_tokenizer: Any,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    model = load_causal_lm(tiny_model)
    tr = PolicyTrainer("policy", model, optim=OptimConfig(lr=1e-2, max_bad_steps=2))
    before = _params(model)
    bad = _samples(tiny_tokenizer)
    for s in bad:
        s.advantage = float("nan")
    with caplog.at_level(logging.WARNING):
        m = tr.train_on(bad)
    assert m["optimizer_steps"] == 0 and m["skipped_steps"] == 1 and tr.skipped_steps == 1
    assert "non-finite" in caplog.text
    assert all(torch.equal(before[n], p) for n, p in _params(model).items())  # weights untouched
    tr.train_on(_samples(tiny_tokenizer))  # a good step resets the streak
    assert tr.bad_in_a_row == 0
    tr.train_on(bad)
    with pytest.raises(TrainingDiverged, match="2 optimizer steps in a row"):
        tr.train_on(bad)


def test_full_publish_full_then_delta(tiny_model: str, tiny_tokenizer: Any) -> None:
    from agentgym.policies.hf import HFPolicy

    model = load_causal_lm(tiny_model)
    pol = HFPolicy(tiny_model, dtype="bfloat16")
    tr = PolicyTrainer("policy", model, optim=OptimConfig(lr=1e-5))  # a small step, as in LLM fine-tuning
    pub = WeightPublisher("bfloat16")
    p1 = pub.publish(trainable_state(model), 1)
    assert p1.deliver(pol) == "ok"
    first = p1.report.to_dict()  # type: ignore[union-attr]
    assert first["kind"] == "full" and first["bytes"] == first["full_bytes"]
    tr.train_on(_samples(tiny_tokenizer))
    p2 = pub.publish(trainable_state(model), 2)
    assert p2.deliver(pol) == "ok"
    second = p2.report.to_dict()  # type: ignore[union-attr]
    # one small step changes few bf16 elements: the sparse delta is sent, and it is smaller
    assert second["kind"] == "delta" and 0 < second["bytes"] < second["full_bytes"]
    assert second["changed_elements"] < second["total_elements"]
    served = pol.model.state_dict()
    for name, t in trainable_state(model).items():
        assert torch.equal(served[name], t.to(torch.bfloat16)), name
    with pytest.raises(VersionNotNewer):
        pub.publish(trainable_state(model), 2)  # versions strictly increase


def test_lora_publishes_merged_adapted_modules_only(tiny_model: str, tiny_tokenizer: Any) -> None:
    from agentgym.policies.hf import HFPolicy

    model = add_lora(load_causal_lm(tiny_model), "policy", rank=4, alpha=8, dropout=0.0, targets=["q_proj", "v_proj"])
    tr = PolicyTrainer("policy", model, optim=OptimConfig(lr=1e-2), adapter="policy")
    assert all("lora_" in n for n, _ in tr.params)
    tr.train_on(_samples(tiny_tokenizer))
    pol = HFPolicy(tiny_model, dtype="float32")
    p = WeightPublisher("float32").publish(trainable_state(model, "policy"), 1)
    assert p.deliver(pol) == "ok"
    assert p.report is not None and len(p.report.tensors) == 4  # q_proj and v_proj of 2 layers
    merged = trainable_state(model, "policy")
    assert set(merged) == {f"model.layers.{i}.self_attn.{m}.weight" for i in (0, 1) for m in ("q_proj", "v_proj")}
    served = pol.model.state_dict()
    for name, t in merged.items():
        assert torch.equal(served[name], t)
    # the merged weights are what the adapted model computes
    x = torch.tensor([tiny_tokenizer("key[owl]", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(x).logits, pol.model(x).logits, atol=1e-5)


def test_checkpoint_roundtrip(tiny_model: str, tiny_tokenizer: Any, tmp_path: Any) -> None:
    model = load_causal_lm(tiny_model)
    tr = PolicyTrainer("policy", model, optim=OptimConfig(lr=1e-2))
    tr.train_on(_samples(tiny_tokenizer))
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"policy": tr}, {"version": step}, keep=2)
    ck = latest_checkpoint(tmp_path)
    assert ck is not None and ck.name == "step-000003"
    assert len(list((tmp_path / "checkpoints").glob("step-*"))) == 2
    tr.train_on(_samples(tiny_tokenizer))  # move away, then restore
    model2 = load_causal_lm(tiny_model)
    tr2 = PolicyTrainer("policy", model2, optim=OptimConfig(lr=1e-2))
    state = load_checkpoint(ck, {"policy": tr2})
    assert state["step"] == 3 and state["version"] == 3 and tr2.steps == 1
    tr3 = PolicyTrainer("policy", load_causal_lm(tiny_model), optim=OptimConfig(lr=1e-2))
    load_checkpoint(ck, {"policy": tr3})
    # identical state -> identical next step
    m2, m3 = tr2.train_on(_samples(tiny_tokenizer)), tr3.train_on(_samples(tiny_tokenizer))
    assert m2["loss"] == pytest.approx(m3["loss"])
    assert all(torch.equal(a, b) for a, b in zip(_params(tr2.model).values(), _params(tr3.model).values(), strict=True))


def test_mixed_precision_keeps_small_updates_that_bf16_weights_round_away(tiny_model: str, tiny_tokenizer: Any) -> None:
    """bf16 weights lose an AdamW step of lr 1e-5 (below half a bf16 ulp of most weights); fp32 master
    weights with bf16 autocast keep it, and the forward really ran in bf16."""
    changed = {}
    for name, dtype, autocast in (("bf16", "bfloat16", None), ("mixed", "float32", torch.bfloat16)):
        model = load_causal_lm(tiny_model, dtype=dtype)
        before = _params(model)
        tr = PolicyTrainer("policy", model, optim=OptimConfig(lr=1e-5, grad_clip=None, warmup_steps=0),
                           autocast=autocast)
        assert tr.train_on(_samples(tiny_tokenizer))["optimizer_steps"] == 1
        after = _params(model)
        n_changed = sum(int((before[n] != p).sum()) for n, p in after.items())
        changed[name] = n_changed / sum(p.numel() for p in after.values())
        assert all(p.dtype == (torch.bfloat16 if name == "bf16" else torch.float32) for p in after.values())
    assert changed["mixed"] > 0.9  # every weight with a gradient moves
    assert changed["bf16"] < 0.5 * changed["mixed"]


def test_a_cancelled_hf_generate_leaves_no_unretrieved_future(tiny_model: str) -> None:
    """Cancelling a caller (a group cancelled at shutdown) must not leave the gather of its rows unread: CPython
    then prints "_GatheringFuture exception was never retrieved" when it is collected, at interpreter exit."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import asyncio
        from agentgym.policies.hf import HFPolicy
        from agentgym.policy import GenRequest, SamplingParams

        async def main():
            pol = HFPolicy({tiny_model!r}, dtype="float32")
            req = GenRequest(messages=[{{"role": "user", "content": "hello"}}], sampling=SamplingParams(max_tokens=200))
            t = asyncio.ensure_future(pol.generate([req]))
            while not pol._active:
                await asyncio.sleep(0.01)
            t.cancel()
            try:
                await t
            except asyncio.CancelledError:
                print("cancelled")
            await pol.aclose()

        asyncio.run(main())
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "cancelled" in p.stdout
    assert "never retrieved" not in p.stderr, p.stderr[-2000:]

"""Sequence packing: several samples per row with block-diagonal attention give the same loss and gradients as
one padded sample per row (sdpa and eager attention), and nothing is trained across a sample boundary."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from agentgym.trainers.batching import TrainSample, collate_packed, pack_rows
from agentgym.trainers.config import LossConfig, OptimConfig
from agentgym.trainers.model import load_causal_lm
from agentgym.trainers.trainer import PolicyTrainer


def _samples(tok: Any, n: int, seed: int = 0) -> list[TrainSample]:
    """Multi-turn SFT-style samples of different lengths: prompt and tool tokens masked out."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ids: list[int] = []
        mask: list[int] = []
        for _ in range(rng.randint(1, 3)):
            prompt = tok(f"<|im_start|>user\nkey[{rng.choice(['owl', 'elk', 'yak'])}]<|im_end|>\n<|im_start|>assistant\n",
                         add_special_tokens=False)["input_ids"]
            reply = tok(f"answer[{rng.choice(['red', 'tan', 'blue'])}]<|im_end|>\n", add_special_tokens=False)["input_ids"]
            ids += prompt + reply
            mask += [0] * len(prompt) + [1] * len(reply)
        lp = [rng.uniform(-2.0, -0.1) if m else 0.0 for m in mask]
        out.append(TrainSample("policy", ids, mask, rng.choice([1.0, -0.5, 0.25]), lp))
    return out


def test_rows_keep_each_sample_apart(tiny_tokenizer: Any) -> None:
    samples = _samples(tiny_tokenizer, 7)
    lengths = [len(s) for s in samples]
    rows = pack_rows(lengths, 60)
    assert sorted(i for r in rows for i in r) == list(range(7))
    assert all(sum(lengths[i] for i in r) <= 60 or len(r) == 1 for r in rows)
    assert len(rows) < 7  # something was packed
    mb = collate_packed(samples, rows, [1.0] * 7)
    assert mb.position_ids is not None
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            s, n = samples[i], lengths[i]
            assert mb.input_ids[r, at:at + n].tolist() == s.token_ids
            assert mb.position_ids[r, at:at + n].tolist() == list(range(n))  # positions restart per sample
            if at:  # the previous sample's last position never learns to predict this sample's first token
                assert mb.target_mask[r, at - 1] == 0
            assert mb.target_mask[r, at:at + n - 1].tolist() == [float(m) for m in s.loss_mask[1:]]
            assert mb.advantages[r, at:at + n - 1].tolist() == pytest.approx([s.advantage] * (n - 1))
            at += n
        assert mb.target_mask[r, at - 1:].sum() == 0  # padding is never a target
    assert pack_rows([100, 10], 50) == [[0], [1]]  # a long sample gets a row of its own, untruncated


def _grads(tiny_model: str, samples: list[TrainSample], algorithm: str, attn: str, pack: bool,
           budget: int) -> tuple[dict[str, Any], torch.Tensor]:
    torch.manual_seed(0)
    model = load_causal_lm(tiny_model)
    model.set_attn_implementation(attn)
    tr = PolicyTrainer("policy", model, algorithm=algorithm,  # type: ignore[arg-type]
                       optim=OptimConfig(lr=0.0, grad_clip=None, token_budget=budget, pack_sequences=pack, pack_len=96),
                       loss=LossConfig(tis_cap=2.0, aggregation="token-mean"))
    m = tr.train_on(samples)
    return m, torch.cat([p.grad.reshape(-1) for _, p in tr.params if p.grad is not None])


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("algorithm", ["sft", "grpo"])
def test_packed_batch_gives_the_same_loss_and_gradients(tiny_model: str, tiny_tokenizer: Any, attn: str,
                                                         algorithm: str) -> None:
    samples = _samples(tiny_tokenizer, 12, seed=1)
    plain, g_plain = _grads(tiny_model, samples, algorithm, attn, False, 256)
    packed, g_packed = _grads(tiny_model, samples, algorithm, attn, True, 256)
    assert packed["padding_efficiency"] > plain["padding_efficiency"]  # the same tokens in fuller rows
    assert packed["loss"] == pytest.approx(plain["loss"], rel=1e-5, abs=1e-6)
    assert packed["logp"] == pytest.approx(plain["logp"], rel=1e-5)
    assert torch.allclose(g_packed, g_plain, rtol=1e-4, atol=1e-6), float((g_packed - g_plain).abs().max())
    assert float(g_plain.abs().sum()) > 0

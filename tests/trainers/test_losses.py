"""Advantage estimators and losses against values computed by hand on small tensors."""

from __future__ import annotations

import math

import pytest
import torch
from agentgym.trainers.advantages import group_advantages, overlong_penalty
from agentgym.trainers.losses import aggregation_weights, k3_kl, policy_loss, sft_loss


def test_grpo_dr_grpo_rloo_by_hand() -> None:
    r = [1.0, 0.0, 0.0, 1.0]
    # mean 0.5; sample std = sqrt(((.5^2)*4)/3) = sqrt(1/3)
    s = math.sqrt(1 / 3)
    assert group_advantages(r, "grpo", eps=0.0).tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s])
    assert group_advantages(r, "dr_grpo").tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    # leave-one-out: r_i - mean of the other three: 1 - 1/3, 0 - 2/3, ...
    assert group_advantages(r, "rloo").tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert group_advantages([3.0, 1.0, 2.0], "rloo").tolist() == pytest.approx([3 - 1.5, 1 - 2.5, 2 - 2.0])


def test_degenerate_groups_have_zero_advantage() -> None:
    for est in ("grpo", "dr_grpo", "rloo"):
        assert group_advantages([1.0, 1.0, 1.0], est).abs().max() < 1e-6  # type: ignore[arg-type]
        assert group_advantages([0.7], est).tolist() == [0.0]  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown advantage"):
        group_advantages([1.0, 0.0], "ppo")  # type: ignore[arg-type]


def test_overlong_penalty() -> None:
    assert overlong_penalty(80, max_tokens=100, buffer=20) == 0.0
    assert overlong_penalty(90, max_tokens=100, buffer=20) == pytest.approx(-0.5)
    assert overlong_penalty(100, max_tokens=100, buffer=20) == pytest.approx(-1.0)
    assert overlong_penalty(150, max_tokens=100, buffer=20, penalty=0.5) == pytest.approx(-0.5)
    assert overlong_penalty(101, max_tokens=100, buffer=0) == -1.0


def test_aggregation_weights_by_hand() -> None:
    counts = [2, 3, 0, 5]  # trained tokens per sequence; the empty one gets weight 0
    assert aggregation_weights(counts, "token-mean") == pytest.approx([0.1, 0.1, 0.0, 0.1])
    assert aggregation_weights(counts, "seq-mean") == pytest.approx([1 / 6, 1 / 9, 0.0, 1 / 15])
    assert aggregation_weights(counts, "token-sum", norm_len=10) == pytest.approx([1 / 30, 1 / 30, 0.0, 1 / 30])
    # every aggregation of a constant per-token loss of 1: token-mean and seq-mean give exactly 1
    for agg in ("token-mean", "seq-mean"):
        w = aggregation_weights(counts, agg)  # type: ignore[arg-type]
        assert sum(wi * c for wi, c in zip(w, counts, strict=True)) == pytest.approx(1.0)


def test_ppo_clip_higher_by_hand() -> None:
    # [B=1, T=4]: ratios 1.5 (A>0, clipped at 1.28), 0.5 (A>0, unclipped: pessimistic), 0.5 (A<0, clipped
    # at 0.8), 1.5 (A<0, unclipped)
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.5, 1.5]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    out = policy_loss(logp, old, adv, clip_low=0.2, clip_high=0.28)
    assert out.loss.tolist()[0] == pytest.approx([-1.28, -0.5, 0.8, 1.5])
    assert out.clipped.tolist()[0] == [1.0, 0.0, 1.0, 0.0]
    assert out.ratio.tolist()[0] == pytest.approx([1.5, 0.5, 0.5, 1.5])


def test_gradient_flows_only_through_unclipped_branch() -> None:
    logp = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_(True)
    out = policy_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), clip_low=0.2, clip_high=0.28)
    out.loss.sum().backward()
    assert logp.grad is not None
    # clipped token: no gradient; unclipped: d(-ratio)/dlogp = -ratio
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -1.1])


def test_k3_kl_and_tis_by_hand() -> None:
    logp = torch.tensor([[math.log(0.5), math.log(0.2)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.2)]])
    # k3 = exp(ref - logp) - (ref - logp) - 1 = 0.5 - ln(0.5) - 1
    kl = k3_kl(logp, ref)
    assert kl.tolist()[0] == pytest.approx([0.5 - math.log(0.5) - 1, 0.0])
    assert (kl >= 0).all()
    old = logp.clone()
    behaviour = torch.tensor([[math.log(0.1), math.log(0.4)]])  # trainer/behaviour = 5 (capped to 2) and 0.5
    out = policy_loss(logp, old, torch.ones(1, 2), behaviour_logp=behaviour, tis_cap=2.0, ref_logp=ref, kl_coef=0.1)
    assert out.is_weight is not None
    assert out.is_weight.tolist()[0] == pytest.approx([2.0, 0.5])
    # ratio 1: loss = -A * 1 * w + 0.1 * kl
    assert out.loss.tolist()[0] == pytest.approx([-2.0 + 0.1 * (0.5 - math.log(0.5) - 1), -0.5])


def test_sft_loss_is_negative_log_likelihood() -> None:
    lp = torch.tensor([[-0.5, -2.0]])
    assert sft_loss(lp).tolist()[0] == [0.5, 2.0]

"""Token-level losses: PPO clip with clip-higher, k3 KL, truncated importance sampling, SFT.

Every loss here returns a per-token loss ``[B, T]``; how tokens are weighted into one scalar is the
job of :func:`aggregation_weights`, computed once over the *whole* batch so that gradient
accumulation over micro-batches gives exactly the full-batch gradient:
``loss = sum(per_token_loss * weights)`` summed over micro-batches.

Shapes: ``B`` sequences, ``T`` target positions (a sequence of ``L`` tokens has ``T = L - 1``
targets: position ``t`` predicts token ``t + 1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["Aggregation", "PolicyLossOutput", "aggregation_weights", "batch_totals", "k3_kl", "policy_loss", "sft_loss"]

Aggregation = Literal["token-mean", "seq-mean", "token-sum"]


def aggregation_weights(token_counts: Sequence[int], aggregation: Aggregation = "token-mean",
                        norm_len: int = 1024, totals: tuple[int, int] | None = None) -> list[float]:
    """The weight of one masked token of each sequence, so that the batch loss is ``sum(w * loss)``.

    Args:
        token_counts: ``[N]`` masked (trained) tokens of each sequence in the whole batch.
        aggregation: ``token-mean``: every token of the batch counts the same (``1 / sum(n)``);
            ``seq-mean``: every sequence counts the same (``1 / (N * n_i)``); ``token-sum``:
            ``1 / (N * norm_len)``, a constant normalizer (Dr.GRPO), so longer sequences weigh more.
        norm_len: The constant of ``token-sum``.
        totals: ``(sequences with a masked token, masked tokens)`` of the whole batch when
            ``token_counts`` is only one rank's share of it (sharded training sums them over the ranks);
            ``None``: ``token_counts`` is the whole batch.

    Returns:
        ``[N]`` per-token weights (0 for a sequence without masked tokens).
    """
    n_seq, total = totals if totals is not None else batch_totals(token_counts)
    out: list[float] = []
    for c in token_counts:
        if c <= 0:
            out.append(0.0)
        elif aggregation == "token-mean":
            out.append(1.0 / total)
        elif aggregation == "seq-mean":
            out.append(1.0 / (n_seq * c))
        elif aggregation == "token-sum":
            out.append(1.0 / (n_seq * norm_len))
        else:
            raise ValueError(f"unknown aggregation {aggregation!r}")
    return out


def batch_totals(token_counts: Sequence[int]) -> tuple[int, int]:
    """``(sequences with a masked token, masked tokens)``: the normalisers of :func:`aggregation_weights`."""
    return sum(1 for c in token_counts if c > 0), sum(c for c in token_counts if c > 0)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(pi || ref) per token: ``exp(ref - logp) - (ref - logp) - 1`` (>= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


@dataclass
class PolicyLossOutput:
    """Per-token loss and what the logs need (all ``[B, T]``)."""

    loss: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor  # 1.0 where the clipped branch was taken
    kl: torch.Tensor | None
    is_weight: torch.Tensor | None


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, *,
                clip_low: float = 0.2, clip_high: float = 0.28, ref_logp: torch.Tensor | None = None,
                kl_coef: float = 0.0, behaviour_logp: torch.Tensor | None = None,
                tis_cap: float | None = None) -> PolicyLossOutput:
    """PPO-clip per-token loss with asymmetric clipping, optional k3 KL and truncated IS.

    Args:
        logp: ``[B, T]`` log-probs of the taken tokens under the model being trained (with grad).
        old_logp: ``[B, T]`` the same under the weights at the start of the step (no grad).
        advantages: ``[B, T]`` (or ``[B, 1]``) advantage of each token.
        clip_low / clip_high: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``.
        ref_logp: ``[B, T]`` a frozen reference model's log-probs, for the KL term.
        kl_coef: Weight of the k3 KL.
        behaviour_logp: ``[B, T]`` log-probs the rollout backend reported when it sampled.
        tis_cap: Truncated importance sampling: multiply by ``min(exp(old - behaviour), tis_cap)``
            (no grad). Corrects for stale weights and for rollout numerics that differ from the
            trainer's (bf16 vLLM vs the trainer's model) even when the weights are fresh.

    Returns:
        The per-token loss (``-A * ratio``, pessimistic branch), before masking and aggregation.
    """
    ratio = torch.exp(logp - old_logp)  # [B, T]
    adv = advantages.expand_as(ratio)
    unclipped = -adv * ratio
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = -adv * clipped_ratio
    loss = torch.maximum(unclipped, clipped)  # [B, T]
    was_clipped = (clipped > unclipped).float()
    is_w = None
    if behaviour_logp is not None and tis_cap is not None:
        is_w = torch.clamp(torch.exp(old_logp - behaviour_logp), max=tis_cap).detach()  # [B, T]
        loss = loss * is_w
    kl = None
    if ref_logp is not None and kl_coef > 0:
        kl = k3_kl(logp, ref_logp)
        loss = loss + kl_coef * kl
    return PolicyLossOutput(loss, ratio.detach(), was_clipped, None if kl is None else kl.detach(), is_w)


def sft_loss(logp: torch.Tensor) -> torch.Tensor:
    """Behaviour cloning: ``-log p`` of each target token, ``[B, T]`` (mask and weights applied outside)."""
    return -logp

"""Group-relative advantage estimators and the reward shaping applied before them.

Each estimator maps the rewards of one group (the G episodes of one task) to one advantage per
episode. On a multi-turn episode that advantage applies to every token the trained policy generated
in it (the loss mask selects them; :mod:`agentgym.trainers.batching`).

* ``grpo``: ``(r_i - mean(r)) / (std(r) + eps)`` with the sample standard deviation (DeepSeekMath).
* ``dr_grpo``: ``r_i - mean(r)``: no std scaling (Dr.GRPO; pair it with ``token-sum`` aggregation).
* ``rloo``: ``r_i - mean_{j != i} r_j``: the leave-one-out baseline (RLOO).

A group of one, or a group whose rewards are all equal, gets all-zero advantages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

__all__ = ["Estimator", "group_advantages", "overlong_penalty"]

Estimator = Literal["grpo", "dr_grpo", "rloo"]


def group_advantages(rewards: Sequence[float] | torch.Tensor, estimator: Estimator = "grpo",
                     eps: float = 1e-6) -> torch.Tensor:
    """Advantages of one group.

    Args:
        rewards: ``[G]`` the episodes' rewards.
        estimator: ``"grpo"``, ``"dr_grpo"`` or ``"rloo"``.
        eps: Added to the std (GRPO).

    Returns:
        ``[G]`` float64 advantages.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)  # [G]
    g = r.numel()
    if g < 2:
        return torch.zeros_like(r)
    mean = r.mean()
    if estimator == "grpo":
        return (r - mean) / (r.std(unbiased=True) + eps)
    if estimator == "dr_grpo":
        return r - mean
    if estimator == "rloo":
        loo = (r.sum() - r) / (g - 1)  # [G] mean of the others
        return r - loo
    raise ValueError(f"unknown advantage estimator {estimator!r}; use grpo, dr_grpo or rloo")


def overlong_penalty(generated_tokens: int, max_tokens: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment (a value <= 0 added to the reward).

    Zero up to ``max_tokens - buffer`` generated tokens, then falling linearly to ``-penalty`` at
    ``max_tokens`` (and staying there beyond).
    """
    if buffer <= 0:
        return -penalty if generated_tokens > max_tokens else 0.0
    start = max_tokens - buffer
    if generated_tokens <= start:
        return 0.0
    return -penalty * min(1.0, (generated_tokens - start) / buffer)

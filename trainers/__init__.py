"""Trainers: GRPO-family RL and SFT on multi-turn trajectories, LoRA or full fine-tune, multi-policy.

Library pieces, connected by plain data (no base classes):

* :mod:`.advantages`: GRPO, Dr.GRPO and RLOO group advantages; DAPO's overlong penalty.
* :mod:`.losses`: PPO clip with clip-higher, k3 KL, truncated importance sampling, SFT; aggregation weights.
* :mod:`.batching`: trajectory groups -> :class:`TrainSample` (segments, masks, advantages) -> packed micro-batches.
* :mod:`.sft`: transcripts (plain or DAgger-relabelled) -> samples, with the student's chat template.
* :mod:`.model`: loading, LoRA adapters, token log-probabilities.
* :mod:`.trainer`: :class:`PolicyTrainer`, one policy's optimizer step (the narrow seam).
* :mod:`.publish`: :func:`trainable_state` (full: every parameter; LoRA: the merged adapted weights),
  handed to the one publisher, :class:`agentgym.weights.WeightPublisher`.
* :mod:`.checkpoint`, :mod:`.metrics`, :mod:`.config`.
* :mod:`.run`: the run folder, seeding, a run's length and which policies a step trains.

The training runs themselves are recipes outside the library (:mod:`agentgym.recipes`, the repository's
``recipes/``) that compose these pieces. Trainers see trajectories, never envs. Heavy modules (torch)
load on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .advantages import group_advantages, overlong_penalty
    from .batching import TrainSample, collate, pack_micro_batches, samples_from_groups
    from .config import TrainConfig, load_train_config
    from .losses import aggregation_weights, k3_kl, policy_loss, sft_loss
    from .publish import trainable_state
    from .sft import load_transcripts, sft_samples, transcript_samples
    from .trainer import PolicyTrainer, build_trainers

__all__ = [
    "PolicyTrainer",
    "TrainConfig",
    "TrainSample",
    "aggregation_weights",
    "build_trainers",
    "collate",
    "group_advantages",
    "k3_kl",
    "load_train_config",
    "load_transcripts",
    "overlong_penalty",
    "pack_micro_batches",
    "policy_loss",
    "samples_from_groups",
    "sft_loss",
    "sft_samples",
    "trainable_state",
    "transcript_samples",
]

_WHERE = {
    "group_advantages": "advantages", "overlong_penalty": "advantages",
    "TrainSample": "batching", "collate": "batching", "pack_micro_batches": "batching",
    "samples_from_groups": "batching", "TrainConfig": "config", "load_train_config": "config",
    "aggregation_weights": "losses", "k3_kl": "losses", "policy_loss": "losses", "sft_loss": "losses",
    "trainable_state": "publish", "load_transcripts": "sft",
    "sft_samples": "sft", "transcript_samples": "sft", "PolicyTrainer": "trainer", "build_trainers": "trainer",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

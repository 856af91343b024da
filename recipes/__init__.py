"""Training recipes: a run reads top to bottom in one file, composed from library pieces.

* :mod:`agentgym.recipes.sft`: :class:`~agentgym.recipes.sft.SFTRecipe`, behaviour cloning on transcripts
  (``run.algorithm = "sft"``).
* :mod:`agentgym.recipes.rl`: :class:`~agentgym.recipes.rl.RLRecipe`, GRPO / Dr.GRPO / RLOO / DAPO on
  rollouts, one policy or two (``run.algorithm = "grpo"``; the estimator and DAPO's pieces are config).
* :mod:`agentgym.recipes.components`: what both build from their typed config sections (rollout policies
  and services, the dataflow runtime, the held-out evaluation).

From Python::

    from agentgym.recipes import run_training
    from agentgym.trainers.config import load_train_config

    result = run_training(load_train_config("configs/train/quickstart.toml", ["run.steps=4"]))

``agentgym train --config FILE`` does the same. The recipes live in the repository's ``recipes/`` folder,
installed as ``agentgym.recipes`` (like ``envs/``, ``policies/`` and ``trainers/``), so ``agentgym train``
works from an installed package and a user can copy a recipe and change it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentgym.trainers.config import TrainConfig

__all__ = ["recipe_for", "run_training"]


def recipe_for(cfg: TrainConfig, **kwargs: Any) -> Any:
    """The recipe object for ``cfg`` (:class:`SFTRecipe` or :class:`RLRecipe`), not yet set up."""
    if cfg.run.algorithm == "sft":
        from .sft import SFTRecipe

        return SFTRecipe(cfg, **kwargs)
    from .rl import RLRecipe

    return RLRecipe(cfg, **kwargs)


def run_training(cfg: TrainConfig, *, env_factory: Callable[[str], Any] | None = None,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Set up, train and clean up one run; returns its result (before/after held-out success, timings, the
    learning-rate schedule spent, ...; also written to ``run.out_dir/result.json``).

    Args:
        cfg: A validated config (:func:`~agentgym.trainers.config.load_train_config`).
        env_factory: ``env_id -> env`` for the rollout services (RL; default: the registry).
        on_step: Called with each step's flat metrics.
    """
    recipe = recipe_for(cfg, env_factory=env_factory, on_step=on_step)
    try:
        recipe.setup()
        result: dict[str, Any] = recipe.train()
        return result
    finally:
        recipe.cleanup()

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

    With ``trainer.procs = N > 1`` and no launcher around this process, the ranks are launched here: on
    ``dataflow.runtime = "ray"`` as a Ray trainer group (:func:`~agentgym.trainers.ray_group.run_trainer_group`,
    which returns rank 0's result). Under ``torchrun`` (or in a group's actor) this process is one rank.
    """
    group = _launch_group(cfg, on_step)
    if group is not None:
        return group(cfg, env_factory=env_factory)
    recipe = recipe_for(cfg, env_factory=env_factory, on_step=on_step)
    try:
        recipe.setup()
        result: dict[str, Any] = recipe.train()
        return result
    finally:
        recipe.cleanup()


def _launch_group(cfg: TrainConfig, on_step: Any) -> Callable[..., dict[str, Any]] | None:
    """What launches ``trainer.procs`` ranks from this process, or ``None`` when this process is the one rank
    (``procs = 1``) or already one of a launched group."""
    import os

    from agentgym.trainers.distributed import launched

    from agentgym.errors import ConfigurationError

    n = cfg.trainer.procs
    if n == 1:
        return None
    if launched():
        world = int(os.environ["WORLD_SIZE"])
        if world != n:
            raise ConfigurationError(f"trainer.procs = {n}, but the launcher started {world} ranks: set "
                                     f"trainer.procs = {world} (or 1), or launch {n} ranks")
        return None
    if cfg.dataflow.runtime != "ray":
        raise ConfigurationError(f"trainer.procs = {n} on the embedded runtime: launch the ranks with torchrun "
                                 f"--nproc_per_node {n} -m agentgym train --config FILE, or set dataflow.runtime = "
                                 "'ray' to run them as a Ray trainer group")
    if on_step is not None:
        raise ConfigurationError("on_step is called in this process, but a Ray trainer group's steps run in its "
                                 "actors: read metrics.jsonl instead")
    from agentgym.trainers.ray_group import run_trainer_group

    return run_trainer_group

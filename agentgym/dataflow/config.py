"""The dataflow layer's configuration: pydantic models, one per concern (the idiom of ``agentgym train``).

* :class:`DataflowConfig`: the user-facing ``[dataflow]`` table of a training config (the trainer's
  :class:`~agentgym.trainers.config.TrainConfig` uses this very model): where rollouts run and how fresh
  trained samples must be.
* :class:`FlowParams`: what a run derives from its other sections (the batch shape, the trained
  policies, the group filters' switches) and the fault-detection timings; the flow takes it beside the
  ``[dataflow]`` table, so nothing is copied field by field.

Both are :class:`~agentgym.config.ConfigModel`: built in Python, a model that does not validate raises
:class:`~agentgym.errors.ConfigurationError` listing every problem; nested in a TrainConfig, its problems
are reported with their ``dataflow.`` keys.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentgym.config import ConfigModel
from agentgym.errors import ConfigurationError

__all__ = ["DataflowConfig", "FlowParams"]


class DataflowConfig(ConfigModel):
    """Where rollouts run and how fresh the trained samples must be (the ``[dataflow]`` table).

    Attributes:
        runtime: ``"embedded"`` (one process, asyncio) or ``"ray"`` (DataFlow and services as Ray actors).
        max_staleness: Most weight versions a trained token may lag (0: synchronous; roll out a batch,
            train, publish, repeat).
        services: Rollout services (each hosts its own rollout policies). Eval policies are separate
            unless the trainer's ``[eval] share_rollout_engine`` (embedded runtime only) evaluates on
            service 0's.
        service_capacity: Groups in flight per service (default: ``rollout.groups_per_step``).
        replay_ratio: Share of each batch replayed from already-trained groups.
        replay_size: Trained groups kept for replay.
        replay_fill: POPO: every group dynamic sampling filtered is replaced by a replayed informative
            group instead of a new rollout (needs the zero-variance filter).
        replay_priority: ``"latest"`` (the newest kept groups) or ``"recency"`` (drawn with priority
            ``0.5 ** (age / replay_half_life)``, age in versions, with replacement; each draw carries
            the importance weight ``(N P_i) ** -replay_beta`` (max-normalised) in the loss).
        replay_half_life / replay_beta: Recency half-life (versions) and importance exponent (0..1).
        replay_max_age: Replayed groups may be at most this many versions old (``None``: no bound).
        ordering: ``"fifo"`` (arrival) or ``"oldest_first"`` (oldest weight version first).
        skip_zero_variance: GRESO-style: skip tasks whose last ``skip_patience`` groups were
            zero-variance, except with probability ``skip_explore``.
        ray_address: An existing Ray cluster (``None``: start or join a local one).
        service_resources: Ray custom resources per service index (e.g. ``[{}, {"node2": 0.01}]``).
    """

    runtime: Literal["embedded", "ray"] = "embedded"
    max_staleness: int = Field(default=0, ge=0)
    services: int = Field(default=1, ge=1)
    service_capacity: int | None = Field(default=None, ge=1)
    replay_ratio: float = Field(default=0.0, ge=0, lt=1)
    replay_size: int = Field(default=256, ge=1)
    replay_fill: bool = False
    replay_priority: Literal["latest", "recency"] = "latest"
    replay_half_life: float = Field(default=4.0, gt=0)
    replay_beta: float = Field(default=1.0, ge=0, le=1)
    replay_max_age: int | None = Field(default=None, ge=0)
    ordering: Literal["fifo", "oldest_first"] = "fifo"
    skip_zero_variance: bool = False
    skip_patience: int = Field(default=1, ge=1)
    skip_explore: float = Field(default=0.1, gt=0, le=1)
    ray_address: str | None = None
    service_resources: list[dict[str, float]] = Field(default_factory=list)


class FlowParams(ConfigModel):
    """What a run derives for the flow from its other sections, and the fault-detection timings.

    Attributes:
        groups_per_step: Groups per trainer batch (per policy).
        policies: The trained policies a ticket feeds.
        workflow: The workflow name services run tickets with.
        filter_zero_variance: Drop zero-variance groups (DAPO dynamic sampling).
        refill: A filtered group's place is refilled with a new rollout (dynamic sampling). ``False``:
            it counts as consumed and the batch comes back short (or, with ``replay_fill``, replayed).
        max_filtered_per_batch: Once this many groups were filtered for a policy since its last batch,
            ``get_batch`` returns what it has (a short, possibly empty batch) instead of waiting for
            more: a model that never succeeds does not stall training forever. ``None``: wait.
        replay_seed: Seeds the replay draws.
        poll_s: How long one service poll waits for a result (the heartbeat period).
        dead_after_s: A service silent for this long is dead.
        max_attempts: A ticket resubmitted this many times is filtered (``"attempts"``) instead.
    """

    groups_per_step: int = Field(default=8, ge=1)
    policies: tuple[str, ...] = ("policy",)
    workflow: str = "default"
    filter_zero_variance: bool = True
    refill: bool = True
    max_filtered_per_batch: int | None = Field(default=None, ge=0)
    replay_seed: int = 0
    poll_s: float = Field(default=0.2, gt=0)
    dead_after_s: float = Field(default=30.0, gt=0)
    max_attempts: int = Field(default=5, ge=1)

    @model_validator(mode="after")
    def _some_policy(self) -> FlowParams:
        if not self.policies:
            raise ValueError("policies must name at least one policy")
        return self


def check_combination(config: DataflowConfig, params: FlowParams) -> None:
    """The one rule that spans both models.

    Raises:
        ConfigurationError: ``replay_fill`` without the zero-variance filter whose groups it replaces.
    """
    if config.replay_fill and not params.filter_zero_variance:
        raise ConfigurationError("replay_fill replaces filtered zero-variance groups: it needs filter_zero_variance")

"""Pilot then commit: spend a whole group only on tasks whose pilot shows reward variance.

:class:`PilotCommitWorkflow` wraps a :class:`~agentgym.rollout.workflow.MultiTurnWorkflow` of group
size ``G``. For each task it first runs a *pilot* of ``pilot_size`` members (``p < G``). The rule:

* the pilot's valid members (no error) got **different** rewards (``max - min > tol``): the task is
  informative now; the other ``G - p`` members run (*commit*) and the group comes back whole, members
  ``0..G-1`` with their own sampling seeds, exactly as a plain group would;
* the pilot's rewards are **all equal**: the group comes back with the pilot members only, marked
  ``early_stopped`` with ``stop_reason = "pilot_commit:pilot_zero_variance"``; the dataflow layer
  files it as filtered with the reason ``"pilot"`` (it never reaches the loss), and the task stream
  counts it as a zero-variance outcome (GRESO skipping sees it);
* fewer than two valid pilot members: nothing can be judged, so the group commits.

A pilot-only group costs ``p / G`` of a group. The price is recall: a task whose pilot happened to
agree but whose full group would have varied is dropped. ``audit=True`` measures that price: every
group runs whole (pilot and rest at once), the decision is only recorded, and the
:class:`~agentgym.rollout.gates.GateRecord` (gate ``"pilot_commit"``) carries the full group's outcome,
so :func:`~agentgym.rollout.gates.gate_precision` gives the pilot's precision and recall against the
groups' real final variance, like the Selective Rollout gate's.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import MutableSequence
from dataclasses import replace

from agentgym.errors import ConfigurationError
from agentgym.policy import Policy
from agentgym.rollout.gates import GateRecord
from agentgym.rollout.runtime import RolloutRuntime
from agentgym.rollout.workflow import GroupRequest, MultiTurnWorkflow
from agentgym.types import Trajectory, TrajectoryGroup

__all__ = ["PILOT_GATE", "PilotCommitWorkflow", "pilot_decision"]

PILOT_GATE = "pilot_commit"


def pilot_decision(pilot: list[Trajectory], tol: float = 1e-9) -> tuple[bool, float | None]:
    """``(commit, spread)``: commit when the valid pilot members' rewards differ by more than ``tol``,
    or when fewer than two are valid (nothing to judge). ``spread`` is ``max - min`` (``None`` then)."""
    rewards = [t.reward for t in pilot if t.error is None]
    if len(rewards) < 2:
        return True, None
    spread = max(rewards) - min(rewards)
    return spread > tol, spread


class PilotCommitWorkflow:
    """Run ``pilot_size`` members first; run the rest of the group only if the pilot's rewards vary.

    Args:
        inner: The group's workflow (its ``group_size`` is the full group; it must have no gates).
        pilot_size: Members in the pilot (``1 <= pilot_size < group_size``; 1 never shows variance,
            so every group would be pilot-only: at least 2 is useful).
        audit: Run every group whole and only record what the pilot would have decided.
        gate_log: A list that collects the pilot's :class:`GateRecord` of every group.
        tol: Rewards closer than this count as equal.
    """

    name = "pilot_commit"

    def __init__(self, inner: MultiTurnWorkflow, pilot_size: int = 2, *, audit: bool = False,
                 gate_log: MutableSequence[GateRecord] | None = None, tol: float = 1e-9) -> None:
        if not 1 <= pilot_size < inner.group_size:
            raise ConfigurationError(f"pilot_size must be in [1, group_size - 1] = [1, {inner.group_size - 1}], "
                                     f"got {pilot_size}")
        if inner.gates:
            raise ConfigurationError("the pilot-then-commit workflow does not combine with early-termination gates "
                                     "(a gate watches one whole group; the pilot runs it in two pieces)")
        self.inner = inner
        self.group_size = inner.group_size
        self.pilot_size = int(pilot_size)
        self.audit = audit
        self.gate_log: MutableSequence[GateRecord] = gate_log if gate_log is not None else []
        self.tol = tol

    @property
    def policies(self) -> list[Policy]:
        return self.inner.policies

    async def run(self, runtime: RolloutRuntime, request: GroupRequest) -> TrajectoryGroup:
        req = replace(request, group_id=request.group_id or uuid.uuid4().hex[:12])
        g, p = self.group_size, self.pilot_size
        t0 = time.monotonic()
        if self.audit:  # the whole group at once; the pilot is its first p members
            pilot_g, rest_g = await asyncio.gather(self.inner.run_members(runtime, req, range(p)),
                                                   self.inner.run_members(runtime, req, range(p, g)))
        else:
            pilot_g = await self.inner.run_members(runtime, req, range(p))
            rest_g = None
        commit, spread = pilot_decision(pilot_g.trajectories, self.tol)
        pilot_tokens = sum(t.num_generated_tokens for t in pilot_g)
        rec = GateRecord(
            gate=PILOT_GATE, group_id=req.group_id, task_id=req.task_id, env_id=req.env_id,
            action="continue" if commit else "stop",
            reason=("pilot_unjudged" if spread is None else "pilot_has_variance") if commit else "pilot_zero_variance",
            score=spread, step=0, enforced=not commit and not self.audit, elapsed_s=time.monotonic() - t0,
            details={"pilot_size": p, "group_size": g, "pilot_rewards": pilot_g.rewards()},
            tokens_at_decision=pilot_tokens)
        if not commit and not self.audit:
            group = pilot_g
            group.early_stopped = True
            group.stop_reason = f"{PILOT_GATE}:pilot_zero_variance"
            rec.final_rewards = group.rewards()
            rec.final_success = [t.success for t in group]
            rec.final_zero_variance = None  # the rest never ran: the full group's variance is unknown
        else:
            if rest_g is None:
                rest_g = await self.inner.run_members(runtime, req, range(p, g))
            group = TrajectoryGroup(group_id=req.group_id, task_id=req.task_id, env_id=req.env_id,
                                    trajectories=pilot_g.trajectories + rest_g.trajectories, info=dict(req.info))
            rec.final_rewards = group.rewards()
            rec.final_success = [t.success for t in group]
            rec.final_zero_variance = group.zero_variance(tol=self.tol)
        rec.final_tokens = sum(t.num_generated_tokens for t in group)
        rec.final_elapsed_s = time.monotonic() - t0
        group.gate_records = [*group.gate_records, rec.to_dict()]
        self.gate_log.append(rec)
        return group

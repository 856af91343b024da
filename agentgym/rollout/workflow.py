"""Workflows: async functions that run one group of episodes for one task.

A workflow takes a :class:`GroupRequest` (env id, task id, seed) and returns ``list[Trajectory]``.
The runtime (:class:`~agentgym.rollout.runtime.RolloutRuntime`) supplies envs, the worker pool for
blocking env calls and the concurrency cap; :class:`~agentgym.rollout.engine.RolloutEngine` runs
many groups at once.

:class:`MultiTurnWorkflow` is the GRPO workhorse: G samples of one task with one policy, every env
reset with ``options={"task_id": ...}`` and the same seed so the group replays one task; gates
(:mod:`agentgym.rollout.gates`) watch the group after every env step.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentgym.errors import ConfigurationError
from agentgym.policy import Policy, SamplingParams
from agentgym.rollout.episode import Episode, EpisodeSpec, TokenMode, run_episode_body
from agentgym.rollout.gates import Gate, GateMonitor, GateRecord, GroupState
from agentgym.rollout.runtime import EnvTimeout, RolloutLimits, RolloutRuntime
from agentgym.types import Trajectory, TrajectoryGroup

__all__ = ["GroupRequest", "MultiTurnWorkflow", "Workflow", "error_trajectory", "member_sampling_seed", "run_group"]


@dataclass
class GroupRequest:
    """One group to run.

    Attributes:
        env_id: Registered env id.
        task_id: The task every member is reset to.
        seed: Env reset seed (the same for all members, so they see the same text).
        group_id: Unique id of the group (generated if empty).
        sampling_seed: Base seed for sampling; member ``i`` gets a distinct derived seed. ``None``:
            the backend's own randomness.
        info: Copied into every trajectory's ``info`` and the group's (eval keys, split, task type...).
    """

    env_id: str
    task_id: str
    seed: int | None = 0
    group_id: str = ""
    sampling_seed: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Workflow(Protocol):
    """Runs one group. Must not raise for a failing policy or env (lost episodes carry ``error``).

    ``group_size`` is the number of episodes in a group; ``policies`` the policies it acts with
    (the rollout service publishes weights to them).
    """

    name: str
    group_size: int

    async def run(self, runtime: RolloutRuntime, request: GroupRequest) -> TrajectoryGroup: ...


def member_sampling_seed(base: int | None, member: int) -> int | None:
    return None if base is None else (base * 7919 + member) % (2**31 - 1)


def error_trajectory(req: GroupRequest, group_id: str, member: int, err: BaseException) -> Trajectory:
    """A trajectory for an episode that could not even start (env construction failed...)."""
    return Trajectory(task_id=req.task_id, env_id=req.env_id, group_id=group_id, member=member,
                      error=f"{type(err).__name__}: {err}", error_source="env",
                      info={**req.info, "seed": req.seed, "actions": [],
                            "error_kind": "env_timeout" if isinstance(err, EnvTimeout) else type(err).__name__},
                      metrics={"turns": 0, "env_steps": 0, "generated_tokens": 0, "prompt_tokens": 0, "parse_errors": 0})


EpisodeBody = Callable[[Episode], Awaitable[None]]


async def run_group(runtime: RolloutRuntime, request: GroupRequest, size: int, body: EpisodeBody, *,
                    limits: RolloutLimits, gates: Sequence[Gate] = (), audit: bool = False,
                    gate_log: list[GateRecord] | None = None) -> TrajectoryGroup:
    """Run ``size`` members of one group, each ``body(episode)`` on its own env, under the group's gates.

    Every member holds a runtime slot while it runs; an env that broke is discarded, not reused.
    """
    group_id = request.group_id or uuid.uuid4().hex[:12]
    monitor = None
    if gates:
        monitor = GateMonitor(GroupState(group_id, request.task_id, request.env_id, size), gates, audit=audit,
                              log=gate_log)

    async def member(i: int) -> Trajectory:
        spec = EpisodeSpec(request.env_id, request.task_id, request.seed, group_id, i,
                           member_sampling_seed(request.sampling_seed, i), dict(request.info))
        async with runtime.slot():
            try:
                async with runtime.env(request.env_id, timeout=limits.env_start_timeout_s) as env:
                    ep = Episode(runtime, env, spec, limits, monitor)
                    traj = await ep.run(body)
                    if ep.env_broken:
                        runtime.discard(env)
                    return traj
            except asyncio.CancelledError:
                raise
            except Exception as e:  # env construction failed: this member is lost, the rest go on
                if monitor is not None:
                    monitor.member_done(i, False)
                return error_trajectory(request, group_id, i, e)

    trajs = list(await asyncio.gather(*(member(i) for i in range(size))))
    group = TrajectoryGroup(group_id=group_id, task_id=request.task_id, env_id=request.env_id, trajectories=trajs,
                            info=dict(request.info))
    if monitor is not None:
        group.gate_records = [r.to_dict() for r in monitor.finish()]
        if monitor.stopped:
            group.early_stopped = True
            group.stop_reason = monitor.stop_reason
            for t in trajs:
                t.early_stopped = True
    return group


class MultiTurnWorkflow:
    """G samples of one task against one policy.

    Args:
        policy: Any :class:`~agentgym.policy.Policy`; token-in/token-out if it declares sessions.
        group_size: G, the number of episodes per task.
        sampling: Sampling parameters for every turn.
        limits: Turn/token/wall-time limits (each gives ``truncated``).
        gates: Early-termination gates watching the group.
        audit: Log gate decisions without enforcing them (for precision measurements).
        gate_log: A list that collects every :class:`GateRecord` (shared across groups).
        token_mode: ``"auto"``, ``"on"`` or ``"off"`` (see :class:`~agentgym.rollout.episode.Conversation`).
        history_window: Message mode only: keep the last N turns of history.
    """

    name = "multi_turn"

    def __init__(self, policy: Policy, group_size: int = 1, *, sampling: SamplingParams | None = None,
                 limits: RolloutLimits | None = None, gates: Sequence[Gate] = (), audit: bool = False,
                 gate_log: list[GateRecord] | None = None, token_mode: TokenMode = "auto",
                 history_window: int | None = None) -> None:
        if group_size < 1:
            raise ConfigurationError(f"group_size must be >= 1, got {group_size}.")
        names = [g.name for g in gates]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"gate names must be unique, got {names}.")
        self.policy = policy
        self.group_size = group_size
        self.sampling = sampling or SamplingParams()
        self.limits = limits or RolloutLimits()
        self.gates = list(gates)
        self.audit = audit
        self.gate_log: list[GateRecord] = gate_log if gate_log is not None else []
        self.token_mode: TokenMode = token_mode
        self.history_window = history_window

    @property
    def policies(self) -> list[Policy]:
        return [self.policy]

    async def run(self, runtime: RolloutRuntime, request: GroupRequest) -> TrajectoryGroup:
        async def body(ep: Episode) -> None:
            await run_episode_body(ep, self.policy, self.sampling, self.token_mode, self.history_window)

        return await run_group(runtime, request, self.group_size, body, limits=self.limits, gates=self.gates,
                               audit=self.audit, gate_log=self.gate_log)

"""The rollout engine: concurrent multi-turn workflows, token-exact episodes and early-termination gates.

* :class:`RolloutRuntime`: the worker pool for blocking env calls (threads, or one process per env),
  env pools and the episode concurrency cap.
* :class:`RolloutEngine`: submit groups, stream :class:`GroupResult` as they finish, cancel, with
  backpressure; or ``run`` a list of requests.
* :class:`Episode`: the one stepper (propose, act, observe) that every workflow composes.
* :class:`MultiTurnWorkflow` (one policy, G samples of a task) and :class:`SolverVerifierWorkflow`
  (two roles, each turn tagged with its policy). Both return a :class:`~agentgym.types.TrajectoryGroup`.
* :class:`RolloutLimits`: turn, token and wall-time limits, each giving ``truncated``.
* Gates: :class:`SelectiveRolloutGate`, :class:`ZeroVarianceDetector`, :func:`gate_precision`.
* JSONL: :func:`write_jsonl`, :func:`append_jsonl`, :func:`read_jsonl`.
* :func:`micro_batch`: coalesce concurrent per-turn requests for static-batching backends (HF).

This package imports only the core (``agentgym.*``); policies come in as objects.
"""

from __future__ import annotations

from agentgym.rollout.batching import MicroBatcher, micro_batch
from agentgym.rollout.engine import GroupResult, RolloutEngine
from agentgym.rollout.episode import Conversation, Episode, EpisodeSpec, StepOutcome, run_episode
from agentgym.rollout.gates import (
    Gate,
    GateDecision,
    GateMonitor,
    GateRecord,
    GroupState,
    SelectiveRolloutGate,
    ZeroVarianceDetector,
    canonical_action,
    gate_precision,
    levenshtein,
    mean_pairwise_distance,
    normalized_distance,
)
from agentgym.rollout.jsonl import append_jsonl, iter_jsonl, read_jsonl, write_jsonl
from agentgym.rollout.multi_policy import SolverVerifierWorkflow, parse_verdict, split_by_policy
from agentgym.rollout.runtime import RolloutLimits, RolloutRuntime
from agentgym.rollout.workflow import GroupRequest, MultiTurnWorkflow, Workflow, run_group

__all__ = [
    "Conversation",
    "Episode",
    "EpisodeSpec",
    "Gate",
    "GateDecision",
    "GateMonitor",
    "GateRecord",
    "GroupRequest",
    "GroupResult",
    "GroupState",
    "MicroBatcher",
    "MultiTurnWorkflow",
    "RolloutEngine",
    "RolloutLimits",
    "RolloutRuntime",
    "SelectiveRolloutGate",
    "SolverVerifierWorkflow",
    "StepOutcome",
    "Workflow",
    "ZeroVarianceDetector",
    "append_jsonl",
    "canonical_action",
    "gate_precision",
    "iter_jsonl",
    "levenshtein",
    "mean_pairwise_distance",
    "micro_batch",
    "normalized_distance",
    "parse_verdict",
    "read_jsonl",
    "run_episode",
    "run_group",
    "split_by_policy",
    "write_jsonl",
]

"""What a recipe builds from its typed config sections: rollout policies, workflows, rollout services, the
training tasks, the dataflow runtime, and the held-out evaluation.

These functions cross layers (policies, envs through the registry, the dataflow runtime, eval), which
only recipes and the CLI may do. Each takes the config *sections* it needs, typed, never the whole config
as a dict; a rollout service's factory is a ``functools.partial`` of :func:`service_workflows` over those
sections (pydantic models pickle), so a Ray actor on another node builds the same thing.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym.trainers.config import (
    EvalConfig,
    GateConfig,
    ModelConfig,
    MultiConfig,
    PilotConfig,
    RolloutConfig,
    TrainConfig,
    flow_params,
)
from agentgym.trainers.run import import_modules

from agentgym.errors import ConfigurationError

__all__ = ["close_policies", "env_factory", "eval_metrics", "evaluate", "registered_workflow", "rollout_policy", "rollout_runtime",
           "service_workflows", "train_tasks", "workflow"]


def rollout_policy(rollout: RolloutConfig, model: ModelConfig, pid: str, path: str, seed: int) -> Any:
    """The rollout (or eval) policy ``pid`` over the model at ``path``: HF or vLLM, per ``rollout.backend``."""
    if rollout.backend == "vllm":
        from agentgym.policies.vllm import VLLMPolicy

        kw: dict[str, Any] = {"max_model_len": rollout.max_total_tokens or 4096,
                              "max_num_seqs": max(8, rollout.concurrency), "kv_cache_gib": 2, **rollout.vllm_kwargs}
        return VLLMPolicy(path, policy_id=pid, dtype=rollout.rollout_dtype or "bfloat16", seed=seed, **kw)
    from agentgym.policies.hf import HFPolicy

    return HFPolicy(path, policy_id=pid, dtype=rollout.rollout_dtype or model.dtype, device=model.device,
                    max_batch_size=max(1, rollout.concurrency), timeout_s=rollout.policy_timeout_s,
                    context_length=rollout.max_total_tokens)


def workflow(rollout: RolloutConfig, multi: MultiConfig, gate: GateConfig, pilot: PilotConfig,
             policies: Mapping[str, Any]) -> Any:
    """The training workflow over ``policies`` (one group = ``rollout.group_size`` episodes of a task), with
    the Selective Rollout gate (``[gate]``) or the pilot-then-commit wrapper (``[pilot]``) when on."""
    from agentgym.policy import SamplingParams
    from agentgym.rollout import MultiTurnWorkflow, RolloutLimits, SelectiveRolloutGate
    from agentgym.rollout.multi_policy import SolverVerifierWorkflow
    from agentgym.rollout.pilot import PilotCommitWorkflow

    if multi.workflow not in ("none", "solver_verifier"):
        return registered_workflow(rollout, multi, policies)
    sampling = SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p, max_tokens=rollout.max_tokens)
    limits = RolloutLimits(max_turns=rollout.max_turns, max_total_tokens=rollout.max_total_tokens,
                           policy_timeout_s=rollout.policy_timeout_s)
    if multi.workflow == "solver_verifier":
        return SolverVerifierWorkflow(
            policies["solver"], policies["verifier"], rollout.group_size, sampling=sampling,
            verifier_sampling=SamplingParams(temperature=rollout.temperature, max_tokens=multi.verifier_max_tokens),
            limits=limits)
    gates = []
    if gate.mode != "off":
        gates.append(SelectiveRolloutGate(gate.k, gate.threshold, level=gate.level, hold=gate.hold, view=gate.view))
    # the gate records travel on each TrajectoryGroup; the workflow's own log keeps only the latest
    wf = MultiTurnWorkflow(policies["policy"], rollout.group_size, sampling=sampling, limits=limits, gates=gates,
                           audit=gate.mode == "audit", gate_log=deque(maxlen=256))
    if pilot.mode != "off":
        return PilotCommitWorkflow(wf, pilot.size, audit=pilot.mode == "audit", gate_log=deque(maxlen=256))
    return wf


def registered_workflow(rollout: RolloutConfig, multi: MultiConfig, policies: Mapping[str, Any]) -> Any:
    """``multi.workflow`` naming a registered workflow (``harness``: an external agent through the policy
    endpoint; see :mod:`agentgym.harness.registry`), built by its factory from the ``[rollout]`` and
    ``[multi]`` tables (plain dicts: a factory also runs inside a Ray rollout service) and the policies."""
    from agentgym.harness.registry import workflow_factory

    tables = {"rollout": rollout.model_dump(), "multi": multi.model_dump()}
    return workflow_factory(multi.workflow)(tables, policies)


def service_workflows(rollout: RolloutConfig, model: ModelConfig, multi: MultiConfig, gate: GateConfig,
                      pilot: PilotConfig, paths: Mapping[str, str], seed: int) -> dict[str, Any]:
    """A rollout service's workflows, over policies of its own (runs where the service runs)."""
    import_modules(rollout.imports)
    policies = {pid: rollout_policy(rollout, model, pid, path, seed) for pid, path in paths.items()}
    return {"default": workflow(rollout, multi, gate, pilot, policies)}


def _make_env(env_kwargs: Mapping[str, Any], env_id: str) -> Any:
    from agentgym.registration import make

    return make(env_id, **dict(env_kwargs))


def env_factory(rollout: RolloutConfig) -> Callable[[str], Any]:
    """A picklable ``env_id -> env`` with ``rollout.env_kwargs``."""
    return functools.partial(_make_env, dict(rollout.env_kwargs))


def train_tasks(rollout: RolloutConfig, seed: int, make_env: Callable[[str], Any]) -> list[Any]:
    """The training tasks (``rollout.split``, the first ``rollout.tasks`` spread evenly) as dataflow task refs."""
    from agentgym.dataflow.tasks import TaskRef
    from agentgym.eval.runner import select_tasks

    env = make_env(rollout.env)
    try:
        try:
            tasks_fn = env.get_wrapper_attr("tasks")
        except AttributeError:
            raise ConfigurationError(f"{rollout.env} has no tasks(); it cannot be trained on") from None
        pool = list(tasks_fn(rollout.split))
    finally:
        env.close()
    if not pool:
        raise ConfigurationError(f"{rollout.env} split {rollout.split!r} has no tasks")
    info: dict[str, Any] = {"derive_sampling_seed": True} if rollout.sampling_seeds else {}
    return [TaskRef(rollout.env, t.task_id, seed=seed, info=info) for t in select_tasks(pool, rollout.tasks)]


def rollout_runtime(cfg: TrainConfig, *, tasks: Sequence[Any], policies: Sequence[str]) -> Any:
    """The dataflow runtime (embedded or Ray, from the ``[dataflow]`` table) feeding ``policies``' buffers
    from ``tasks``; the batch shape and filter switches come from the rest of the config (:func:`flow_params`)."""
    from agentgym.dataflow import make_runtime

    return make_runtime(cfg.dataflow, flow_params(cfg, tuple(policies)), tasks, seed=cfg.run.seed)


# what a held-out evaluation takes from [rollout] (its episode limits and the env's kwargs); the rest of the
# runner's protocol comes from [eval] or is the runner's default
EVAL_FROM_ROLLOUT = ("max_turns", "max_tokens", "max_total_tokens", "concurrency", "env_kwargs")


async def evaluate(policy: Any, ev: EvalConfig, rollout: RolloutConfig, out: Path) -> dict[str, Any]:
    """Held-out evaluation of ``policy`` through ``agentgym.eval`` (same protocol and summary as
    ``agentgym eval``), written to ``out``. Returns success with the summary's 95% interval (a bootstrap over
    tasks, or a Wilson interval over the episodes where every task ties)."""
    from agentgym.eval.runner import EvalConfig as RunnerEvalConfig
    from agentgym.eval.runner import arun_eval

    # the runner's protocol: the [rollout] limits, then every field [eval] shares with the runner's model
    # (split, tasks, seeds, sampling; an unset max_turns / max_tokens keeps the rollout's)
    shared = set(RunnerEvalConfig.model_fields)
    rc = RunnerEvalConfig(envs=[rollout.env], **{**rollout.model_dump(include=set(EVAL_FROM_ROLLOUT)),
                                                 **ev.model_dump(include=shared, exclude_none=True)})
    t0 = time.monotonic()
    summary = await arun_eval(policy, rc, out)
    ov = summary.get("overall", {})
    succ = ov.get("success", {})
    ci = succ.get("ci95")
    # agentgym.eval.stats: a bootstrap over tasks (a task's seeds together), or Wilson over the episodes when
    # every task ties; never zero-width
    interval = [max(0.0, ci[0]), min(1.0, ci[1])] if ci is not None else None
    kind = {"wilson": "Wilson 95% over episodes", "bootstrap over tasks": "95% bootstrap over tasks"}.get(
        succ.get("method") or "", "no interval")
    return {"success": succ.get("mean"), "success_ci95": ci, "success_interval": interval, "interval_kind": kind,
            "episodes": ov.get("episodes"), "reward": ov.get("reward", {}).get("mean"), "split": ev.split,
            "seeds": list(ev.seeds), "wall_s": time.monotonic() - t0}


def eval_metrics(res: Mapping[str, Any]) -> dict[str, Any]:
    """The curve's point of one evaluation (success and its interval)."""
    iv = res.get("success_interval") or [None, None]
    return {"success": res["success"], "success_lo": iv[0], "success_hi": iv[1], "episodes": res.get("episodes")}


def close_policies(policies: Mapping[str, Any]) -> None:
    """Stop the engines of policies a recipe built (vLLM's engine core, HF's decode thread). Called outside
    any event loop (the recipes' ``cleanup``)."""
    import asyncio

    for p in policies.values():
        shutdown = getattr(p, "shutdown", None)
        if callable(shutdown):
            shutdown()
        elif callable(getattr(p, "aclose", None)):
            asyncio.run(p.aclose())

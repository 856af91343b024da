"""Rollout policies and workflows for a training run, built from the config wherever a service runs.

Everything here is a module-level function of plain data (the config as a dict), so a rollout
service can build its policies inside a Ray actor on another node as well as in this process.
"""

from __future__ import annotations

import importlib
from collections import deque
from collections.abc import Mapping
from typing import Any

from agentgym.rollout.workflow import Workflow

__all__ = ["make_env", "make_rollout_policy", "make_workflow", "policy_paths", "registered_workflow", "service_workflows"]


def policy_paths(cfg: Mapping[str, Any]) -> dict[str, str]:
    """policy id -> model folder, for the trained policies of this config."""
    path = cfg["model"]["path"]
    if cfg["multi"]["workflow"] == "solver_verifier":
        return {"solver": path, "verifier": cfg["multi"].get("verifier_path") or path}
    return {"policy": path}


def make_rollout_policy(cfg: Mapping[str, Any], pid: str, path: str) -> Any:
    """The rollout policy ``pid`` (HF or vLLM, per ``rollout.backend``)."""
    r = cfg["rollout"]
    if r["backend"] == "vllm":
        from agentgym.policies.vllm import VLLMPolicy

        kw = {"max_model_len": r.get("max_total_tokens") or 4096, "max_num_seqs": max(8, r["concurrency"]),
              "kv_cache_gib": 2, **r.get("vllm_kwargs", {})}
        return VLLMPolicy(path, policy_id=pid, dtype=r.get("rollout_dtype") or "bfloat16", seed=cfg["run"]["seed"], **kw)
    from agentgym.policies.hf import HFPolicy

    return HFPolicy(path, policy_id=pid, dtype=r.get("rollout_dtype") or cfg["model"]["dtype"],
                    device=cfg["model"]["device"], max_batch_size=max(1, r["concurrency"]),
                    timeout_s=r["policy_timeout_s"], context_length=r.get("max_total_tokens"))


def make_workflow(cfg: Mapping[str, Any], policies: Mapping[str, Any]) -> Workflow:
    """The training workflow over ``policies`` (one group = ``rollout.group_size`` episodes of a task),
    with the Selective Rollout gate (``[gate]``) or the pilot-then-commit wrapper (``[pilot]``) if on."""
    from agentgym.policy import SamplingParams
    from agentgym.rollout import MultiTurnWorkflow, RolloutLimits, SelectiveRolloutGate
    from agentgym.rollout.multi_policy import SolverVerifierWorkflow
    from agentgym.rollout.pilot import PilotCommitWorkflow

    if cfg["multi"]["workflow"] not in ("none", "solver_verifier"):
        return registered_workflow(cfg, policies)
    r = cfg["rollout"]
    sampling = SamplingParams(temperature=r["temperature"], top_p=r["top_p"], max_tokens=r["max_tokens"])
    limits = RolloutLimits(max_turns=r.get("max_turns"), max_total_tokens=r.get("max_total_tokens"),
                           policy_timeout_s=r["policy_timeout_s"])
    if cfg["multi"]["workflow"] == "solver_verifier":
        return SolverVerifierWorkflow(
            policies["solver"], policies["verifier"], r["group_size"], sampling=sampling,
            verifier_sampling=SamplingParams(temperature=r["temperature"], max_tokens=cfg["multi"]["verifier_max_tokens"]),
            limits=limits)
    gate = cfg.get("gate") or {"mode": "off"}
    pilot = cfg.get("pilot") or {"mode": "off"}
    gates = []
    if gate["mode"] != "off":
        gates.append(SelectiveRolloutGate(gate["k"], gate["threshold"], level=gate["level"], hold=gate["hold"],
                                          view=gate["view"]))
    # the gate records travel on each TrajectoryGroup; the workflow's own log keeps only the latest
    wf = MultiTurnWorkflow(policies["policy"], r["group_size"], sampling=sampling, limits=limits, gates=gates,
                           audit=gate["mode"] == "audit", gate_log=deque(maxlen=256))
    if pilot["mode"] != "off":
        return PilotCommitWorkflow(wf, pilot["size"], audit=pilot["mode"] == "audit", gate_log=deque(maxlen=256))
    return wf


def registered_workflow(cfg: Mapping[str, Any], policies: Mapping[str, Any]) -> Workflow:
    """``multi.workflow`` naming a registered workflow (``harness``: an external agent through the policy
    endpoint), built by its factory from the config and the ``policy`` rollout policy."""
    from agentgym.harness.registry import workflow_factory

    return workflow_factory(cfg["multi"]["workflow"])(cfg, policies)


def service_workflows(cfg: Mapping[str, Any]) -> dict[str, Workflow]:
    """A rollout service's workflows, with policies of its own (runs where the service runs)."""
    for mod in cfg["rollout"].get("imports", []):
        importlib.import_module(mod)
    policies = {pid: make_rollout_policy(cfg, pid, path) for pid, path in policy_paths(cfg).items()}
    return {"default": make_workflow(cfg, policies)}


def make_env(env_kwargs: Mapping[str, Any], env_id: str) -> Any:
    """A picklable env factory: ``functools.partial(make_env, env_kwargs)``."""
    from agentgym.registration import make

    return make(env_id, **dict(env_kwargs))

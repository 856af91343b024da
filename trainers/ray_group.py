"""The trainer as a Ray worker group: the ranks of a sharded (FSDP2) run as Ray actors.

``agentgym train`` with ``trainer.strategy = "fsdp2"``, ``dataflow.runtime = "ray"`` and ``trainer.procs = N > 1``
(and no ``torchrun`` around it) calls :func:`run_trainer_group`, which

1. connects to Ray (``dataflow.ray_address``, or starts a local instance, as the Ray runtime does);
2. creates N trainer actors, each placed with ``trainer.resources`` (the syntax of
   ``dataflow.service_resources``: ``num_cpus`` / ``num_gpus`` / ``memory`` and custom resources;
   ``num_cpus`` defaults to 1), and waits (bounded) until every one is placed;
3. gives each actor the environment of one ``torch.distributed`` rank, the one ``torchrun`` would give:
   ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (its index among the group's actors on its node; 0 when Ray
   assigned it GPUs, since Ray then narrows ``CUDA_VISIBLE_DEVICES`` to them), ``MASTER_ADDR`` (rank 0's
   node IP) and ``MASTER_PORT`` (a port rank 0's actor found free);
4. has every actor run the same recipe, :func:`agentgym.recipes.run_training`, as that rank. The process
   group forms over those variables exactly as under ``torchrun``; rank 0's actor owns the rollout services,
   which it starts on the same Ray cluster (the Ray runtime connects to the cluster it already runs in);
5. waits for all of them and returns rank 0's result. A rank that dies (killed, OOM, node lost) or raises
   stops the whole group at once: the driver kills the other actors and raises :class:`TrainerGroupFailed`
   naming the rank, without waiting for the process group's collective timeout. The wait is bounded by
   ``timeout_s`` (default: ``run.time_budget_s`` plus 30 minutes for setup and evaluation, else none) and, once
   one rank has finished, by ``grace_s`` for the others.

The group is killed when this returns or raises, and a Ray instance this call started is shut down.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from agentgym.trainers.config import TrainConfig

from agentgym.errors import AgentGymError

__all__ = ["TrainerGroupFailed", "actor_options", "rank_envs", "run_trainer_group"]

_RAY_OPTIONS = ("num_cpus", "num_gpus", "memory")


class TrainerGroupFailed(AgentGymError, RuntimeError):
    """A rank of a Ray trainer group died, raised, or did not finish in time; the whole group was stopped."""


def actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray actor options from ``trainer.resources``: ``num_cpus`` (default 1), ``num_gpus`` and ``memory`` as
    themselves, any other key as a custom resource (as ``dataflow.service_resources`` places services)."""
    opts: dict[str, Any] = {"num_cpus": 1.0}
    custom = {k: float(v) for k, v in resources.items() if k not in _RAY_OPTIONS}
    opts.update({k: float(v) for k, v in resources.items() if k in _RAY_OPTIONS})
    if custom:
        opts["resources"] = custom
    return opts


class _TrainerRank:
    """One rank of the trainer group (decorated with ``ray.remote`` in :func:`run_trainer_group`)."""

    def place(self) -> dict[str, Any]:
        """Where this actor landed: its node, node IP, assigned GPUs and a free port (used on rank 0)."""
        import socket

        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        ctx = ray.get_runtime_context()
        return {"node": ctx.get_node_id(), "ip": ip, "port": port, "gpus": list(ray.get_gpu_ids())}

    def run(self, cfg: TrainConfig, env: dict[str, str],
            env_factory: Callable[[str], Any] | None) -> dict[str, Any]:
        """Run the recipe as the rank ``env`` names (the variables a ``torchrun`` rank gets)."""
        import os

        os.environ.update(env)
        from agentgym.recipes import run_training

        return run_training(cfg, env_factory=env_factory)


def _ray() -> Any:
    from agentgym.dataflow.ray_runtime import _ray as ray

    return ray()


def rank_envs(places: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The ``torch.distributed`` environment of each rank, from where the actors landed (rank 0's IP and port)."""
    world, seen = len(places), dict[str, int]()
    out = []
    for rank, p in enumerate(places):
        local = seen.get(p["node"], 0)
        seen[p["node"]] = local + 1
        out.append({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0" if p["gpus"] else str(local),
                    "MASTER_ADDR": places[0]["ip"], "MASTER_PORT": str(places[0]["port"])})
    return out


def run_trainer_group(cfg: TrainConfig, *, env_factory: Callable[[str], Any] | None = None,
                      timeout_s: float | None = None, grace_s: float = 300.0, place_timeout_s: float = 300.0,
                      poll_s: float = 0.5) -> dict[str, Any]:
    """Run ``cfg`` as ``trainer.procs`` Ray actors forming one process group; returns rank 0's result.

    Args:
        cfg: A validated config (``trainer.strategy = "fsdp2"``, ``trainer.procs > 1``).
        env_factory: Shipped to every rank (rank 0's rollout services use it); must pickle.
        timeout_s: Bound on the whole run (default: ``run.time_budget_s`` + 1800 s, or none without a budget).
        grace_s: Once one rank has finished, how long the others may take to finish too.
        place_timeout_s: How long the actors may wait for resources before the launch gives up.

    Raises:
        TrainerGroupFailed: a rank died or raised (the message names it), the actors could not be placed,
            or the run went past its bound. The other actors are killed first.
    """
    ray = _ray()
    n = cfg.trainer.procs
    if timeout_s is None and cfg.run.time_budget_s is not None:
        timeout_s = cfg.run.time_budget_s + 1800.0
    started = not ray.is_initialized()
    if started:
        ray.init(address=cfg.dataflow.ray_address, include_dashboard=False, log_to_driver=True)
    cls = ray.remote(max_restarts=0, max_task_retries=0)(_TrainerRank)
    opts = actor_options(cfg.trainer.resources)
    tag = uuid.uuid4().hex[:8]  # names show each actor's rank in `ray list actors` / the state API
    actors = [cls.options(name=f"agentgym-trainer-{tag}-rank-{r}", **opts).remote()  # type: ignore[attr-defined]
              for r in range(n)]
    try:
        places_refs = [a.place.remote() for a in actors]
        ready, _ = ray.wait(places_refs, num_returns=n, timeout=place_timeout_s)
        if len(ready) < n:
            raise TrainerGroupFailed(
                f"the trainer group's {n} actors (each {opts}) could not all be placed in {place_timeout_s:g} s; "
                f"the cluster has {ray.cluster_resources()}: lower trainer.procs or trainer.resources, or add nodes")
        places = []
        for rank, ref in enumerate(places_refs):
            try:
                places.append(ray.get(ref))
            except ray.exceptions.RayError as e:  # its worker could not start (OOM-killed, runtime_env, ...)
                raise TrainerGroupFailed(f"trainer rank {rank} of {n} could not start: {type(e).__name__}: "
                                         f"{_first_line(e)}") from e
        refs = [a.run.remote(cfg, env, env_factory) for a, env in zip(actors, rank_envs(places), strict=True)]
        results = _wait_all(ray, refs, timeout_s, grace_s, poll_s)
        out: dict[str, Any] = results[0]
        return out
    finally:
        for a in actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(a, no_restart=True)
        if started:
            ray.shutdown()


def _wait_all(ray: Any, refs: list[Any], timeout_s: float | None, grace_s: float, poll_s: float) -> list[Any]:
    """Every rank's result, or :class:`TrainerGroupFailed` as soon as one rank fails (or the bound passes)."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s if timeout_s is not None else None
    rank_of = {ref: i for i, ref in enumerate(refs)}
    results: dict[int, Any] = {}
    pending, graced = list(refs), False
    while pending:
        wait = poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic()))
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=wait)
        failures: list[tuple[int, bool, BaseException]] = []
        for ref in ready:
            try:
                results[rank_of[ref]] = ray.get(ref)
            except ray.exceptions.RayActorError as e:  # killed, crashed, OOM, node lost
                failures.append((rank_of[ref], True, e))
            except ray.exceptions.RayTaskError as e:  # the recipe raised
                cause = getattr(e, "cause", None)
                failures.append((rank_of[ref], False, cause if isinstance(cause, BaseException) else e))
        if failures:
            # a death usually makes the other ranks' collectives fail: report the dead rank first
            failures.sort(key=lambda f: (not f[1], f[0]))
            rank, died, err = failures[0]
            what = (f"died ({type(err).__name__}: {_first_line(err)})" if died
                    else f"raised {type(err).__name__}: {err}")
            others = "".join(f"; rank {r} {'died' if d else 'raised ' + type(x).__name__}" for r, d, x in failures[1:])
            raise TrainerGroupFailed(f"trainer rank {rank} of {len(refs)} {what}{others}; the group was stopped "
                                     f"after {time.monotonic() - t0:.0f} s") from err
        if pending and results and not graced:  # a rank finished: the others must follow soon
            graced = True
            soon = time.monotonic() + grace_s
            deadline = soon if deadline is None else min(deadline, soon)
        if pending and deadline is not None and time.monotonic() >= deadline:
            late = sorted(rank_of[r] for r in pending)
            raise TrainerGroupFailed(f"trainer ranks {late} of {len(refs)} did not finish in time "
                                     f"({time.monotonic() - t0:.0f} s; ranks {sorted(results)} finished); the group "
                                     "was stopped")
    return [results[i] for i in range(len(refs))]


def _first_line(e: BaseException) -> str:
    lines = [x for x in str(e).splitlines() if x.strip()]
    return lines[0][:300] if lines else ""

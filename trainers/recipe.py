"""The training recipe: a readable, synchronous setup / train / cleanup.

``algorithm = "grpo"``, one step::

    batch    = await dataflow.get_batch(policy)        # groups_per_step groups of group_size episodes
               (rollout services run tasks on their own; DAPO dynamic sampling drops zero-variance
               groups and refills, up to filter.max_refill_rounds groups' worth per batch)
    samples  = samples_from_groups(batch, policy)      # segments, loss masks, advantages
    metrics  = trainer.train_on(samples)               # micro-batches, accumulation, optimizer step
    publish  = dataflow.publish(policy, update, version + 1)   # to every rollout service
    log, checkpoint every run.checkpoint_every steps, evaluate every eval.every steps

Rollouts run on the dataflow runtime (:mod:`agentgym.dataflow`): rollout services feed per-policy
buffers and the trainer pulls batches. ``dataflow.max_staleness = 0`` (the default) is the
synchronous schedule (roll out a batch, train, publish, repeat); ``max_staleness = k`` lets the
services run ``k`` versions ahead. ``dataflow.runtime = "ray"`` puts the services (and the buffers) in
Ray actors, possibly on other nodes. It is the same code path either way.

``algorithm = "sft"``, one step: a batch of transcript samples (``[data]``) -> ``train_on``.

The trainer sees trajectories and samples, never envs; the recipe is where rollout and training meet.

Outputs in ``run.out_dir``: ``config.json``, ``metrics.jsonl``, ``checkpoints/``, ``eval/<stage>/``
(the same summary as ``agentgym eval``), ``curves.png``, ``final/`` (a model folder the next stage
can load: ``model.path = "OUT/final"``) and ``result.json`` (before/after success and timings).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import importlib
import json
import logging
import math
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch

from agentgym.errors import ConfigurationError, TrainingDataError
from agentgym.types import Trajectory

from .batching import TrainSample, samples_from_groups
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import TrainConfig
from .memory import memory_metrics
from .metrics import (
    GroupLog,
    MetricsLogger,
    RolloutProgress,
    eval_line,
    flow_counters,
    plot_curves,
    step_line,
)
from .model import add_lora, load_causal_lm
from .publish import WeightPublisher
from .rollout_setup import make_env, make_rollout_policy, make_workflow, policy_paths, service_workflows
from .sft import sft_samples
from .trainer import PolicyTrainer

__all__ = ["Recipe", "load_transcripts", "policy_batches", "recipe_steps", "run_training", "trained_at"]

# Run-folder locks this process holds. A forked child (vLLM's engine core, a multiprocessing worker) must not
# keep a copy: an flock lives as long as any descriptor of it, and the folder would stay locked after cleanup.
_LOCK_FDS: set[int] = set()


def _close_lock_fds_in_child() -> None:
    for fd in list(_LOCK_FDS):
        with contextlib.suppress(OSError):
            os.close(fd)
    _LOCK_FDS.clear()


os.register_at_fork(after_in_child=_close_lock_fds_in_child)

log = logging.getLogger(__name__)
_DT = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _pids_of(cfg: TrainConfig) -> list[str]:
    return ["solver", "verifier"] if cfg.multi.workflow == "solver_verifier" else ["policy"]


def recipe_steps(cfg: TrainConfig, sft_samples: int = 0) -> int:
    """Recipe steps of a run: ``run.steps``, or for SFT with ``run.steps = 0``, ``data.epochs`` passes over
    ``sft_samples`` samples in batches of ``data.batch_size``."""
    if cfg.run.algorithm == "sft" and cfg.run.steps == 0:
        return math.ceil(sft_samples / cfg.data.batch_size) * cfg.data.epochs
    return cfg.run.steps


def trained_at(cfg: TrainConfig, step: int) -> list[str]:
    """The policies recipe step ``step`` trains: all, or with ``multi.schedule = "alternating"`` policy
    ``step mod n``."""
    pids = _pids_of(cfg)
    if len(pids) > 1 and cfg.multi.schedule == "alternating":
        return [pids[step % len(pids)]]
    return pids


def policy_batches(cfg: TrainConfig, sft_samples: int = 0) -> dict[str, int]:
    """``{policy: batches}``: the ``train_on`` calls each trainer gets over the whole run (its
    learning-rate schedule spans ``batches x steps_per_batch`` optimizer steps)."""
    steps = recipe_steps(cfg, sft_samples)
    out = dict.fromkeys(_pids_of(cfg), 0)
    for step in range(steps):
        for pid in trained_at(cfg, step):
            out[pid] += 1
    return out


def load_transcripts(paths: list[str]) -> list[Trajectory]:
    """Trajectories from JSONL files (or folders holding ``trajectories.jsonl``)."""
    from agentgym.rollout.jsonl import iter_jsonl

    out: list[Trajectory] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            path = path / "trajectories.jsonl"
        if not path.is_file():
            raise ConfigurationError(f"data.paths: {p} does not exist (write it with agentgym collect --out {p})")
        out += list(iter_jsonl(path))
    if not out:
        raise ConfigurationError(f"data.paths {paths} hold no trajectories")
    return out


class Recipe:
    """One training run (see the module docstring).

    Args:
        cfg: The validated config.
        env_factory: ``env_id -> env`` for the rollout runtime (default: the registry).
        on_step: Called with each step's flat metrics (tests, notebooks).
    """

    def __init__(self, cfg: TrainConfig, *, env_factory: Callable[[str], Any] | None = None,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.cfg = cfg
        self.out = Path(cfg.run.out_dir)
        self.env_factory = env_factory
        self.on_step = on_step
        self.trainers: dict[str, PolicyTrainer] = {}
        self.publishers: dict[str, WeightPublisher] = {}
        self.rollout_policies: dict[str, Any] = {}
        self.version = 0
        self.step = 0
        self.stop_requested = False
        self.result: dict[str, Any] = {}
        self._runtime: Any = None
        self._workflow: Any = None
        self._specs: list[Any] = []
        self._flow_state: dict[str, Any] | None = None
        self._sft: list[TrainSample] = []
        self.logger: MetricsLogger | None = None
        self._lock_fd: int | None = None

    # ================================================================== setup
    def setup(self) -> None:
        """Seeds, models, trainers, rollout policies and the engine; resumes from a checkpoint."""
        cfg = self.cfg
        self._lock_out_dir()
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed % (2**32))
        torch.manual_seed(cfg.run.seed)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        for mod in cfg.rollout.imports:
            try:
                importlib.import_module(mod)
            except ImportError as e:
                raise ConfigurationError(f"rollout.imports: cannot import {mod!r}: {e}") from e
        from agentgym.policies.models import load_tokenizer, resolve_model

        self.model_path = resolve_model(cfg.model.path)
        self.tokenizer = load_tokenizer(self.model_path)
        if cfg.run.algorithm == "sft":  # first: the data's size sets the run's length (and the LR schedule's)
            trajs = load_transcripts(cfg.data.paths)
            self._sft, counts = sft_samples(trajs, self.tokenizer, self._pids[0], only_success=cfg.data.only_success,
                                            max_len=cfg.data.max_len)
            if not self._sft:
                raise TrainingDataError(f"no SFT samples from {cfg.data.paths}: {counts}")
            self.result["sft_data"] = counts
        self._build_trainers()
        needs_rollout = cfg.run.algorithm == "grpo" or cfg.eval.before or cfg.eval.after or cfg.eval.every
        if needs_rollout:
            self._build_rollout()
        ck = latest_checkpoint(self.out) if cfg.run.resume else None
        if ck is None:
            self._fresh_start()
        else:
            state = load_checkpoint(ck, self.trainers)
            self.step = int(state["step"])
            self.version = int(state.get("version", 0))
            self.result = dict(state.get("result", self.result))
            self._flow_state = state.get("dataflow")
            log.info("resumed from %s (step %d, version %d)", ck, self.step, self.version)
        self.logger = MetricsLogger(self.out, self.total_steps, tensorboard=cfg.log.tensorboard,
                                    progress=cfg.log.progress, start_step=self.step)
        if ck is not None:
            self.logger.note(f"resumed from {ck} at step {self.step}")

    def _lock_out_dir(self) -> None:
        """One run per folder: a second ``agentgym train`` on the same ``run.out_dir`` (a leftover process, a
        second terminal) would interleave its metrics and overwrite checkpoints. The lock is an ``flock`` on
        ``OUT/.lock``, dropped by the kernel however the holder ends."""
        import fcntl

        self.out.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.out / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigurationError(f"run folder {self.out} is in use by another training run (pid {holder}); "
                                     "wait for it or stop it, or set run.out_dir to another folder") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd
        _LOCK_FDS.add(fd)

    def _fresh_start(self) -> None:
        """A run that does not resume starts a new curve: drop the old run's metrics, evals and checkpoints."""
        import shutil

        for name in ("metrics.jsonl", "result.json", "curves.png", "groups.jsonl"):
            (self.out / name).unlink(missing_ok=True)
        for name in ("eval", "checkpoints", "tensorboard"):
            shutil.rmtree(self.out / name, ignore_errors=True)

    @property
    def _pids(self) -> list[str]:
        return _pids_of(self.cfg)

    @property
    def total_steps(self) -> int:
        """Recipe steps of the run (``run.steps``; SFT with ``run.steps = 0``: ``data.epochs`` passes)."""
        return recipe_steps(self.cfg, len(self._sft))

    def trained_at(self, step: int) -> list[str]:
        """The policies recipe step ``step`` trains (all of them; ``multi.schedule = "alternating"``: one)."""
        return trained_at(self.cfg, step)

    def _build_trainers(self) -> None:
        cfg, m = self.cfg, self.cfg.model
        pids = self._pids
        lora = m.finetune == "lora"
        lkw: dict[str, Any] = {"rank": m.lora_rank, "alpha": m.lora_alpha, "dropout": m.lora_dropout,
                               "targets": m.lora_targets}
        models: dict[str, Any] = {}
        if cfg.multi.workflow != "none" and cfg.multi.shared_base:
            shared = load_causal_lm(cfg.model.path, m.dtype, m.device, m.gradient_checkpointing)
            for pid in pids:
                shared = add_lora(shared, pid, **lkw)
            models = dict.fromkeys(pids, shared)
        else:
            for pid in pids:
                path = cfg.multi.verifier_path if pid == "verifier" and cfg.multi.verifier_path else cfg.model.path
                base = load_causal_lm(path, m.dtype, m.device, m.gradient_checkpointing)
                models[pid] = add_lora(base, pid, **lkw) if lora else base
        rdt = _DT[cfg.rollout.rollout_dtype or ("bfloat16" if cfg.rollout.backend == "vllm" else m.dtype)]
        for pid in pids:
            ref = None
            if cfg.loss.kl_coef > 0 and not lora:
                ref = copy.deepcopy(models[pid]).eval()
                for p in ref.parameters():
                    p.requires_grad_(False)
            self.trainers[pid] = PolicyTrainer(pid, models[pid], algorithm=cfg.run.algorithm, optim=cfg.optim,
                                               loss=cfg.loss, adapter=pid if lora else None, ref_model=ref,
                                               batches=policy_batches(cfg, len(self._sft))[pid], seed=cfg.run.seed,
                                               autocast=_DT[m.autocast] if m.autocast else None)
            self.publishers[pid] = WeightPublisher(models[pid], pid if lora else None, dtype=rdt, mode="auto")

    def _build_rollout(self) -> None:
        """Eval policies here; rollout services on the dataflow runtime (GRPO only)."""
        import functools

        cfg = self.cfg
        cfg_dict = cfg.to_dict()
        paths = policy_paths(cfg_dict)
        for pid, path in paths.items():
            self.rollout_policies[pid] = make_rollout_policy(cfg_dict, pid, path)
        if cfg.run.algorithm != "grpo":
            return
        from agentgym.dataflow.flow import DataflowConfig
        from agentgym.dataflow.runtime import ServiceSpec, make_runtime
        from agentgym.dataflow.tasks import TaskRef, TaskStream, ZeroVarianceSkipper

        r, d, f = cfg.rollout, cfg.dataflow, cfg.filter
        info: dict[str, Any] = {"derive_sampling_seed": True} if r.sampling_seeds else {}
        tasks = [TaskRef(r.env, tid, seed=cfg.run.seed, info=info) for tid in self._task_ids()]
        filtering = f.dynamic_sampling or cfg.gate.mode == "enforce" or cfg.pilot.mode == "enforce"
        flow_cfg = DataflowConfig(
            groups_per_step=r.groups_per_step, max_staleness=d.max_staleness, policies=tuple(paths),
            replay_ratio=d.replay_ratio, replay_size=d.replay_size, replay_fill=d.replay_fill,
            replay_priority=d.replay_priority, replay_half_life=d.replay_half_life, replay_beta=d.replay_beta,
            replay_max_age=d.replay_max_age, replay_seed=cfg.run.seed, refill=f.refill,
            ordering=d.ordering, filter_zero_variance=f.dynamic_sampling,
            max_filtered_per_batch=r.groups_per_step * (f.max_refill_rounds + 1) if filtering else None,
            dead_after_s=max(60.0, r.policy_timeout_s))
        skipper = ZeroVarianceSkipper(d.skip_patience, d.skip_explore) if d.skip_zero_variance else None
        env_factory = self.env_factory or functools.partial(make_env, dict(r.env_kwargs))
        if d.runtime == "embedded":
            stream = TaskStream(tasks, seed=cfg.run.seed, skipper=skipper)
            self._runtime = make_runtime("embedded", tasks, flow_cfg, stream=stream)
            if cfg.log.groups:
                self._runtime.flow.group_observers.append(GroupLog(self.out / "groups.jsonl", self))
        else:
            if cfg.log.groups:
                raise ConfigurationError("log.groups writes from the embedded runtime's process; it is not "
                                         "available with dataflow.runtime = 'ray'")
            self._runtime = make_runtime("ray", tasks, flow_cfg, seed=cfg.run.seed, address=d.ray_address,
                                         skipper=skipper)
        capacity = d.service_capacity or r.groups_per_step
        self._specs = []
        for i in range(d.services):
            shares = i == 0 and d.runtime == "embedded"
            if shares:  # the eval policies also serve: no second engine
                wf = make_workflow(cfg_dict, self.rollout_policies)
                factory: Any = functools.partial(dict, default=wf)
            else:
                factory = functools.partial(service_workflows, cfg_dict)
            res = d.service_resources[i] if i < len(d.service_resources) else None
            # a service that built its own policies closes them (its vLLM engine) when it stops
            self._specs.append(ServiceSpec(f"rollout-{i}", factory, capacity=capacity, max_concurrency=r.concurrency,
                                           env_factory=env_factory, resources=res, close_policies=not shares))

    def _task_ids(self) -> list[str]:
        from agentgym.eval.runner import select_tasks

        r = self.cfg.rollout
        env = (self.env_factory or functools.partial(make_env, dict(r.env_kwargs)))(r.env)
        try:
            try:
                tasks_fn = env.get_wrapper_attr("tasks")
            except AttributeError:
                raise ConfigurationError(f"{r.env} has no tasks(); it cannot be trained on") from None
            pool = list(tasks_fn(r.split))
        finally:
            env.close()
        if not pool:
            raise ConfigurationError(f"{r.env} split {r.split!r} has no tasks")
        return [t.task_id for t in select_tasks(pool, r.tasks)]

    # ================================================================== train
    def train(self) -> dict[str, Any]:
        """Run to ``run.steps`` (Ctrl-C stops after the current step and leaves a checkpoint)."""
        old = None
        try:
            old = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread
            old = None
        try:
            return asyncio.run(self._train())
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.stop_requested:
            raise KeyboardInterrupt
        self.stop_requested = True
        if self.logger is not None:
            self.logger.note("interrupt: finishing this step, then writing a checkpoint (Ctrl-C again to abort)")

    async def _train(self) -> dict[str, Any]:
        await self._start_rollout()
        try:
            return await self._train_loop()
        finally:
            if self._runtime is not None:
                await self._runtime.stop()

    async def _start_rollout(self) -> None:
        """Start the dataflow runtime and its services; a resumed run brings everyone to its version."""
        full = {pid: (pub.full_state(), self.version) for pid, pub in self.publishers.items()} if self.version else None
        shared = self._runtime is not None and self.cfg.dataflow.runtime == "embedded"
        if full and not shared:  # eval policies that no service shares
            for pid, pol in self.rollout_policies.items():
                await asyncio.to_thread(pol.update_weights, full[pid][0], self.version)
        if self._runtime is None:
            return
        if self._flow_state is not None:
            await self._runtime.load_state_dict(self._flow_state)
        await self._runtime.start()
        for spec in self._specs:
            await self._runtime.add_service(spec, weights=full)

    async def _train_loop(self) -> dict[str, Any]:
        cfg = self.cfg
        assert self.logger is not None
        t_run = time.monotonic()
        if cfg.eval.before and self.step == 0 and "before" not in self.result:
            self.result["before"] = await self._evaluate("before")
            self.logger.log(0, {"eval": self._eval_metrics(self.result["before"])})
        while self.step < self.total_steps and not self.stop_requested:
            rec = await (self._sft_step() if cfg.run.algorithm == "sft" else self._rl_step())
            self.step += 1
            if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < self.total_steps:
                ev = await self._evaluate(f"step-{self.step:06d}")
                rec["eval"] = self._eval_metrics(ev)
            rec["elapsed_s"] = time.monotonic() - t_run
            rec["mem"] = memory_metrics()
            flat = self.logger.log(self.step - 1, rec) if (self.step - 1) % cfg.log.log_every == 0 else rec
            if self.on_step is not None:
                self.on_step(flat)
            over_budget = cfg.run.time_budget_s is not None and time.monotonic() - t_run > cfg.run.time_budget_s
            if over_budget and self.step < self.total_steps:
                self.logger.note(f"time budget of {cfg.run.time_budget_s:.0f} s spent after step {self.step} "
                                 f"of {self.total_steps}: stopping")
                self.result["stopped_by_time_budget_at_step"] = self.step
            if (self.step % cfg.run.checkpoint_every == 0 or self.step == self.total_steps or self.stop_requested
                    or over_budget):
                await self._checkpoint()
            if over_budget:
                break
        if self.stop_requested:
            self.result["interrupted_at_step"] = self.step
            return self.result
        if cfg.eval.after:
            self.result["after"] = await self._evaluate("after")
            self.logger.log(self.total_steps, {"eval": self._eval_metrics(self.result["after"])})
        self.result["train_wall_s"] = self.result.get("train_wall_s", 0.0) + (time.monotonic() - t_run)
        self.result["steps"] = self.step
        self.result["lr_schedule"] = {pid: {"horizon": tr.horizon, "spent": tr.schedule_pos, "optimizer_steps": tr.steps}
                                      for pid, tr in self.trainers.items()}
        if self._runtime is not None:
            st = await self._runtime.stats()
            self.result["dataflow"] = {k: st.get(k) for k in ("groups", "task_stream", "replay")}
            self.result["dataflow"]["gates"] = flow_counters(st)["gates"]
        await self._checkpoint()
        self._save_final()
        return self.result

    async def _rl_step(self) -> dict[str, Any]:
        assert self._runtime is not None and self.logger is not None
        runtime = self._runtime
        t0 = time.monotonic()

        async def pull() -> dict[str, Any]:
            return {pid: await runtime.get_batch(pid) for pid in self.trainers}

        log_cfg = self.cfg.log
        progress = RolloutProgress(runtime.stats, self.logger.note, log_cfg.progress_every_s if log_cfg.progress else 0)
        batches, delta = await progress.watch(f"step {self.step + 1}/{self.total_steps}", pull())
        t1 = time.monotonic()
        rec: dict[str, Any] = {}
        pids = self.trained_at(self.step)
        parallel = len(pids) > 1 and not self.cfg.multi.shared_base  # separate models: train side by side
        results = await asyncio.gather(*(self._train_policy(pid, batches[pid], parallel) for pid in pids))
        per = dict(zip(pids, results, strict=True))
        updated = [pid for pid, m in per.items() if m["train"].get("optimizer_steps", 0) > 0]
        t2 = time.monotonic()
        if updated:
            self.version += 1
            rec["publish"] = await self._publish(self.version)
        else:  # a step without an update still frees the staleness budget for the next batch
            for pid in self.trainers:
                await self._runtime.step_done(pid)
        t3 = time.monotonic()
        if len(self.trainers) == 1:
            rec.update(next(iter(per.values())))
        else:
            rec.update(per)
        rec["filter"] = {"dropped_groups": sum(b.filtered for b in batches.values())}
        rec["rollout_all"] = delta.to_metrics()  # every group finished during the step, kept or filtered
        rec["flow"] = flow_counters(await self._runtime.stats())
        rec["version"] = self.version
        rec["time"] = {"rollout_s": t1 - t0, "train_s": t2 - t1, "publish_s": t3 - t2, "step_s": t3 - t0}
        if log_cfg.progress or len(updated) < len(per):  # a step without an update is always reported
            self.logger.note(step_line(self.step + 1, self.total_steps, per if len(per) > 1 else rec, delta))
        return rec

    async def _train_policy(self, pid: str, batch: Any, in_thread: bool) -> dict[str, Any]:
        """Advantages, samples and one optimizer step for ``pid`` on its batch; returns its metrics."""
        f, tr = self.cfg.filter, self.trainers[pid]
        # a stable order, whatever finished first; replayed groups carry their importance weight
        pairs = sorted(zip(batch.all_groups, batch.group_weights, strict=True), key=lambda gw: gw[0].group_id)
        groups, weights = [g for g, _ in pairs], [w for _, w in pairs]
        samples, stats = samples_from_groups(groups, pid, group_weights=weights, estimator=self.cfg.advantage.estimator,
                                             eps=self.cfg.advantage.eps, mask_truncated=f.mask_truncated,
                                             overlong_max_tokens=f.overlong_max_tokens,
                                             overlong_buffer=f.overlong_buffer,
                                             overlong_penalty_value=f.overlong_penalty)
        m: dict[str, Any] = {"rollout": stats.to_metrics(),
                             "dataflow": {"groups": len(batch.groups), "replayed": len(batch.replayed),
                                          "filtered": batch.filtered, "expired": batch.expired,
                                          "wait_s": batch.wait_s,
                                          "replay_weight_mean": (sum(batch.replay_weights) / len(batch.replay_weights)
                                                                 if batch.replay_weights else None),
                                          "staleness_max": max((self.version - v for v in batch.versions), default=0)}}
        if not samples:
            why = (f"every group was filtered: {batch.filtered} dropped by the dataflow filters; of the "
                   f"{stats.groups} in the batch, {stats.zero_variance_groups} zero-variance, "
                   f"{stats.early_stopped_groups} early-stopped, {stats.error_episodes} lost episodes")
            m["train"] = {**tr.train_on([]), "skipped": "all groups filtered", "skip_reason": why}  # spends its share
            # of the learning-rate schedule
        elif in_thread:
            m["train"] = await asyncio.to_thread(tr.train_on, samples)
        else:
            m["train"] = tr.train_on(samples)
        return m

    async def _sft_step(self) -> dict[str, Any]:
        cfg = self.cfg
        n = len(self._sft)
        bs = cfg.data.batch_size
        per_epoch = math.ceil(n / bs)
        epoch, k = divmod(self.step, per_epoch)
        order = np.random.default_rng([cfg.run.seed, epoch]).permutation(n)
        batch = [self._sft[int(i)] for i in order[k * bs:(k + 1) * bs]]
        t0 = time.monotonic()
        m = self.trainers[self._pids[0]].train_on(batch)
        rec = {"train": m, "epoch": epoch, "time": {"train_s": time.monotonic() - t0}}
        assert self.logger is not None
        if cfg.log.progress or not m.get("optimizer_steps"):
            self.logger.note(step_line(self.step + 1, self.total_steps, rec))
        return rec

    # ================================================================== weights, eval, checkpoints
    async def _publish(self, version: int) -> dict[str, Any]:
        """Send every trainer's new weights as ``version``: to the rollout services through the dataflow
        runtime (a service that is behind gets the full state) and to the eval policies."""
        out: dict[str, Any] = {}
        shared = self._runtime is not None and self.cfg.dataflow.runtime == "embedded"
        for pid, pub in self.publishers.items():
            update, info = pub.build()
            t0 = time.perf_counter()
            if self._runtime is not None:
                info["services"] = await self._runtime.publish(pid, update, version, full=pub.full_state())
            pol = self.rollout_policies.get(pid)
            if pol is not None and not shared:  # in the embedded runtime the eval policies are service 0's
                await asyncio.to_thread(pol.update_weights, update, version)
            info["apply_s"] = time.perf_counter() - t0
            info["version"] = version
            info["publish_s"] = info["build_s"] + info["apply_s"]
            pub.history.append(info)
            out[pid] = info
        return out if len(out) != 1 else next(iter(out.values()))

    async def _evaluate(self, stage: str) -> dict[str, Any]:
        from agentgym.eval.runner import EvalConfig as RunnerEvalConfig
        from agentgym.eval.runner import arun_eval

        e, r = self.cfg.eval, self.cfg.rollout
        pid = self._pids[0]
        policy = self.rollout_policies[pid]
        if self.cfg.run.algorithm == "sft" and stage != "before":
            self.version += 1
            await self._publish(self.version)
        ec = RunnerEvalConfig(envs=[r.env], split=e.split, tasks=e.tasks, seeds=list(e.seeds),
                              max_turns=e.max_turns or r.max_turns, max_tokens=e.max_tokens or r.max_tokens,
                              temperature=e.temperature, concurrency=r.concurrency, env_kwargs=dict(r.env_kwargs),
                              sampling_seeds=e.sampling_seeds, max_total_tokens=r.max_total_tokens)
        t0 = time.monotonic()
        summary = await arun_eval(policy, ec, self.out / "eval" / stage)
        ov = summary.get("overall", {})
        succ = ov.get("success", {})
        ci, wilson = succ.get("ci95"), succ.get("wilson95")
        if ci is not None and ci[1] > ci[0]:
            interval, kind = [max(0.0, ci[0]), min(1.0, ci[1])], f"95% over {len(e.seeds)} seeds"
        else:  # one seed, or every seed tied: a binomial interval over the episodes
            interval, kind = wilson, "Wilson 95% over episodes"
        res = {"success": succ.get("mean"), "success_ci95": ci, "success_interval": interval, "interval_kind": kind,
               "episodes": ov.get("episodes"), "reward": ov.get("reward", {}).get("mean"),
               "split": e.split, "seeds": list(e.seeds), "wall_s": time.monotonic() - t0, "version": self.version}
        assert self.logger is not None
        self.logger.note(eval_line(stage, res))
        return res

    @staticmethod
    def _eval_metrics(res: dict[str, Any]) -> dict[str, Any]:
        iv = res.get("success_interval") or [None, None]
        return {"success": res["success"], "success_lo": iv[0], "success_hi": iv[1], "episodes": res.get("episodes")}

    async def _checkpoint(self) -> None:
        flow = await self._runtime.state_dict() if self._runtime is not None else None
        save_checkpoint(self.out, self.step, self.trainers,
                        {"version": self.version, "result": self.result, "data_position": self.step,
                         "dataflow": flow, "algorithm": self.cfg.run.algorithm}, keep=self.cfg.run.keep_checkpoints)

    def _save_final(self) -> None:
        final = self.out / "final"
        for pid, tr in self.trainers.items():
            target = final if len(self.trainers) == 1 else final / pid
            target.mkdir(parents=True, exist_ok=True)
            model = tr.model
            if tr.adapter is not None:
                model.save_pretrained(str(target / "adapter"), selected_adapters=[tr.adapter])
                if len(self.trainers) > 1 and self.cfg.multi.shared_base:
                    continue
                model = model.merge_and_unload()
                tr.model = model
            model.save_pretrained(str(target))
            self.tokenizer.save_pretrained(str(target))

    # ================================================================== cleanup
    def cleanup(self) -> None:
        """Stop engines and policies, close logs, draw the curves; release the run folder."""
        if self._lock_fd is None:
            return  # setup never got the folder: nothing of ours is in it
        try:
            self._cleanup()
        finally:
            _LOCK_FDS.discard(self._lock_fd)
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def _cleanup(self) -> None:
        if self.logger is not None:
            self.logger.close()
        for p in self.rollout_policies.values():
            shutdown = getattr(p, "shutdown", None)
            if callable(shutdown):
                shutdown()
        self.rollout_policies = {}
        if self.cfg.log.plot and (self.out / "metrics.jsonl").is_file():
            drawn = plot_curves(self.out / "metrics.jsonl", self.out / "curves.png")
            if drawn is not None:
                self.result["curves_png"] = str(drawn[0])
        if self.result:
            (self.out / "result.json").write_text(json.dumps(self.result, indent=2, default=str))


def run_training(cfg: TrainConfig, **kwargs: Any) -> dict[str, Any]:
    """setup, train, cleanup; returns the result (before/after eval, timings)."""
    recipe = Recipe(cfg, **kwargs)
    try:
        recipe.setup()
        return recipe.train()
    finally:
        recipe.cleanup()

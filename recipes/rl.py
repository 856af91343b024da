"""The RL recipe: GRPO, Dr.GRPO, RLOO and DAPO on rollouts (``algorithm = "grpo"``), read top to bottom.

The estimators and DAPO's pieces are config, not code paths: ``[advantage] estimator`` (grpo / dr_grpo /
rloo), ``[loss]`` (clip-higher, token-sum aggregation, KL, truncated importance sampling), ``[filter]``
(dynamic sampling, overlong penalty). ``[multi]`` trains two policies at once (solver + verifier).

::

    setup     run folder (locked), seeds
              model:    one PolicyTrainer per policy (full or LoRA, separate models or adapters on one base);
                        each LR schedule spans run.steps x loss.epochs x loss.mini_batches optimizer steps
              rollout:  training tasks -> the dataflow runtime (embedded or Ray) and its rollout services,
                        each with rollout policies of its own
              eval:     eval policies of their own (or rollout service 0's: eval.share_rollout_engine)
              resume from the newest checkpoint (run.resume), or start a fresh curve
    train     start the services (a resumed run first brings them to its weights); evaluate before
              each step: pull a batch per policy (the services roll out meanwhile; progress is printed)
                         -> samples with advantages -> train_on (loss.epochs x loss.mini_batches optimizer steps)
                         -> publish version v+1 to every service -> log; evaluate every eval.every steps;
                         checkpoint every run.checkpoint_every steps
              evaluate after; final/ (a model folder the next stage loads)
    cleanup   stop the services and eval engines, draw curves.png, write result.json, release the folder

``dataflow.max_staleness = 0`` (the default) is the synchronous schedule (roll out a batch, train, publish,
repeat); ``max_staleness = k`` lets the services run up to ``k`` versions ahead. Same code path.

Sharded (``trainer.strategy = "fsdp2"``, under ``torchrun --nproc_per_node N -m agentgym train ...``; one policy,
or two as separate models with every ``multi.schedule``): every rank builds its sharded trainers and runs this
recipe; rank 0 alone owns the run folder, the dataflow runtime and its rollout services, the eval policy, the logs
and the checkpoint metadata. Each step trains the policies ``trained_at`` names (a function of the step, so every
rank knows them), one after the other in ``self.policies`` order (never side by side: the FSDP collectives of two
models must not interleave). For each, rank 0 computes the samples with their advantages from its batch (an
``alternating_kept`` batch merged first, on rank 0 alone) and sends them to every rank as plain data (JSON bytes
through ``torch.distributed.broadcast``; an empty list when it has none, so the ranks stay in step); every rank
then trains on its share of each *global* mini-batch (``train_on(..., whole_batch=True)``: the one process's
step). Which policies updated is agreed over the ranks; every rank then takes part in gathering each updated
policy's trained tensors (the adapter's only, for LoRA) into rank 0's one-process copy of that policy's model,
from which rank 0 publishes as one process does (same versions; full, delta or merged-LoRA updates, the deltas
computed on rank 0). Checkpoints are sharded (DCP, one folder per policy); rank 0 evaluates the gathered copy and
writes ``final/`` from the copies. One base with two adapters (``multi.shared_base``) is not sharded.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

from agentgym.trainers.batching import TrainSample, decode_samples, encode_samples, samples_from_groups
from agentgym.trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.distributed import (
    QuietLogger,
    Ranks,
    broadcast_bytes,
    close_ranks,
    gathered_trainer,
    init_ranks,
)
from agentgym.trainers.memory import memory_metrics
from agentgym.trainers.metrics import (
    GroupLog,
    MetricsLogger,
    RolloutProgress,
    eval_line,
    flow_counters,
    plot_curves,
    step_line,
)
from agentgym.trainers.publish import publish_weights, resume_state, send_publication, trainable_state
from agentgym.trainers.run import (
    RunFolder,
    StopControl,
    import_modules,
    policy_batches,
    policy_paths,
    seed_everything,
    trained_at,
)
from agentgym.trainers.shard_delta import ShardDeltas
from agentgym.trainers.trainer import PolicyTrainer, build_trainers

from agentgym.dataflow.flow import Batch
from agentgym.errors import ConfigurationError
from agentgym.weights import WeightPublisher

from .components import (
    close_policies,
    env_factory,
    eval_metrics,
    evaluate,
    rollout_policy,
    rollout_runtime,
    service_workflows,
    train_tasks,
    workflow,
)

__all__ = ["RLRecipe"]


class RLRecipe:
    """One RL run (see the module docstring).

    Args:
        cfg: The validated config (``run.algorithm = "grpo"``).
        env_factory: ``env_id -> env`` for the rollout services (default: the registry, with
            ``rollout.env_kwargs``).
        on_step: Called with each step's flat metrics (tests, notebooks).
    """

    def __init__(self, cfg: TrainConfig, *, env_factory: Callable[[str], Any] | None = None,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.cfg = cfg
        self.make_env = env_factory
        self.on_step = on_step
        self.folder = RunFolder(cfg.run.out_dir)
        self.step = 0
        self.version = 0  # weight version the services hold (one more per step that updated anything)
        self.result: dict[str, Any] = {}
        self.trainers: dict[str, PolicyTrainer] = {}
        self.publishers: dict[str, WeightPublisher] = {}
        self.eval_policies: dict[str, Any] = {}
        self.runtime: Any = None
        self.services: list[Any] = []
        self.logger: MetricsLogger | QuietLogger | None = None
        self.group_log: GroupLog | None = None  # log.groups: OUT/groups.jsonl
        self.stop = StopControl(cfg.run.time_budget_s)
        self._flow_state: dict[str, Any] | None = None
        self.ranks: Ranks | None = None  # sharded (trainer.strategy = "fsdp2"): this rank's place
        self.whole: dict[str, Any] = {}  # sharded: rank 0's one-process copy of each policy's model (publishing,
        # eval, final/; None off rank 0)
        self._kept: dict[str, Batch] = {}  # multi.schedule = "alternating_kept": a batch awaiting its policy's step
        self._train_lock = asyncio.Lock()  # updates run in a thread (off the event loop), one after another
        # sharded full fine-tune: each rank diffs its own slices after an update (trainers.shard_delta); rank 0
        # encodes the changes, and keeps no whole copy of a policy between steps once its deltas run
        self.deltas: dict[str, ShardDeltas] = {}
        self._changes: dict[str, dict[str, Any]] = {}  # this step's changes, per policy (rank 0)
        self._gathered: set[str] = set()  # policies gathered whole this step (published from the copy)

    @property
    def main(self) -> bool:
        """The process that owns the run folder, the rollout services and the logs (rank 0 when sharded)."""
        return self.ranks is None or self.ranks.is_main

    # ================================================================== setup
    def setup(self) -> None:
        cfg = self.cfg
        if cfg.trainer.strategy == "fsdp2":
            self.ranks = init_ranks(cfg.model.device)
        if self.main:
            self.folder.lock()
        seed_everything(cfg.run)
        if self.main:
            self.folder.write_config(cfg)
        import_modules(cfg.rollout.imports)
        from agentgym.policies.models import load_tokenizer, resolve_model

        self.tokenizer = load_tokenizer(resolve_model(cfg.model.path))
        # model: a trainer per policy, and what it publishes to the rollout policies
        self.paths = policy_paths(cfg.model, cfg.multi)
        self.policies = list(self.paths)
        self.trainers = build_trainers(cfg.model, self.paths, algorithm="grpo", optim=cfg.optim, loss=cfg.loss,
                                       batches=policy_batches(cfg.run.steps, self.policies, cfg.multi.schedule),
                                       seed=cfg.run.seed, shared_base=cfg.multi.shared_base, kl_coef=cfg.loss.kl_coef,
                                       sharding=cfg.trainer, ranks=self.ranks)
        r = cfg.rollout
        dtype = r.rollout_dtype or ("bfloat16" if r.backend == "vllm" else cfg.model.dtype)
        if self.ranks is not None and cfg.model.finetune == "full":
            self.deltas = {pid: ShardDeltas(self.trainers[pid], dtype) for pid in self.policies}
        if not self.main:  # sharded, rank > 0: no services, no eval policy, no folder; resume and train in step
            self._resume()
            self.logger = QuietLogger()
            return
        # the one publisher per policy encodes in the rollout policies' dtype (agentgym.weights)
        self.publishers = {pid: WeightPublisher(dtype=dtype) for pid in self.trainers}
        # eval: policies of their own unless the config lends rollout service 0's
        e = cfg.eval
        if e.before or e.after or e.every:  # the first policy is evaluated; service 0 needs all when lent
            lent = e.share_rollout_engine
            self.eval_policies = {pid: rollout_policy(r, cfg.model, pid, path, cfg.run.seed)
                                  for pid, path in self.paths.items() if lent or pid == self.policies[0]}
        # rollout: the training tasks, the dataflow runtime and its services
        make_env = self.make_env or env_factory(r)
        self.runtime = rollout_runtime(cfg, tasks=train_tasks(r, cfg.run.seed, make_env), policies=self.policies)
        if cfg.log.groups:
            if cfg.dataflow.runtime != "embedded":
                raise ConfigurationError("log.groups writes from the embedded runtime's process; it is not "
                                         "available with dataflow.runtime = 'ray'")
            self.group_log = GroupLog(self.folder.path / "groups.jsonl", self)
            self.runtime.flow.group_observers.append(self.group_log)
        self.services = self.service_specs(make_env)
        # resume, or a fresh curve
        ck = self._resume()
        if self.group_log is not None:
            self.group_log.resume_at(self.step)
        self.logger = MetricsLogger(self.folder.path, cfg.run.steps, tensorboard=cfg.log.tensorboard,
                                    progress=cfg.log.progress, start_step=self.step)
        self.stop.note = self.logger.note
        if ck is not None:
            self.logger.note(f"resumed from {ck} at step {self.step}")

    def _resume(self) -> Any:
        """Load the newest checkpoint (``run.resume``) or start a fresh curve; returns the checkpoint or ``None``.
        Sharded: every rank loads its shards and the counters, then gathers the weights into rank 0's copy."""
        cfg = self.cfg
        ck = latest_checkpoint(self.folder.path) if cfg.run.resume else None
        if self.ranks is not None:
            self.ranks.barrier()  # every rank has looked before rank 0 may drop an old run's files
        if ck is None:
            if self.main:
                self.folder.fresh_start()
        else:
            state = load_checkpoint(ck, self.trainers)
            self.step = int(state["step"])
            self.version = int(state.get("version", 0))
            if self.main:
                self.result = dict(state.get("result", self.result))
                self._flow_state = state.get("dataflow")
        if self.ranks is not None:
            self.gather()  # rank 0's copy starts at the trained (or loaded) weights
            if self.version:  # the services will be brought to these weights whole (start_rollout): deltas from here
                for d in self.deltas.values():
                    d.mark()
        return ck

    def gather(self, pids: list[str] | None = None) -> dict[str, Any]:
        """Sharded: the trained tensors (the adapter's only, for LoRA) of ``pids`` (default: every policy) gathered
        into rank 0's one-process copy of each one's model (a collective: every rank calls it with the same
        ``pids``; they are gathered in ``self.policies`` order). The copies are ``None`` off rank 0."""
        m = self.cfg.model
        lora = {"rank": m.lora_rank, "alpha": m.lora_alpha, "dropout": m.lora_dropout, "targets": m.lora_targets}
        for pid in self.policies:
            if pids is None or pid in pids:
                self.whole[pid] = gathered_trainer(self.trainers[pid], self.paths[pid], m.dtype, lora,
                                                   into=self.whole.get(pid), trainable_only=True)
        return self.whole

    def sync_weights(self, pids: list[str]) -> None:
        """Sharded, after an update of ``pids`` (a collective, in step on every rank): what rank 0 publishes from.
        A policy whose shard deltas run (a full fine-tune, after its first whole publish) has each rank diff its
        slices and rank 0 receive the changes; any other is gathered whole into rank 0's copy (LoRA: its adapter)."""
        self._changes, self._gathered = {}, set()
        whole = [pid for pid in pids if pid not in self.deltas or self.deltas[pid].shadow is None]
        if whole:
            self.gather(whole)
            self._gathered = set(whole)
        for pid in self.policies:
            d = self.deltas.get(pid)
            if d is None or pid not in pids:
                continue
            if pid in whole:
                d.mark()  # published whole from the copy this step; later steps diff against these slices
            else:
                self._changes[pid] = d.changes()

    @property
    def sources(self) -> dict[str, Any]:
        """What publishing, evaluation and ``final/`` read the weights from: the trainers, or (sharded) rank 0's
        gathered copies (objects with ``model`` and ``adapter``, like a trainer's), one per policy."""
        if self.ranks is None:
            return dict(self.trainers)
        return {pid: self.whole[pid] for pid in self.policies}

    def service_specs(self, make_env: Callable[[str], Any]) -> list[Any]:
        """One spec per rollout service: each builds its own policies where it runs (a Ray actor too), except
        that with ``eval.share_rollout_engine`` service 0 serves on the eval policies."""
        from agentgym.dataflow import ServiceSpec

        cfg, r, d = self.cfg, self.cfg.rollout, self.cfg.dataflow
        own = functools.partial(service_workflows, r, cfg.model, cfg.multi, cfg.gate, cfg.pilot, self.paths,
                                cfg.run.seed)
        specs = []
        for i in range(d.services):
            lent = i == 0 and cfg.eval.share_rollout_engine and bool(self.eval_policies)
            factory: Any = own
            if lent:
                factory = functools.partial(dict, default=workflow(r, cfg.multi, cfg.gate, cfg.pilot, self.eval_policies))
            res = d.service_resources[i] if i < len(d.service_resources) else None
            # a service that built its own policies closes them (its vLLM engine) when it stops
            specs.append(ServiceSpec(f"rollout-{i}", factory, capacity=d.service_capacity or r.groups_per_step,
                                     max_concurrency=r.concurrency, env_factory=make_env, resources=res,
                                     close_policies=not lent))
        return specs

    # ================================================================== train
    def train(self) -> dict[str, Any]:
        """Run to ``run.steps`` (Ctrl-C stops after the current step and leaves a checkpoint)."""
        with self.stop.handling_sigint():
            return asyncio.run(self._train())

    async def _train(self) -> dict[str, Any]:
        if not self.main:
            return await self._loop()
        await self.start_rollout()
        try:
            return await self._loop()
        finally:
            await self.runtime.stop()

    async def start_rollout(self) -> None:
        """Start the runtime and its services; a resumed run brings every service to its weights first."""
        full = resume_state(self.version, self.publishers, self.sources) if self.version else None
        if self._flow_state is not None:
            await self.runtime.load_state_dict(self._flow_state)
        await self.runtime.start()
        for spec in self.services:
            await self.runtime.add_service(spec, weights=full)

    async def _loop(self) -> dict[str, Any]:
        cfg, logger = self.cfg, self.logger
        assert logger is not None
        t_run = time.monotonic()
        self.stop.start(float(self.result.get("train_wall_s") or 0.0))
        if cfg.eval.before and self.step == 0 and "before" not in self.result and self.main:
            self.result["before"] = await self.evaluate("before")
            logger.log(0, {"eval": eval_metrics(self.result["before"])})
        while self.step < cfg.run.steps and not self.stop.requested:
            rec = await self.rl_step() if self.main else self.follower_step()
            self.step += 1
            if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.run.steps and self.main:
                rec["eval"] = eval_metrics(await self.evaluate(f"step-{self.step:06d}"))
            rec["elapsed_s"] = time.monotonic() - t_run
            rec["mem"] = memory_metrics()
            flat = logger.log(self.step - 1, rec) if (self.step - 1) % cfg.log.log_every == 0 else rec
            if self.on_step is not None and self.main:
                self.on_step(flat)
            over_budget = self.stop.over_budget() and self.step < cfg.run.steps
            if self.ranks is not None:  # the ranks stop together: rank 0's clock, a Ctrl-C on any rank
                over, stop = self.ranks.max([float(over_budget and self.main), float(self.stop.requested)])
                over_budget, self.stop.requested = bool(over), bool(stop)
            if over_budget:
                logger.note(f"time budget of {cfg.run.time_budget_s:.0f} s spent after step {self.step} of "
                            f"{cfg.run.steps}: stopping")
                self.result["stopped_by_time_budget_at_step"] = self.step
            if (self.step % cfg.run.checkpoint_every == 0 or self.step == cfg.run.steps or self.stop.requested
                    or over_budget):
                await self.checkpoint()
            if over_budget:
                break
        if self.stop.requested:
            self.result["interrupted_at_step"] = self.step
            return self.result
        if self.deltas:  # sharded full fine-tune: rank 0 dropped its copies between steps; final/ is gathered
            self.gather(list(self.deltas))
        if not self.main:  # rank > 0: the last checkpoint's shards; rank 0 evaluates and writes the rest
            await self.checkpoint()
            return self.result
        if cfg.eval.after:
            self.result["after"] = await self.evaluate("after")
            logger.log(cfg.run.steps, {"eval": eval_metrics(self.result["after"])})
        self.result["train_wall_s"] = self.stop.wall_s()
        self.result["steps"] = self.step
        self.result["lr_schedule"] = {pid: {"horizon": tr.horizon, "spent": tr.schedule_pos, "optimizer_steps": tr.steps}
                                      for pid, tr in self.trainers.items()}
        if self.ranks is not None:
            self.result["world_size"] = self.ranks.world
        st = await self.runtime.stats()
        self.result["dataflow"] = {k: st.get(k) for k in ("groups", "task_stream", "replay")}
        self.result["dataflow"]["gates"] = flow_counters(st)["gates"]
        await self.checkpoint()
        self.folder.save_final(self.sources, self.tokenizer, shared_base=self.cfg.multi.shared_base)
        return self.result

    # ================================================================== one step
    async def rl_step(self) -> dict[str, Any]:
        """Pull a batch per policy, train the policies this step trains, publish, report."""
        assert self.logger is not None
        cfg, runtime = self.cfg, self.runtime
        t0 = time.monotonic()

        async def pull() -> dict[str, Any]:
            return {pid: await runtime.get_batch(pid) for pid in self.policies}

        every = cfg.log.progress_every_s if cfg.log.progress else 0
        batches, delta = await RolloutProgress(runtime.stats, self.logger.note, every).watch(
            f"step {self.step + 1}/{cfg.run.steps}", pull())
        t1 = time.monotonic()
        pids = trained_at(self.policies, cfg.multi.schedule, self.step)
        if cfg.multi.schedule == "alternating_kept":  # no episode's tokens are thrown away
            for pid in self.policies:
                if pid in pids and pid in self._kept:
                    batches[pid] = merge_batches(self._kept.pop(pid), batches[pid])
                elif pid not in pids:
                    self._kept[pid] = batches[pid]
        if self.ranks is not None:  # one policy after the other, in step with every rank (see follower_step)
            per = {pid: await self.train_policy(pid, batches[pid], False) for pid in pids}
        else:
            parallel = len(pids) > 1 and not cfg.multi.shared_base  # separate models: train side by side
            results = await asyncio.gather(*(self.train_policy(pid, batches[pid], parallel) for pid in pids))
            per = dict(zip(pids, results, strict=True))
        updated = [pid for pid, m in per.items() if m["train"].get("optimizer_steps", 0) > 0]
        if self.ranks is not None:  # with every rank: the new weights into rank 0's copies, published from there
            updated = self.agreed_updates(pids, updated)
            if updated:
                self.sync_weights(updated)
        t2 = time.monotonic()
        rec: dict[str, Any] = {}
        if updated:
            self.version += 1
            rec["publish"] = await self.publish(self.version)
        else:  # a step without an update still frees the staleness budget for the next batch
            for pid in self.policies:
                await runtime.step_done(pid)
        t3 = time.monotonic()
        rec.update(next(iter(per.values())) if len(self.policies) == 1 else per)
        rec["filter"] = {"dropped_groups": sum(b.filtered for b in batches.values())}
        rec["rollout_all"] = delta.to_metrics()  # every group finished during the step, kept or filtered
        rec["flow"] = flow_counters(await runtime.stats())
        rec["version"] = self.version
        rec["time"] = {"rollout_s": t1 - t0, "train_s": t2 - t1, "publish_s": t3 - t2, "step_s": t3 - t0}
        if cfg.log.progress or len(updated) < len(per):  # a step without an update is always reported
            self.logger.note(step_line(self.step + 1, cfg.run.steps, per if len(per) > 1 else rec, delta))
        return rec

    async def train_policy(self, pid: str, batch: Any, in_thread: bool) -> dict[str, Any]:
        """Advantages, samples and ``train_on`` for ``pid`` on its batch; returns its metrics."""
        cfg, tr = self.cfg, self.trainers[pid]
        f = cfg.filter
        # a stable order, whatever finished first; replayed groups carry their importance weight
        pairs = sorted(zip(batch.all_groups, batch.group_weights, strict=True), key=lambda gw: gw[0].group_id)
        samples, stats = samples_from_groups(
            [g for g, _ in pairs], pid, group_weights=[w for _, w in pairs], estimator=cfg.advantage.estimator,
            eps=cfg.advantage.eps, mask_truncated=f.mask_truncated, overlong_max_tokens=f.overlong_max_tokens,
            overlong_buffer=f.overlong_buffer, overlong_penalty_value=f.overlong_penalty,
            keep_zero_advantage=f.keep_zero_advantage)
        m: dict[str, Any] = {"rollout": stats.to_metrics(),
                             "dataflow": {"groups": len(batch.groups), "replayed": len(batch.replayed),
                                          "filtered": batch.filtered, "expired": batch.expired, "wait_s": batch.wait_s,
                                          "replay_weight_mean": (sum(batch.replay_weights) / len(batch.replay_weights)
                                                                 if batch.replay_weights else None),
                                          "staleness_max": max((self.version - v for v in batch.versions), default=0)}}
        if self.ranks is not None:  # every rank trains on its share of each global mini-batch of these samples
            self.share_samples(samples)
        if not samples:  # no update; the batch still spends its share of the learning-rate schedule
            why = (f"every group was filtered: {batch.filtered} dropped by the dataflow filters; of the "
                   f"{stats.groups} in the batch, {stats.zero_variance_groups} zero-variance, "
                   f"{stats.early_stopped_groups} early-stopped, {stats.error_episodes} lost episodes")
            m["train"] = {**tr.train_on([], whole_batch=True), "skipped": "all groups filtered", "skip_reason": why}
        elif self.ranks is not None:
            m["train"] = tr.train_on(samples, whole_batch=True)
        elif in_thread:
            m["train"] = await asyncio.to_thread(tr.train_on, samples)
        else:  # off the event loop, so the services' heartbeats and rollouts go on; one update at a time
            async with self._train_lock:
                m["train"] = await asyncio.to_thread(tr.train_on, samples)
        return m

    # ================================================================== sharded: what every rank does in step
    def share_samples(self, samples: list[TrainSample] | None) -> list[TrainSample]:
        """Rank 0's samples of this step on every rank (a collective; rank 0 passes them, the others ``None``):
        plain data, JSON bytes broadcast as a tensor, nothing pickled. An empty list is sent too."""
        assert self.ranks is not None
        data = broadcast_bytes(self.ranks, encode_samples(samples) if self.main and samples is not None else None)
        return list(samples or []) if self.main else decode_samples(data)

    def agreed_updates(self, pids: list[str], updated: list[str]) -> list[str]:
        """Which of the step's trained ``pids`` updated their weights, agreed over the ranks (every rank then
        gathers the same policies, in the same order); ``updated``: those that did on this rank."""
        assert self.ranks is not None
        agreed = self.ranks.max([float(pid in updated) for pid in pids])
        return [pid for pid, up in zip(pids, agreed, strict=True) if up]

    def follower_step(self) -> dict[str, Any]:
        """A step of a rank other than 0: for each policy the step trains (``trained_at``, as rank 0 computes it),
        rank 0's samples and this rank's share of each global mini-batch; then the gathering of the updated
        policies' weights. The collectives in :meth:`rl_step`'s order."""
        pids = trained_at(self.policies, self.cfg.multi.schedule, self.step)
        per = {pid: self.trainers[pid].train_on(self.share_samples(None), whole_batch=True) for pid in pids}
        updated = self.agreed_updates(pids, [pid for pid, m in per.items() if m.get("optimizer_steps", 0) > 0])
        if updated:
            self.sync_weights(updated)
            self.version += 1
        rec: dict[str, Any] = {pid: {"train": m} for pid, m in per.items()}
        return {**(rec[pids[0]] if len(self.policies) == 1 else rec), "version": self.version}

    # ================================================================== publish, evaluate, checkpoint
    async def publish(self, version: int) -> dict[str, Any]:
        """Send every trainer's new weights as ``version`` to the rollout services (the one place weights
        leave this recipe; a service that is behind gets the full state, one that cannot apply it is taken out).
        Sharded: a policy whose shard deltas run is published from the ranks' changes (none if it did not train
        this step), any other from rank 0's gathered copy."""
        if not self.deltas:
            out = await publish_weights(version, self.publishers, self.sources, self.runtime, {})
            if self.ranks is not None:
                for info in out.values():
                    info["source"] = "gathered copy"
            return out if len(out) != 1 else next(iter(out.values()))
        out = {}
        for pid, pub in self.publishers.items():
            d = self.deltas[pid]
            if d.shadow is not None and pid not in self._gathered and pub.shadow is not None:
                out[pid] = await send_publication(pid, pub.publish_changes(self._changes.get(pid, {}), version),
                                                  self.runtime, {})
                out[pid]["source"] = "shard deltas"
                self.whole[pid] = None  # later publishes come from the shards; final/ gathers again
            else:
                out[pid] = (await publish_weights(version, {pid: pub}, self.sources, self.runtime, {}))[pid]
                out[pid]["source"] = "gathered copy"
        self._changes, self._gathered = {}, set()
        return out if len(out) != 1 else next(iter(out.values()))

    async def evaluate(self, stage: str) -> dict[str, Any]:
        """Held-out evaluation of the first policy (the solver, alone, in a multi-policy run) at the current
        version; eval policies of their own are brought to it first."""
        assert self.logger is not None
        pid = self.policies[0]
        policy = self.eval_policies[pid]
        lent = self.cfg.eval.share_rollout_engine  # service 0's policy: published to with every step
        if not lent and self.version > getattr(policy, "weight_version", 0):
            pub = self.publishers[pid]
            if self.whole.get(pid) is None and pid in self.deltas:  # sharded, no copy between steps: what was published
                full = WeightPublisher(pub.dtype).publish(dict(pub.full().tensors), self.version)
            else:
                tr = self.sources[pid]
                full = WeightPublisher(pub.dtype).publish(trainable_state(tr.model, tr.adapter), self.version)
            await asyncio.to_thread(full.deliver, policy)
        res = await evaluate(policy, self.cfg.eval, self.cfg.rollout, self.folder.path / "eval" / stage)
        res["version"] = self.version
        self.logger.note(eval_line(stage, res))
        return res

    async def checkpoint(self) -> None:
        """Sharded: every rank writes its shards; rank 0 the metadata (the dataflow's state included)."""
        flow = await self.runtime.state_dict() if self.main else None
        self.result["train_wall_s"] = self.stop.wall_s()
        save_checkpoint(self.folder.path, self.step, self.trainers,
                        {"version": self.version, "result": self.result, "data_position": self.step, "dataflow": flow,
                         "algorithm": "grpo"}, keep=self.cfg.run.keep_checkpoints, ranks=self.ranks)

    # ================================================================== cleanup
    def cleanup(self) -> None:
        """Close the eval engines, draw the curves, write result.json; release the run folder (the services
        stopped with the runtime at the end of :meth:`train`). Sharded: every rank leaves the process group."""
        if self.ranks is not None:
            close_ranks()
        if not self.folder.locked:
            return  # setup never got the folder (or this is not rank 0): nothing of ours is in it
        try:
            if self.logger is not None:
                self.logger.close()
            close_policies(self.eval_policies)
            self.eval_policies = {}
            if self.cfg.log.plot and (self.folder.path / "metrics.jsonl").is_file():
                drawn = plot_curves(self.folder.path / "metrics.jsonl", self.folder.path / "curves.png")
                if drawn is not None:
                    self.result["curves_png"] = str(drawn[0])
            if self.result:
                self.folder.write_result(self.result)
        finally:
            self.folder.release()


def merge_batches(first: Batch, second: Batch) -> Batch:
    """Two batches of one policy as one (``multi.schedule = "alternating_kept"``: the batch a step left untrained
    joins the policy's next one), groups, replay weights and counters kept."""
    if first.policy_id != second.policy_id:
        raise ValueError(f"cannot merge batches of {first.policy_id!r} and {second.policy_id!r}")

    def replay_weights(b: Batch) -> list[float]:
        return list(b.replay_weights) or [1.0] * len(b.replayed)

    return Batch(first.policy_id, first.groups + second.groups, first.tickets + second.tickets,
                 replayed=first.replayed + second.replayed, versions=first.versions + second.versions,
                 replay_weights=replay_weights(first) + replay_weights(second), expired=first.expired + second.expired,
                 wait_s=first.wait_s + second.wait_s, filtered=first.filtered + second.filtered,
                 short=first.short or second.short)

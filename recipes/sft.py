"""The SFT recipe: behaviour cloning on transcripts (``algorithm = "sft"``), read top to bottom.

::

    setup     run folder (locked), seeds
              data:   transcripts ([data] paths) -> samples in the student's chat template, assistant tokens only
              model:  one PolicyTrainer (full or LoRA); its LR schedule spans every optimizer step of the run
              eval:   an eval policy of its own (HF or vLLM, [rollout] backend), if [eval] asks for one
              resume from the newest checkpoint (run.resume), or start a fresh curve
    train     evaluate before
              each step: the next data.batch_size samples of this epoch's shuffled order -> one optimizer step;
              log; evaluate every eval.every steps; checkpoint every run.checkpoint_every steps
              evaluate after; final/ (a model folder the next stage loads)
    cleanup   close the eval engine, draw curves.png, write result.json, release the folder

Outputs in ``run.out_dir``: ``config.json``, ``metrics.jsonl``, ``checkpoints/``, ``eval/<stage>/``,
``curves.png``, ``final/`` and ``result.json``.

Sharded (``trainer.strategy = "fsdp2"``, under ``torchrun --nproc_per_node N -m agentgym train ...``): every
rank runs this recipe; each trains on its share of every batch, checkpoints are sharded, and rank 0 alone
takes the folder, evaluates (on the weights gathered into a one-process copy) and writes logs, metrics,
``final/`` (gathered) and ``result.json``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from agentgym.trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.distributed import QuietLogger, Ranks, close_ranks, gathered_trainer, init_ranks
from agentgym.trainers.memory import memory_metrics
from agentgym.trainers.metrics import MetricsLogger, eval_line, plot_curves, step_line
from agentgym.trainers.publish import trainable_state
from agentgym.trainers.run import RunFolder, StopControl, import_modules, seed_everything, sft_steps
from agentgym.trainers.sft import load_transcripts, sft_samples
from agentgym.trainers.trainer import build_trainers

from agentgym.errors import TrainingDataError
from agentgym.weights import Publication, WeightPublisher

from .components import close_policies, eval_metrics, evaluate, rollout_policy

__all__ = ["SFTRecipe"]

PID = "policy"


class SFTRecipe:
    """One SFT run (see the module docstring).

    Args:
        cfg: The validated config (``run.algorithm = "sft"``).
        on_step: Called with each step's flat metrics (tests, notebooks).
    """

    def __init__(self, cfg: TrainConfig, *, on_step: Callable[[dict[str, Any]], None] | None = None,
                 env_factory: Any = None) -> None:
        self.cfg = cfg
        self.on_step = on_step
        self.folder = RunFolder(cfg.run.out_dir)
        self.step = 0
        self.steps = 0
        self.result: dict[str, Any] = {}
        self.eval_policy: Any = None
        self.logger: MetricsLogger | QuietLogger | None = None
        self.stop = StopControl(cfg.run.time_budget_s)
        self.ranks: Ranks | None = None
        self.whole: Any = None  # sharded: rank 0's gathered one-process copy of the model (eval, final/)
        self.eval_version = 0  # sharded: the step whose weights the eval policy holds

    @property
    def main(self) -> bool:
        """The process that writes the run folder (rank 0 when sharded)."""
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

        # data: the transcripts, rendered with the student's own template
        self.tokenizer = load_tokenizer(resolve_model(cfg.model.path))
        self.samples, counts = sft_samples(load_transcripts(cfg.data.paths), self.tokenizer, PID,
                                           only_success=cfg.data.only_success, max_len=cfg.data.max_len)
        if not self.samples:
            raise TrainingDataError(f"no SFT samples from {cfg.data.paths}: {counts}")
        self.result["sft_data"] = counts
        self.steps = sft_steps(cfg.run, cfg.data, len(self.samples))
        # model: one trainer; one optimizer step per batch, so the schedule spans self.steps steps
        self.trainer = build_trainers(cfg.model, {PID: cfg.model.path}, algorithm="sft", optim=cfg.optim,
                                      loss=cfg.loss, batches={PID: self.steps}, seed=cfg.run.seed,
                                      sharding=cfg.trainer, ranks=self.ranks)[PID]
        # the eval policy: its own engine, given the trained weights before each evaluation
        e = cfg.eval
        if (e.before or e.after or e.every) and self.main:
            self.eval_policy = rollout_policy(cfg.rollout, cfg.model, PID, cfg.model.path, cfg.run.seed)
        # resume, or a fresh curve
        ck = latest_checkpoint(self.folder.path) if cfg.run.resume else None
        if self.ranks is not None:
            self.ranks.barrier()  # every rank has looked before rank 0 may drop an old run's files
        if ck is None:
            if self.main:
                self.folder.fresh_start()
        else:
            state = load_checkpoint(ck, {PID: self.trainer})
            self.step = int(state["step"])
            self.result = dict(state.get("result", self.result))
        self.logger = MetricsLogger(self.folder.path, self.steps, tensorboard=cfg.log.tensorboard,
                                    progress=cfg.log.progress, start_step=self.step) if self.main else QuietLogger()
        self.stop.note = self.logger.note
        if ck is not None:
            self.logger.note(f"resumed from {ck} at step {self.step}")

    # ================================================================== train
    def train(self) -> dict[str, Any]:
        """Run to the last step (Ctrl-C stops after the current step and leaves a checkpoint)."""
        with self.stop.handling_sigint():
            return asyncio.run(self._train())

    async def _train(self) -> dict[str, Any]:
        cfg, logger = self.cfg, self.logger
        assert logger is not None
        t_run = time.monotonic()
        self.stop.start(float(self.result.get("train_wall_s") or 0.0))
        if cfg.eval.before and self.step == 0 and "before" not in self.result:
            self.result["before"] = await self.evaluate("before")
            logger.log(0, {"eval": eval_metrics(self.result["before"])})
        while self.step < self.steps and not self.stop.requested:
            epoch, batch = self.batch(self.step)
            t0 = time.monotonic()
            share = batch if self.ranks is None else self.ranks.share(batch)
            rec: dict[str, Any] = {"train": self.trainer.train_on(share), "epoch": epoch}
            rec["time"] = {"train_s": time.monotonic() - t0}
            self.step += 1
            if cfg.log.progress or not rec["train"].get("optimizer_steps"):
                logger.note(step_line(self.step, self.steps, rec))
            if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < self.steps:
                rec["eval"] = eval_metrics(await self.evaluate(f"step-{self.step:06d}"))
            rec["elapsed_s"] = time.monotonic() - t_run
            rec["mem"] = memory_metrics()
            flat = logger.log(self.step - 1, rec) if (self.step - 1) % cfg.log.log_every == 0 else rec
            if self.on_step is not None:
                self.on_step(flat)
            over_budget = self.stop.over_budget() and self.step < self.steps
            if self.ranks is not None:  # the ranks stop together: rank 0's clock, a Ctrl-C on any rank
                over, stop = self.ranks.max([float(over_budget and self.main), float(self.stop.requested)])
                over_budget, self.stop.requested = bool(over), bool(stop)
            if over_budget:
                logger.note(f"time budget of {cfg.run.time_budget_s:.0f} s spent after step {self.step} of "
                            f"{self.steps}: stopping")
                self.result["stopped_by_time_budget_at_step"] = self.step
            if self.step % cfg.run.checkpoint_every == 0 or self.step == self.steps or self.stop.requested or over_budget:
                self.checkpoint()
            if over_budget:
                break
        if self.stop.requested:
            self.result["interrupted_at_step"] = self.step
            return self.result
        if cfg.eval.after:
            self.result["after"] = await self.evaluate("after")
            logger.log(self.steps, {"eval": eval_metrics(self.result["after"])})
        self.result["train_wall_s"] = self.stop.wall_s()
        self.result["steps"] = self.step
        self.result["lr_schedule"] = {PID: {"horizon": self.trainer.horizon, "spent": self.trainer.schedule_pos,
                                            "optimizer_steps": self.trainer.steps}}
        self.checkpoint()
        if self.ranks is None:
            self.folder.save_final({PID: self.trainer}, self.tokenizer)
        elif self.gather() is not None:
            self.folder.save_final({PID: self.whole}, self.tokenizer)
        return self.result

    def gather(self) -> Any:
        """Sharded: the current weights gathered into rank 0's one-process copy (a collective; ``None`` off rank 0)."""
        m = self.cfg.model
        lora = {"rank": m.lora_rank, "alpha": m.lora_alpha, "dropout": m.lora_dropout, "targets": m.lora_targets}
        self.whole = gathered_trainer(self.trainer, m.path, m.dtype, lora, into=self.whole)
        return self.whole

    def batch(self, step: int) -> tuple[int, list[Any]]:
        """Step ``step``'s samples: batch ``k`` of epoch ``e``'s order, shuffled with ``(seed, e)``."""
        n, bs = len(self.samples), self.cfg.data.batch_size
        epoch, k = divmod(step, -(-n // bs))
        order = np.random.default_rng([self.cfg.run.seed, epoch]).permutation(n)
        return epoch, [self.samples[int(i)] for i in order[k * bs:(k + 1) * bs]]

    # ================================================================== evaluate, checkpoint
    async def evaluate(self, stage: str) -> dict[str, Any]:
        """Held-out evaluation of the current weights (given to the eval policy first, as version = step).
        Sharded: every rank gathers the weights, rank 0 evaluates while the others wait."""
        assert self.logger is not None
        if self.ranks is not None:
            if self.step > self.eval_version:
                self.eval_version = self.step
                if self.gather() is not None:
                    await asyncio.to_thread(self.publish_state(self.whole).deliver, self.eval_policy)
            if not self.main:
                self.ranks.barrier()
                return {"success": None, "version": self.step}
        assert self.eval_policy is not None
        if self.ranks is None and self.step > getattr(self.eval_policy, "weight_version", 0):
            await asyncio.to_thread(self.publish_state().deliver, self.eval_policy)
        res = await evaluate(self.eval_policy, self.cfg.eval, self.cfg.rollout, self.folder.path / "eval" / stage)
        if self.ranks is not None:
            self.ranks.barrier()
        res["version"] = self.step
        self.logger.note(eval_line(stage, res))
        return res

    def publish_state(self, source: Any = None) -> Publication:
        """The trained tensors in the eval policy's dtype, as version ``step`` (the one place this recipe
        hands weights over). ``source``: a trainer-like ``model`` + ``adapter`` (default: the trainer)."""
        r, m = self.cfg.rollout, self.cfg.model
        src = source if source is not None else self.trainer
        dtype = r.rollout_dtype or ("bfloat16" if r.backend == "vllm" else m.dtype)
        return WeightPublisher(dtype).publish(trainable_state(src.model, src.adapter), self.step)

    def checkpoint(self) -> None:
        self.result["train_wall_s"] = self.stop.wall_s()
        save_checkpoint(self.folder.path, self.step, {PID: self.trainer},
                        {"version": self.step, "result": self.result, "data_position": self.step, "algorithm": "sft"},
                        keep=self.cfg.run.keep_checkpoints, ranks=self.ranks)

    # ================================================================== cleanup
    def cleanup(self) -> None:
        """Close the eval engine, draw the curves, write result.json; release the run folder; leave the process
        group."""
        if self.ranks is not None:
            close_ranks()
        if not self.folder.locked:
            return  # setup never got the folder (or this is not rank 0): nothing of ours is in it
        try:
            if self.logger is not None:
                self.logger.close()
            if self.eval_policy is not None:
                close_policies({PID: self.eval_policy})
                self.eval_policy = None
            if self.cfg.log.plot and (self.folder.path / "metrics.jsonl").is_file():
                drawn = plot_curves(self.folder.path / "metrics.jsonl", self.folder.path / "curves.png")
                if drawn is not None:
                    self.result["curves_png"] = str(drawn[0])
            if self.result:
                self.folder.write_result(self.result)
        finally:
            self.folder.release()

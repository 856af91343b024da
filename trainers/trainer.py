"""``PolicyTrainer``: one trained policy's model, optimizer and loss. The narrow seam of training.

A trainer takes a list of :class:`~agentgym.trainers.batching.TrainSample` (built from trajectory
groups or transcripts), runs one optimizer step per mini-batch (micro-batches packed under a
token budget, gradients accumulated), and returns metrics. Publishing the new weights is the
caller's move (:class:`~agentgym.weights.WeightPublisher`), so a synchronous recipe and a
dataflow runtime drive it the same way.

Several trainers can share one peft model (two LoRA adapters over one base): each owns one adapter,
activates it for its own forward passes and optimizes only its parameters.

**Learning-rate schedule.** One :meth:`PolicyTrainer.train_on` call is one *batch*, and a batch is
``steps_per_batch`` optimizer steps (RL: ``loss.epochs x loss.mini_batches``; SFT: 1; micro-batches
accumulate gradients and are not steps). The trainer is told how many batches the run will hand it
(``batches``), so the schedule spans the run's true number of optimizer steps,
``horizon = batches x steps_per_batch`` (:func:`lr_factor`). Every batch spends its
``steps_per_batch`` positions of the schedule whether it takes them or not (a batch whose groups were
all filtered, fewer samples than mini-batches, a skipped non-finite step), so the schedule always ends
where the run does.

Faults: a non-finite loss or gradient norm skips the optimizer step (gradients dropped, counted in
``skipped_steps``, logged); ``optim.max_bad_steps`` consecutive ones raise
:class:`~agentgym.errors.TrainingDiverged`. An empty sample list is not a step (it still spends its
batch's positions of the schedule).

**Sharded** (``ranks``, ``trainer.strategy = "fsdp2"``): the model is an FSDP2 model
(:func:`~agentgym.trainers.distributed.shard_model`), each rank calls :meth:`PolicyTrainer.train_on` with its
share of the batch, and the loss normalisers, the number of micro-batches, the finiteness of the step and the
gradient norm are agreed over the ranks (see :mod:`agentgym.trainers.distributed`). With one mini-batch the
step equals one process's step on the whole batch. With several (RL's ``loss.mini_batches``), every rank passes
the whole batch with ``train_on(batch, whole_batch=True)``: the split and shuffle are the one process's, over
the global batch, with an RNG that is identical on every rank, and each rank trains on its share of each global
mini-batch, so N ranks take the one process's optimizer steps exactly (the RL recipe does this; SFT passes
shares, with one mini-batch). The loss, gradient norm, trained tokens and sequences in the metrics are global;
the other statistics are this rank's.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

from agentgym.errors import ConfigurationError, TrainingDiverged

from .batching import MicroBatch, TrainSample, collate, collate_packed, pack_micro_batches, pack_rows
from .config import LossConfig, ModelConfig, OptimConfig
from .distributed import local_value
from .losses import aggregation_weights, batch_totals, policy_loss, sft_loss
from .memory import release_free_memory
from .model import DTYPES, adapter_parameters, add_lora, load_causal_lm, token_logprobs

if TYPE_CHECKING:
    from .config import TrainerConfig
    from .distributed import Ranks

__all__ = ["PolicyTrainer", "build_trainers", "lr_factor"]

log = logging.getLogger(__name__)


def lr_factor(step: int, *, warmup_steps: int, schedule: str, horizon: int) -> float:
    """The learning-rate multiplier of optimizer step ``step`` (0-based) of a run of ``horizon`` steps.

    A linear warmup over the first ``warmup_steps`` steps (step ``k`` gets ``(k + 1) / warmup_steps``),
    then ``"constant"`` (1) or ``"cosine"``: ``0.5 (1 + cos(pi t))`` with ``t = (k - warmup) /
    (horizon - warmup)``, which reaches its end (0) at ``k = horizon``, right after the run's last step
    (transformers' ``get_cosine_schedule_with_warmup`` convention: no step is spent at learning rate 0).
    """
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "cosine":
        t = min(1.0, (step - warmup_steps) / max(1, horizon - warmup_steps))
        return 0.5 * (1 + math.cos(math.pi * t))
    return 1.0


class PolicyTrainer:
    """Model, optimizer and loss of one policy.

    Args:
        policy_id: The policy whose tokens this trainer trains on.
        model: A transformers causal LM (or a peft model holding ``adapter``).
        algorithm: ``"grpo"`` (PPO-clip on advantages) or ``"sft"`` (negative log-likelihood).
        optim / loss: Optimizer and loss settings.
        adapter: The LoRA adapter this trainer owns (``None``: full fine-tune of ``model``).
        ref_model: A frozen reference for the KL term (with LoRA the base model is used instead,
            by disabling the adapter). Sharded: an FSDP2 model on the same ranks as ``model``.
        batches: The ``train_on`` calls the run will make (the schedule's horizon is ``batches x
            steps_per_batch`` optimizer steps; see the module docstring). Needed by a cosine schedule.
        seed: Shuffles mini-batches.
        autocast: Run forward and backward under ``torch.autocast`` in this dtype (mixed precision:
            the weights and optimizer state keep the model's dtype).
        ranks: Sharded training: this rank's place in the process group (``model`` is sharded with FSDP2
            and each ``train_on`` call gets this rank's share of the batch).
    """

    def __init__(self, policy_id: str, model: Any, *, algorithm: Literal["grpo", "sft"] = "grpo",
                 optim: OptimConfig | None = None, loss: LossConfig | None = None, adapter: str | None = None,
                 ref_model: Any = None, batches: int | None = None, seed: int = 0,
                 autocast: torch.dtype | None = None, ranks: Ranks | None = None) -> None:
        self.policy_id = policy_id
        self.model = model
        self.algorithm = algorithm
        self.optim_cfg = optim or OptimConfig()
        self.loss_cfg = loss or LossConfig()
        self.adapter = adapter
        self.ref_model = ref_model
        self.ranks = ranks
        self.device = ranks.device if ranks is not None else next(model.parameters()).device
        self.params = adapter_parameters(model, adapter)
        for _, p in self.params:
            p.requires_grad_(True)
        o = self.optim_cfg
        self.optimizer = torch.optim.AdamW([p for _, p in self.params], lr=o.lr, betas=o.betas, eps=o.eps,
                                           weight_decay=o.weight_decay)
        if batches is None and o.schedule != "constant":
            raise ConfigurationError(f"a {o.schedule} learning-rate schedule needs the run's length: pass batches=")
        self.batches = max(1, batches or 1)
        self.schedule_pos = 0  # optimizer steps of the schedule spent (taken or not)
        self.lr = o.lr * self.lr_factor(0)
        self.steps = 0  # optimizer steps taken
        self.skipped_steps = 0
        self.bad_in_a_row = 0
        self.rng = random.Random(seed)
        self.autocast = autocast

    # ------------------------------------------------------------------ schedule
    @property
    def steps_per_batch(self) -> int:
        """Optimizer steps one ``train_on`` call plans: ``loss.epochs x loss.mini_batches`` (RL), 1 (SFT)."""
        return self.loss_cfg.epochs * self.loss_cfg.mini_batches if self.algorithm == "grpo" else 1

    @property
    def horizon(self) -> int:
        """Optimizer steps the learning-rate schedule spans: ``batches x steps_per_batch``."""
        return self.batches * self.steps_per_batch

    def lr_factor(self, pos: int) -> float:
        """The schedule's multiplier at position ``pos`` (:func:`lr_factor` over this run's horizon)."""
        o = self.optim_cfg
        return lr_factor(pos, warmup_steps=o.warmup_steps, schedule=o.schedule, horizon=self.horizon)

    # ------------------------------------------------------------------ helpers
    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Make this trainer's adapter the active one (no-op for a full fine-tune)."""
        if self.adapter is not None:
            self.model.set_adapter(self.adapter)
            for _, p in self.params:
                p.requires_grad_(True)
        yield

    def _forward_ctx(self) -> contextlib.AbstractContextManager[Any]:
        """Forward passes run under autocast when mixed precision is on (backward follows its dtypes)."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast)

    def _micro_batches(self, samples: Sequence[TrainSample]) -> list[MicroBatch]:
        agg = "token-mean" if self.algorithm == "sft" else self.loss_cfg.aggregation
        counts = [s.num_masked for s in samples]
        totals = None
        if self.ranks is not None:  # the normalisers of the whole batch, not of this rank's share
            n_seq, n_tok = self.ranks.sum(batch_totals(counts))
            totals = (int(n_seq), int(n_tok))
        weights = aggregation_weights(counts, agg, self.loss_cfg.norm_len, totals)
        if not samples:
            return []
        o = self.optim_cfg
        if o.pack_sequences:  # several samples per row, block-diagonal attention (see trainers/batching.py)
            rows = pack_rows([len(s) for s in samples], o.pack_len)
            groups = pack_micro_batches([sum(len(samples[i]) for i in row) for row in rows], o.token_budget)
            return [collate_packed(samples, [rows[g] for g in grp], weights).to(self.device) for grp in groups]
        groups = pack_micro_batches([len(s) for s in samples], o.token_budget)
        return [collate(samples, idx, weights).to(self.device) for idx in groups]

    @torch.no_grad()
    def _logprobs_nograd(self, mbs: list[MicroBatch], reference: bool = False) -> list[torch.Tensor]:
        out = []
        was = self.model.training
        self.model.eval()
        try:
            for mb in mbs:
                with self._forward_ctx():
                    if reference and self.ref_model is not None:
                        lp, _ = token_logprobs(self.ref_model, mb)
                    elif reference:  # LoRA: the base model is the reference
                        with self.model.disable_adapter():
                            lp, _ = token_logprobs(self.model, mb)
                    else:
                        lp, _ = token_logprobs(self.model, mb)
                out.append(lp.detach())
        finally:
            self.model.train(was)
        return out

    # ------------------------------------------------------------------ one step
    def train_on(self, samples: Sequence[TrainSample], *, whole_batch: bool = False) -> dict[str, Any]:
        """Train on one batch: ``loss.epochs`` x ``loss.mini_batches`` optimizer steps.

        Args:
            samples: The batch (sharded: this rank's share of it, unless ``whole_batch``).
            whole_batch: Sharded only: every rank passes the *whole* batch (the same list, in the same order).
                The mini-batch split and shuffle are then the one process's (the same RNG, identical on every
                rank, over the global batch) and each rank trains on its share of every global mini-batch, so
                N ranks take exactly the optimizer steps one process takes, with several mini-batches too.
                Without it each rank shuffles and splits its own share (equal with one mini-batch only).

        Returns:
            Metrics: loss, grad norm, clip fraction, ratio, KL, entropy, TIS weight, behaviour logprob
            mismatch, tokens/s, padding efficiency, steps taken and skipped.
        """
        base = self.schedule_pos
        self.schedule_pos += self.steps_per_batch  # the batch's share of the schedule, taken or not
        samples = [s for s in samples if s.policy_id == self.policy_id and s.num_masked > 0]
        whole = whole_batch and self.ranks is not None
        if self.ranks is None or whole:
            n_global = len(samples)  # whole: every rank holds the same list
        else:
            n_global = int(self.ranks.sum([len(samples)])[0])
        if not n_global:
            return {"optimizer_steps": 0, "skipped": "no samples", "lr": self.lr}
        t0 = time.perf_counter()
        cfg = self.loss_cfg
        rl = self.algorithm == "grpo"
        n_mini = min(cfg.mini_batches, n_global) if rl else 1
        epochs = cfg.epochs if rl else 1
        order = list(range(len(samples)))
        if n_mini > 1:
            self.rng.shuffle(order)
        chunks = [[samples[i] for i in order[k::n_mini]] for k in range(n_mini)]
        if whole:  # this rank's share of every global mini-batch
            assert self.ranks is not None
            chunks = [self.ranks.share(c) for c in chunks]
            samples = [s for c in chunks for s in c]
        plans = [self._micro_batches(c) for c in chunks]
        reals = [len(p) for p in plans]  # micro-batches past these are a rank's zero-weight padding
        if self.ranks is not None:
            plans = self._pad(plans)
        need_old = rl and (epochs > 1 or n_mini > 1)
        # sharded: the old and reference log-probs run over the padded plans, so every rank makes as many forwards of
        # the policy and of the (sharded) reference as the others, in the same order, empty shares included
        with self.active():
            olds = [self._logprobs_nograd(p) for p in plans] if need_old else None
            refs = [self._logprobs_nograd(p, reference=True) for p in plans] if rl and cfg.kl_coef > 0 else None
            acc = _Acc()
            for e in range(epochs):
                for k, mbs in enumerate(plans):
                    self._step(mbs, None if olds is None else olds[k], None if refs is None else refs[k], acc,
                               pos=base + e * cfg.mini_batches + k, real=reals[k])
        m = acc.metrics()
        tokens = sum(s.num_masked for s in samples)
        n_seqs = len(samples)
        if self.ranks is not None:
            tokens, n_seqs = (int(v) for v in self.ranks.sum([tokens, n_seqs]))
        t_trim = time.perf_counter()
        release_free_memory()  # the step's freed activations go back to the OS (see trainers/memory.py)
        m["trim_s"] = time.perf_counter() - t_trim
        dt = time.perf_counter() - t0
        m.update({"trained_tokens": tokens, "sequences": n_seqs, "train_s": dt,
                  "tokens_per_s": (sum(len(s) for s in samples) * epochs) / dt if dt > 0 else None,
                  "trained_tokens_per_s": tokens * epochs / dt if dt > 0 else None,
                  "lr": self.lr, "skipped_steps_total": self.skipped_steps})
        return m

    def _pad(self, plans: list[list[MicroBatch]]) -> list[list[MicroBatch]]:
        """Every rank runs as many micro-batches per mini-batch as the busiest one (FSDP's collectives run in
        every forward and backward): the others pad with a zero-weight micro-batch."""
        assert self.ranks is not None
        most = [int(v) for v in self.ranks.max([len(p) for p in plans])]
        pad = collate([TrainSample(self.policy_id, [0, 0], [0, 1])], [0], [0.0]).to(self.device)
        return [p + [pad] * (n - len(p)) for p, n in zip(plans, most, strict=True)]

    def _step(self, mbs: list[MicroBatch], olds: list[torch.Tensor] | None, refs: list[torch.Tensor] | None,
              acc: _Acc, pos: int, real: int | None = None) -> None:
        cfg = self.loss_cfg
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        finite = True
        for j, mb in enumerate(mbs):
            bonus = cfg.entropy_coef > 0 and self.algorithm == "grpo"
            with self._forward_ctx():
                logp, ent = token_logprobs(self.model, mb, entropy=True, entropy_grad=bonus)  # [B, W-1]
            if self.algorithm == "sft":
                per_tok = sft_loss(logp)
                out = None
            else:
                old = logp.detach() if olds is None else olds[j]
                out = policy_loss(logp, old, mb.advantages, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                  ref_logp=None if refs is None else refs[j], kl_coef=cfg.kl_coef,
                                  behaviour_logp=mb.behaviour_logp, tis_cap=cfg.tis_cap)
                per_tok = out.loss
            if bonus and ent is not None:
                per_tok = per_tok - cfg.entropy_coef * ent  # entropy bonus (keeps exploring)
                ent = ent.detach()
            loss = (per_tok * mb.weights).sum()
            if not torch.isfinite(loss):
                finite = False
                if self.ranks is None:
                    break
            loss.backward()  # sharded: every rank runs every backward (the step is skipped below if need be)
            total += float(loss.detach())
            if real is None or j < real:
                acc.add(mb, logp.detach(), ent, out)
        if self.ranks is not None:  # the batch's loss; a non-finite loss on any rank skips the step on all
            total, bad = self.ranks.sum([total if finite else 0.0, 0.0 if finite else 1.0])
            finite = bad == 0
        grad_norm = float("nan")
        if finite:
            params = [p for _, p in self.params if p.grad is not None]
            clip = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip is not None else float("inf")
            grad_norm = local_value(torch.nn.utils.clip_grad_norm_(params, clip)) if params else 0.0
            finite = math.isfinite(grad_norm)
        if not finite:
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            self.bad_in_a_row += 1
            acc.skipped += 1
            log.warning("%s: non-finite loss or gradient; optimizer step skipped (%d in a row, %d in total)",
                        self.policy_id, self.bad_in_a_row, self.skipped_steps)
            if self.bad_in_a_row >= self.optim_cfg.max_bad_steps:
                raise TrainingDiverged(
                    f"{self.policy_id}: {self.bad_in_a_row} optimizer steps in a row had a non-finite loss or "
                    "gradient; lower optim.lr, check the data, or resume from the last checkpoint")
            return
        self.lr = self.optim_cfg.lr * self.lr_factor(pos)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        self.optimizer.step()
        self.steps += 1
        self.bad_in_a_row = 0
        acc.losses.append(total)
        acc.grad_norms.append(grad_norm)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), **self.counters()}

    def counters(self) -> dict[str, Any]:
        """Everything but the optimizer: schedule position, learning rate, step counters, mini-batch RNG (a
        sharded checkpoint keeps the optimizer in ``torch.distributed.checkpoint`` shards instead)."""
        return {"schedule_pos": self.schedule_pos, "lr": self.lr, "steps": self.steps,
                "skipped_steps": self.skipped_steps, "bad_in_a_row": self.bad_in_a_row, "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_counters(state)

    def load_counters(self, state: dict[str, Any]) -> None:
        self.schedule_pos = int(state["schedule_pos"])
        self.lr = float(state["lr"])
        self.steps = int(state["steps"])
        self.skipped_steps = int(state["skipped_steps"])
        self.bad_in_a_row = int(state["bad_in_a_row"])
        self.rng.setstate(_tuplify(state["rng"]))

    def weights(self) -> dict[str, torch.Tensor]:
        """The parameters this trainer optimizes (for checkpoints)."""
        return {n: p.detach() for n, p in self.params}

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        mine = dict(self.params)
        missing = set(mine) - set(weights)
        if missing:
            raise KeyError(f"checkpoint lacks {sorted(missing)[:3]}")
        with torch.no_grad():
            for n, p in mine.items():
                p.copy_(weights[n].to(p.dtype))


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x


class _Acc:
    """Token-weighted running statistics over the micro-batches of a train call."""

    def __init__(self) -> None:
        self.n = 0.0
        self.sums: dict[str, float] = {}
        self.losses: list[float] = []
        self.grad_norms: list[float] = []
        self.skipped = 0
        self.padded = 0
        self.real = 0
        self.micro = 0

    def _add(self, key: str, t: torch.Tensor, mask: torch.Tensor) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + float((t.float() * mask).sum())

    def add(self, mb: MicroBatch, logp: torch.Tensor, ent: torch.Tensor | None, out: Any) -> None:
        mask = mb.target_mask
        self.n += float(mask.sum())
        self.padded += mb.padded_tokens
        self.real += mb.real_tokens
        self.micro += 1
        self._add("logp", logp, mask)
        if ent is not None:
            self._add("entropy", ent, mask)
        if out is not None:
            self._add("ratio", out.ratio, mask)
            self._add("clip_frac", out.clipped, mask)
            if out.kl is not None:
                self._add("kl", out.kl, mask)
            if out.is_weight is not None:
                self._add("tis_weight", out.is_weight, mask)
        if mb.behaviour_logp is not None:
            self._add("behaviour_logp_abs_diff", (logp - mb.behaviour_logp).abs(), mask)

    def metrics(self) -> dict[str, Any]:
        m: dict[str, Any] = {k: v / self.n for k, v in self.sums.items()} if self.n else {}
        m["loss"] = sum(self.losses) / len(self.losses) if self.losses else None
        m["grad_norm"] = sum(self.grad_norms) / len(self.grad_norms) if self.grad_norms else None
        m["optimizer_steps"] = len(self.losses)
        m["skipped_steps"] = self.skipped
        m["micro_batches"] = self.micro
        m["padding_efficiency"] = self.real / self.padded if self.padded else None
        return m


def build_trainers(model: ModelConfig, paths: Mapping[str, str], *, algorithm: Literal["grpo", "sft"],
                   optim: OptimConfig, loss: LossConfig, batches: Mapping[str, int], seed: int = 0,
                   shared_base: bool = False, kl_coef: float = 0.0, sharding: TrainerConfig | None = None,
                   ranks: Ranks | None = None) -> dict[str, PolicyTrainer]:
    """One :class:`PolicyTrainer` per policy (``paths``: policy id -> model folder).

    ``model.finetune = "lora"`` gives each policy its own adapter; with ``shared_base`` (several policies)
    the adapters sit on one base model. A KL term (``kl_coef > 0``) gets a frozen reference copy of a fully
    fine-tuned model (with LoRA the base, adapter disabled, is the reference). ``batches``: the
    ``train_on`` calls each trainer will get (the learning-rate schedule's horizon). ``sharding`` with
    ``strategy = "fsdp2"`` (and this process's ``ranks``): each model is loaded on the CPU, gets its adapter, and
    is sharded with FSDP2 onto ``ranks.device`` (every rank must have seeded its RNGs alike, so that LoRA
    weights start the same); a full fine-tune's KL reference is copied before sharding and sharded the same way
    on the same ranks (frozen, no whole copy stays on any rank).
    """
    fsdp = sharding is not None and sharding.strategy == "fsdp2"
    if fsdp and ranks is None:
        raise ConfigurationError("trainer.strategy = 'fsdp2' needs the process group: pass ranks=init_ranks(...)")
    if fsdp and shared_base:
        raise ConfigurationError("trainer.strategy = 'fsdp2' does not train adapters over a shared base yet: "
                                 "set multi.shared_base = false (separate models) or trainer.strategy = 'single'")
    load_device = "cpu" if fsdp else model.device
    lora = model.finetune == "lora"
    lkw: dict[str, Any] = {"rank": model.lora_rank, "alpha": model.lora_alpha, "dropout": model.lora_dropout,
                           "targets": model.lora_targets}
    models: dict[str, Any] = {}
    if shared_base and len(paths) > 1:
        shared = load_causal_lm(model.path, model.dtype, load_device, model.gradient_checkpointing)
        for pid in paths:
            shared = add_lora(shared, pid, **lkw)
        models = dict.fromkeys(paths, shared)
    else:
        for pid, path in paths.items():
            base = load_causal_lm(path, model.dtype, load_device, model.gradient_checkpointing)
            models[pid] = add_lora(base, pid, **lkw) if lora else base
    refs: dict[str, Any] = dict.fromkeys(paths)
    for pid in paths:
        if kl_coef > 0 and not lora:  # a frozen copy of the initial model, taken whole (before sharding)
            refs[pid] = copy.deepcopy(models[pid]).eval()
            for p in refs[pid].parameters():
                p.requires_grad_(False)
        if fsdp:
            from .distributed import shard_model

            assert sharding is not None and ranks is not None
            shard_model(models[pid], ranks, mixed_precision=sharding.mixed_precision, cpu_offload=sharding.cpu_offload,
                        activation_checkpointing=sharding.activation_checkpointing)
            if refs[pid] is not None:  # sharded too, computing as the policy does (it never runs backward)
                shard_model(refs[pid], ranks, mixed_precision=sharding.mixed_precision,
                            cpu_offload=sharding.cpu_offload, frozen=True)
    out: dict[str, PolicyTrainer] = {}
    for pid in paths:
        out[pid] = PolicyTrainer(pid, models[pid], algorithm=algorithm, optim=optim, loss=loss,
                                 adapter=pid if lora else None, ref_model=refs[pid], batches=batches[pid], seed=seed,
                                 autocast=DTYPES[model.autocast] if model.autocast else None,
                                 ranks=ranks if fsdp else None)
    return out

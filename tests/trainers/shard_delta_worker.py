"""One rank of ``test_shard_delta.py`` (two of these, gloo on localhost).

``python shard_delta_worker.py MODEL OUT DTYPE``: a sharded full fine-tune of the tiny model publishes once whole,
then after each of :data:`fsdp_worker.STEPS` training steps every rank diffs its own slices
(:class:`~agentgym.trainers.shard_delta.ShardDeltas`) and rank 0 encodes the changes
(``WeightPublisher.publish_changes``). Rank 0 also gathers the whole new state and publishes it through a second
publisher the one-process way, and writes ``OUT/report.json``: per step, whether the two updates are identical
(kind, indices with their dtype, values' bits, base checksums, whole tensors) and what they hold.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import fsdp_worker
import torch


def same(a: Any, b: Any) -> list[str]:
    """Where two weight updates differ (empty when identical, bit for bit)."""
    out = []
    if a.kind != b.kind:
        out.append(f"kind {a.kind} != {b.kind}")
    for field in ("tensors", "indices", "values"):
        x, y = getattr(a, field), getattr(b, field)
        if sorted(x) != sorted(y):
            out.append(f"{field} names differ: {sorted(set(x) ^ set(y))[:4]}")
            continue
        for k in x:
            if x[k].dtype != y[k].dtype or x[k].shape != y[k].shape or not torch.equal(
                    x[k].reshape(-1).view(torch.uint8), y[k].reshape(-1).view(torch.uint8)):
                out.append(f"{field}[{k}] differs")
    if dict(a.base_crc) != dict(b.base_crc):
        out.append("base checksums differ")
    return out


def main(model_path: str, out: str, dtype: str) -> None:
    from agentgym.trainers.distributed import close_ranks, gather_trainable, init_ranks
    from agentgym.trainers.shard_delta import ShardDeltas

    from agentgym.weights import WeightPublisher

    ranks = init_ranks("cpu", timeout_s=120)
    try:
        case = {"name": "delta", "finetune": "full", "algorithm": "grpo", "aggregation": "token-mean", "seed": 11,
                "lr": 2e-5}
        tr = fsdp_worker.build(model_path, case, ranks)
        deltas = ShardDeltas(tr, dtype)
        ours, theirs = WeightPublisher(dtype), WeightPublisher(dtype)
        whole = gather_trainable(tr)
        if ranks.is_main:
            ours.publish(whole, 1)
            theirs.publish(whole, 1)
        deltas.mark()
        steps = []
        for v, b in enumerate(fsdp_worker.batches(case["seed"]), start=2):
            tr.train_on(b, whole_batch=True)
            changes = deltas.changes()
            whole = gather_trainable(tr)
            if ranks.is_main:
                a = ours.publish_changes(changes, v).update
                b2 = theirs.publish(whole, v).update
                steps.append({"version": v, "kind": a.kind, "differences": same(a, b2),
                              "sparse": len(a.indices), "whole": len(a.tensors), "changed": a.num_changed(),
                              "elements": sum(t.numel() for t in whole.values())})
        if ranks.is_main:
            assert ours.shadow is not None and theirs.shadow is not None
            shadow_diff = [k for k in theirs.shadow if not torch.equal(
                ours.shadow[k].view(torch.uint8), theirs.shadow[k].view(torch.uint8))]
            Path(out, "report.json").write_text(json.dumps({"steps": steps, "shadow_differs": shadow_diff}))
    finally:
        close_ranks()


if __name__ == "__main__":
    main(*sys.argv[1:4])

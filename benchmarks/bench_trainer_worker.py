"""One run of ``bench_trainer.py --procs``: the SFT training work on one process, or as one FSDP2 rank under torchrun.

``python benchmarks/bench_trainer_worker.py --model M --work W.json --steps S --threads T --dtype D --out DIR``:
alone, a one-process full fine-tune (``trainer.strategy = "single"``); under ``torchrun --nproc_per_node N``, each
rank holds its FSDP2 shards (``"fsdp2"``, gloo) and trains on its share (``batch[rank::N]``) of the same global
batch. Every step is one AdamW step on the whole workload (``algorithm = "sft"``); the ranks meet at a barrier
before each timed step, so rank 0's clock times the group's step. Each rank writes ``DIR/rank<R>.json``: its step
times, the step's trained tokens (over the whole batch), its peak resident memory over the whole run
(``ru_maxrss``: the model load included, where every rank holds the whole model before sharding it) and over the
training steps alone (``VmHWM``, reset after the trainer is built), and the bytes of the parameters, gradients and
optimizer state it holds (its shards).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

OPTIM = {"lr": 1e-6, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}


def _local(t: Any) -> Any:
    """A DTensor's local shard (a plain tensor is its own)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _nbytes(t: Any) -> int:
    loc = _local(t)
    return int(loc.numel() * loc.element_size())


def held_bytes(trainer: Any) -> dict[str, int]:
    """The parameter, gradient and optimizer-state bytes this process holds (its shards when sharded).

    Gradients are counted as they are held during the step: one gradient shard per trainable parameter shard, in
    the parameter's dtype (the trainer frees them after the optimizer step, so they are sized from the shards)."""
    import torch

    params = [p for p in trainer.model.parameters()]
    trainable = [p for p in params if p.requires_grad]
    opt = 0
    for st in trainer.optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                opt += _nbytes(v)
    out = {"params": sum(_nbytes(p) for p in params), "grads": sum(_nbytes(p) for p in trainable), "optimizer": opt}
    out["total"] = sum(out.values())
    return out


def _vm_hwm() -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_hwm() -> bool:
    """Reset this process's resident high-water mark (``VmHWM``; Linux >= 4.0), so that it measures what follows."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from agentgym.trainers.batching import TrainSample
    from agentgym.trainers.config import LossConfig, ModelConfig, OptimConfig, TrainerConfig
    from agentgym.trainers.distributed import close_ranks, init_ranks, launched
    from agentgym.trainers.trainer import build_trainers

    ranks = init_ranks("cpu", timeout_s=600) if launched() else None
    try:
        torch.manual_seed(0)
        work = json.loads(Path(a.work).read_text())
        batch = [TrainSample("policy", ids, mask, 1.0) for ids, mask in
                 zip(work["token_ids"], work["loss_mask"], strict=True)]
        share = batch if ranks is None else ranks.share(batch)
        optim = OptimConfig(lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"], weight_decay=OPTIM["weight_decay"],
                            token_budget=4096, grad_clip=1.0)
        sharding = TrainerConfig(strategy="fsdp2") if ranks is not None else None
        tr = build_trainers(ModelConfig(path=a.model, finetune="full", dtype=a.dtype), {"policy": a.model},
                            algorithm="sft", optim=optim, loss=LossConfig(), batches={"policy": a.steps}, seed=0,
                            sharding=sharding, ranks=ranks)["policy"]
        assert type(tr.optimizer) is torch.optim.AdamW, type(tr.optimizer)
        # the load (every rank reads the whole model before sharding it) is in ru_maxrss; VmHWM, reset here,
        # measures the training steps alone
        import gc

        from agentgym.trainers.memory import release_free_memory

        gc.collect()
        release_free_memory()
        reset = _reset_hwm()
        times: list[float] = []
        tokens: list[int] = []
        micro: list[int] = []
        for _ in range(a.steps):
            if ranks is not None:
                ranks.barrier()
            t0 = time.perf_counter()
            m = tr.train_on(share)
            times.append(time.perf_counter() - t0)
            assert m.get("optimizer_steps") == 1, m
            tokens.append(int(m["trained_tokens"]))  # summed over the ranks when sharded
            micro.append(int(m.get("micro_batches", 0)))
        rank = 0 if ranks is None else ranks.rank
        world = 1 if ranks is None else ranks.world
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        rec = {"rank": rank, "world": world, "pid": os.getpid(), "threads": torch.get_num_threads(),
               "step_s": times, "trained_tokens": tokens, "micro_batches": micro,
               "sequences": len(share), "peak_rss_bytes": peak, "train_peak_rss_bytes": _vm_hwm() if reset else None,
               "held_bytes": held_bytes(tr)}
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / f"rank{rank}.json").write_text(json.dumps(rec))
    finally:
        if ranks is not None:
            close_ranks()


if __name__ == "__main__":
    main()

"""One rank of the sharded-training tests (``test_fsdp.py`` starts two of these, gloo on localhost).

``python fsdp_worker.py MODEL OUT CASES_JSON``: for each case, trains the tiny model on :data:`STEPS` batches
(:func:`batches`), on this rank's share of each (or, ``whole_batch``, on its share of each global mini-batch of
the whole batch) with ``trainer.strategy = "fsdp2"``, and rank 0 writes
the gathered trained parameters to ``OUT/<case>.safetensors``. :func:`train_single` is the one-process twin the
test compares them with.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

STEPS = 3


def batches(seed: int, n: int = 11, vocab: int = 300) -> list[list[Any]]:
    """:data:`STEPS` batches of ``n`` synthetic samples; even positions long, odd ones short, so rank 0 of 2 gets
    more sequences, most of the tokens and more micro-batches than rank 1 (a per-rank normaliser then weighs
    tokens and sequences wrongly, and rank 1 pads)."""
    from agentgym.trainers.batching import TrainSample

    rng = random.Random(seed)
    out = []
    for _ in range(STEPS):
        batch = []
        for i in range(n):
            length = rng.randint(24, 40) if i % 2 == 0 else rng.randint(5, 9)
            mask = [0] * 3 + [int(rng.random() < 0.7) for _ in range(length - 3)]
            mask[-1] = 1
            batch.append(TrainSample("policy", [rng.randrange(3, vocab) for _ in range(length)], mask,
                                     advantage=rng.uniform(-1.0, 1.0)))
        out.append(batch)
    return out


def build(model_path: str, case: dict[str, Any], ranks: Any = None) -> Any:
    from agentgym.trainers.config import LossConfig, ModelConfig, OptimConfig, TrainerConfig
    from agentgym.trainers.trainer import build_trainers

    torch.manual_seed(case["seed"])
    mcfg = ModelConfig(path=model_path, finetune=case["finetune"], lora_rank=4, lora_alpha=8.0)
    optim = OptimConfig(lr=case.get("lr", 1e-3), token_budget=64, grad_clip=1.0, eps=1e-6)
    kl_coef = case.get("kl_coef", 0.0)  # > 0: a KL term to a frozen reference (sharded like the policy)
    loss = LossConfig(aggregation=case.get("aggregation", "token-mean"), norm_len=32, tis_cap=None,
                      mini_batches=case.get("mini_batches", 1), kl_coef=kl_coef)
    sharding = None
    if ranks is not None:
        sharding = TrainerConfig(strategy="fsdp2", mixed_precision=case.get("mixed_precision"),
                                 activation_checkpointing=case.get("activation_checkpointing", False))
    return build_trainers(mcfg, {"policy": model_path}, algorithm=case["algorithm"], optim=optim, loss=loss,
                          batches={"policy": STEPS}, seed=case["seed"], kl_coef=kl_coef, sharding=sharding,
                          ranks=ranks)["policy"]


def trained(trainer: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The trained parameters of ``state`` (a full state dict of the trainer's model)."""
    names = {n for n, _ in trainer.params}
    return {n: v.detach().float().cpu().contiguous() for n, v in state.items() if n in names}


def train_single(model_path: str, case: dict[str, Any]) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """One process on the whole batches: the parameters after :data:`STEPS` steps, and each step's metrics."""
    tr = build(model_path, case)
    ms = [tr.train_on(b) for b in batches(case["seed"])]
    return trained(tr, dict(tr.model.state_dict())), ms


def main(model_path: str, out: str, cases_json: str) -> None:
    from agentgym.trainers.distributed import close_ranks, full_state, init_ranks
    from safetensors.torch import save_file

    ranks = init_ranks("cpu", timeout_s=120)
    try:
        for case in json.loads(cases_json):
            tr = build(model_path, case, ranks)
            if case.get("whole_batch"):  # every rank gets the whole batch (the RL recipe's way)
                ms = [tr.train_on(b, whole_batch=True) for b in batches(case["seed"])]
            else:  # every rank gets its share (the SFT recipe's way)
                ms = [tr.train_on(ranks.share(b)) for b in batches(case["seed"])]
            if tr.ref_model is not None:  # the KL reference stays sharded (its root reshards after each forward)
                from torch.distributed.tensor import DTensor

                gathered = [n for n, p in tr.ref_model.named_parameters() if not isinstance(p, DTensor)]
                assert not gathered, f"{case['name']}: the reference holds gathered parameters {gathered[:3]}"
            state = full_state(tr.model)
            if ranks.is_main:
                save_file(trained(tr, state), str(Path(out) / f"{case['name']}.safetensors"))
                (Path(out) / f"{case['name']}.json").write_text(json.dumps(ms, default=str))
    finally:
        close_ranks()


if __name__ == "__main__":
    main(*sys.argv[1:4])

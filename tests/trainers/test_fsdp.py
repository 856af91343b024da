"""Sharded training (``trainer.strategy = "fsdp2"``): two gloo ranks take exactly the step one process takes.

Two ranks (``fsdp_worker.py``, started here on a free localhost port, bounded by a timeout and killed with their
process groups whatever happens) train the tiny model on 3 batches, each on its share of every batch, with
micro-batching on; one process trains on the whole batches. Their parameters must agree to float32 round-off:
full fine-tune and LoRA, RL losses under each aggregation, and SFT; and with 2 PPO mini-batches per batch, where
the shuffle and split are over the global batch (``train_on(batch, whole_batch=True)``) and each rank trains on
its share of every global mini-batch; and with a KL term (full fine-tune: a frozen reference sharded like the
policy; LoRA: the base, adapter disabled), whose effect on the parameters is checked to be far above the tolerance.
A per-rank normaliser (each rank weighting its tokens by its own count) moves the parameters by orders of magnitude
more than the tolerance (checked by planting it), and a mean of the ranks' gradients instead of their sum shows in
the gradient norm.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from agentgym.errors import ConfigurationError

HERE = Path(__file__).resolve().parent
WORLD = 2
KL_EFFECT = 50  # the KL cases' parameters differ from the same training without KL by this many tolerances or more
CASES: list[dict[str, Any]] = [
    {"name": "full-token-mean", "finetune": "full", "algorithm": "grpo", "aggregation": "token-mean", "seed": 1},
    {"name": "full-seq-mean", "finetune": "full", "algorithm": "grpo", "aggregation": "seq-mean", "seed": 2},
    {"name": "full-token-sum", "finetune": "full", "algorithm": "grpo", "aggregation": "token-sum", "seed": 3},
    {"name": "lora-sft", "finetune": "lora", "algorithm": "sft", "seed": 4, "lr": 1e-2},
    {"name": "lora-token-mean", "finetune": "lora", "algorithm": "grpo", "aggregation": "token-mean", "seed": 5,
     "lr": 1e-2},
    # two PPO mini-batches per batch: the split and shuffle are over the global batch (the RL recipe's
    # whole_batch), so each of the 2 optimizer steps per batch is the one process's
    {"name": "full-2-mini-batches", "finetune": "full", "algorithm": "grpo", "aggregation": "token-mean", "seed": 8,
     "mini_batches": 2, "whole_batch": True},
    {"name": "lora-2-mini-batches", "finetune": "lora", "algorithm": "grpo", "aggregation": "seq-mean", "seed": 9,
     "lr": 1e-2, "mini_batches": 2, "whole_batch": True},
    # a KL term: full fine-tune against a frozen copy sharded like the policy, over 6 global mini-batches of which
    # the last (1 sample) leaves rank 1 an empty share (it pads, and still runs the reference's forward); LoRA
    # against its own base (adapter disabled), with the reference's forward the first one of each batch
    {"name": "full-kl", "finetune": "full", "algorithm": "grpo", "aggregation": "token-mean", "seed": 10,
     "kl_coef": 0.5, "mini_batches": 6, "whole_batch": True},
    {"name": "lora-kl", "finetune": "lora", "algorithm": "grpo", "aggregation": "seq-mean", "seed": 11, "lr": 1e-2,
     "kl_coef": 0.5},
]
# FSDP's bf16 compute and activation checkpointing: they train, and the first step's loss is one process's
MIXED: list[dict[str, Any]] = [
    {"name": "full-bf16-ac", "finetune": "full", "algorithm": "grpo", "aggregation": "token-mean", "seed": 6,
     "mixed_precision": "bfloat16", "activation_checkpointing": True},
    {"name": "lora-bf16-ac", "finetune": "lora", "algorithm": "sft", "seed": 7, "lr": 1e-2,
     "mixed_precision": "bfloat16", "activation_checkpointing": True},
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_ranks(argv: list[str], world: int, *, timeout_s: float = 300.0, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> list[str]:
    """Run ``python argv...`` as ``world`` ranks of one gloo group on localhost (the variables ``torchrun``
    sets), each in its own process group; wait for all, killing every one on a timeout or a failure.
    Returns each rank's output; raises AssertionError naming the ranks that failed."""
    port = _free_port()
    procs = []
    base = {**os.environ, **(env or {}), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1"}
    try:
        for r in range(world):
            procs.append(subprocess.Popen([sys.executable, *argv], cwd=cwd,
                                          env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))
        outs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    assert not failed, "\n".join(f"rank {r} exited {procs[r].returncode}:\n{outs[r][-4000:]}" for r in failed)
    return outs


@pytest.fixture(scope="module")
def sharded_run(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    launch_ranks([str(HERE / "fsdp_worker.py"), tiny_model, str(out), json.dumps(CASES + MIXED)], WORLD)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_two_ranks_take_the_one_process_step(case: dict[str, Any], tiny_model: str, sharded_run: Path) -> None:
    sys.path.insert(0, str(HERE))
    import fsdp_worker
    from safetensors.torch import load_file

    single, single_metrics = fsdp_worker.train_single(tiny_model, case)
    sharded = load_file(str(sharded_run / f"{case['name']}.safetensors"))
    sharded_metrics = json.loads((sharded_run / f"{case['name']}.json").read_text())
    assert set(sharded) == set(single) and single
    fresh = fsdp_worker.build(tiny_model, case)
    init = fsdp_worker.trained(fresh, dict(fresh.model.state_dict()))
    moved = max(float((single[n] - init[n]).abs().max()) for n in single)
    worst = max(float((sharded[n] - single[n]).abs().max()) for n in single)
    assert moved > 1e-3  # the steps did train
    # float32 round-off (reduction order), amplified a little by Adam on near-zero gradients: ~1e-4 of the
    # distance trained; a per-rank normaliser gives 5e-2 or more
    assert worst < 2e-3 * moved, (f"{case['name']}: sharded parameters differ from one process's by {worst:.2e} "
                                  f"(the steps moved them by {moved:.2e})")
    for s, m in zip(single_metrics, sharded_metrics, strict=True):
        assert m["optimizer_steps"] == s["optimizer_steps"] == case.get("mini_batches", 1)
        assert m["trained_tokens"] == s["trained_tokens"] and m["sequences"] == s["sequences"]
        assert m["loss"] == pytest.approx(s["loss"], rel=1e-4, abs=1e-6)
        assert m["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-4)
    if case.get("kl_coef"):
        # the reference is the initial model: the KL starts at 0 (exactly, with one mini-batch) and is positive once
        # the policy has moved (rank 0's own tokens on the sharded side)
        for ms in (single_metrics, sharded_metrics):
            assert all(m["kl"] > -1e-7 for m in ms) and all(m["kl"] > 1e-7 for m in ms[1:])
            if case.get("mini_batches", 1) == 1:
                assert ms[0]["kl"] == pytest.approx(0.0, abs=1e-7)
        # and it shapes the steps: without it the parameters end far outside the tolerance
        plain, _ = fsdp_worker.train_single(tiny_model, {**case, "kl_coef": 0.0})
        effect = max(float((plain[n] - single[n]).abs().max()) for n in single)
        assert effect > KL_EFFECT * 2e-3 * moved, (f"{case['name']}: the KL term moved the parameters by {effect:.2e} "
                                                   f"only (the tolerance is {2e-3 * moved:.2e})")


@pytest.mark.parametrize("case", MIXED, ids=[c["name"] for c in MIXED])
def test_bf16_compute_and_activation_checkpointing_train(case: dict[str, Any], tiny_model: str,
                                                         sharded_run: Path) -> None:
    sys.path.insert(0, str(HERE))
    import fsdp_worker
    from safetensors.torch import load_file

    single, single_metrics = fsdp_worker.train_single(tiny_model, case)
    sharded = load_file(str(sharded_run / f"{case['name']}.safetensors"))
    metrics = json.loads((sharded_run / f"{case['name']}.json").read_text())
    assert [m["optimizer_steps"] for m in metrics] == [1] * fsdp_worker.STEPS
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in metrics)
    assert metrics[0]["loss"] == pytest.approx(single_metrics[0]["loss"], rel=2e-2, abs=1e-3)
    fresh = fsdp_worker.build(tiny_model, case)
    init = fsdp_worker.trained(fresh, dict(fresh.model.state_dict()))
    assert max(float((sharded[n] - init[n]).abs().max()) for n in init) > 1e-3  # the steps did train


def test_strategy_settings_are_validated() -> None:
    from agentgym.trainers.config import TrainerConfig, validate_config

    assert TrainerConfig().strategy == "single"
    with pytest.raises(ConfigurationError, match=r"trainer\.strategy"):
        validate_config({"trainer": {"strategy": "ddp"}})
    with pytest.raises(ConfigurationError, match="FSDP2 setting"):
        validate_config({"trainer": {"mixed_precision": "bfloat16"}})
    sft = {"run": {"algorithm": "sft"}, "data": {"paths": ["x.jsonl"]}}
    ok = validate_config({**sft, "trainer": {"strategy": "fsdp2", "mixed_precision": "bfloat16",
                                            "activation_checkpointing": True}})
    assert ok.trainer.strategy == "fsdp2"
    rl = validate_config({"trainer": {"strategy": "fsdp2"}, "model": {"finetune": "lora"}})  # RL runs sharded
    assert rl.run.algorithm == "grpo" and rl.trainer.strategy == "fsdp2"
    # a KL reference runs sharded (full fine-tune and LoRA)
    for finetune in ("full", "lora"):
        kl = validate_config({"trainer": {"strategy": "fsdp2"}, "model": {"finetune": finetune},
                              "loss": {"kl_coef": 0.1}})
        assert kl.loss.kl_coef == 0.1 and kl.trainer.strategy == "fsdp2"
    from agentgym.trainers.config import LossConfig, ModelConfig, OptimConfig
    from agentgym.trainers.distributed import Ranks
    from agentgym.trainers.trainer import build_trainers

    with pytest.raises(ConfigurationError, match="adapters over a shared base") as refused:  # before any model loads
        build_trainers(ModelConfig(finetune="lora"), {"a": "x", "b": "x"}, algorithm="grpo", optim=OptimConfig(),
                       loss=LossConfig(kl_coef=0.1), batches={"a": 1, "b": 1}, shared_base=True, kl_coef=0.1,
                       sharding=TrainerConfig(strategy="fsdp2"), ranks=Ranks(0, 2, 0, torch.device("cpu")))
    assert "KL" not in str(refused.value)
    # two policies run sharded as separate models; one base with two adapters does not
    multi = validate_config({"trainer": {"strategy": "fsdp2"}, "multi": {"workflow": "solver_verifier"}})
    assert multi.multi.workflow == "solver_verifier" and not multi.multi.shared_base
    with pytest.raises(ConfigurationError, match=r"set multi\.shared_base = false \(separate models\)"):
        validate_config({"trainer": {"strategy": "fsdp2"}, "model": {"finetune": "lora"},
                         "multi": {"workflow": "solver_verifier", "shared_base": True}})
    # on Ray the sharded RL recipe runs as a Ray trainer group of trainer.procs actors
    ray = {"dataflow": {"runtime": "ray"}}
    with pytest.raises(ConfigurationError, match=r"Ray trainer group: set trainer\.procs"):
        validate_config({"trainer": {"strategy": "fsdp2"}, **ray})
    group = validate_config({"trainer": {"strategy": "fsdp2", "procs": 2, "resources": {"num_cpus": 1}}, **ray})
    assert group.trainer.procs == 2 and group.trainer.resources == {"num_cpus": 1.0}
    assert TrainerConfig().procs == 1 and TrainerConfig().resources == {}
    with pytest.raises(ConfigurationError, match="several ranks train sharded"):
        validate_config({"trainer": {"procs": 2}})
    with pytest.raises(ConfigurationError, match=r"trainer\.procs"):
        validate_config({"trainer": {"strategy": "fsdp2", "procs": 0}})
    with pytest.raises(ConfigurationError, match="negative amount of num_gpus"):
        validate_config({"trainer": {"strategy": "fsdp2", "procs": 2, "resources": {"num_gpus": -1}}, **ray})
    for where in ({"trainer": {"strategy": "fsdp2", "procs": 2, "resources": {"num_cpus": 1}}},  # embedded
                  {"trainer": {"resources": {"node2": 0.01}}, **ray}):  # not a group
        with pytest.raises(ConfigurationError, match="places the actors of a Ray trainer group"):
            validate_config(where)
    from agentgym.trainers.ray_group import actor_options

    assert actor_options({}) == {"num_cpus": 1.0}
    assert actor_options({"num_cpus": 2, "num_gpus": 1, "node2": 0.01}) == {
        "num_cpus": 2.0, "num_gpus": 1.0, "resources": {"node2": 0.01}}
    with pytest.raises(ConfigurationError, match=r"set trainer\.mixed_precision instead"):
        validate_config({**sft, "trainer": {"strategy": "fsdp2"}, "model": {"autocast": "bfloat16"}})
    with pytest.raises(ConfigurationError, match="cpu_offload"):
        validate_config({**sft, "trainer": {"strategy": "fsdp2", "cpu_offload": True}})


def test_one_rank_group_matches_one_process(tiny_model: str) -> None:
    """A group of one (no launcher) is the degenerate case: the FSDP2 path on one rank equals the plain one."""
    sys.path.insert(0, str(HERE))
    import fsdp_worker
    from agentgym.trainers.distributed import close_ranks, full_state, init_ranks

    case = CASES[0]
    single, _ = fsdp_worker.train_single(tiny_model, case)
    env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    try:
        ranks = init_ranks("cpu", timeout_s=60)
        assert (ranks.rank, ranks.world) == (0, 1)
        tr = fsdp_worker.build(tiny_model, case, ranks)
        for b in fsdp_worker.batches(case["seed"]):
            tr.train_on(ranks.share(b))
        sharded = fsdp_worker.trained(tr, full_state(tr.model))
    finally:
        close_ranks()
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert max(float((sharded[n] - single[n]).abs().max()) for n in single) < 1e-5
    assert torch.distributed.is_initialized() is False


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_tampered_sharded_checkpoint_runs_nothing(tmp_path: Path) -> None:
    """DCP's metadata is a pickle: it is read through an allowlist, so resuming a run folder executes nothing."""
    import pickle

    from agentgym.trainers.distributed import load_sharded, save_sharded

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    save_sharded(tmp_path / "ck", model, opt)
    again = torch.nn.Linear(4, 2)
    opt2 = torch.optim.AdamW(again.parameters())
    load_sharded(tmp_path / "ck", again, opt2)  # an honest one loads
    assert torch.equal(again.weight, model.weight)
    marker = tmp_path / "pwned"
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(ConfigurationError, match="nothing in it was run"):
        load_sharded(tmp_path / "ck", again, opt2)
    assert not marker.exists()


def test_samples_cross_ranks_as_plain_data() -> None:
    """What rank 0 of a sharded RL run broadcasts: JSON (no pickle), every field back exactly, non-finite
    floats included."""
    from agentgym.trainers.batching import TrainSample, decode_samples, encode_samples

    samples = [TrainSample("policy", [5, 6, 7, 8], [0, 1, 1, 0], advantage=-0.123456789012345,
                           logprobs=[0.0, -1e-310, float("-inf"), 0.1 + 0.2], versions=[-1, 3, 3, -1], reward=1.0,
                           group_id="g-1", weight=0.75),
               TrainSample("policy", [9, 10], [0, 1], advantage=float("nan"))]
    data = encode_samples(samples)
    assert json.loads(data)["samples"][0][0] == "policy"  # plain JSON
    back = decode_samples(data)
    assert [s.token_ids for s in back] == [s.token_ids for s in samples]
    assert back[0] == samples[0]  # exact floats, -inf included
    assert math.isnan(back[1].advantage) and back[1].logprobs is None and back[1].versions == []
    assert decode_samples(encode_samples([])) == [] and decode_samples(b"") == []
    with pytest.raises(ValueError, match="fields"):
        decode_samples(json.dumps({"fields": ["policy_id"], "samples": []}).encode())

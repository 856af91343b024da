"""``torchrun --nproc_per_node 2 -m agentgym train`` on the tiny model: SFT end to end, sharded.

Rank 0 writes the run folder (metrics, sharded checkpoints, a gathered ``final/`` that transformers loads);
the result equals a one-process run of the same config; the sharded checkpoint of step 2 resumes in one process
(2 ranks -> 1), and the one-process checkpoint of step 2 resumes on two ranks (1 -> 2), and both end where the
uninterrupted runs end.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torchrun_launch import torchrun_train

from agentgym.types import Trajectory

HERE = Path(__file__).resolve().parent
KEYS = ["owl", "elk", "yak", "emu"]
VALUES = ["red", "tan", "blue"]




def _transcripts(path: Path) -> Path:
    from agentgym.rollout.jsonl import write_jsonl

    trajs = []
    for k in KEYS:
        for v in VALUES:
            msgs: list[Any] = [{"role": "user", "content": f"key[{k}]"}, {"role": "assistant", "content": "lookup[]"},
                               {"role": "tool", "content": f"value[{v}]"},
                               {"role": "assistant", "content": f"answer[{v}]"}]
            trajs.append(Trajectory(f"{k}-{v}", "agentgym/TinyLookup-v0", messages=msgs, reward=1.0, success=True))
    write_jsonl(path, trajs)
    return path


def _config(tmp: Path, model: str, out: Path, strategy: str, finetune: str) -> Path:
    data = _transcripts(tmp / "demos.jsonl")
    cfg = f"""
[run]
algorithm = "sft"
out_dir = "{out}"
steps = 4
seed = 3
checkpoint_every = 2
keep_checkpoints = 3
[model]
path = "{model}"
finetune = "{finetune}"
lora_rank = 4
[optim]
lr = 3e-3
token_budget = 64
[data]
paths = ["{data}"]
batch_size = 5
[rollout]
env = "agentgym/TinyLookup-v0"
imports = ["tiny_lookup"]
max_tokens = 6
max_turns = 2
[eval]
split = "test"
tasks = 2
before = false
every = 2
after = true
[log]
plot = false
progress = false
[trainer]
strategy = "{strategy}"
"""
    path = tmp / f"{strategy}-{finetune}.toml"
    path.write_text(cfg)
    return path


def _torchrun(config: Path, *overrides: str, timeout_s: float = 300.0) -> str:
    return torchrun_train(config, *overrides, timeout_s=timeout_s)[0]


def _final_weights(folder: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder / "final"))
    return {n: p.detach().float() for n, p in model.named_parameters()}


def _one_process(config: Path, out: Path) -> dict[str, Any]:
    from agentgym.recipes import run_training
    from agentgym.trainers.config import load_train_config

    cfg = load_train_config(config, [f"run.out_dir={out}", "trainer.strategy=single"])
    return run_training(cfg)


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_torchrun_sft_matches_one_process_and_resumes_on_one(finetune: str, tiny_model: str, tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    config = _config(tmp_path, tiny_model, sharded, "fsdp2", finetune)
    out = _torchrun(config)
    assert "done" in out and out.count("done") == 1  # rank 0 reports
    # rank 0 wrote the run folder: metrics of every step, sharded checkpoints, result, a gathered final/
    lines = [json.loads(x) for x in (sharded / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in lines if "train" in json.dumps(r)][-1] >= 3
    ck = sharded / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["step-000002", "step-000004"]
    assert (ck / "step-000002" / "policy.dcp").is_dir()
    assert json.loads((ck / "step-000002" / "state.json").read_text())["world_size"] == 2
    result = json.loads((sharded / "result.json").read_text())
    assert result["steps"] == 4
    # rank 0 evaluated the gathered weights (at step 2 and after), as one process does
    assert result["after"]["episodes"] == 2 and result["after"]["version"] == 4
    assert (sharded / "eval" / "step-000002").is_dir() and (sharded / "eval" / "after").is_dir()
    if finetune == "lora":
        assert (sharded / "final" / "adapter").is_dir()
    got = _final_weights(sharded)

    # one process on the same config: the same weights
    ref = tmp_path / "single"
    single = _one_process(config, ref)
    assert single["after"]["episodes"] == result["after"]["episodes"]
    want = _final_weights(ref)
    assert set(got) == set(want)
    init = _final_weights_of_model(tiny_model)
    moved = max(float((want[n] - init[n]).abs().max()) for n in want)
    worst = max(float((got[n] - want[n]).abs().max()) for n in want)
    assert moved > 1e-3 and worst < 2e-3 * moved, (worst, moved)

    # 2 ranks -> 1: resume the sharded step-2 checkpoint in one process; it ends where both runs ended
    resumed = tmp_path / "resumed"
    shutil.copytree(sharded, resumed, ignore=shutil.ignore_patterns("final", "result.json", "step-000004", ".lock"))
    res = _one_process(config, resumed)
    assert res["steps"] == 4
    # it resumed (a fresh start would have dropped the sharded checkpoint) and went on in the one-process format
    assert (resumed / "checkpoints" / "step-000002" / "policy.dcp").is_dir()
    assert (resumed / "checkpoints" / "step-000004" / "policy.weights.safetensors").is_file()
    again = _final_weights(resumed)
    worst = max(float((again[n] - want[n]).abs().max()) for n in want)
    assert worst < 2e-3 * moved, (worst, moved)

    # 1 -> 2 ranks: the one-process run's step-2 checkpoint resumes sharded and ends there too
    grown = tmp_path / "grown"
    shutil.copytree(ref, grown, ignore=shutil.ignore_patterns("final", "result.json", "step-000004", ".lock"))
    _torchrun(config, f"run.out_dir={grown}")
    assert (grown / "checkpoints" / "step-000004" / "policy.dcp").is_dir()
    again = _final_weights(grown)
    worst = max(float((again[n] - want[n]).abs().max()) for n in want)
    assert worst < 2e-3 * moved, (worst, moved)


def _final_weights_of_model(path: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    return {n: p.detach().float() for n, p in model.named_parameters()}

"""Checkpoint and resume: N steps straight equal k steps, resume, N-k steps; Ctrl-C leaves a checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from agentgym.recipes import run_training
from agentgym.trainers.config import TrainConfig, validate_config

HERE = Path(__file__).resolve().parent


def _cfg(tiny_model: str, out: Path, steps: int, dynamic: bool = False, **run: Any) -> TrainConfig:
    import tiny_lookup  # noqa: F401  (registers the env)

    return validate_config({
        "run": {"out_dir": str(out), "steps": steps, "seed": 3, "checkpoint_every": 1, "threads": 1, **run},
        "model": {"path": tiny_model},
        "filter": {"dynamic_sampling": dynamic, "max_refill_rounds": 1},
        "rollout": {"env": "agentgym/TinyLookup-v0", "group_size": 4, "groups_per_step": 3, "max_tokens": 6,
                    "max_turns": 2, "sampling_seeds": True, "concurrency": 8},
        "loss": {"mini_batches": 2},  # exercises the saved mini-batch RNG
        "optim": {"lr": 3e-3},
        "eval": {"before": False, "after": False},
        "log": {"progress": False, "plot": False},
    })


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "final" / "model.safetensors"))


def _curve(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_resumed_run_continues_the_same_curve(tiny_sft_model: str, tmp_path: Path) -> None:
    tiny_model = tiny_sft_model  # it succeeds sometimes, so groups have signal
    straight, split = tmp_path / "straight", tmp_path / "split"
    run_training(_cfg(tiny_model, straight, 4))
    run_training(_cfg(tiny_model, split, 2))
    assert json.loads((split / "checkpoints" / "step-000002" / "state.json").read_text())["step"] == 2
    with open(split / "metrics.jsonl", "a") as fh:  # a step logged, then lost with a crash before its checkpoint
        fh.write(json.dumps({"step": 2, "lost": True}) + "\n" + '{"step": 3, "tor')
    first = json.loads((split / "checkpoints" / "step-000002" / "state.json").read_text())["result"]["train_wall_s"]
    t0 = time.monotonic()
    res = run_training(_cfg(tiny_model, split, 4))  # resumes at step 2
    second = time.monotonic() - t0
    assert res["steps"] == 4
    # the training wall-clock is the whole run's: the first sitting's (kept in its checkpoint) plus this one's
    assert first > 0
    assert first < res["train_wall_s"] <= first + second
    a, b = _curve(straight), _curve(split)
    assert [r["step"] for r in b] == [0, 1, 2, 3]  # each step once: the lost record and the torn line are gone
    assert not any(r.get("lost") for r in b)
    assert sum(r["train/optimizer_steps"] for r in a) >= 3
    for ra, rb in zip(a, b, strict=True):
        assert ra["rollout/reward_mean"] == pytest.approx(rb["rollout/reward_mean"], abs=1e-9)
        if ra.get("train/loss") is not None:
            assert ra["train/loss"] == pytest.approx(rb["train/loss"], rel=1e-3, abs=1e-5)
        assert ra["version"] == rb["version"]
    wa, wb = _weights(straight), _weights(split)
    assert wa.keys() == wb.keys()
    # the rollout model batches requests continuously, so its behaviour logprobs (and through truncated
    # importance sampling, the gradients) carry batch-composition rounding at the 1e-7 level
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-4), (k, float((wa[k] - wb[k]).abs().max()))
    # and training did something: the weights moved away from the initial model
    from safetensors.torch import load_file

    init = load_file(str(Path(tiny_model) / "model.safetensors"))
    assert any(not torch.allclose(init[k], wa[k]) for k in wa if k in init)


def test_fresh_run_discards_old_curve(tiny_model: str, tmp_path: Path) -> None:
    run_training(_cfg(tiny_model, tmp_path, 1))
    run_training(_cfg(tiny_model, tmp_path, 1, resume=False))
    assert [r["step"] for r in _curve(tmp_path)] == [0]


@pytest.mark.slow
def test_ctrl_c_leaves_a_resumable_checkpoint(tiny_model: str, tmp_path: Path) -> None:
    cfg = tmp_path / "tiny.toml"
    out = tmp_path / "run"
    cfg.write_text(f"""
[run]
out_dir = "{out}"
steps = 200
checkpoint_every = 1000
threads = 1
[model]
path = "{tiny_model}"
[rollout]
env = "agentgym/TinyLookup-v0"
imports = ["tiny_lookup"]
group_size = 4
groups_per_step = 2
max_tokens = 6
max_turns = 2
[eval]
before = false
after = false
[log]
progress = false
""")
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "agentgym", "train", "--config", str(cfg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "metrics.jsonl").is_file() and len((out / "metrics.jsonl").read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    ckpts = sorted((out / "checkpoints").glob("step-*"))
    assert ckpts, err  # checkpoint_every=1000, so this one was written by the interrupt
    done = json.loads((ckpts[-1] / "state.json").read_text())["step"]
    assert done == len((out / "metrics.jsonl").read_text().splitlines())
    res = subprocess.run([sys.executable, "-m", "agentgym", "train", "--config", str(cfg), "--set",
                          f"run.steps={done + 1}"], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(done + 1))
    # the flow's cumulative counters carry over the resume: they keep growing, not restart from zero
    for key in ("flow/groups_finished", "flow/generated_tokens"):
        assert rows[done][key] > rows[done - 1][key] > 0, (key, [r[key] for r in rows])


def test_a_batch_where_every_group_was_filtered(tiny_model: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # the untrained model never succeeds: every group has zero variance and dynamic sampling drops it
    res = run_training(_cfg(tiny_model, tmp_path, 2, dynamic=True))
    assert res["steps"] == 2
    rows = _curve(tmp_path)
    assert all(r["train/skipped"] == "all groups filtered" and r["version"] == 0 for r in rows)
    assert "every group was filtered" in capsys.readouterr().err


def test_time_budget_stops_the_run_then_evaluates(tiny_model: str, tmp_path: Path) -> None:
    cfg = _cfg(tiny_model, tmp_path, 1000, time_budget_s=0.01)
    cfg.eval.after = True
    cfg.eval.tasks = 2
    res = run_training(cfg)
    assert res["stopped_by_time_budget_at_step"] == res["steps"] == 1  # one step always runs
    assert res["after"]["episodes"] == 2
    assert (tmp_path / "final" / "model.safetensors").is_file()


def test_a_second_run_on_the_same_folder_is_refused(tiny_model: str, tmp_path: Path) -> None:
    from agentgym.recipes.rl import RLRecipe

    from agentgym.errors import ConfigurationError

    first = RLRecipe(_cfg(tiny_model, tmp_path, 1))
    first.folder.lock()  # as setup does first; held until cleanup
    try:
        (tmp_path / "curves.png").write_bytes(b"the first run's")
        with pytest.raises(ConfigurationError, match=rf"in use by another training run \(pid {os.getpid()}\)"):
            run_training(_cfg(tiny_model, tmp_path, 1, resume=False))
        assert (tmp_path / "curves.png").read_bytes() == b"the first run's"  # the refused run touched nothing
        ready_r, ready_w = os.pipe()
        pid = os.fork()  # a forked child (vLLM's engine core) must not keep the folder locked after cleanup
        if pid == 0:
            try:
                os.write(ready_w, b"1")  # the at-fork hooks have run by the time the child's code does
                time.sleep(30)
            finally:
                os._exit(0)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"1"  # wait for the child to start (on a busy machine it may lag)
        os.close(ready_r)
    finally:
        first.cleanup()
    try:
        assert run_training(_cfg(tiny_model, tmp_path, 1))["steps"] == 1  # released: the folder is usable again
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

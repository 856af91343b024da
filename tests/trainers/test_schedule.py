"""The learning-rate schedule spans the run's true number of optimizer steps, for every shipped config.

A run hands each trainer ``policy_batches`` batches (``train_on`` calls); a batch is ``steps_per_batch``
optimizer steps (RL: ``loss.epochs x loss.mini_batches``; SFT: 1). The schedule must warm up as configured
and then reach its end exactly where the run's last optimizer step ends, with every learning rate the
optimizer really used along the way recorded here (a hook on ``optimizer.step``).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from agentgym.recipes import run_training
from agentgym.trainers.batching import TrainSample
from agentgym.trainers.config import TrainConfig, load_train_config, validate_config
from agentgym.trainers.model import load_causal_lm
from agentgym.trainers.run import policy_batches, policy_paths, sft_steps, trained_at
from agentgym.trainers.trainer import PolicyTrainer, lr_factor

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "train").rglob("*.toml"))
SFT_SAMPLES = 37  # the transcripts live in runs/ (not shipped): any count not a multiple of the batch size


def _samples(tok: Any, n: int) -> list[TrainSample]:
    head = tok("<|im_start|>user\nkey[owl]<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    out = []
    for i in range(n):
        body = tok(f"answer[{['red', 'tan'][i % 2]}]<|im_end|>", add_special_tokens=False)["input_ids"]
        out.append(TrainSample("policy", head + body, [0] * len(head) + [1] * len(body), 1.0 if i % 2 else -1.0))
    return out


def _record_lrs(tr: PolicyTrainer) -> list[float]:
    used: list[float] = []
    tr.optimizer.register_step_pre_hook(lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    return used


def _plan(cfg: TrainConfig) -> tuple[int, list[str], dict[str, int]]:
    """Recipe steps, policies and batches per policy, computed as the recipes do (recipes/sft.py, rl.py)."""
    pids = list(policy_paths(cfg.model, cfg.multi))
    if cfg.run.algorithm == "sft":
        steps = sft_steps(cfg.run, cfg.data, SFT_SAMPLES)
        return steps, pids, {pids[0]: steps}
    return cfg.run.steps, pids, policy_batches(cfg.run.steps, pids, cfg.multi.schedule)


def _run_schedule(cfg: TrainConfig, tiny_model: str, tok: Any, empty_every: int = 0) -> list[tuple[PolicyTrainer, list[float], list[int]]]:
    """Drive one trainer per policy through the whole run as the recipe does (same batch counts, same
    policies per step); every ``empty_every``-th batch comes back with nothing to train (all filtered)."""
    steps, pids, batches = _plan(cfg)
    out = []
    for pid, n in batches.items():
        torch.manual_seed(0)
        tr = PolicyTrainer("policy", load_causal_lm(tiny_model), algorithm=cfg.run.algorithm, optim=cfg.optim,
                           loss=cfg.loss, batches=n)
        used = _record_lrs(tr)
        per = cfg.loss.mini_batches if cfg.run.algorithm == "grpo" else 1
        samples = _samples(tok, max(2, per))
        slots: list[int] = []  # schedule positions of the steps taken
        k = 0
        for step in range(steps):
            if pid not in trained_at(pids, cfg.multi.schedule, step):
                continue
            empty = empty_every and k % empty_every == empty_every - 1
            if not empty:
                slots += [tr.schedule_pos + i for i in range(tr.steps_per_batch)]
            tr.train_on([] if empty else samples)
            k += 1
        assert k == n
        out.append((tr, used, slots))
    return out


def _check(cfg: TrainConfig, tr: PolicyTrainer, used: list[float], slots: list[int]) -> None:
    o = cfg.optim
    horizon = tr.horizon
    assert len(used) == len(slots) and tr.steps == len(slots)  # every planned step was taken (or knowingly skipped)
    assert tr.schedule_pos == horizon  # the schedule ends exactly where the run's last optimizer step does
    factors = [lr / o.lr for lr in used] if o.lr else [lr_factor(p, warmup_steps=o.warmup_steps, schedule=o.schedule,
                                                                 horizon=horizon) for p in slots]
    for f, pos in zip(factors, slots, strict=True):
        if pos < o.warmup_steps:
            assert f == pytest.approx((pos + 1) / o.warmup_steps)  # the warmup, as configured
        elif o.schedule == "constant":
            assert f == pytest.approx(1.0)
        else:
            assert f == pytest.approx(0.5 * (1 + math.cos(math.pi * (pos - o.warmup_steps) / (horizon - o.warmup_steps))))
            assert f > 0  # never a step at learning rate 0 ...
    if o.schedule == "cosine":
        # ... and the decay reaches its end right after the last step, not before
        assert lr_factor(horizon, warmup_steps=o.warmup_steps, schedule="cosine", horizon=horizon) == pytest.approx(0.0)
        decay = [f for f, p in zip(factors, slots, strict=True) if p >= o.warmup_steps]
        assert all(a > b for a, b in itertools.pairwise(decay))


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    """Hundreds of tiny steps: on a loaded 2-core machine two torch threads spin against each other."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _shipped(path: Path, overrides: list[str]) -> TrainConfig:
    return load_train_config(path, overrides)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "configs" / "train")))
def test_schedule_spans_every_shipped_run(path: Path, tiny_model: str, tiny_tokenizer: Any) -> None:
    cfg = _shipped(path, [])
    steps, _, _ = _plan(cfg)
    if cfg.run.algorithm == "sft" and cfg.run.steps == 0:
        assert steps == math.ceil(SFT_SAMPLES / cfg.data.batch_size) * cfg.data.epochs
    for tr, used, slots in _run_schedule(cfg, tiny_model, tiny_tokenizer):
        per = cfg.loss.epochs * cfg.loss.mini_batches if cfg.run.algorithm == "grpo" else 1
        assert tr.horizon == len(slots) == tr.batches * per
        _check(cfg, tr, used, slots)


# no shipped RL config uses more than one epoch or mini-batch, and only one uses cosine: these cover the rest
VARIANTS = {
    "search-grpo.toml": ["run.steps=5", "loss.epochs=2", "loss.mini_batches=3", "optim.schedule=cosine",
                         "optim.warmup_steps=3"],
    "solver-verifier-lora.toml": ["run.steps=5", "multi.schedule=alternating", "loss.mini_batches=2",
                                  "optim.schedule=cosine", "optim.warmup_steps=1"],
    "alfworld-sft.toml": ["loss.epochs=3", "loss.mini_batches=2"],  # SFT: one optimizer step per batch regardless
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_schedule_spans_epochs_mini_batches_and_alternation(name: str, tiny_model: str, tiny_tokenizer: Any) -> None:
    cfg = _shipped(ROOT / "configs" / "train" / name, VARIANTS[name])
    runs = _run_schedule(cfg, tiny_model, tiny_tokenizer)
    for tr, used, slots in runs:
        per = cfg.loss.epochs * cfg.loss.mini_batches if cfg.run.algorithm == "grpo" else 1
        assert tr.horizon == len(slots) == tr.batches * per
        _check(cfg, tr, used, slots)
    if cfg.multi.schedule == "alternating":
        assert [tr.batches for tr, _, _ in runs] == [3, 2]


@pytest.mark.parametrize("name", ["alfworld-sft.toml", "strategies/dapo.toml"])
def test_steps_without_an_update_spend_their_share(name: str, tiny_model: str, tiny_tokenizer: Any) -> None:
    """Every third batch has every group filtered: no optimizer step, but the schedule still ends with the run."""
    cfg = _shipped(ROOT / "configs" / "train" / name, ["optim.schedule=cosine", "optim.warmup_steps=2"])
    for tr, used, slots in _run_schedule(cfg, tiny_model, tiny_tokenizer, empty_every=3):
        assert len(slots) < tr.horizon
        _check(cfg, tr, used, slots)


def test_cosine_needs_the_run_length(tiny_model: str) -> None:
    from agentgym.trainers.config import OptimConfig

    from agentgym.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="batches"):
        PolicyTrainer("policy", load_causal_lm(tiny_model), optim=OptimConfig(schedule="cosine"))


def test_alternating_policies_split_the_steps() -> None:
    cfg = validate_config({"run": {"steps": 5}, "model": {"finetune": "lora"},
                           "multi": {"workflow": "solver_verifier", "schedule": "alternating"}})
    assert _plan(cfg)[2] == {"solver": 3, "verifier": 2}
    assert [trained_at(["solver", "verifier"], "alternating", s) for s in range(3)] == [["solver"], ["verifier"], ["solver"]]
    assert trained_at(["solver", "verifier"], "concurrent", 1) == ["solver", "verifier"]


def _lrs(out: Path) -> list[tuple[int, float, int]]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["train/lr"], r["train/optimizer_steps"]) for r in rows if "train/lr" in r]


def test_sft_run_over_epochs_decays_to_its_last_step(tiny_model: str, tmp_path: Path) -> None:
    """``run.steps = 0`` (SFT over ``data.epochs``): the cosine schedule spans every batch of every epoch.
    Before the fix the horizon was 1, so every step after the warmup trained at learning rate 0."""
    from tiny_lookup import protocol_demos

    demos = protocol_demos(tmp_path / "demos.jsonl")
    cfg = validate_config({
        "run": {"algorithm": "sft", "out_dir": str(tmp_path / "run"), "steps": 0, "seed": 0, "threads": 1},
        "model": {"path": tiny_model},
        "data": {"paths": [str(demos)], "batch_size": 16, "epochs": 2},
        "optim": {"lr": 1e-3, "schedule": "cosine", "warmup_steps": 2},
        "rollout": {"env": "agentgym/TinyLookup-v0"},
        "eval": {"before": False, "after": False},
        "log": {"progress": False, "plot": False},
    })
    res = run_training(cfg)
    rows = _lrs(tmp_path / "run")
    assert res["lr_schedule"]["policy"]["horizon"] == res["lr_schedule"]["policy"]["spent"] == len(rows)
    n = len(rows)
    assert n >= 6 and [s for s, _, _ in rows] == list(range(n))
    lrs = [lr for _, lr, _ in rows]
    assert lrs[:3] == pytest.approx([5e-4, 1e-3, 1e-3])  # warmup, then the decay starts from the full rate
    assert all(a > b > 0 for a, b in itertools.pairwise(lrs[2:]))  # decaying, never 0
    assert lrs[-1] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * (n - 3) / (n - 2))))


def test_rl_run_spans_epochs_times_mini_batches(tiny_sft_model: str, tmp_path: Path) -> None:
    """An RL step is ``loss.epochs x loss.mini_batches`` optimizer steps: a 3-step run is 12 of them."""
    import tiny_lookup  # noqa: F401

    cfg = validate_config({
        "run": {"out_dir": str(tmp_path), "steps": 3, "seed": 0, "threads": 1},
        "model": {"path": tiny_sft_model},
        "filter": {"dynamic_sampling": False},
        "rollout": {"env": "agentgym/TinyLookup-v0", "group_size": 4, "groups_per_step": 3, "max_tokens": 6,
                    "max_turns": 2, "sampling_seeds": True},
        "loss": {"epochs": 2, "mini_batches": 2},
        "optim": {"lr": 1e-3, "schedule": "cosine"},
        "eval": {"before": False, "after": False},
        "log": {"progress": False, "plot": False},
    })
    res = run_training(cfg)
    assert res["lr_schedule"]["policy"]["horizon"] == res["lr_schedule"]["policy"]["spent"] == 12
    rows = _lrs(tmp_path)
    assert [s for s, _, _ in rows] == [0, 1, 2]
    taken = [(s, lr) for s, lr, k in rows if k == 4]  # a step whose groups all tied takes none (rare here)
    assert len(taken) >= 2 and res["lr_schedule"]["policy"]["optimizer_steps"] == 4 * len(taken)
    # the last optimizer step of step s is schedule position 4 s + 3 of 12
    for s, lr in taken:
        assert lr == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * (4 * s + 3) / 12)))
        assert lr > 0

"""The RL recipe's event loop: an update never blocks it (heartbeats and rollouts run on it)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from agentgym.recipes import run_training
from agentgym.trainers.config import validate_config
from agentgym.trainers.trainer import PolicyTrainer


def test_rl_updates_run_off_the_event_loop(tiny_sft_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each update runs in a worker thread, so the loop that hears the rollout services' heartbeats is free while
    it trains. (Run on the loop, a 653 s update got the only service declared dead, and the run waited forever.)"""
    import tiny_lookup  # noqa: F401

    on_loop: list[bool] = []
    train_on = PolicyTrainer.train_on

    def spy(self: PolicyTrainer, samples: Any, **kw: Any) -> dict[str, Any]:
        if samples:  # an empty batch (every group filtered) only spends its share of the schedule
            on_loop.append(threading.current_thread() is threading.main_thread())  # asyncio.run's thread
        return train_on(self, samples, **kw)

    monkeypatch.setattr(PolicyTrainer, "train_on", spy)
    cfg = validate_config({
        "run": {"out_dir": str(tmp_path), "steps": 2, "seed": 0, "threads": 1},
        "model": {"path": tiny_sft_model},
        "filter": {"dynamic_sampling": False},
        "rollout": {"env": "agentgym/TinyLookup-v0", "group_size": 4, "groups_per_step": 3, "max_tokens": 6,
                    "max_turns": 2, "sampling_seeds": True},
        "optim": {"lr": 1e-3},
        "eval": {"before": False, "after": False},
        "log": {"progress": False, "plot": False},
    })
    res = run_training(cfg)
    assert res["steps"] == 2
    assert on_loop and not any(on_loop), on_loop

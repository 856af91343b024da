"""Checkpoints are data, never code: a planted pickle in a run folder is refused, not run (issue 23, item 7).

``run.resume`` is on by default, so whatever sits in ``OUT/checkpoints/`` is read at the next start. The
payloads below would write a marker file if anything unpickled them with ``weights_only=False``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from agentgym.trainers.batching import TrainSample
from agentgym.trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentgym.trainers.config import OptimConfig, validate_config
from agentgym.trainers.model import load_causal_lm
from agentgym.trainers.trainer import PolicyTrainer

from agentgym.errors import ConfigurationError


class _Payload:
    """Unpickling this runs ``exec``: it writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"import pathlib; pathlib.Path({str(self.marker)!r}).write_text('pwned')",))


def _samples(tok: Any) -> list[TrainSample]:
    head = tok("<|im_start|>user\nkey[owl]<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    body = tok("answer[red]<|im_end|>", add_special_tokens=False)["input_ids"]
    return [TrainSample("policy", head + body, [0] * len(head) + [1] * len(body), 1.0)]


def _checkpoint(tiny_model: str, tok: Any, out: Path) -> tuple[Path, PolicyTrainer]:
    tr = PolicyTrainer("policy", load_causal_lm(tiny_model), optim=OptimConfig(lr=1e-2))
    tr.train_on(_samples(tok))
    save_checkpoint(out, 1, {"policy": tr}, {"version": 1})
    ck = latest_checkpoint(out)
    assert ck is not None
    return ck, tr


def test_the_payload_really_runs_when_unpickled(tmp_path: Path) -> None:
    """The attack is real: loading the same file the old way (``weights_only=False``) writes the marker."""
    marker = tmp_path / "pwned"
    torch.save({"python": _Payload(marker)}, tmp_path / "rng.pt")
    torch.load(tmp_path / "rng.pt", weights_only=False)
    assert marker.read_text() == "pwned"


@pytest.mark.parametrize("planted", ["rng.pt", "policy.trainer.pt"])
def test_a_planted_pickle_is_refused_not_run(planted: str, tiny_model: str, tiny_tokenizer: Any, tmp_path: Path) -> None:
    ck, _ = _checkpoint(tiny_model, tiny_tokenizer, tmp_path)
    marker = tmp_path / "pwned"
    torch.save({"python": _Payload(marker), "optimizer": _Payload(marker)}, ck / planted)
    fresh = PolicyTrainer("policy", load_causal_lm(tiny_model), optim=OptimConfig(lr=1e-2))
    try:
        with pytest.raises(ConfigurationError, match=rf"refusing to load .*{planted}.*nothing in it was run"):
            load_checkpoint(ck, {"policy": fresh})
    finally:
        assert not marker.exists(), "the planted payload ran"


def test_resume_refuses_a_planted_checkpoint(tiny_model: str, tmp_path: Path) -> None:
    """The default path: ``agentgym train`` rerun on a folder whose newest checkpoint was tampered with."""
    from agentgym.recipes import run_training
    from tiny_lookup import protocol_demos

    demos = protocol_demos(tmp_path / "demos.jsonl")

    def cfg(steps: int) -> Any:
        return validate_config({
            "run": {"algorithm": "sft", "out_dir": str(tmp_path / "run"), "steps": steps, "checkpoint_every": 1,
                    "threads": 1},
            "model": {"path": tiny_model}, "data": {"paths": [str(demos)], "batch_size": 8},
            "rollout": {"env": "agentgym/TinyLookup-v0"}, "eval": {"before": False, "after": False},
            "log": {"progress": False, "plot": False}})

    run_training(cfg(1))
    ck = latest_checkpoint(tmp_path / "run")
    assert ck is not None
    marker = tmp_path / "pwned"
    torch.save({"python": _Payload(marker)}, ck / "rng.pt")
    with pytest.raises(ConfigurationError, match="refusing to load"):
        run_training(cfg(2))
    assert not marker.exists()


def test_rng_and_trainer_state_round_trip_as_plain_data(tiny_model: str, tiny_tokenizer: Any, tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.normal()  # a cached Gaussian is part of NumPy's state
    ck, tr = _checkpoint(tiny_model, tiny_tokenizer, tmp_path)
    draws = (random.random(), np.random.normal(), np.random.randint(1 << 30), torch.rand(3), tr.rng.random())
    for name in ("rng.pt", "policy.trainer.pt"):  # loadable without unpickling anything but plain data
        assert isinstance(torch.load(ck / name, weights_only=True), dict)
    fresh = PolicyTrainer("policy", load_causal_lm(tiny_model), optim=OptimConfig(lr=1e-2))
    load_checkpoint(ck, {"policy": fresh})
    again = (random.random(), np.random.normal(), np.random.randint(1 << 30), torch.rand(3), fresh.rng.random())
    assert draws[:3] == again[:3] and torch.equal(draws[3], again[3]) and draws[4] == again[4]
    assert fresh.steps == tr.steps == 1 and fresh.schedule_pos == tr.schedule_pos
    assert fresh.optimizer.state_dict()["state"].keys() == tr.optimizer.state_dict()["state"].keys()

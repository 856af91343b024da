"""Checkpoints: everything a run needs to continue the same curve.

``OUT/checkpoints/step-000040/``:

* ``<policy>.weights.safetensors``: the parameters each trainer optimizes (the whole model for a
  full fine-tune, the adapter for LoRA);
* ``<policy>.trainer.pt``: optimizer, LR schedule, step and skip counters, mini-batch RNG;
* ``state.json``: step, weight version, data position, config fingerprint;
* ``rng.pt``: Python, NumPy and torch RNG states.

A checkpoint is written to a temporary folder and renamed into place, so a crash mid-write leaves
the previous checkpoint intact; older ones beyond ``keep`` are deleted.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.errors import ConfigurationError

from .trainer import PolicyTrainer

__all__ = ["latest_checkpoint", "load_checkpoint", "save_checkpoint"]

_PREFIX = "step-"


def _safe(pid: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in pid)


def save_checkpoint(out_dir: str | Path, step: int, trainers: dict[str, PolicyTrainer], state: dict[str, Any],
                    keep: int = 2) -> Path:
    """Write a checkpoint for ``step`` (atomically) and prune old ones. Returns its folder."""
    from safetensors.torch import save_file

    root = Path(out_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        for pid, tr in trainers.items():
            w = {k: v.detach().cpu().contiguous() for k, v in tr.weights().items()}
            save_file(w, str(tmp / f"{_safe(pid)}.weights.safetensors"))
            torch.save(tr.state_dict(), tmp / f"{_safe(pid)}.trainer.pt")
        torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
                   tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=2, default=str))
        final = root / f"{_PREFIX}{step:06d}"
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    done = sorted(p for p in root.iterdir() if p.name.startswith(_PREFIX) and p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under ``out_dir/checkpoints`` (``None`` if there is none)."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if p.name.startswith(_PREFIX) and (p / "state.json").is_file())
    return done[-1] if done else None


def load_checkpoint(path: str | Path, trainers: dict[str, PolicyTrainer], restore_rng: bool = True) -> dict[str, Any]:
    """Restore the trainers (weights, optimizer, counters) and RNGs; returns the saved state dict."""
    from safetensors.torch import load_file

    p = Path(path)
    if not (p / "state.json").is_file():
        raise ConfigurationError(f"{p} is not a checkpoint (no state.json)")
    for pid, tr in trainers.items():
        wf = p / f"{_safe(pid)}.weights.safetensors"
        if not wf.is_file():
            raise ConfigurationError(f"checkpoint {p} has no weights for policy {pid!r}")
        tr.load_weights(load_file(str(wf)))
        tr.load_state_dict(torch.load(p / f"{_safe(pid)}.trainer.pt", weights_only=False))
    if restore_rng:
        rng = torch.load(p / "rng.pt", weights_only=False)
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
    return dict(json.loads((p / "state.json").read_text()))

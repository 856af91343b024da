"""Checkpoints: everything a run needs to continue the same curve.

``OUT/checkpoints/step-000040/``:

* ``<policy>.weights.safetensors``: the parameters each trainer optimizes (the whole model for a
  full fine-tune, the adapter for LoRA);
* ``<policy>.trainer.pt``: optimizer, LR schedule position, step and skip counters, mini-batch RNG;
* ``state.json``: step, weight version, data position, config fingerprint;
* ``rng.pt``: Python, NumPy and torch RNG states.

**Nothing in a checkpoint is executed.** Resuming is on by default, so a run folder is input: the
``.pt`` files hold only tensors, numbers, strings, lists, tuples and dicts (the NumPy RNG state is
stored as a tensor, not a pickled array) and are read with ``torch.load(weights_only=True)``, which
refuses anything else; the weights are safetensors and the rest is JSON. A file that holds other
objects (tampered with, or written by an older AgentGym that pickled NumPy state) raises
:class:`~agentgym.errors.ConfigurationError` without running any of it.

A checkpoint is written to a temporary folder and renamed into place, so a crash mid-write leaves
the previous checkpoint intact; older ones beyond ``keep`` are deleted.

**Sharded runs** (``trainer.strategy = "fsdp2"``, ``ranks`` given) write ``<policy>.dcp/`` instead of the
weights file: model and optimizer state through ``torch.distributed.checkpoint``, each rank its own shards,
under the unsharded parameter names (:func:`~agentgym.trainers.distributed.save_sharded`); ``<policy>.trainer.pt``
then holds the trainer's counters only, and rank 0 writes the rest. Such a checkpoint resumes on any world size,
one process included (its metadata is read through an allowlist, so nothing in it is executed either). The
ranks share one file system (one machine under ``torchrun``).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.errors import ConfigurationError

from .distributed import Ranks, load_full, load_sharded, save_sharded
from .trainer import PolicyTrainer

__all__ = ["latest_checkpoint", "load_checkpoint", "save_checkpoint"]

_PREFIX = "step-"


def _safe(pid: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in pid)


def save_checkpoint(out_dir: str | Path, step: int, trainers: dict[str, PolicyTrainer], state: dict[str, Any],
                    keep: int = 2, ranks: Ranks | None = None) -> Path:
    """Write a checkpoint for ``step`` (atomically) and prune old ones. Returns its folder. With ``ranks``
    (sharded training) every rank calls it and writes its shards."""
    from safetensors.torch import save_file

    if ranks is not None:
        return _save_sharded_checkpoint(Path(out_dir), step, trainers, state, keep, ranks)

    root = Path(out_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        for pid, tr in trainers.items():
            w = {k: v.detach().cpu().contiguous() for k, v in tr.weights().items()}
            save_file(w, str(tmp / f"{_safe(pid)}.weights.safetensors"))
            torch.save(tr.state_dict(), tmp / f"{_safe(pid)}.trainer.pt")
        torch.save(_rng_state(), tmp / "rng.pt")
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


def _save_sharded_checkpoint(out_dir: Path, step: int, trainers: dict[str, PolicyTrainer], state: dict[str, Any],
                             keep: int, ranks: Ranks) -> Path:
    root = out_dir / "checkpoints"
    tmp = root / f".tmp-{_PREFIX}{step:06d}"  # one name every rank knows
    final = root / f"{_PREFIX}{step:06d}"
    if ranks.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    ranks.barrier()
    try:
        for pid, tr in trainers.items():
            save_sharded(tmp / f"{_safe(pid)}.dcp", tr.model, tr.optimizer)
        if ranks.is_main:
            for pid, tr in trainers.items():
                torch.save(tr.counters(), tmp / f"{_safe(pid)}.trainer.pt")
            torch.save(_rng_state(), tmp / "rng.pt")
            (tmp / "state.json").write_text(json.dumps({**state, "step": step, "world_size": ranks.world}, indent=2,
                                                       default=str))
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            done = sorted(p for p in root.iterdir() if p.name.startswith(_PREFIX) and p.is_dir())
            for old in done[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if ranks.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    ranks.barrier()
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
        if (p / f"{_safe(pid)}.dcp").is_dir():  # sharded: any world size reads it
            load_sharded(p / f"{_safe(pid)}.dcp", tr.model, tr.optimizer)
            tf = p / f"{_safe(pid)}.trainer.pt"
            try:
                tr.load_counters(_load_data(tf))
            except (KeyError, TypeError, ValueError) as e:
                raise ConfigurationError(f"{tf} is not a trainer state this version can resume ({type(e).__name__}: "
                                         f"{e}); start afresh with run.resume = false") from None
            continue
        wf = p / f"{_safe(pid)}.weights.safetensors"
        if not wf.is_file():
            raise ConfigurationError(f"checkpoint {p} has no weights for policy {pid!r}")
        if tr.ranks is None:
            tr.load_weights(load_file(str(wf)))
        tf = p / f"{_safe(pid)}.trainer.pt"
        state = _load_data(tf)
        try:
            if tr.ranks is None:
                tr.load_state_dict(state)
            else:  # a one-process checkpoint into shards (1 -> N ranks)
                load_full(tr.model, tr.optimizer, [n for n, _ in tr.params], load_file(str(wf)), state["optimizer"])
                tr.load_counters(state)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigurationError(f"{tf} is not a trainer state this version can resume ({type(e).__name__}: {e}); "
                                     "start afresh with run.resume = false") from None
    if restore_rng:
        _set_rng_state(_load_data(p / "rng.pt"), p / "rng.pt")
    return dict(json.loads((p / "state.json").read_text()))


def _load_data(path: Path) -> dict[str, Any]:
    """A ``.pt`` file of plain data, unpickled with ``weights_only=True``: nothing in it can run code."""
    if not path.is_file():
        raise ConfigurationError(f"checkpoint file {path} is missing")
    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        raise ConfigurationError(
            f"refusing to load {path}: it holds something other than tensors and plain data (a tampered file, "
            f"or a checkpoint of an older AgentGym); nothing in it was run. Delete the checkpoint or set "
            f"run.resume = false ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"{path} does not hold a dict of state")
    return data


def _rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states as plain data (the NumPy key as a tensor, not a pickled array)."""
    kind, key, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "numpy": {"kind": str(kind), "key": torch.from_numpy(np.asarray(key, dtype=np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}


def _set_rng_state(rng: dict[str, Any], path: Path) -> None:
    try:
        n = rng["numpy"]
        key = n["key"].numpy().astype(np.uint32)
        np_state = (n["kind"], key, int(n["pos"]), int(n["has_gauss"]), float(n["cached_gaussian"]))
        py = rng["python"]
        torch_state = rng["torch"]
        if not isinstance(torch_state, torch.Tensor):
            raise TypeError("torch state is not a tensor")
        random.setstate(py)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
        raise ConfigurationError(f"{path} is not an RNG state this version can restore ({type(e).__name__}: {e}); "
                                 "start afresh with run.resume = false") from None

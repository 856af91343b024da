"""Run-level pieces the recipes share: the run folder, seeding, how long a run is, the final model.

* :class:`RunFolder`: one run per folder (an ``flock`` on ``OUT/.lock`` that forked children do not
  inherit), a fresh start that drops an old run's curve, ``config.json``, ``final/``.
* :func:`seed_everything`: Python, NumPy and torch RNGs, and torch's thread count.
* :func:`sft_steps`, :func:`trained_at`, :func:`policy_batches`: the run's length in recipe steps, which
  policies a step trains, and the ``train_on`` calls each trainer gets (its learning-rate schedule's
  horizon, see :class:`~agentgym.trainers.trainer.PolicyTrainer`).
* :class:`StopControl`: Ctrl-C finishes the step and checkpoints; ``run.time_budget_s``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import random
import shutil
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch

from agentgym.errors import ConfigurationError

from .config import DataConfig, ModelConfig, MultiConfig, RunConfig

__all__ = ["RunFolder", "StopControl", "import_modules", "policy_batches", "policy_paths", "seed_everything",
           "sft_steps", "trained_at"]

# Run-folder locks this process holds. A forked child (vLLM's engine core, a multiprocessing worker) must not
# keep a copy: an flock lives as long as any descriptor of it, and the folder would stay locked after cleanup.
_LOCK_FDS: set[int] = set()
_AT_FORK_REGISTERED = False


def _close_lock_fds_in_child() -> None:
    for fd in list(_LOCK_FDS):
        with contextlib.suppress(OSError):
            os.close(fd)
    _LOCK_FDS.clear()


class RunFolder:
    """``run.out_dir``: locked for one run at a time; what a run writes there."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def locked(self) -> bool:
        return self._fd is not None

    def lock(self) -> RunFolder:
        """Take the folder: a second ``agentgym train`` on it (a leftover process, a second terminal) would
        interleave metrics and overwrite checkpoints. The kernel drops the lock however the holder ends;
        forked children close their copy (registered here, when a run first takes a lock, not at import)."""
        import fcntl

        global _AT_FORK_REGISTERED
        if not _AT_FORK_REGISTERED:
            os.register_at_fork(after_in_child=_close_lock_fds_in_child)
            _AT_FORK_REGISTERED = True
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigurationError(f"run folder {self.path} is in use by another training run (pid {holder}); "
                                     "wait for it or stop it, or set run.out_dir to another folder") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        _LOCK_FDS.add(fd)
        return self

    def release(self) -> None:
        if self._fd is not None:
            _LOCK_FDS.discard(self._fd)
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def fresh_start(self) -> None:
        """A run that does not resume starts a new curve: drop the old run's metrics, evals and checkpoints."""
        for name in ("metrics.jsonl", "result.json", "curves.png", "groups.jsonl"):
            (self.path / name).unlink(missing_ok=True)
        for name in ("eval", "checkpoints", "tensorboard"):
            shutil.rmtree(self.path / name, ignore_errors=True)

    def write_config(self, config: Any) -> None:
        (self.path / "config.json").write_text(json.dumps(config.model_dump(mode="json"), indent=2))

    def write_result(self, result: Mapping[str, Any]) -> None:
        (self.path / "result.json").write_text(json.dumps(result, indent=2, default=str))

    def save_final(self, trainers: Mapping[str, Any], tokenizer: Any, *, shared_base: bool = False) -> Path:
        """``final/``: a model folder the next stage loads (``model.path = "OUT/final"``); one subfolder per
        policy when there are several; LoRA runs also keep ``adapter/``. A shared base keeps only adapters."""
        final = self.path / "final"
        for pid, tr in trainers.items():
            target = final if len(trainers) == 1 else final / pid
            target.mkdir(parents=True, exist_ok=True)
            model = tr.model
            if tr.adapter is not None:
                model.save_pretrained(str(target / "adapter"), selected_adapters=[tr.adapter])
                if len(trainers) > 1 and shared_base:
                    continue
                model = model.merge_and_unload()
                tr.model = model
            model.save_pretrained(str(target))
            tokenizer.save_pretrained(str(target))
        return final


def seed_everything(run: RunConfig) -> None:
    """Seed Python, NumPy and torch from ``run.seed``; set torch's threads (``run.threads``)."""
    if run.threads:
        torch.set_num_threads(run.threads)
    random.seed(run.seed)
    np.random.seed(run.seed % (2**32))
    torch.manual_seed(run.seed)


def import_modules(modules: Sequence[str]) -> None:
    """``rollout.imports``: modules that register custom envs."""
    for mod in modules:
        try:
            importlib.import_module(mod)
        except ImportError as e:
            raise ConfigurationError(f"rollout.imports: cannot import {mod!r}: {e}") from e


def policy_paths(model: ModelConfig, multi: MultiConfig) -> dict[str, str]:
    """policy id -> model folder, for the trained policies of a run."""
    if multi.workflow == "solver_verifier":
        return {"solver": model.path, "verifier": multi.verifier_path or model.path}
    return {"policy": model.path}


def sft_steps(run: RunConfig, data: DataConfig, samples: int) -> int:
    """Recipe steps of an SFT run: ``run.steps``, or with ``run.steps = 0``, ``data.epochs`` passes over
    ``samples`` in batches of ``data.batch_size``."""
    return run.steps or math.ceil(samples / data.batch_size) * data.epochs


def trained_at(policies: Sequence[str], schedule: str, step: int) -> list[str]:
    """The policies recipe step ``step`` trains: all, or with an alternating schedule policy ``step mod n``."""
    if len(policies) > 1 and schedule in ("alternating", "alternating_kept"):
        return [policies[step % len(policies)]]
    return list(policies)


def policy_batches(steps: int, policies: Sequence[str], schedule: str = "concurrent") -> dict[str, int]:
    """``{policy: batches}``: the ``train_on`` calls each trainer gets over ``steps`` recipe steps (its
    learning-rate schedule spans ``batches x steps_per_batch`` optimizer steps)."""
    out = dict.fromkeys(policies, 0)
    for step in range(steps):
        for pid in trained_at(policies, schedule, step):
            out[pid] += 1
    return out


class StopControl:
    """When a run stops early: Ctrl-C (finish the step, checkpoint; a second Ctrl-C aborts) or
    ``run.time_budget_s`` spent."""

    def __init__(self, budget_s: float | None, note: Any = None) -> None:
        self.budget_s = budget_s
        self.note = note
        self.requested = False
        self.t0 = time.monotonic()
        self.prior_s = 0.0

    def start(self, prior_s: float = 0.0) -> None:
        """The budget counts from here (the start of the training loop, not of setup); ``prior_s`` is the training
        wall-clock of the sittings before a resume (the checkpoint's ``train_wall_s``)."""
        self.t0 = time.monotonic()
        self.prior_s = prior_s

    def wall_s(self) -> float:
        """Training wall-clock over every sitting so far: what a checkpoint records, so a resumed run's
        ``train_wall_s`` is the whole run's, not its last piece's."""
        return self.prior_s + (time.monotonic() - self.t0)

    def over_budget(self) -> bool:
        return self.budget_s is not None and time.monotonic() - self.t0 > self.budget_s

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.note is not None:
            self.note("interrupt: finishing this step, then writing a checkpoint (Ctrl-C again to abort)")

    @contextlib.contextmanager
    def handling_sigint(self) -> Iterator[None]:
        """Install the Ctrl-C handler (only possible on the main thread; elsewhere a no-op)."""
        try:
            old = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread
            old = None
        try:
            yield
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)

"""Find the runs under the paths given to ``agentgym view``.

Three kinds of run, recognised by the files they hold:

* **eval**: an ``agentgym eval`` output folder (``summary.json`` and/or ``episodes.jsonl``), also each
  held-out stage of a training run (``TRAIN/eval/<stage>/``);
* **train**: an ``agentgym train`` run folder (``metrics.jsonl``, ``result.json``, or ``config.json`` beside
  ``eval/``), with its eval stages as child runs and ``groups.jsonl`` when it was logged;
* **episodes**: a plain trajectory JSONL file (``agentgym collect`` output, SFT data).

A path that is none of these is searched for runs (three folder levels down, 200 runs at most).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentgym.errors import ConfigurationError

__all__ = ["MAX_DEPTH", "MAX_RUNS", "RunKind", "RunSource", "discover_runs", "read_json", "stage_order"]

RunKind = Literal["eval", "train", "episodes"]
MAX_DEPTH = 3
MAX_RUNS = 200
_STAGE_STEP = re.compile(r"^step-(\d+)$")


@dataclass
class RunSource:
    """One run the viewer shows.

    Attributes:
        id: Its number in this viewer session (document paths use it).
        name: A short label: the last parts of its path that tell it from the other runs (``TRAIN › stage``
            for a training run's eval stage).
        path: The folder (eval, train) or file (episodes).
        kind: ``eval``, ``train`` or ``episodes``.
        parent: The training run an eval stage belongs to.
        stage: The stage name (``before``, ``step-000006``, ``after``).
        children: A training run's eval stages, in training order.
    """

    id: int
    name: str
    path: Path
    kind: RunKind
    parent: int | None = None
    stage: str | None = None
    children: list[int] = field(default_factory=list)

    @property
    def episodes_file(self) -> Path | None:
        if self.kind == "episodes":
            return self.path
        if self.kind == "eval":
            return self.path / "episodes.jsonl"
        return None

    def file(self, name: str) -> Path:
        return self.path / name


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or ``None`` if it is missing, unreadable or not an object (never raises)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def stage_order(stage: str) -> tuple[int, int, str]:
    """Sort key of a training run's eval stage: ``before``, ``step-N`` by N, ``after``, then the rest."""
    if stage == "before":
        return (0, 0, stage)
    m = _STAGE_STEP.match(stage)
    if m:
        return (1, int(m.group(1)), stage)
    if stage == "after":
        return (2, 0, stage)
    return (3, 0, stage)


def _kind(path: Path) -> RunKind | None:
    if path.is_file():
        return "episodes" if path.suffix == ".jsonl" else None
    if not path.is_dir():
        return None
    if (path / "metrics.jsonl").is_file() or (path / "result.json").is_file() or (
            (path / "config.json").is_file() and (path / "eval").is_dir()):
        return "train"
    if (path / "summary.json").is_file() or (path / "episodes.jsonl").is_file():
        return "eval"
    return None


def _search(root: Path, depth: int, found: list[tuple[Path, RunKind]]) -> None:
    if depth > MAX_DEPTH or len(found) >= MAX_RUNS:
        return
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return
    for p in entries:
        if p.name.startswith(".") or p.is_symlink():
            continue
        k = _kind(p) if p.is_dir() else None  # inside a folder only run folders count, not every .jsonl
        if k is not None:
            found.append((p, k))
        elif p.is_dir() and p.name not in ("checkpoints", "final", "tensorboard", "__pycache__"):
            _search(p, depth + 1, found)
        if len(found) >= MAX_RUNS:
            return


def _labels(names: list[str]) -> list[str]:
    """For each path, its shortest tail of parts that no other path ends with (``runs/a/train`` and
    ``runs/b/train`` become ``a/train`` and ``b/train``)."""
    parts = [Path(n).resolve().parts for n in names]
    out = []
    for i, ps in enumerate(parts):
        for k in range(1, len(ps) + 1):
            tail = ps[-k:]
            if all(j == i or tuple(q[-k:]) != tail for j, q in enumerate(parts)):
                break
        out.append("/".join(tail) if tail and tail != ("/",) else names[i])  # "/" itself: as given
    return out


def discover_runs(paths: list[str | os.PathLike[str]]) -> list[RunSource]:
    """The runs at or under ``paths``, in the order given (a training run's stages follow it).

    Raises:
        ConfigurationError: a path does not exist, or holds no run.
    """
    if not paths:
        raise ConfigurationError("give at least one run folder (an `agentgym eval --out` or `agentgym train` folder).")
    found: list[tuple[Path, str, RunKind]] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise ConfigurationError(f"{p} does not exist; pass an `agentgym eval --out` or `agentgym train` run folder.")
        k = _kind(p)
        if k is not None:
            found.append((p, str(raw), k))
            continue
        if p.is_file():
            raise ConfigurationError(f"{p} is not a run: give a run folder or a trajectory .jsonl file.")
        inner: list[tuple[Path, RunKind]] = []
        _search(p, 1, inner)
        if not inner:
            raise ConfigurationError(
                f"no run found in {p} (looked {MAX_DEPTH} levels down for summary.json, episodes.jsonl, "
                "metrics.jsonl or result.json).")
        found += [(q, str(Path(raw) / q.relative_to(p)), kk) for q, kk in inner]
    unique: list[tuple[Path, str, RunKind]] = []
    seen: set[Path] = set()
    for p, name, k in found:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append((p, name, k))
    labels = _labels([name for _, name, _ in unique])
    runs: list[RunSource] = []
    for (p, _name, k), label in zip(unique, labels, strict=True):
        run = RunSource(len(runs), label, p, k)
        runs.append(run)
        if k == "train" and (p / "eval").is_dir():
            stages = sorted((q for q in (p / "eval").iterdir() if q.is_dir() and _kind(q) == "eval"),
                            key=lambda q: stage_order(q.name))
            for q in stages:
                child = RunSource(len(runs), f"{label} › {q.name}", q, "eval", parent=run.id, stage=q.name)
                run.children.append(child.id)
                runs.append(child)
        if len(runs) > MAX_RUNS:
            raise ConfigurationError(f"more than {MAX_RUNS} runs under {paths}; give fewer or deeper folders.")
    return runs

"""Trajectories to and from JSON Lines, losslessly.

One trajectory per line (``Trajectory.to_dict``). Numbers, nested tool-call arguments, per-token
weight versions and non-finite floats round-trip exactly; numpy scalars/arrays that envs may put in
``info`` are written as plain JSON numbers/lists. Each line is written with a single ``write``
call and flushed, so an interrupted writer leaves at most one partial last line, which
:func:`read_jsonl` skips (and :func:`append_jsonl` first terminates).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from agentgym.types import Trajectory

__all__ = ["append_jsonl", "dumps_trajectory", "iter_jsonl", "loads_trajectory", "read_jsonl", "write_jsonl"]

log = logging.getLogger(__name__)


def _default(obj: Any) -> Any:
    # numpy scalars and arrays, sets, tuples-in-dataclasses (asdict keeps lists), Paths, bytes
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    return repr(obj)


def dumps_trajectory(traj: Trajectory) -> str:
    """One JSON line (no trailing newline)."""
    return json.dumps(traj.to_dict(), ensure_ascii=False, default=_default, allow_nan=True)


def loads_trajectory(line: str) -> Trajectory:
    return Trajectory.from_dict(json.loads(line))


def write_jsonl(path: str | os.PathLike[str], trajectories: Iterable[Trajectory]) -> int:
    """Write (overwrite) ``path``; returns the number of lines written."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(dumps_trajectory(t) + "\n")
            n += 1
    return n


def append_jsonl(path: str | os.PathLike[str], trajectories: Iterable[Trajectory], fsync: bool = False) -> int:
    """Append to ``path`` (created if missing), one flushed line per trajectory."""
    p = Path(path)
    n = 0
    needs_newline = False
    if p.exists() and p.stat().st_size > 0:
        with open(p, "rb") as f:
            f.seek(-1, os.SEEK_END)
            needs_newline = f.read(1) != b"\n"
    with open(p, "a", encoding="utf-8") as f:
        if needs_newline:  # a previous writer died mid-line: close that line
            f.write("\n")
        for t in trajectories:
            f.write(dumps_trajectory(t) + "\n")
            f.flush()
            if fsync:
                os.fsync(f.fileno())
            n += 1
    return n


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    """Yield trajectories; malformed lines (an interrupted write) are skipped and logged."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield loads_trajectory(line)
            except (json.JSONDecodeError, TypeError, KeyError) as e:
                log.warning("%s:%d: skipping malformed line (%s)", path, lineno, e)


def read_jsonl(path: str | os.PathLike[str]) -> list[Trajectory]:
    return list(iter_jsonl(path))

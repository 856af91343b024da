"""Reading benchmark files: :func:`read_rows` (JSON or JSON Lines rows, plain or gzipped) and :class:`LoadReport`
(what an env's task loader kept and what it left out).

A loader that reads a benchmark's files may not turn every row into a task (a row it cannot
score, a game the engine cannot play, a duplicate id). It must never drop one silently: it
records each skipped row with its reason, and logs one WARNING with the counts. The eval reads
the report through :meth:`AgentEnv.load_report() <agentgym.core.AgentEnv.load_report>` and
records it in ``summary.json``::

    report = LoadReport("SQL-AgentBench-v0", source="dbbench/standard.jsonl")
    for i, row in enumerate(rows):
        if not scorable(row):
            report.skip(f"row {i}", "no label and no answer_md5")
            continue
        tasks.append(make_task(row))
    report.loaded = len(tasks)
    report.warn(log)   # one WARNING line when anything was skipped
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.errors import ValidationError

__all__ = ["LoadReport", "read_rows"]

JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")

MAX_LISTED = 200  # skipped items listed by name in to_dict(); the counts always cover all of them


def read_rows(path: str | os.PathLike[str], *, source: str = "", keys: Sequence[str] = ()) -> list[Any]:
    """The rows of a JSON or JSON Lines file, plain or gzip-compressed (``.gz``, named for what it holds:
    ``tasks.jsonl.gz``).

    ``.jsonl``/``.ndjson``: one JSON value per non-blank line. Any other file is read as one JSON
    document (a list is its rows; an object holding a list under one of ``keys``, the first found, is
    that list's rows: ``{"rows": [...]}``; any other value is one row), or, where it is not one
    document, as JSON Lines (datasets ship JSON Lines named ``.json``).

    Args:
        path: The file.
        source: Who is reading (an env's name), to start error messages with.
        keys: Keys under which a JSON document may wrap its rows (``("rows", "data")``); none by default.

    Raises:
        ValidationError: the file cannot be read, or a line (or the document) is not JSON; the
            message names the file and the line.
    """
    p = Path(path)
    where = f"{source}: " if source else ""
    packed = p.suffix == ".gz"
    try:
        with (gzip.open(p, "rt", encoding="utf-8") if packed else p.open(encoding="utf-8")) as f:
            text = f.read()
    except (OSError, EOFError, UnicodeDecodeError) as e:  # gzip's BadGzipFile is an OSError
        raise ValidationError(f"{where}cannot read {str(p)!r}: {e}") from e
    if Path(p.stem if packed else p.name).suffix not in JSON_LINES_SUFFIXES:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if len([line for line in text.splitlines() if line.strip()]) <= 1:
                raise ValidationError(f"{where}{p.name} is not JSON: {e}") from e
        else:
            if isinstance(data, dict):
                wrapped = next((data[k] for k in keys if isinstance(data.get(k), list)), None)
                if wrapped is not None:
                    return list(wrapped)
            return data if isinstance(data, list) else [data]
    rows: list[Any] = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValidationError(f"{where}{p.name} line {n} is not JSON: {e}") from e
    return rows


@dataclass
class LoadReport:
    """Counts of loaded and skipped tasks, with a reason per skipped row.

    Attributes:
        env: The env's short name (``"SQL-AgentBench-v0"``), used in the log line.
        source: Where the rows came from (a path, ``"generated"``...).
        loaded: Tasks the loader produced (all splits).
        skipped: ``(item, reason)`` per left-out row; ``item`` names the row (``"row 12"``, a file).
        notes: Facts about loaded tasks worth recording (e.g. how many needed a dialect fix).
    """

    env: str = ""
    source: str = ""
    loaded: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: dict[str, int] = field(default_factory=dict)

    def skip(self, item: str, reason: str) -> None:
        """Record that ``item`` was left out because of ``reason`` (keep reasons short and shared)."""
        self.skipped.append((str(item), str(reason)))

    def note(self, key: str, n: int = 1) -> None:
        """Count a fact about the loaded tasks (``notes[key] += n``)."""
        self.notes[key] = self.notes.get(key, 0) + n

    @property
    def n_skipped(self) -> int:
        return len(self.skipped)

    def reasons(self) -> dict[str, int]:
        """Skipped rows per reason, most common first."""
        return dict(Counter(r for _, r in self.skipped).most_common())

    def summary(self) -> str:
        """One line: ``loaded N task(s) from SOURCE; skipped M: 3 x reason A; 1 x reason B``."""
        head = f"{self.env + ': ' if self.env else ''}loaded {self.loaded} task(s)"
        if self.source:
            head += f" from {self.source}"
        if not self.skipped:
            return head + "; skipped none"
        parts = "; ".join(f"{n} x {r}" for r, n in self.reasons().items())
        return f"{head}; skipped {self.n_skipped}: {parts}"

    def warn(self, logger: logging.Logger) -> None:
        """Log :meth:`summary` at WARNING if anything was skipped (at INFO otherwise)."""
        logger.log(logging.WARNING if self.skipped else logging.INFO, "%s", self.summary())

    def merge(self, other: LoadReport) -> None:
        """Add another report's counts (e.g. one per split file) into this one."""
        self.loaded += other.loaded
        self.skipped.extend(other.skipped)
        for k, v in other.notes.items():
            self.note(k, v)

    def to_dict(self) -> dict[str, Any]:
        """JSON form, as recorded in an eval's ``summary.json``."""
        return {
            "source": self.source or None,
            "loaded": self.loaded,
            "skipped": self.n_skipped,
            "skip_reasons": self.reasons(),
            "skipped_items": [{"item": i, "reason": r} for i, r in self.skipped[:MAX_LISTED]],
            "notes": dict(self.notes),
        }

"""Sandboxed per-episode SQLite databases and result comparison.

Every episode gets its own in-memory database, deserialised from an immutable snapshot (the bytes
of ``Connection.serialize()``), so nothing an agent does reaches the source file or another
episode. The database lives in a **worker process** (:mod:`.db_worker`, one per open episode,
reused across episodes), so that a statement can always be stopped at its deadline:

* a progress handler aborts any statement that runs past its deadline between SQLite steps (a
  recursive CTE that never ends, a huge cross join), keeping the episode's earlier changes;
* a statement stuck inside one long SQLite call (pattern matching or trimming on huge strings)
  cannot be interrupted that way: the host kills the worker ``kill_grace_s`` after the deadline,
  starts a fresh one and rebuilds the episode's database by replaying the changes that succeeded
  before it (statements whose result depends on ``random()`` or the clock may then differ);
* the worker has an address-space limit and SQLite's hard heap limit, and keeps temporary
  tables, sorts and indexes in memory (``temp_store = MEMORY``) under them: a huge ``GROUP BY``
  fails with "out of memory" instead of filling the disk or the host's memory.

The connection is locked down:

* an authorizer denies ``ATTACH``/``DETACH`` (which also blocks ``VACUUM INTO 'file'``),
  ``load_extension()`` and other unsafe functions, and every ``PRAGMA`` that sets a value; read
  pragmas such as ``PRAGMA table_info(t)`` are allowed;
* ``max_page_count`` caps the database size (main and temp); a write past it fails with
  ``database or disk is full``, returned to the agent as an error;
* SQLite's own limits cap a single string or blob (``SQLITE_LIMIT_LENGTH``), the SQL text and
  LIKE/GLOB patterns.

**Multiple statements.** :meth:`EpisodeDB.run` executes exactly one statement per call. Trailing
semicolons, whitespace and comments are fine (``SELECT 1;;``); a call containing two or more
statements is rejected as a whole *before anything runs*, so no prefix of it is applied.

Comparison helpers: :func:`results_match` (execution match: multiset of rows, order-sensitive
only when asked), :func:`answers_match` (normalised strings with a numeric tolerance) and
:func:`table_state_hash` (a digest of every user table's contents, row order ignored).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import marshal
import math
import os
import re
import select
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from itertools import permutations
from typing import Any

from agentgym.errors import EnvError

from .db_worker import table_state_hash

__all__ = [
    "EpisodeDB",
    "QueryResult",
    "answers_match",
    "flatten_rows",
    "format_result",
    "has_order_by",
    "normalise_answer",
    "results_match",
    "snapshot_from_file",
    "snapshot_from_sql",
    "table_state_hash",
]

PAGE_SIZE = 4096
_WORKER_SRC = resources.files(__package__).joinpath("db_worker.py").read_text(encoding="utf-8")


def snapshot_from_sql(script: str) -> bytes:
    """Build a database from a SQL script and return its serialised bytes."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        conn.executescript(script)
        return conn.serialize()
    finally:
        conn.close()


def snapshot_from_file(path: str) -> bytes:
    """Read a SQLite file (opened read-only, never modified) into serialised bytes."""
    src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        mem = sqlite3.connect(":memory:")
        try:
            src.backup(mem)
            return mem.serialize()
        finally:
            mem.close()
    finally:
        src.close()


@dataclass
class QueryResult:
    """One statement's outcome. ``error`` is set (and ``rows`` empty) when it failed."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool = False
    rowcount: int = -1
    error: str | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


class _Worker:
    """One SQL worker process (see :mod:`.db_worker`)."""

    def __init__(self, memory_limit_mb: int) -> None:
        self.memory_limit_mb = memory_limit_mb
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WORKER_SRC, str(memory_limit_mb)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         close_fds=True, cwd="/")
        except OSError as e:
            raise EnvError(f"could not start the SQL worker process: {e}") from e
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._w = self.proc.stdin
        self._fd = self.proc.stdout.fileno()
        self._buf = b""

    def request(self, req: tuple[Any, ...], timeout_s: float | None) -> tuple[Any, ...] | None:
        """Send ``req``; its answer, or ``None`` if none came within ``timeout_s`` or the worker died."""
        data = marshal.dumps(req)
        try:
            self._w.write(struct.pack(">I", len(data)) + data)
            self._w.flush()
        except (BrokenPipeError, OSError, ValueError):
            return None
        deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        need = 4
        body = False
        while True:
            while len(self._buf) < need:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                ready, _, _ = select.select([self._fd], [], [], None if math.isinf(left) else left)
                if not ready:
                    return None
                chunk = os.read(self._fd, max(need - len(self._buf), 1 << 16))
                if not chunk:
                    return None
                self._buf += chunk
            if not body:
                need = 4 + struct.unpack(">I", self._buf[:4])[0]
                body = True
                continue
            payload, self._buf = self._buf[4:need], self._buf[need:]
            resp = marshal.loads(payload)
            return resp if isinstance(resp, tuple) else None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if f is not None:
                    f.close()


_IDLE: list[_Worker] = []
_IDLE_MAX = 64
_IDLE_LOCK = threading.Lock()
_RETURNED: collections.deque[_Worker] = collections.deque()  # from episodes collected without close()


def _take_worker(memory_limit_mb: int) -> _Worker:
    while _RETURNED:
        try:
            _give_worker(_RETURNED.popleft())
        except IndexError:
            break
    with _IDLE_LOCK:
        for i, w in enumerate(_IDLE):
            if w.memory_limit_mb == memory_limit_mb:
                del _IDLE[i]
                if w.alive():
                    return w
                w.kill()
                break
    return _Worker(memory_limit_mb)


def _give_worker(w: _Worker) -> None:
    if w.alive() and w.request(("close",), 10.0) == ("ok",):
        with _IDLE_LOCK:
            if len(_IDLE) < _IDLE_MAX:
                _IDLE.append(w)
                return
    w.kill()


def _release(holder: list[_Worker]) -> None:
    """An episode's finalizer: hand its worker back (it may run inside the garbage collector, so it
    only queues the worker; the next episode to open recycles it)."""
    if holder:
        _RETURNED.append(holder.pop())


@atexit.register
def _stop_idle_workers() -> None:
    with _IDLE_LOCK:
        idle, _IDLE[:] = list(_IDLE), []
    idle += list(_RETURNED)
    _RETURNED.clear()
    for w in idle:
        w.kill()


class EpisodeDB:
    """An isolated, locked-down in-memory copy of a database snapshot, held by a worker process.

    For a source too big to copy per episode, pass ``readonly_path`` instead of a snapshot: the
    file is opened read-only (``mode=ro`` and ``PRAGMA query_only``), so every write fails with an
    error the agent sees and the file is never modified. Change tasks need a copy.

    Args:
        snapshot: Bytes from :func:`snapshot_from_sql` / :func:`snapshot_from_file`.
        readonly_path: A SQLite file to open read-only instead of copying a snapshot.
        timeout_s: Per-statement deadline.
        max_db_bytes: Size cap of the episode database (at least the snapshot size + 1 MiB).
        max_value_bytes: Largest string or blob a statement may build.
        max_sql_chars: Longest SQL text accepted.
        max_memory_mb: SQLite's heap limit in the worker (temp storage included); the worker's
            address space is limited to this plus 512 MiB.
        kill_grace_s: How long after its deadline a statement stuck in one SQLite call may run
            before the worker is killed and the database rebuilt.
        collations: Named collations to register (``"MYSQL_AI_CI"``; see ``db_worker.COLLATIONS``).
    """

    def __init__(
        self,
        snapshot: bytes | None = None,
        *,
        readonly_path: str | None = None,
        timeout_s: float = 5.0,
        max_db_bytes: int = 64 * 1024 * 1024,
        max_value_bytes: int = 1_000_000,
        max_sql_chars: int = 200_000,
        max_memory_mb: int = 512,
        kill_grace_s: float = 0.5,
        collations: Sequence[str] = (),
    ) -> None:
        if (snapshot is None) == (readonly_path is None):
            raise ValueError("EpisodeDB needs exactly one of snapshot and readonly_path")
        self.timeout_s = float(timeout_s)
        self.kill_grace_s = float(kill_grace_s)
        self.readonly = readonly_path is not None
        self._open_args = (snapshot, readonly_path, int(max_db_bytes), int(max_value_bytes), int(max_sql_chars),
                           int(max_memory_mb), tuple(str(c) for c in collations))
        self._memory_limit_mb = int(max_memory_mb) + 512
        self._log: list[str] = []  # statements that changed the database, replayed after a kill
        # The worker is held in a list that only the finalizer shares, so a live worker process is
        # always reachable from the finalizer registry and never becomes cyclic garbage.
        self._holder: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _release, self._holder)
        self._open()

    @property
    def _worker(self) -> _Worker | None:
        return self._holder[0] if self._holder else None

    def _open(self) -> None:
        w = _take_worker(self._memory_limit_mb)
        resp = w.request(("open", *self._open_args), 60.0)
        if resp is None or resp[0] != "ok":
            w.kill()
            detail = resp[1] if resp is not None and len(resp) > 1 else "the worker did not answer"
            raise EnvError(f"could not open the episode database: {detail}")
        self._holder[:] = [w]

    def _require(self) -> _Worker:
        w = self._worker
        if w is None:
            raise EnvError("this EpisodeDB is closed")
        return w

    def run(self, sql: str, max_rows: int | None = None) -> QueryResult:
        """Execute one statement; never raises for bad SQL.

        Args:
            sql: A single SQL statement.
            max_rows: Fetch at most this many rows (``truncated`` says whether more existed).
        """
        if not isinstance(sql, str):
            return QueryResult([], [], error="the query must be a string")
        w = self._require()
        resp = w.request(("run", sql, max_rows, self.timeout_s), self.timeout_s + self.kill_grace_s)
        if resp is None or resp[0] != "ok":
            died = resp is None and not w.alive()
            note = self._restart()
            what = ("the query crashed the database worker" if died else
                    f"query timed out after {self.timeout_s:g} s and was stopped")
            return QueryResult([], [], error=what + note, timed_out=not died)
        _, cols, rows, truncated, rowcount, error, timed_out, wrote = resp
        if timed_out:
            return QueryResult([], [], error=f"query timed out after {self.timeout_s:g} s and was stopped",
                               timed_out=True)
        if error is not None:
            return QueryResult([], [], error=str(error))
        if wrote:
            self._log.append(sql)
        return QueryResult(list(cols), [tuple(r) for r in rows], bool(truncated), int(rowcount))

    def _restart(self) -> str:
        """Kill the worker, rebuild the database in a fresh one; a note for the agent if that failed."""
        if self._holder:
            self._holder.pop().kill()
        self._open()
        w = self._require()
        for i, sql in enumerate(self._log):
            resp = w.request(("run", sql, 0, max(self.timeout_s, 10.0)), max(self.timeout_s, 10.0) + 5.0)
            if resp is None or resp[0] != "ok" or resp[5] is not None:
                self._log = self._log[:i]
                return " (the database could not be fully restored: changes after that point were lost)"
        return ""

    def in_transaction(self) -> bool:
        """Whether a transaction is open (the agent ran BEGIN without COMMIT)."""
        resp = self._require().request(("in_tx",), 30.0)
        return bool(resp is not None and resp[0] == "ok" and resp[1])

    def state_hash(self, tables: Sequence[str] | None = None) -> str:
        """:func:`table_state_hash` of this database (every user table, or ``tables``)."""
        resp = self._require().request(("hash", None if tables is None else list(tables)), 120.0)
        if resp is None or resp[0] != "ok":
            raise EnvError(f"could not hash the episode database: {resp}")
        return str(resp[1])

    def close(self) -> None:
        self._finalizer.detach()
        if self._holder:
            _give_worker(self._holder.pop())


# ---------------------------------------------------------------------------- formatting

def _cell(v: Any, width: int = 60) -> str:
    if v is None:
        s = "NULL"
    elif isinstance(v, bytes):
        s = f"<blob {len(v)} bytes>"
    elif isinstance(v, float):
        s = repr(round(v, 6)) if math.isfinite(v) else repr(v)
    else:
        s = str(v)
    s = s.replace("\n", " ").replace("|", "\\|")
    return s if len(s) <= width else s[: width - 3] + "..."


def format_result(res: QueryResult, *, max_rows: int, max_chars: int) -> str:
    """Render a result as a pipe table, stating any row or character cap that was applied."""
    if res.error is not None:
        return f"Error: {res.error}"
    if not res.columns:
        n = res.rowcount
        return f"OK. {n} row(s) affected." if n is not None and n >= 0 else "OK."
    lines = [" | ".join(res.columns)]
    lines += [" | ".join(_cell(v) for v in row) for row in res.rows]
    text = "\n".join(lines)
    notes = []
    if len(text) > max_chars:
        cut = text[:max_chars]
        text = cut[: cut.rfind("\n")] if "\n" in cut else cut
        shown = text.count("\n")
        notes.append(f"output cut to {max_chars} characters ({shown} of {len(res.rows)} fetched rows shown)")
    if res.truncated:
        notes.append(f"only the first {max_rows} rows are shown; the result has more, add LIMIT or aggregate")
    n = len(res.rows)
    summary = f"({n}{'+' if res.truncated else ''} row{'s' if n != 1 else ''})"
    return text + "\n" + summary + ("".join(f"\n[{m}]" for m in notes))


# ---------------------------------------------------------------------------- comparison

_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


def has_order_by(sql: str) -> bool:
    """Whether a query sorts its output (the Spider rule: any ``ORDER BY`` in the text)."""
    return bool(_ORDER_BY.search(sql))


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return None


def _cells_equal(a: Any, b: Any, rel: float, abs_: float) -> bool:
    fa, fb = _num(a), _num(b)
    if fa is not None and fb is not None:
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        return math.isclose(fa, fb, rel_tol=rel, abs_tol=abs_)
    return a == b


def _sort_key(row: Sequence[Any]) -> tuple[Any, ...]:
    out: list[tuple[int, Any]] = []
    for v in row:
        f = _num(v)
        if v is None:
            out.append((0, 0))
        elif f is not None:
            out.append((1, round(f, 6) if math.isfinite(f) else str(f)))
        elif isinstance(v, bytes):
            out.append((3, v.hex()))
        else:
            out.append((2, str(v)))
    return tuple(out)


def _rows_equal(a: Sequence[Sequence[Any]], b: Sequence[Sequence[Any]], ordered: bool, rel: float, abs_: float) -> bool:
    if len(a) != len(b):
        return False
    if not ordered:
        a = sorted(a, key=_sort_key)
        b = sorted(b, key=_sort_key)
    for ra, rb in zip(a, b, strict=True):
        if len(ra) != len(rb) or not all(_cells_equal(x, y, rel, abs_) for x, y in zip(ra, rb, strict=True)):
            return False
    return True


def results_match(
    pred: Sequence[Sequence[Any]],
    gold: Sequence[Sequence[Any]],
    *,
    ordered: bool = False,
    rel_tol: float = 1e-6,
    abs_tol: float = 1e-6,
    column_permutations: bool = True,
) -> bool:
    """Execution match: the same multiset of rows (the same list when ``ordered``).

    Numbers compare with a tolerance, ``1 == 1.0``. With ``column_permutations`` the predicted
    columns may come in another order (tried for up to 4 columns), as in Spider's evaluation.
    """
    pred = [tuple(r) for r in pred]
    gold = [tuple(r) for r in gold]
    if _rows_equal(pred, gold, ordered, rel_tol, abs_tol):
        return True
    if not column_permutations or not pred or not gold:
        return False
    width = len(gold[0])
    if width < 2 or width > 4 or any(len(r) != width for r in pred):
        return False
    identity = tuple(range(width))
    for perm in permutations(range(width)):
        if perm == identity:
            continue
        if _rows_equal([tuple(r[i] for i in perm) for r in pred], gold, ordered, rel_tol, abs_tol):
            return True
    return False


def flatten_rows(rows: Iterable[Sequence[Any]]) -> list[Any]:
    """All cells of a result, row by row (how a query result becomes an answer list)."""
    return [v for r in rows for v in r]


_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_NULLS = {"", "none", "null", "nan", "undefined"}


def normalise_answer(v: Any) -> str | float | None:
    """Normalise one answer item: trimmed, unquoted, case-folded text, or a number.

    ``"1,234"`` and ``"12%"`` become numbers; ``None``/``"null"``/``""`` become ``None``.
    """
    if v is None:
        return None
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    s = str(v).strip().strip("'\"`").strip()
    if s.lower() in _NULLS:
        return None
    t = s.replace(",", "").rstrip("%").strip()
    if _NUMBER.match(t):
        return float(t)
    return " ".join(s.casefold().split())


def answers_match(pred: Sequence[Any], gold: Sequence[Any], *, rel_tol: float = 1e-4, abs_tol: float = 1e-2) -> bool:
    """Answer match: equal multisets of normalised items, numbers within a tolerance.

    The default ``abs_tol=0.01`` follows AgentBench's float comparison (answers are often rounded).
    """
    a = [normalise_answer(x) for x in pred]
    b = [normalise_answer(x) for x in gold]
    if len(a) != len(b):
        return False
    return _rows_equal([(x,) for x in a], [(y,) for y in b], False, rel_tol, abs_tol)


def multiset(rows: Iterable[Sequence[Any]]) -> Counter[tuple[Any, ...]]:
    """Rows as a Counter (exact values); handy in tests."""
    return Counter(tuple(r) for r in rows)

"""Sandboxed per-episode SQLite databases and result comparison.

Every episode gets its own in-memory database, deserialised from an immutable snapshot (the bytes
of ``Connection.serialize()``), so nothing an agent does reaches the source file or another
episode. The episode connection is locked down:

* an authorizer denies ``ATTACH``/``DETACH`` (which also blocks ``VACUUM INTO 'file'``),
  ``load_extension()`` and other unsafe functions, and every ``PRAGMA`` that sets a value; read
  pragmas such as ``PRAGMA table_info(t)`` are allowed;
* ``max_page_count`` caps the database size (main and temp); a write past it fails with
  ``database or disk is full``, returned to the agent as an error;
* ``SQLITE_LIMIT_LENGTH`` caps a single string or blob;
* a progress handler aborts any statement that runs past its deadline (a recursive CTE that never
  ends, a huge cross join), and the agent sees a timeout error.

**Multiple statements.** :meth:`EpisodeDB.run` executes exactly one statement per call. Trailing
semicolons, whitespace and comments are fine; a call containing two or more statements is
rejected as a whole *before anything runs*, so no prefix of it is applied.

Comparison helpers: :func:`results_match` (execution match: multiset of rows, order-sensitive
only when asked), :func:`answers_match` (normalised strings with a numeric tolerance) and
:func:`table_state_hash` (a digest of every user table's contents, row order ignored).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import permutations
from typing import Any

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
_READ_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "foreign_key_check", "collation_list", "function_list", "pragma_list",
    "integrity_check", "quick_check",
})
_DENY_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})
_DENY_ACTIONS = frozenset({sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH})


def _authorizer(action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
    if action in _DENY_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA:
        name = (arg1 or "").lower()
        if name in _READ_PRAGMAS or arg2 is None:
            return sqlite3.SQLITE_OK
        return sqlite3.SQLITE_DENY  # PRAGMA x = value: a write
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENY_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


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


class EpisodeDB:
    """An isolated, locked-down in-memory copy of a database snapshot.

    For a source too big to copy per episode, pass ``readonly_path`` instead of a snapshot: the
    file is opened read-only (``mode=ro`` and ``PRAGMA query_only``), so every write fails with an
    error the agent sees and the file is never modified. Change tasks need a copy.

    Args:
        snapshot: Bytes from :func:`snapshot_from_sql` / :func:`snapshot_from_file`.
        readonly_path: A SQLite file to open read-only instead of copying a snapshot.
        timeout_s: Per-statement deadline, enforced by sqlite's progress handler.
        max_db_bytes: Size cap of the episode database (at least the snapshot size + 1 MiB).
        max_value_bytes: Largest string or blob a statement may build.
    """

    def __init__(
        self,
        snapshot: bytes | None = None,
        *,
        readonly_path: str | None = None,
        timeout_s: float = 5.0,
        max_db_bytes: int = 64 * 1024 * 1024,
        max_value_bytes: int = 1_000_000,
    ) -> None:
        if (snapshot is None) == (readonly_path is None):
            raise ValueError("EpisodeDB needs exactly one of snapshot and readonly_path")
        self.timeout_s = float(timeout_s)
        self._deadline = math.inf
        self.readonly = readonly_path is not None
        if readonly_path is not None:
            conn = sqlite3.connect(f"file:{readonly_path}?mode=ro", uri=True, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA query_only = 1")
            size = 0
        else:
            assert snapshot is not None
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            conn.deserialize(snapshot)
            size = len(snapshot)
        cap = max(int(max_db_bytes), size + 1024 * 1024)  # a big source may still grow 1 MiB
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0]) or PAGE_SIZE
        pages = -(-cap // page_size)
        if not self.readonly:
            conn.execute(f"PRAGMA main.max_page_count={pages}")
        conn.execute(f"PRAGMA temp.max_page_count={pages}")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, int(max_value_bytes))
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.set_authorizer(_authorizer)
        conn.set_progress_handler(self._progress, 1000)
        self.conn = conn

    def _progress(self) -> int:
        return 1 if time.perf_counter() > self._deadline else 0

    def run(self, sql: str, max_rows: int | None = None) -> QueryResult:
        """Execute one statement; never raises for bad SQL.

        Args:
            sql: A single SQL statement.
            max_rows: Fetch at most this many rows (``truncated`` says whether more existed).
        """
        self._deadline = time.perf_counter() + self.timeout_s
        try:
            cur = self.conn.execute(sql)
            cols = [d[0] for d in cur.description] if cur.description else []
            if max_rows is None:
                rows = cur.fetchall()
                truncated = False
            else:
                rows = cur.fetchmany(max_rows + 1)
                truncated = len(rows) > max_rows
                rows = rows[:max_rows]
            rowcount = cur.rowcount
            cur.close()
            return QueryResult(cols, rows, truncated, rowcount)
        except sqlite3.OperationalError as e:
            if str(e) == "interrupted":
                self._recover()
                return QueryResult([], [], error=f"query timed out after {self.timeout_s:g} s and was stopped",
                                   timed_out=True)
            return QueryResult([], [], error=str(e))
        except sqlite3.ProgrammingError as e:
            if "one statement at a time" in str(e):
                return QueryResult([], [], error="execute_sql runs one statement per call; this call held "
                                   "several, so none of them was run. Send them in separate calls.")
            return QueryResult([], [], error=str(e))
        except (sqlite3.Error, OverflowError, ValueError, MemoryError) as e:
            return QueryResult([], [], error=str(e) or type(e).__name__)
        finally:
            self._deadline = math.inf

    def _recover(self) -> None:
        """After an interrupt sqlite rolls the statement back; end any transaction it left open."""
        if self.conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")

    def state_hash(self) -> str:
        """:func:`table_state_hash` of this database."""
        return table_state_hash(self.conn)

    def close(self) -> None:
        self.conn.close()


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


def _hash_cell(v: Any) -> str:
    if v is None:
        return "N"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f = float(v)
        if math.isfinite(f) and f == round(f):
            return f"I{int(f)}"
        return f"F{round(f, 6)!r}"
    if isinstance(v, bytes):
        return "B" + v.hex()
    return "S" + str(v)


def table_state_hash(conn: sqlite3.Connection, tables: Sequence[str] | None = None) -> str:
    """A digest of the contents of ``tables`` (default: every user table), row order ignored.

    Numbers are canonicalised (``3 == 3.0``; floats rounded to 6 decimals) so that equivalent
    arithmetic in a different order hashes the same.
    """
    if tables is None:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    h = hashlib.sha256()
    for name in sorted(tables):
        quoted = '"' + name.replace('"', '""') + '"'
        try:
            rows = conn.execute(f"SELECT * FROM {quoted}").fetchall()
        except sqlite3.Error:
            h.update(f"<missing {name}>".encode())
            continue
        encoded = sorted("\x1f".join(_hash_cell(v) for v in r) for r in rows)
        h.update(f"\x1e{name}\x1d{len(rows)}\x1d".encode())
        for line in encoded:
            h.update(line.encode("utf-8", "surrogatepass"))
            h.update(b"\x1e")
    return h.hexdigest()


def multiset(rows: Iterable[Sequence[Any]]) -> Counter[tuple[Any, ...]]:
    """Rows as a Counter (exact values); handy in tests."""
    return Counter(tuple(r) for r in rows)

"""``agentgym/SQL-AgentBench-v0``: AgentBench's DB-Bench (dbbench) scored the way AgentBench scores it.

AgentBench (THUDM/AgentBench, ``src/server/tasks/dbbench``) builds each task's tables in MySQL 8
and gives the agent two tools, ``execute_sql`` and ``commit_final_answer``. This env builds the
same tables in SQLite and keeps both tool names and both scoring rules:

* **Select-like rows** (``type`` ``other``, ``counting``, ``comparison``, ``ranking``,
  ``aggregation-*``...): the committed answer is compared with ``label`` by AgentBench's rule
  (:func:`agentbench_answer_match`): items are trimmed and unquoted, ``%`` and thousands commas
  dropped, ``None``/``null``/``nan``/``inf``/empty mean ``0``; one item each: equal strings, or
  numbers within 0.01 absolute; several: a greedy one-to-one match within 0.01 when every item on
  both sides is a number, otherwise **set** equality. No case folding and no whitespace collapsing.
* **INSERT / UPDATE / DELETE rows** (gold SQL in ``label``, result in ``answer_md5``): the tables
  after the episode are hashed with AgentBench's MySQL hash (:func:`tables_md5`: per row the first 5
  hex digits of ``MD5(CONCAT_WS(',', columns...))``, sorted, joined by ``,``, cut to MySQL's
  ``group_concat_max_len`` of 1024, then ``MD5`` of that; tables joined by ``_``) and compared with
  ``answer_md5``. What the agent answers does not matter for these rows, as in AgentBench.

``scoring="lenient"`` keeps the looser rules for training (case-folded, whitespace-collapsed
multisets with a relative tolerance; table state compared with the gold SQL run on a fresh copy).
It is named as such in the eval protocol (``env_kwargs``); published comparisons use the default.

**Tables.** AgentBench creates every column as ``TEXT`` and inserts ``str(value)`` of each cell (a
JSON ``null`` becomes the text ``None``). MySQL then compares numeric-looking text with numbers as
numbers; SQLite does not, so a column whose values are all canonical integers is declared
``INTEGER``, and one whose values are all numbers that one rendering reproduces exactly
(``12``/``1.5``; ``12.0``; or a fixed number of decimals) ``REAL``; other columns stay ``TEXT``.
The hash renders each stored value back to the text MySQL would hold. Text comparisons use a
``MYSQL_AI_CI`` collation (case- and accent-insensitive, like MySQL 8's default
``utf8mb4_0900_ai_ci``) on every column.

**What SQLite cannot reproduce** (rows left out of the split are counted, with the reason, in
:meth:`load_report` and in an eval's ``summary.json``). Every mutation row with gold SQL is checked
at load: its ``answer_md5`` must equal the hash of the untouched tables (the gold changed nothing
in MySQL) or of the tables after the gold SQL, run as written or translated from MySQL's dialect
(backslash escapes in string literals, double-quoted strings, identifiers that start with a
digit). A row for which neither holds is excluded; the reason names the SQLite error (a
MySQL-only function or syntax such as ``UPDATE ... LIMIT``) or says that the resulting tables
differ (typically MySQL's collation rules beyond case and accents, number-to-text formatting, or
silent truncation). Known differences the check cannot see, because they only matter for what an
agent might do:

* ``LIKE`` is ASCII-case-insensitive only (MySQL's is accent-insensitive too);
* text written into a numeric column is stored as a number and hashed in the column's rendering
  (``'010'`` is held as ``10``; ``'0.5'`` in a column of ``'0.50'``-style values as ``0.50``), where
  MySQL's ``TEXT`` column keeps the text as written;
* an empty cell in a numeric column compares as text (greater than any number); MySQL reads it as 0;
* MySQL-only functions and syntax (``IF()``, ``SUBSTRING_INDEX()``, ``UPDATE ... LIMIT``) fail with
  an error the agent sees.

The agent is told it talks to SQLite.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import math
import os
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentgym.errors import ConfigurationError, ValidationError
from agentgym.loading import LoadReport, read_rows
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec

from .db import PAGE_SIZE, EpisodeDB, answers_match
from .db_worker import mysql_ci
from .env import BaseSQLEnv, _need_path, _SnapshotCache

__all__ = [
    "COLLATION",
    "AgentBenchSQLEnv",
    "agentbench_answer_match",
    "agentbench_hash_match",
    "clean_answer",
    "column_style",
    "mysql_to_sqlite",
    "register_mysql_collation",
    "render_mysql",
    "table_md5",
    "tables_md5",
]

log = logging.getLogger(__name__)
ENV = "SQL-AgentBench-v0"
MUTATIONS = ("INSERT", "UPDATE", "DELETE")
GROUP_CONCAT_MAX_LEN = 1024  # MySQL 8's default group_concat_max_len (bytes)
COLLATION = "MYSQL_AI_CI"
FLOAT_TOL = 1e-2  # AgentBench's absolute tolerance for numbers

SYSTEM_PROMPT = (
    "I will ask you a question, then you should help me operate a SQLite database with SQL to answer the question. "
    "(The tasks come from AgentBench, written for MySQL; text comparisons here are case- and accent-insensitive as "
    "in MySQL.)\n"
    "You have to explain the problem and your solution to me and write down your thoughts.\n"
    "After thinking and explaining thoroughly, every round you can choose to operate or to answer with the two "
    "tools provided.\n"
    "If you should execute a SQL query, use the `execute_sql` function. Every time you can only execute one SQL "
    "statement.\n"
    "If you are done operating, and you want to commit your final answer, then use the `commit_final_answer` "
    "function. DO NOT use this tool unless you are sure about your answer. Your answer must be exactly the same "
    "as the correct answer.\n"
    "If the question is about modifying the database, then after done operation, your answer field can be "
    "anything.\n"
    "You should always use the tools provided to submit your answer."
)


# ---------------------------------------------------------------------------- answer comparison
_SPECIAL = {"none", "null", "undefined", "nan", "inf", "infinity", "-inf", "-infinity", ""}


def _normalize_special(value: Any) -> str:
    """One answer item as AgentBench normalises it: ``None``-likes to ``"0"``, no ``%``, no thousands commas."""
    if value is None:
        return "0"
    s = str(value).strip()
    if s.endswith("%"):
        return s[:-1].strip()
    if "," in s and not (s.startswith("[") or s.endswith("]")):
        s = s.replace(",", "")
    return "0" if s.lower() in _SPECIAL else s


def _item(x: Any) -> str:
    if isinstance(x, tuple) and len(x) == 1:
        x = x[0]
    return _normalize_special(str(x).strip().strip("'\""))


def _split_list_text(inner: str) -> list[str]:
    """Split ``a, 'b, c', d`` on commas outside quotes (AgentBench's fallback for unparsable lists)."""
    items: list[str] = []
    cur = ""
    quoted = False
    for ch in inner:
        if ch in "\"'":
            quoted = not quoted
        elif ch == "," and not quoted:
            if cur:
                items.append(_normalize_special(cur.strip().strip("'\"")))
                cur = ""
        else:
            cur += ch
    if cur:
        items.append(_normalize_special(cur.strip().strip("'\"")))
    return items


def clean_answer(answer: Any) -> list[str]:
    """An answer (or a label) as the list of strings AgentBench compares.

    Strings that look like a list (``"['a', 'b']"``, or a MySQL result ``"[('a',), ('b',)]"``) are
    read as Python literals (never evaluated); in a result, rows with more than one column are
    dropped, as AgentBench does.
    """
    if answer is None:
        return ["0"]
    if isinstance(answer, str):
        s = answer.strip()
        if s.startswith("[") and s.endswith("]"):
            try:
                parsed = ast.literal_eval(s)
            except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
                return _split_list_text(s[1:-1])
            if isinstance(parsed, list):
                if all(isinstance(x, tuple) for x in parsed):  # a MySQL result: keep one-column rows
                    return [_normalize_special(str(x[0]).strip().strip("'\"")) for x in parsed if len(x) == 1]
                return [_item(x) for x in parsed]
        return [_normalize_special(s.strip().strip("'\""))]
    if isinstance(answer, (list, tuple)):
        return [_item(x) for x in answer]
    return [_normalize_special(str(answer).strip().strip("'\""))]


def _is_float(s: str) -> bool:
    try:
        float(s)
    except (ValueError, TypeError, OverflowError):
        return False
    return True


def _float_equal(a: str, b: str) -> bool:
    try:
        return abs(float(a) - float(b)) <= FLOAT_TOL
    except (ValueError, TypeError, OverflowError):
        return False


def agentbench_answer_match(answer: Any, ground_truth: Any) -> bool:
    """AgentBench's comparison of a committed answer with a select row's ``label``.

    One item each: both ``"0"`` (after normalisation), or numbers within 0.01, or equal strings.
    Otherwise: when every item on both sides is a number, the same count and a greedy one-to-one
    match within 0.01; else **set** equality (duplicates and order do not matter).
    """
    a, g = clean_answer(answer), clean_answer(ground_truth)
    if len(a) == 1 and len(g) == 1:
        x, y = a[0], g[0]
        if x == "0" and y == "0":
            return True
        if _is_float(x) and _is_float(y):
            return _float_equal(x, y)
        return x == y
    if all(_is_float(x) for x in a) and all(_is_float(y) for y in g):
        if len(a) != len(g):
            return False
        used = [False] * len(g)
        for x in a:
            for i, y in enumerate(g):
                if not used[i] and _float_equal(x, y):
                    used[i] = True
                    break
            else:
                return False
        return all(used)
    return set(a) == set(g)


def agentbench_hash_match(state_hash: str, answer_md5: Any) -> bool:
    """A mutation row's check: the tables' hash equals ``answer_md5`` (``"[('<md5>',)]"`` or a bare hash)."""
    return clean_answer(state_hash) == clean_answer(answer_md5)


# ---------------------------------------------------------------------------- tables and the hash
def _canonical_int(s: str) -> bool:
    t = s.strip()
    if t != s or not t.lstrip("-").isdigit() or t.startswith("+"):
        return False
    try:
        n = int(t)
    except ValueError:
        return False
    return str(n) == s and -(2**63) <= n < 2**63


def _render_real(f: float, style: str) -> str:
    if style == "py":
        return repr(f)
    if style.startswith("f"):
        return f"{f:.{int(style[1:])}f}"
    if math.isfinite(f) and f.is_integer() and abs(f) < 1e16:
        return str(int(f))
    return repr(f)


def column_style(values: Sequence[str]) -> str:
    """How a column is stored: ``"int"``, ``"real:<style>"`` or ``"text"`` (see the module docstring).

    ``values`` are the cells as AgentBench stores them (``str(value)``). Empty cells and ``None``
    do not decide the type (they are stored as text either way).
    """
    vals = [v for v in values if v not in ("", "None")]
    if not vals:
        return "text"
    if all(_canonical_int(v) for v in vals):
        return "int"
    try:
        floats = [float(v) for v in vals]
    except (ValueError, OverflowError):
        return "text"
    if not all(math.isfinite(f) for f in floats) or any(v != v.strip() or "_" in v for v in vals):
        return "text"
    decimals = {len(v.split(".", 1)[1]) if "." in v and "e" not in v.lower() else -1 for v in vals}
    styles = ["g", "py"] + ([f"f{decimals.pop()}"] if len(decimals) == 1 and min(decimals) > 0 else [])
    for style in styles:
        if all(_render_real(f, style) == v for f, v in zip(floats, vals, strict=True)):
            return "real:" + style
    return "text"


def render_mysql(value: Any, style: str) -> str | None:
    """The text MySQL holds for a stored SQLite value (``None`` for NULL, which ``CONCAT_WS`` skips)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _render_real(value, style[5:] if style.startswith("real:") else "g")
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8", "surrogateescape"), usedforsecurity=False).hexdigest()


def _select(source: sqlite3.Connection | EpisodeDB, sql: str) -> list[tuple[Any, ...]]:
    """Rows of a trusted query, from a local connection or an episode database (in its worker)."""
    if isinstance(source, EpisodeDB):
        res = source.run(sql)
        if not res.ok:
            raise sqlite3.OperationalError(res.error)
        return res.rows
    return source.execute(sql).fetchall()


def table_md5(conn: sqlite3.Connection | EpisodeDB, name: str, columns: Sequence[str], styles: Sequence[str]) -> str:
    """AgentBench's MySQL hash of one table (``"None"`` for an empty table, as MySQL's NULL prints).

    ``MD5(GROUP_CONCAT(rowhash ORDER BY rowhash))`` with ``rowhash = SUBSTRING(MD5(CONCAT_WS(',',
    cols...)), 1, 5)``; ``GROUP_CONCAT`` stops at 1024 bytes as MySQL's does by default. A table
    the agent dropped (or a column it removed) hashes to a value no gold can have.
    """
    cols = ", ".join('"' + c.replace('"', '""') + '"' for c in columns)
    try:
        rows = _select(conn, f'SELECT {cols} FROM "{name.replace(chr(34), chr(34) * 2)}"')
    except sqlite3.Error as e:
        return f"<error: {e}>"
    if not rows:
        return "None"
    hashes = sorted(
        _md5(",".join(t for t in (render_mysql(v, s) for v, s in zip(r, styles, strict=True)) if t is not None))[:5]
        for r in rows)
    return _md5(",".join(hashes)[:GROUP_CONCAT_MAX_LEN])


def tables_md5(conn: sqlite3.Connection | EpisodeDB, tables: Sequence[dict[str, Any]]) -> str:
    """The hashes of a task's tables, sorted and joined by ``_`` (AgentBench's combined hash)."""
    return "_".join(sorted(table_md5(conn, t["name"], t["columns"], t["styles"]) for t in tables))


_mysql_ci = mysql_ci  # the same function the episode databases' workers register


def register_mysql_collation(conn: sqlite3.Connection) -> None:
    """Make ``COLLATE MYSQL_AI_CI`` (case- and accent-insensitive, trailing spaces significant) usable."""
    conn.create_collation(COLLATION, _mysql_ci)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_text(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _cell_text(v: Any) -> str:
    return str(v)  # what AgentBench inserts: str(value), so JSON null is the text 'None'


def build_tables(tables: list[Any], where: str) -> tuple[str, list[dict[str, Any]]]:
    """The SQLite script that creates a row's tables, and per table its name, columns and styles."""
    out = ["BEGIN;"]
    meta: list[dict[str, Any]] = []
    for t in tables:
        try:
            name = str(t["table_name"])
            cols = [str(c["name"]) for c in t["table_info"]["columns"]]
            rows = t["table_info"]["rows"]
            if not isinstance(rows, list):
                raise TypeError("rows is not a list")
        except (KeyError, TypeError) as e:
            raise ValidationError(f"{ENV}: {where}: a table needs table_name and table_info "
                                  f"{{columns: [{{name, type}}], rows: [...]}} ({e}).") from e
        if any(not isinstance(r, list) or len(r) != len(cols) for r in rows):
            raise ValidationError(f"{ENV}: {where}: table {name!r} has a row whose length differs from its "
                                  f"{len(cols)} columns.")
        text_rows = [[_cell_text(v) for v in r] for r in rows]
        styles = [column_style([r[j] for r in text_rows]) for j in range(len(cols))]
        decl = {"int": "INTEGER", "text": "TEXT"}
        out.append(f"CREATE TABLE {_ident(name)} (" + ", ".join(
            f"{_ident(c)} {decl.get(s, 'REAL')} COLLATE {COLLATION}" for c, s in zip(cols, styles, strict=True)) + ");")
        for r in text_rows:
            out.append(f"INSERT INTO {_ident(name)} VALUES (" + ", ".join(_sql_text(v) for v in r) + ");")
        meta.append({"name": name, "columns": cols, "styles": styles})
    out.append("COMMIT;")
    return "\n".join(out), meta


def snapshot(script: str) -> bytes:
    """Build the tables (with the MySQL collation registered) and return the database bytes."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        register_mysql_collation(conn)
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        conn.executescript(script)
        return conn.serialize()
    finally:
        conn.close()


# ---------------------------------------------------------------------------- MySQL -> SQLite
_ESC = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "%": "\\%", "_": "\\_"}
_DIGIT_IDENT = re.compile(r"(?<![\w$`.])(\d+[A-Za-z_$][\w$]*)")
_NUMBER_EXP = re.compile(r"^\d+[eE][+-]?\d+$")


def mysql_to_sqlite(sql: str) -> str:
    """Translate MySQL-only lexical forms of a statement into SQLite's.

    String literals in single or double quotes (MySQL reads ``"..."`` as a string) are rewritten
    with their backslash escapes resolved (``\\'``, ``\\\\``, ``\\n``...; ``\\%`` and ``\\_`` keep
    the backslash, as in MySQL) and quotes doubled; unquoted identifiers that start with a digit
    (``1st_place``) get backticks. Everything else is kept.
    """
    out: list[str] = []
    i, n = 0, len(sql)
    plain_start = 0

    def flush_plain(end: int) -> None:
        chunk = sql[plain_start:end]
        out.append(_DIGIT_IDENT.sub(lambda m: m.group(1) if _NUMBER_EXP.match(m.group(1)) else f"`{m.group(1)}`", chunk))

    while i < n:
        ch = sql[i]
        if ch == "`":
            j = sql.find("`", i + 1)
            j = n - 1 if j < 0 else j
            flush_plain(i)
            out.append(sql[i:j + 1])
            i = plain_start = j + 1
            continue
        if ch in "'\"":
            flush_plain(i)
            quote, j, buf = ch, i + 1, []
            while j < n:
                c = sql[j]
                if c == "\\" and j + 1 < n:
                    nxt = sql[j + 1]
                    buf.append(_ESC.get(nxt, nxt))
                    j += 2
                    continue
                if c == quote:
                    if j + 1 < n and sql[j + 1] == quote:
                        buf.append(quote)
                        j += 2
                        continue
                    break
                buf.append(c)
                j += 1
            out.append(_sql_text("".join(buf)))
            i = plain_start = j + 1
            continue
        i += 1
    flush_plain(n)
    return "".join(out)


def _sqlite_failure(error: str) -> str:
    """A short, shared reason for a gold statement SQLite rejects."""
    e = error.lower()
    m = re.search(r"no such function: (\w+)", e)
    if m:
        return f"MySQL-only function {m.group(1).upper()}()"
    if "syntax error" in e or "incomplete input" in e or "unrecognized token" in e:
        return "MySQL-only syntax"
    if "no such column" in e or "no such table" in e:
        return "MySQL name resolution (identifier or quoting rules)"
    if "several" in e or "one statement" in e:
        return "several statements in one gold query"
    return "SQLite error: " + re.sub(r"['\"`].*?['\"`]", "...", error)[:60]


# ---------------------------------------------------------------------------- env
class AgentBenchSQLEnv(BaseSQLEnv):
    """AgentBench DB-Bench rows (every type) in SQLite, scored by AgentBench's rules (module docstring).

    Reads a JSONL file (one row per line; a ``.json`` list also works) of AgentBench's dbbench
    format: ``description``, ``table`` (``table_name``, ``table_info.columns[{name, type}]``,
    ``table_info.rows``; or a list of such tables), ``type`` (``["SELECT"]``, ``["INSERT"]``...),
    ``label`` (the answer list, or for a mutation the gold SQL), ``answer_md5`` (mutations),
    optional ``sql.query``, ``add_description`` and ``evidence``.

    Tools: ``execute_sql(query)`` and ``commit_final_answer(answers)`` (AgentBench's names).

    Args:
        path: The JSONL (or JSON) file, e.g. AgentBench's ``data/dbbench/standard.jsonl``.
        split: The split name its tasks get (default ``test``).
        scoring: ``"agentbench"`` (default: AgentBench's rules) or ``"lenient"`` (for training: normalised
            multiset answers with a tolerance; table state compared with the gold SQL's result).
        show_schema: Put the ``CREATE`` statements in the opening message (AgentBench does not; default off).
        timeout_s, max_rows, max_chars, max_db_mb, gold_timeout_s, parser, format_penalty: See
            :class:`~agentgym.envs.sql.env.BaseSQLEnv`.
    """

    collations = (COLLATION,)  # every episode database compares text as MySQL 8 does

    SCORINGS: ClassVar[tuple[str, ...]] = ("agentbench", "lenient")

    def __init__(self, path: str | os.PathLike[str] | None = None, split: str = "test", *,
                 scoring: str = "agentbench", show_schema: bool = False, **kwargs: Any) -> None:
        p = _need_path(path, ENV, "an AgentBench dbbench JSONL file (e.g. data/dbbench/standard.jsonl)")
        if p.is_dir():
            raise ConfigurationError(f"{ENV}: path {str(p)!r} is a folder; pass the JSONL file.")
        if scoring not in self.SCORINGS:
            raise ConfigurationError(f"{ENV}: scoring must be one of {self.SCORINGS}, not {scoring!r}.")
        super().__init__(show_schema=show_schema, **kwargs)
        self.tools.remove("submit")
        self.scoring = scoring
        self.path = p
        self.splits = (split,)  # type: ignore[misc]
        self.default_split = split  # type: ignore[misc]
        self._cache = _SnapshotCache(256 * 1024 * 1024)
        self.load_log = LoadReport(ENV, source=str(p))
        self._tasks = self._load(p, split)
        self.load_log.loaded = len(self._tasks)
        self.load_log.warn(log)
        if not self._tasks:
            raise ConfigurationError(f"{ENV}: {str(p)!r} holds no usable task ({self.load_log.summary()}).")
        self.last_check: dict[str, Any] = {}

    # ------------------------------------------------------------------ loading
    def _load(self, p: Path, split: str) -> list[TaskSpec]:
        tasks: list[TaskSpec] = []
        for i, e in enumerate(read_rows(p, source=ENV)):
            where = f"{p.name} row {i}"
            if not isinstance(e, dict) or "description" not in e or "table" not in e:
                raise ValidationError(f"{ENV}: {where} needs 'description' and 'table'.")
            typ = e.get("type", "SELECT")
            typ = str(typ[0] if isinstance(typ, list) and typ else typ or "SELECT")
            tables = e["table"] if isinstance(e["table"], list) else [e["table"]]
            script, meta = build_tables(tables, where)
            data: dict[str, Any] = {
                "question": str(e["description"]), "add_description": str(e.get("add_description") or ""),
                "evidence": str(e.get("evidence") or ""), "type": typ, "script": script, "tables": meta,
                "row": i,
            }
            item = f"row {i} ({typ})"
            if typ.upper() in MUTATIONS:
                reason = self._prepare_mutation(e, data, script, f"dbbench-{i}")
                if reason is not None:
                    self.load_log.skip(item, reason)
                    continue
            else:
                if "label" not in e or e["label"] is None:
                    self.load_log.skip(item, "select row without a label")
                    continue
                data["label"] = e["label"]
                data["kind"] = "answer"
            tasks.append(TaskSpec(f"dbbench-{i}", split, typ.lower(), data))
        return tasks

    def _prepare_mutation(self, e: dict[str, Any], data: dict[str, Any], script: str, task_id: str) -> str | None:
        """Fill a mutation row's scoring data; return why it cannot be scored here, or ``None``."""
        gold = e.get("label")
        if isinstance(gold, list):
            gold = gold[0] if len(gold) == 1 and isinstance(gold[0], str) else None
        if not isinstance(gold, str) or not gold.strip():
            sql = e.get("sql")
            gold = sql.get("query") if isinstance(sql, dict) else sql
        gold = gold if isinstance(gold, str) and gold.strip() else None
        md5 = e.get("answer_md5")
        md5 = md5 if isinstance(md5, str) and md5.strip() else None
        data["kind"] = "state"
        data["gold_sql"] = gold
        if gold is None and md5 is None:
            return "mutation row without gold SQL or answer_md5"
        snap = snapshot(script)
        initial = self._hash_after(snap, data["tables"], None)[0]
        variants = [gold] if gold is not None else []
        if gold is not None and mysql_to_sqlite(gold) != gold:
            variants.append(mysql_to_sqlite(gold))
        if md5 is None:  # AgentBench hashes the gold SQL's result itself (empty answer_md5)
            assert gold is not None
            for sql in variants:
                h, err = self._hash_after(snap, data["tables"], sql)
                if err is None:
                    data.update(answer_md5=h, expert_sql=sql, md5_source="gold SQL run in SQLite")
                    if sql != gold:
                        self.load_log.note("gold SQL translated from MySQL's dialect")
                    return None
            return "gold SQL fails in SQLite: " + _sqlite_failure(err or "")
        data["answer_md5"] = md5
        if agentbench_hash_match(initial, md5):
            data.update(expert_sql=None, md5_source="answer_md5 (the gold SQL left the tables unchanged in MySQL)")
            self.load_log.note("answer_md5 equals the unchanged tables")
            return None
        if gold is None:
            data.update(expert_sql=None, md5_source="answer_md5 (not verified: no gold SQL)")
            self.load_log.note("answer_md5 not verified (no gold SQL)")
            return None
        errors: list[str] = []
        for sql in variants:
            h, err = self._hash_after(snap, data["tables"], sql)
            if err is not None:
                errors.append(err)
            elif agentbench_hash_match(h, md5):
                data.update(expert_sql=sql, md5_source="answer_md5 (verified: the gold SQL reproduces it in SQLite)")
                if sql != gold:
                    self.load_log.note("gold SQL translated from MySQL's dialect")
                return None
        if len(errors) == len(variants):
            return "gold SQL fails in SQLite: " + _sqlite_failure(errors[-1])
        return "SQLite tables after the gold SQL differ from answer_md5"

    def _hash_after(self, snap: bytes, tables: list[dict[str, Any]], sql: str | None) -> tuple[str, str | None]:
        db = EpisodeDB(snap, timeout_s=self.gold_timeout_s, max_db_bytes=self.max_db_bytes,
                       collations=self.collations)
        try:
            if sql is not None:
                res = db.run(sql)
                if not res.ok:
                    return "", str(res.error)
            return tables_md5(db, tables), None
        finally:
            db.close()

    def tasks(self, split: str = "test") -> Sequence[TaskSpec]:
        return self._tasks if split in self.splits else []

    # ------------------------------------------------------------------ episode
    def _snapshot(self, task: TaskSpec) -> bytes:
        return self._cache.get(task.task_id, lambda: snapshot(str(task.data["script"])))

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT + " " + self.parser.format_instructions(self.tools)

    def _question(self, task: TaskSpec) -> str:
        d = task.data
        q = ""
        if d.get("evidence"):
            q += f"Evidence about the question: {d['evidence']}\n"
        if d.get("add_description"):
            q += f"Additional table information about the question: {d['add_description']}\n"
        return q + "Question: " + str(d["question"])

    def reset_task(self, task: TaskSpec) -> list[Message]:
        self.last_check = {}
        if self.db is not None:
            self.db.close()
        self.db = self._new_db(task)
        parts = []
        if self.show_schema:
            rows = _select(self.db, "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL ORDER BY rowid")
            parts.append("Database schema:\n" + "\n".join(r[0].strip() + ";" for r in rows))
        parts.append(self._question(task))
        return [
            {"role": "system", "content": self.system_prompt()},
            {"role": "user", "content": "\n\n".join(parts)},
        ]

    # ------------------------------------------------------------------ tools
    @tool
    def commit_final_answer(self, answers: list[str | int | float | None] | str | int | float | None = None) -> str:
        """Commit your final answer; this ends the episode.

        Args:
            answers: The answer values, e.g. ["42"] or ["Norway", "Sweden"]. For a question that asks you to
                modify the database, make the change with execute_sql first; the answer can then be anything.

        Returns:
            Whether the task was solved.
        """
        task = self._require_task()
        self.count("submissions")
        ok = self._score_commit(task, answers)
        self.finish(1.0 if ok else 0.0, ok)
        return ("Correct." if ok else "Incorrect.") + " The episode is over."

    def _score_commit(self, task: TaskSpec, answers: Any) -> bool:
        d = task.data
        db = self._require_db()
        if d["kind"] == "answer":
            if self.scoring == "agentbench":
                ok = agentbench_answer_match(answers, d["label"])
            else:
                pred = answers if isinstance(answers, list) else clean_answer(answers)
                gold = d["label"] if isinstance(d["label"], list) else [d["label"]]
                ok = answers_match(pred, gold)
            self.last_check = {"kind": "answer", "scoring": self.scoring, "answer": answers, "label": d["label"]}
            return ok
        state = tables_md5(db, d["tables"])
        if self.scoring == "agentbench" or str(d.get("md5_source", "")).startswith("answer_md5 (not verified"):
            ok = agentbench_hash_match(state, d["answer_md5"])
            self.last_check = {"kind": "state", "scoring": "agentbench", "hash": state, "answer_md5": d["answer_md5"]}
            return ok
        ok = db.state_hash() == self._gold_state_hash(task)
        self.last_check = {"kind": "state", "scoring": "lenient", "hash": state}
        return ok

    def _gold_state_hash(self, task: TaskSpec) -> str:
        h = self._gold_state.get(task.task_id)
        if h is None:
            ref = self._new_db(task)
            ref.timeout_s = self.gold_timeout_s
            try:
                sql = task.data.get("expert_sql")
                if sql:
                    res = ref.run(str(sql))
                    if not res.ok:
                        raise ValidationError(f"gold SQL of task {task.task_id!r} fails: {res.error}")
                h = ref.state_hash()
            finally:
                ref.close()
            self._gold_state[task.task_id] = h
        return h

    # ------------------------------------------------------------------ expert
    def expert_action(self) -> str | None:
        """The oracle: commits the label (select rows); runs the gold SQL, then commits (mutation rows)."""
        if self.task is None or self.done:
            return None
        d = self.task.data
        if d["kind"] == "state" and d.get("expert_sql") and self.db is not None and \
                not agentbench_hash_match(tables_md5(self.db, d["tables"]), d["answer_md5"]):
            return self._call("execute_sql", {"query": str(d["expert_sql"])})
        answers = d["label"] if d["kind"] == "answer" else []
        return self._call("commit_final_answer", {"answers": answers})

    def _call(self, name: str, args: dict[str, Any]) -> str:
        if self.parser.name == "react":
            (value,) = args.values()
            return f"Action: {name}[{value if isinstance(value, str) else json.dumps(value)}]"
        call = {"name": name, "arguments": args}
        if self.parser.name == "json":
            return json.dumps(call)
        return f"<tool_call>{json.dumps(call)}</tool_call>"

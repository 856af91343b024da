"""The SQL worker: one process that holds one episode database at a time (stdlib only; read as text
by :mod:`.db` and started with ``python -I -S -c``). The host imports one thing from it,
:func:`table_state_hash`, so that the scoring hash is written once; importing it has no effects.

Protocol on stdin/stdout: frames of a 4-byte big-endian length + ``marshal`` payload. Requests are
tuples ``(op, *args)``; every request gets exactly one answer. The host kills this process when a
statement runs past its deadline inside a single SQLite call (which no progress handler can
interrupt), so nothing here needs to be interruptible.
"""

import contextlib
import hashlib
import marshal
import math
import os
import re
import resource
import sqlite3
import struct
import sys
import time
import unicodedata
from collections.abc import Iterable
from functools import lru_cache

PAGE_SIZE = 4096
READ_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "foreign_key_check", "collation_list", "function_list", "pragma_list",
    "integrity_check", "quick_check",
})
DENY_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})
READ_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                          sqlite3.SQLITE_PRAGMA, getattr(sqlite3, "SQLITE_RECURSIVE", 33)})
MAX_FETCH = 1_000_000


@lru_cache(maxsize=65536)
def _ci_key(s):
    return "".join(ch for ch in unicodedata.normalize("NFKD", s) if not unicodedata.combining(ch)).casefold()


def mysql_ci(a, b):
    """MySQL 8's default collation, approximately: case- and accent-insensitive, trailing spaces significant."""
    ka, kb = _ci_key(a), _ci_key(b)
    return (ka > kb) - (ka < kb)


COLLATIONS = {"MYSQL_AI_CI": mysql_ci}  # collations an episode may ask for, by name


class Episode:
    def __init__(self, snapshot, readonly_path, max_db_bytes, max_value_bytes, max_sql_chars, max_memory_mb,
                 collations=()):
        self.deadline = math.inf
        self.wrote = False
        if readonly_path is not None:
            conn = sqlite3.connect("file:%s?mode=ro" % readonly_path, uri=True, isolation_level=None)
            conn.execute("PRAGMA query_only = 1")
            size = 0
        else:
            conn = sqlite3.connect(":memory:", isolation_level=None)
            conn.deserialize(snapshot)
            size = len(snapshot)
        cap = max(int(max_db_bytes), size + 1024 * 1024)  # a big source may still grow 1 MiB
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0]) or PAGE_SIZE
        pages = -(-cap // page_size)
        if readonly_path is None:
            conn.execute("PRAGMA main.max_page_count=%d" % pages)
        conn.execute("PRAGMA temp_store = MEMORY")  # temp tables, sorts and indexes never touch the disk
        conn.execute("PRAGMA temp.max_page_count=%d" % pages)
        conn.execute("PRAGMA hard_heap_limit = %d" % (int(max_memory_mb) << 20))
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, int(max_value_bytes))
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, int(max_sql_chars))
        conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 10_000)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        for name in collations:
            conn.create_collation(name, COLLATIONS[name])
        conn.set_authorizer(self.authorize)
        conn.set_progress_handler(self.progress, 1000)
        self.conn = conn

    def authorize(self, action, arg1, arg2, db, trigger):
        if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_PRAGMA:
            if (arg1 or "").lower() in READ_PRAGMAS or arg2 is None:
                return sqlite3.SQLITE_OK  # PRAGMA x, or PRAGMA table_info(t)
            return sqlite3.SQLITE_DENY  # PRAGMA x = value: a write
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in DENY_FUNCTIONS:
            return sqlite3.SQLITE_DENY
        if action not in READ_ACTIONS:
            self.wrote = True
        return sqlite3.SQLITE_OK

    def progress(self):
        return 1 if time.perf_counter() > self.deadline else 0

    def run(self, sql, max_rows, timeout_s):
        """``(columns, rows, truncated, rowcount, error, timed_out, wrote)``."""
        self.deadline = time.perf_counter() + timeout_s
        self.wrote = False
        try:
            try:
                cur = self.conn.execute(sql)
            except sqlite3.ProgrammingError as e:
                if "one statement at a time" not in str(e):
                    raise
                first, rest = first_statement(sql)
                if not only_separators(rest):
                    return [], [], False, -1, ("execute_sql runs one statement per call; this call held several, "
                                               "so none of them was run. Send them in separate calls."), False, False
                self.wrote = False
                cur = self.conn.execute(first)
            cols = [d[0] for d in cur.description] if cur.description else []
            limit = MAX_FETCH if max_rows is None else max_rows
            rows = cur.fetchmany(limit + 1)
            truncated = len(rows) > limit
            if truncated and max_rows is None:
                cur.close()
                return [], [], False, -1, "the result has more than %d rows" % MAX_FETCH, False, False
            rows = [tuple(r) for r in rows[:limit]]
            rowcount = cur.rowcount
            cur.close()
            return cols, rows, truncated, rowcount, None, False, self.wrote
        except sqlite3.OperationalError as e:
            if str(e) == "interrupted":
                self.recover()
                return [], [], False, -1, "interrupted", True, False
            return [], [], False, -1, str(e), False, False
        except (sqlite3.Error, OverflowError, ValueError, MemoryError) as e:
            return [], [], False, -1, str(e) or type(e).__name__, False, False
        finally:
            self.deadline = math.inf

    def recover(self):
        """After an interrupt sqlite rolls the statement back; end any transaction it left open."""
        if self.conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")

    def state_hash(self, tables):
        return table_state_hash(self.conn, tables)


def table_state_hash(conn: sqlite3.Connection, tables: Iterable[str] | None = None) -> str:
    """A digest of the contents of ``tables`` (default: every user table), row order ignored.

    Numbers are canonicalised (``3 == 3.0``; floats rounded to 6 decimals) so that equivalent
    arithmetic in a different order hashes the same. The one implementation: the host imports it
    from here (:func:`agentgym.envs.sql.db.table_state_hash`), so both sides hash byte-identically.
    """
    if tables is None:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    h = hashlib.sha256()
    for name in sorted(tables):
        quoted = '"' + name.replace('"', '""') + '"'
        try:
            rows = conn.execute("SELECT * FROM %s" % quoted).fetchall()
        except sqlite3.Error:
            h.update(("<missing %s>" % name).encode())
            continue
        encoded = sorted("\x1f".join(hash_cell(v) for v in r) for r in rows)
        h.update(("\x1e%s\x1d%d\x1d" % (name, len(rows))).encode())
        for line in encoded:
            h.update(line.encode("utf-8", "surrogatepass"))
            h.update(b"\x1e")
    return h.hexdigest()


def hash_cell(v):
    if v is None:
        return "N"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f = float(v)
        if math.isfinite(f) and f == round(f):
            return "I%d" % int(f)
        return "F%r" % round(f, 6)
    if isinstance(v, bytes):
        return "B" + v.hex()
    return "S" + str(v)


_SEMI = re.compile(";")


def first_statement(sql):
    """Split off the first complete statement (strings, comments and triggers respected)."""
    for m in _SEMI.finditer(sql):
        head = sql[: m.end()]
        if sqlite3.complete_statement(head):
            return head, sql[m.end():]
    return sql, ""


def only_separators(rest):
    """Whether ``rest`` holds nothing but semicolons, whitespace and comments."""
    i, n = 0, len(rest)
    while i < n:
        c = rest[i]
        if c.isspace() or c == ";":
            i += 1
        elif rest.startswith("--", i):
            j = rest.find("\n", i)
            i = n if j < 0 else j + 1
        elif rest.startswith("/*", i):
            j = rest.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            return False
    return True


def read_frame(f):
    head = f.read(4)
    if len(head) < 4:
        return None
    n = struct.unpack(">I", head)[0]
    body = f.read(n)
    return None if len(body) < n else marshal.loads(body)


def write_frame(f, obj):
    data = marshal.dumps(obj)
    f.write(struct.pack(">I", len(data)) + data)
    f.flush()


def main():
    limit_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if limit_mb > 0:  # a runaway query runs out of memory here, never on the host
        resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    rf = os.fdopen(os.dup(0), "rb")
    wf = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    ep = None
    while True:
        resp: tuple = ("err", "no answer")
        req = read_frame(rf)
        if req is None:
            return
        op = req[0]
        try:
            if op in ("open", "close"):
                if ep is not None:
                    ep.conn.close()
                    ep = None
                if op == "open":
                    ep = Episode(*req[1:])
                resp = ("ok",)
            elif ep is None:
                resp = ("err", "no database is open")
            elif op == "run":
                resp = ("ok", *ep.run(*req[1:]))
            elif op == "hash":
                resp = ("ok", ep.state_hash(req[1]))
            elif op == "in_tx":
                resp = ("ok", ep.conn.in_transaction)
            else:
                resp = ("err", "unknown op %r" % (op,))
        except BaseException as e:  # a broken request (or no episode open): say so, keep serving
            resp = ("err", "%s: %s" % (type(e).__name__, e))
        write_frame(wf, resp)


if __name__ == "__main__":
    main()

"""The sandboxed episode database and the comparison helpers, against real SQLite."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from agentgym.envs.sql.db import (
    EpisodeDB,
    QueryResult,
    answers_match,
    format_result,
    has_order_by,
    normalise_answer,
    results_match,
    snapshot_from_file,
    snapshot_from_sql,
    table_state_hash,
)

SCRIPT = """
CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT, age INTEGER);
INSERT INTO people VALUES (1, 'Ada', 36), (2, 'Alan', 41), (3, 'Grace', 85);
"""


@pytest.fixture(scope="module")
def snap() -> bytes:
    return snapshot_from_sql(SCRIPT)


@pytest.fixture
def db(snap: bytes):
    d = EpisodeDB(snap, timeout_s=0.3)
    yield d
    d.close()


def count(db: EpisodeDB) -> int:
    res = db.run("SELECT COUNT(*) FROM people")
    assert res.ok, res.error
    return int(res.rows[0][0])


def test_episodes_are_isolated_from_each_other(snap: bytes) -> None:
    a, b = EpisodeDB(snap), EpisodeDB(snap)
    try:
        assert a.run("DROP TABLE people").ok
        assert not a.run("SELECT * FROM people").ok
        assert count(b) == 3
        assert b.run("DELETE FROM people WHERE id = 1").rowcount == 1
        c = EpisodeDB(snap)
        assert count(c) == 3  # a fresh episode sees the pristine snapshot
        c.close()
    finally:
        a.close()
        b.close()


def test_source_file_is_never_modified(tmp_path: Path) -> None:
    path = tmp_path / "src.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(SCRIPT)
    conn.close()
    before = path.read_bytes()
    ep = EpisodeDB(snapshot_from_file(str(path)))
    assert ep.run("DELETE FROM people").rowcount == 3
    assert ep.run("DROP TABLE people").ok
    assert ep.run("CREATE TABLE junk (x)").ok
    ep.close()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.sqlite"]


def test_attach_and_vacuum_into_are_denied(db: EpisodeDB, tmp_path: Path) -> None:
    target = tmp_path / "x.db"
    res = db.run(f"ATTACH DATABASE '{target}' AS x")
    assert not res.ok and "not authorized" in (res.error or "")
    res = db.run(f"VACUUM INTO '{target}'")
    assert not res.ok
    assert not target.exists()


def test_load_extension_is_denied(db: EpisodeDB) -> None:
    res = db.run("SELECT load_extension('/tmp/evil.so')")
    assert not res.ok and "not authorized" in (res.error or "")


@pytest.mark.parametrize("pragma", ["PRAGMA max_page_count = 1000000", "PRAGMA journal_mode = WAL",
                                    "PRAGMA writable_schema = ON", "PRAGMA foreign_keys = 1"])
def test_pragma_writes_are_denied(db: EpisodeDB, pragma: str) -> None:
    res = db.run(pragma)
    assert not res.ok and "not authorized" in (res.error or ""), pragma


def test_pragma_reads_are_allowed(db: EpisodeDB) -> None:
    res = db.run("PRAGMA table_info(people)")
    assert res.ok and [r[1] for r in res.rows] == ["id", "name", "age"]
    assert db.run("PRAGMA page_count").ok


def test_size_cap_stops_growth(snap: bytes) -> None:
    ep = EpisodeDB(snap, max_db_bytes=256 * 1024)
    try:
        assert ep.run("CREATE TABLE big (x TEXT)").ok
        res = ep.run("INSERT INTO big WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5000) "
                     "SELECT hex(randomblob(200)) FROM r")
        assert not res.ok and "full" in (res.error or "")
        assert count(ep) == 3  # the database still works
        res = ep.run("CREATE TEMP TABLE t AS WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r "
                     "WHERE n < 5000) SELECT hex(randomblob(200)) AS x FROM r")
        assert not res.ok and "full" in (res.error or "")
    finally:
        ep.close()


def test_huge_value_is_refused(db: EpisodeDB) -> None:
    res = db.run("SELECT length(randomblob(50000000))")
    assert not res.ok and "too big" in (res.error or "")


def test_runaway_recursive_cte_times_out(db: EpisodeDB) -> None:
    t0 = time.perf_counter()
    res = db.run("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT max(n) FROM r")
    elapsed = time.perf_counter() - t0
    assert res.timed_out and not res.ok and "timed out" in (res.error or "")
    assert elapsed < 3.0
    assert count(db) == 3  # usable afterwards


def test_timed_out_write_is_rolled_back(db: EpisodeDB) -> None:
    res = db.run("INSERT INTO people (name, age) WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
                 "SELECT 'x', n FROM r")
    assert res.timed_out
    assert count(db) == 3
    assert not db.in_transaction()


def test_multiple_statements_run_nothing(db: EpisodeDB) -> None:
    res = db.run("INSERT INTO people VALUES (9, 'Eve', 20); DELETE FROM people")
    assert not res.ok and "one statement per call" in (res.error or "")
    assert count(db) == 3
    # one statement with trailing semicolons and a comment is fine
    res = db.run("SELECT name FROM people WHERE id = 1; -- done\n")
    assert res.ok and res.rows == [("Ada",)]


def test_sql_error_is_a_result(db: EpisodeDB) -> None:
    res = db.run("SELEC nonsense")
    assert not res.ok and "syntax error" in (res.error or "")
    assert format_result(res, max_rows=5, max_chars=100).startswith("Error: ")


def test_format_states_row_and_char_caps(db: EpisodeDB) -> None:
    res = db.run("SELECT name, age FROM people ORDER BY id", max_rows=2)
    assert res.truncated and len(res.rows) == 2
    text = format_result(res, max_rows=2, max_chars=10_000)
    assert "name | age" in text and "Ada | 36" in text and "Grace" not in text
    assert "only the first 2 rows" in text and "(2+ rows)" in text
    res = db.run("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 500) SELECT n FROM r",
                 max_rows=1000)
    text = format_result(res, max_rows=1000, max_chars=200)
    assert "output cut to 200 characters" in text
    assert len(text) < 400
    write = db.run("UPDATE people SET age = age + 1")
    assert format_result(write, max_rows=5, max_chars=100) == "OK. 3 row(s) affected."


def test_results_match_rules() -> None:
    gold = [("a", 1), ("b", 2), ("b", 2)]
    assert results_match([("b", 2), ("a", 1), ("b", 2)], gold)
    assert not results_match([("b", 2), ("a", 1), ("b", 2)], gold, ordered=True)
    assert not results_match([("a", 1), ("b", 2)], gold)  # multiset: the duplicate matters
    assert results_match([("a", 1.0000000001), ("b", 2.0), ("b", 2)], gold)
    assert not results_match([("a", 1.01), ("b", 2), ("b", 2)], gold)
    assert results_match([(1, "a"), (2, "b"), (2, "b")], gold)  # column order
    assert not results_match([(1, "a"), (2, "b"), (2, "b")], gold, column_permutations=False)
    assert not results_match([], gold)
    assert results_match([], [])
    assert has_order_by("SELECT a FROM t ORDER  BY a") and not has_order_by("SELECT border FROM t")


def test_answers_match_normalises() -> None:
    assert answers_match([" Ada ", "1,234", "12%"], ["ada", "1234", 12])
    assert answers_match(["3.14159"], ["3.14"])  # AgentBench-style tolerance
    assert answers_match(["b", "a"], ["a", "b"])
    assert not answers_match(["a"], ["a", "a"])
    assert not answers_match(["Ada"], ["Alan"])
    assert not answers_match(["3.2"], ["3.14"])
    assert normalise_answer("'NULL'") is None
    assert normalise_answer("  New   York ") == "new york"


PINNED_SCRIPT = """
CREATE TABLE people (id INTEGER, name TEXT, score REAL, blob BLOB);
INSERT INTO people VALUES (2, 'Zoë', 3.0, NULL), (1, 'Ada', 2.5, x'00ff'), (3, NULL, 0.1234567, x''), (4, 'x"y', -7, NULL);
CREATE TABLE "odd ""name" (v);
INSERT INTO "odd ""name" VALUES (1e300), (-0.0), ('3');
"""


def test_table_state_hash_is_pinned(snap: bytes) -> None:
    """Gold states are hashed when a task is scored, so the digest must never drift: pinned on a fixed
    table (text with a non-ASCII letter and a quote, NULLs, blobs, 3.0 vs 3, rounding, -0.0, a huge
    float, a quoted table name, a missing table), from the host's function and from the worker."""
    local = sqlite3.connect(":memory:")
    local.executescript(PINNED_SCRIPT)
    pinned = {
        None: "67c5b0f5fcbdf8381a2dad0471dc0ccebcee8d4d2adf570156b4718abbf1df35",
        ("people",): "cdfdaa0d6f4b68eddd25f55f1557b6a20c05ec89678a122d31b90c4b545be614",
        ("missing", "people"): "a34a619770d85a6516ffee6db34ce32a5d24bce7a7957b2a97cb6c80a7ac3f7f",
    }
    try:
        for tables, digest in pinned.items():
            assert table_state_hash(local, tables) == digest
        db = EpisodeDB(snap)
        try:
            db.run("DROP TABLE people")
            for stmt in PINNED_SCRIPT.strip().split(";\n"):
                db.run(stmt)
            for tables, digest in pinned.items():
                assert db.state_hash(tables) == digest  # the worker process hashes with the same code
        finally:
            db.close()
    finally:
        local.close()


def test_table_state_hash(snap: bytes) -> None:
    a, b = EpisodeDB(snap), EpisodeDB(snap)
    try:
        assert a.state_hash() == b.state_hash()
        # same contents in another physical order and with 3 vs 3.0
        a.run("DELETE FROM people WHERE id = 1")
        a.run("INSERT INTO people VALUES (1, 'Ada', 36.0)")
        assert a.state_hash() == b.state_hash()
        a.run("UPDATE people SET age = 37 WHERE id = 1")
        assert a.state_hash() != b.state_hash()
        assert a.state_hash(["people"]) != b.state_hash(["people"])
        local = sqlite3.connect(":memory:")
        local.executescript(SCRIPT)
        assert b.state_hash() == table_state_hash(local)  # the worker hashes exactly as the host does
        local.close()
        b.run("CREATE TABLE extra (x)")
        a.run("UPDATE people SET age = 36 WHERE id = 1")
        assert a.state_hash() != b.state_hash()  # a new table is part of the state
    finally:
        a.close()
        b.close()


def test_query_result_ok_flag() -> None:
    assert QueryResult([], []).ok and not QueryResult([], [], error="x").ok


# ------------------------------------------------------------------------------ hardening (issue 11)
BIG = "printf('%.*c', {n}, 'a')"


def test_a_statement_stuck_in_one_sqlite_call_ends_at_its_deadline(snap: bytes) -> None:
    """trim() on two large strings is one C call (O(n*m)) that no progress handler can interrupt."""
    ep = EpisodeDB(snap, timeout_s=1.0)
    try:
        assert ep.run("INSERT INTO people VALUES (4, 'Kay', 50)").ok
        assert ep.run("CREATE TABLE notes (x TEXT)").ok
        assert ep.run("INSERT INTO notes VALUES ('kept')").ok
        a, b = BIG.format(n=999_000), BIG.format(n=80_000).replace("'a'", "'b'")  # trim's set is capped at ~83k
        for sql in (f"SELECT length(trim({a}, {b} || 'a'))",
                    f"SELECT instr({BIG.format(n=999_000)}, {BIG.format(n=450_000)} || 'b')"):
            t0 = time.monotonic()
            res = ep.run(sql)
            took = time.monotonic() - t0
            assert res.timed_out and not res.ok, res
            assert took < 1.0 + 2.0, f"the statement ran {took:.1f} s under a 1 s limit"
            assert count(ep) == 4, "the episode's earlier changes must survive"
            assert ep.run("SELECT x FROM notes").rows == [("kept",)]
    finally:
        ep.close()


def _written_chars() -> int:
    """Bytes written (write syscalls) by this process and its children, from /proc/*/io."""
    import os

    me = os.getpid()
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if int(name) != me and ppid != me:
                continue
            with open(f"/proc/{name}/io") as f:
                total += int(next(ln for ln in f if ln.startswith("wchar:")).split()[1])
        except (OSError, StopIteration, ValueError):
            continue
    return total


def test_huge_sorts_stay_in_memory_under_the_cap(snap: bytes) -> None:
    ep = EpisodeDB(snap, timeout_s=2.5)
    try:
        assert ep.run("PRAGMA temp_store").rows == [(2,)]
        assert not ep.run("PRAGMA temp_store = 0").ok
        assert not ep.run("PRAGMA hard_heap_limit = 0").ok
        before = _written_chars()
        t0 = time.monotonic()
        res = ep.run("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 3000000) "
                     "SELECT i % 1000003, count(*), max(randomblob(300)) FROM c GROUP BY 1 ORDER BY 3")
        # a guard against a hang, with slack for a loaded 2-core machine (it took 4.6 s beside a vLLM eval); a
        # timeout that does not fire is caught below: unbounded, this query ends in the row cap, not memory/timeout
        assert time.monotonic() - t0 < 2.5 + 5.0
        written = _written_chars() - before
        assert written < 50 << 20, f"the sort wrote {written >> 20} MB of temporary files"
        assert not res.ok and ("memory" in (res.error or "") or res.timed_out), res
        assert count(ep) == 3
    finally:
        ep.close()


def test_trailing_semicolons_are_one_statement(db: EpisodeDB) -> None:
    for sql in ("SELECT 1;;", "SELECT 1 ; ;\n; -- end", "SELECT 1; /* c */ ;", "SELECT ';;' ;;"):
        res = db.run(sql)
        assert res.ok and len(res.rows) == 1, (sql, res)
    for sql in ("SELECT 1;; SELECT 2", "SELECT 1; x", "DELETE FROM people;; DELETE FROM people"):
        res = db.run(sql)
        assert not res.ok and "one statement per call" in (res.error or ""), (sql, res)
    assert count(db) == 3

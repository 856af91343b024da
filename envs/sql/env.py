"""Multi-turn text-to-SQL environments over sandboxed SQLite.

The agent explores a database with ``execute_sql`` and ends the episode with ``submit``. Three
task kinds decide how ``submit`` is scored:

* ``query`` (built-in SELECT tasks, Spider/BIRD): **execution match**. ``submit(query=...)`` runs
  the query on the episode database; reward 1 if its rows equal the gold query's rows as a
  multiset (as a list when the gold query has ``ORDER BY``), numbers within a tolerance.
* ``answer`` (AgentBench SELECT-like types): **answer match**. ``submit(answer=[...])`` is compared
  with the label list after normalisation (trimmed, case-folded text; numbers within 0.01).
  ``submit(query=...)`` also works: the result's cells, flattened row by row, are the answer.
* ``state`` (INSERT/UPDATE/DELETE tasks): **table-state match**. The hash of every user table
  after the episode must equal the hash after running the gold SQL on a fresh copy. Make the
  changes with ``execute_sql`` and call ``submit()``, or pass the change as ``submit(query=...)``
  (run once, just before the check).

``submit`` always ends the episode. A submission that cannot be scored (the field the task needs
is missing, or the submitted query fails) gets ``-format_penalty``; so does an unparseable turn.

Each episode runs on its own in-memory copy of the database (:class:`~.db.EpisodeDB`), so nothing
an agent does (``DROP``, ``UPDATE``, ``DELETE``) reaches the source or another episode. See
:mod:`.db` for the safety rules (authorizer, size cap, per-query timeout, one statement per call).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentgym.core import AgentEnv
from agentgym.errors import ConfigurationError, ValidationError
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec

from .db import (
    EpisodeDB,
    answers_match,
    flatten_rows,
    format_result,
    has_order_by,
    results_match,
    snapshot_from_file,
)

__all__ = ["BaseSQLEnv", "SQLEnv", "SpiderSQLEnv"]

log = logging.getLogger(__name__)
KINDS = ("query", "answer", "state")
MAX_ANSWER_ROWS = 10_000  # rows fetched when a query stands in for an answer list


class BaseSQLEnv(AgentEnv):
    """Shared episode logic: the sandboxed database, the two tools, scoring and the expert.

    Subclasses implement :meth:`tasks` and :meth:`_snapshot` (the database bytes of a task).

    Args:
        timeout_s: Per-query deadline (sqlite progress handler); a query past it is stopped.
        max_rows: Rows shown per ``execute_sql`` result.
        max_chars: Characters shown per ``execute_sql`` result.
        max_db_mb: Size cap of the episode database, in MiB.
        gold_timeout_s: Deadline for running a task's gold SQL (once per task, at its first reset).
        show_schema: Put the ``CREATE`` statements in the opening message.
        parser: ``hermes`` (default), ``json`` or ``react``.
        format_penalty: Subtracted for an unparseable turn or an unscorable submission.
    """

    family = "sql"

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        max_rows: int = 50,
        max_chars: int = 4000,
        max_db_mb: float = 64.0,
        gold_timeout_s: float = 60.0,
        show_schema: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if timeout_s <= 0 or max_rows <= 0 or max_chars <= 0 or max_db_mb <= 0:
            raise ConfigurationError("timeout_s, max_rows, max_chars and max_db_mb must be positive.")
        self.timeout_s = float(timeout_s)
        self.max_rows = int(max_rows)
        self.max_chars = int(max_chars)
        self.max_db_bytes = int(max_db_mb * 1024 * 1024)
        self.gold_timeout_s = float(gold_timeout_s)
        self.show_schema = bool(show_schema)
        self.db: EpisodeDB | None = None
        self._gold_rows: dict[str, list[tuple[Any, ...]]] = {}
        self._gold_state: dict[str, str] = {}
        self._schema_text: dict[str, str] = {}
        # State the real caps in the tool's schema (the docstring cannot know them).
        self.tools["execute_sql"].description = (
            "Run one SQLite statement on your private copy of the database. A call holding several statements "
            "is rejected and none of them runs.\n\nReturns: the result as a table with a row count, cut to at most "
            f"{self.max_rows} rows and {self.max_chars} characters (a note says so when it is cut); "
            "'OK. N row(s) affected.' for a change; or 'Error: ...' for a failed or disallowed statement, or one "
            f"that ran longer than {self.timeout_s:g} s and was stopped."
        )

    # ------------------------------------------------------------------ hooks
    def _snapshot(self, task: TaskSpec) -> bytes:
        """The serialised source database of ``task``."""
        raise NotImplementedError

    def _question(self, task: TaskSpec) -> str:
        return str(task.data["question"])

    def _db_key(self, task: TaskSpec) -> str:
        return str(task.data.get("db_id", task.task_id))

    # ------------------------------------------------------------------ episode
    collations: tuple[str, ...] = ()  # named collations every episode database registers

    def _new_db(self, task: TaskSpec) -> EpisodeDB:
        return EpisodeDB(self._snapshot(task), timeout_s=self.timeout_s, max_db_bytes=self.max_db_bytes,
                         collations=self.collations)

    def system_prompt(self) -> str:
        return (
            "You answer questions about a SQLite database. Explore it with execute_sql (one SQL statement "
            f"per call; results show at most {self.max_rows} rows and {self.max_chars} characters; each "
            f"query is stopped after {self.timeout_s:g} s). The database is a private sandbox: nothing you "
            "do changes the original or other episodes. When done, call submit exactly once; it ends the episode. "
            + self.parser.format_instructions(self.tools)
        )

    def _instructions(self, kind: str) -> str:
        if kind == "query":
            return "When you are sure, call submit with query set to one SQL SELECT statement that answers the question."
        if kind == "answer":
            return ("When you are sure, call submit with answer set to the list of values that answer the question, "
                    'e.g. {"answer": ["42"]}.')
        return ("Make the requested change with execute_sql, then call submit with no arguments "
                "(or pass the change itself as query).")

    def reset_task(self, task: TaskSpec) -> list[Message]:
        if self.db is not None:
            self.db.close()
        kind = task.data.get("kind", "query")
        if kind not in KINDS:
            raise ValidationError(f"task {task.task_id!r} has kind {kind!r}; expected one of {KINDS}.")
        self.db = self._new_db(task)
        if kind == "query" and task.task_id not in self._gold_rows:
            self.db.timeout_s = self.gold_timeout_s
            try:
                res = self.db.run(str(task.data["sql"]))
            finally:
                self.db.timeout_s = self.timeout_s
            if not res.ok:
                raise ValidationError(f"gold SQL of task {task.task_id!r} fails: {res.error}")
            self._gold_rows[task.task_id] = res.rows
        parts = []
        if self.show_schema:
            key = self._db_key(task)
            if key not in self._schema_text:
                res = self.db.run(
                    "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
                    "ORDER BY CASE type WHEN 'table' THEN 0 ELSE 1 END, rowid")
                if not res.ok:
                    raise ValidationError(f"cannot read the schema of task {task.task_id!r}: {res.error}")
                self._schema_text[key] = "\n".join(str(r[0]).strip() + ";" for r in res.rows)
            parts.append("Database schema:\n" + self._schema_text[key])
        parts.append("Question: " + self._question(task))
        parts.append(self._instructions(kind))
        return [
            {"role": "system", "content": self.system_prompt()},
            {"role": "user", "content": "\n\n".join(parts)},
        ]

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None
        super().close()

    # ------------------------------------------------------------------ tools
    @tool
    def execute_sql(self, query: str) -> str:
        """Run one SQLite statement on your private copy of the database.

        Args:
            query: Exactly one SQL statement (SELECT, or INSERT/UPDATE/DELETE/CREATE to change the copy).

        Returns:
            The result as a table with a row count (at most max_rows rows and max_chars characters; a note
            says when output was cut), "OK. N row(s) affected." for a change, or "Error: ..." for a failed,
            timed-out or disallowed statement.
        """
        db = self._require_db()
        res = db.run(query, max_rows=self.max_rows)
        self.count("sql_queries")
        if not res.ok:
            self.count("sql_errors")
            if res.timed_out:
                self.count("sql_timeouts")
        return format_result(res, max_rows=self.max_rows, max_chars=self.max_chars)

    @tool
    def submit(self, query: str | None = None, answer: list[str | int | float | None] | None = None) -> str:
        """Submit your final result; this ends the episode.

        Args:
            query: For question tasks, one SELECT statement whose result answers the question. For change
                tasks, an optional change to run before the check.
            answer: For tasks that ask for values, the list of answer values.

        Returns:
            Whether the submission was correct.
        """
        task = self._require_task()
        kind = task.data.get("kind", "query")
        self.count("submissions")
        try:
            ok, note = self._score(task, kind, query, answer)
        except _Unscorable as e:
            self.count("bad_submissions")
            self.finish(-self.format_penalty, False)
            return f"Submission not accepted: {e} The episode is over."
        self.finish(1.0 if ok else 0.0, ok)
        return ("Correct." if ok else "Incorrect.") + (f" {note}" if note else "")

    # ------------------------------------------------------------------ scoring
    def _score(self, task: TaskSpec, kind: str, query: str | None, answer: Sequence[Any] | None) -> tuple[bool, str]:
        db = self._require_db()
        query = query.strip() if isinstance(query, str) else None
        if kind == "answer" and query and query.startswith("[") and answer is None:
            try:  # react-style submit[["a", "b"]]
                parsed = json.loads(query)
            except json.JSONDecodeError:
                parsed = None
            if isinstance(parsed, list):
                answer, query = parsed, None
        if kind == "query":
            if not query:
                raise _Unscorable("this task is scored by execution match; pass query='SELECT ...'.")
            gold = self._gold_rows[task.task_id]
            res = db.run(query, max_rows=len(gold))  # more rows than gold cannot match; never fetch them all
            if not res.ok:
                raise _Unscorable(f"the submitted query failed: {res.error}.")
            if res.truncated:
                return False, ""
            return results_match(res.rows, gold, ordered=has_order_by(str(task.data["sql"]))), ""
        if kind == "answer":
            if answer is None:
                if not query:
                    raise _Unscorable("this task is scored by answer match; pass answer=[...].")
                res = db.run(query, max_rows=MAX_ANSWER_ROWS)
                if not res.ok:
                    raise _Unscorable(f"the submitted query failed: {res.error}.")
                answer = flatten_rows(res.rows)
            label = task.data.get("label")
            labels = label if isinstance(label, list) else [label]
            return answers_match(list(answer), labels), ""
        # state
        if query:
            res = db.run(query)
            if not res.ok:
                raise _Unscorable(f"the submitted change failed: {res.error}.")
        return db.state_hash() == self._gold_state_hash(task), ""

    def _gold_state_hash(self, task: TaskSpec) -> str:
        h = self._gold_state.get(task.task_id)
        if h is None:
            ref = self._new_db(task)
            ref.timeout_s = self.gold_timeout_s
            try:
                res = ref.run(str(task.data["sql"]))
                if not res.ok:
                    raise ValidationError(f"gold SQL of task {task.task_id!r} fails: {res.error}")
                h = ref.state_hash()
            finally:
                ref.close()
            self._gold_state[task.task_id] = h
        return h

    def _require_db(self) -> EpisodeDB:
        if self.db is None:
            raise ConfigurationError("no database: call reset() first")
        return self.db

    def _require_task(self) -> TaskSpec:
        if self.task is None:
            raise ConfigurationError("no task: call reset() first")
        return self.task

    # ------------------------------------------------------------------ expert
    def expert_action(self) -> str | None:
        """The oracle: submits the gold SQL (query and change tasks) or the gold answer."""
        if self.task is None or self.done:
            return None
        kind = self.task.data.get("kind", "query")
        if kind == "answer":
            label = self.task.data.get("label")
            args: dict[str, Any] = {"answer": label if isinstance(label, list) else [label]}
        else:
            args = {"query": str(self.task.data["sql"])}
        if self.parser.name == "react":
            arg = json.dumps(args["answer"]) if "answer" in args else args["query"]
            return f"Action: submit[{arg}]"
        call = {"name": "submit", "arguments": args}
        if self.parser.name == "json":
            return json.dumps(call)
        return f"<tool_call>{json.dumps(call)}</tool_call>"


class _Unscorable(Exception):
    """A submission that cannot be scored (missing field, failing query)."""


# ---------------------------------------------------------------------------- built-in


class SQLEnv(BaseSQLEnv):
    """Generated text-to-SQL tasks over six realistic schemas (see :mod:`.tasks`).

    ``train`` (hr, library, retail, university) and ``test`` (flights, clinic) use disjoint
    schemas. Tasks span filters, joins, aggregation, group-by/having, ordering, nested queries and
    INSERT/UPDATE/DELETE.

    Args:
        seed: Data and template seed (the same seed gives the same databases and tasks).
        variants: Parameter draws per template and column (more gives more tasks).
        task_types: Keep only these task types (e.g. ``["join", "nested"]``); ``None`` keeps all.
    """

    def __init__(self, seed: int = 0, variants: int = 5, task_types: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data_seed = int(seed)
        self.variants = int(variants)
        self.task_types = tuple(task_types) if task_types else None

    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        from .tasks import generate_tasks

        if split not in self.splits:
            return []
        tasks = generate_tasks(split, self.data_seed, self.variants)
        if self.task_types:
            tasks = [t for t in tasks if t.task_type in self.task_types]
        return tasks

    def _snapshot(self, task: TaskSpec) -> bytes:
        from .tasks import builtin_db

        return builtin_db(str(task.data["db_id"]), int(task.data.get("seed", self.data_seed))).snapshot


# ---------------------------------------------------------------------------- file-backed

class _SnapshotCache:
    """An LRU of database snapshots bounded by total bytes (shared by an env's episodes)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, load: Any) -> bytes:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        data: bytes = load()
        with self._lock:
            self._items[key] = data
            total = sum(len(v) for v in self._items.values())
            while total > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                total -= len(old)
        return data


def _need_path(path: str | os.PathLike[str] | None, env_name: str, what: str) -> Path:
    if path is None or str(path) == "":
        raise ConfigurationError(
            f"{env_name} needs path=: {what}. Example: agentgym.make('agentgym/{env_name}', path='/data/...')."
        )
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigurationError(f"{env_name}: path {str(p)!r} does not exist ({what}).")
    return p


class SpiderSQLEnv(BaseSQLEnv):
    """Spider or BIRD tasks scored by execution match.

    Reads the standard layout under ``path``: question files with ``db_id``, ``question`` and
    ``query`` (Spider) or ``SQL`` plus optional ``evidence`` (BIRD), and databases at
    ``<db_dir>/<db_id>/<db_id>.sqlite``. ``tables.json`` is optional (it is only checked for
    ``db_id`` names). Source database files are opened read-only and copied into memory.

    Args:
        path: The dataset folder (e.g. ``spider/`` or BIRD's ``dev/``).
        split_files: Split name -> question files (relative to ``path``). Default: ``train`` from
            ``train_spider.json``/``train_others.json``/``train.json`` and ``test`` from ``dev.json``;
            splits with no file are left out.
        db_dirs: Folders searched for databases (default ``database``, ``dev_databases``, ``train_databases``,
            ``test_database``).
        cache_mb: Bound on the in-memory snapshot cache.
        max_copy_mb: Databases larger than this are not copied per episode but opened read-only
            (writes then fail with an error observation; the source is never modified).
    """

    DEFAULT_SPLITS: ClassVar[dict[str, tuple[str, ...]]] = {
        "train": ("train_spider.json", "train_others.json", "train.json"),
        "test": ("dev.json",),
    }
    DEFAULT_DB_DIRS = ("database", "dev_databases", "train_databases", "test_database")

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        split_files: dict[str, Sequence[str]] | None = None,
        db_dirs: Sequence[str] | None = None,
        cache_mb: float = 512.0,
        max_copy_mb: float = 256.0,
        **kwargs: Any,
    ) -> None:
        root = _need_path(path, "SQL-Spider-v0", "a Spider/BIRD folder with dev.json and database/<db_id>/<db_id>.sqlite")
        if not root.is_dir():
            raise ConfigurationError(f"SQL-Spider-v0: path {str(root)!r} must be a folder.")
        super().__init__(**kwargs)
        self.root = root
        self.max_copy_bytes = int(max_copy_mb * 1024 * 1024)
        self._cache = _SnapshotCache(int(cache_mb * 1024 * 1024))
        dirs = [root / d for d in (db_dirs or self.DEFAULT_DB_DIRS)]
        known_ids: set[str] | None = None
        if (root / "tables.json").exists():
            known_ids = {str(t["db_id"]) for t in _read_json(root / "tables.json")}
        self._tasks: dict[str, list[TaskSpec]] = {}
        self._db_paths: dict[str, Path] = {}
        self.load_log.env, self.load_log.source = "SQL-Spider-v0", str(root)
        for split, files in (split_files or self.DEFAULT_SPLITS).items():
            found = [root / f for f in files if (root / f).exists()]
            if not found:
                continue
            items: list[TaskSpec] = []
            for f in found:
                for i, ex in enumerate(_read_json(f)):
                    items.append(self._make_task(split, f.stem, i, ex, dirs, known_ids))
            self._tasks[split] = items
        if not self._tasks:
            wanted = sorted({f for fs in (split_files or self.DEFAULT_SPLITS).values() for f in fs})
            raise ConfigurationError(f"SQL-Spider-v0: no question file under {str(root)!r}; looked for {', '.join(wanted)}.")
        self.splits = tuple(self._tasks)  # type: ignore[misc]
        self.default_split = "train" if "train" in self._tasks else self.splits[0]  # type: ignore[misc]
        self.load_log.loaded = sum(len(v) for v in self._tasks.values())
        self.load_log.warn(log)  # every row becomes a task (a malformed row is an error): INFO

    def _make_task(self, split: str, stem: str, i: int, ex: Any, dirs: list[Path], known: set[str] | None) -> TaskSpec:
        where = f"{stem}.json item {i}"
        if not isinstance(ex, dict):
            raise ValidationError(f"SQL-Spider-v0: {where} is not an object.")
        sql = ex.get("query", ex.get("SQL"))
        db_id, question = ex.get("db_id"), ex.get("question")
        if not isinstance(sql, str) or not isinstance(db_id, str) or not isinstance(question, str):
            raise ValidationError(f"SQL-Spider-v0: {where} needs string fields db_id, question and query (or SQL).")
        if known is not None and db_id not in known:
            raise ValidationError(f"SQL-Spider-v0: {where} names db_id {db_id!r}, which tables.json does not list.")
        if db_id not in self._db_paths:
            cands = [d / db_id / f"{db_id}.sqlite" for d in dirs]
            hit = next((c for c in cands if c.exists()), None)
            if hit is None:
                raise ValidationError(f"SQL-Spider-v0: no database for {db_id!r}; looked at {', '.join(map(str, cands))}.")
            self._db_paths[db_id] = hit
        evidence = ex.get("evidence") or ""
        q = question.strip() + (f"\nEvidence: {evidence.strip()}" if evidence else "")
        return TaskSpec(f"{stem}-{i}", split, "spider", {"db_id": db_id, "question": q, "sql": sql, "kind": "query"})

    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        return self._tasks.get(split, [])

    def _snapshot(self, task: TaskSpec) -> bytes:
        db_id = str(task.data["db_id"])
        return self._cache.get(db_id, lambda: snapshot_from_file(str(self._db_paths[db_id])))

    def _new_db(self, task: TaskSpec) -> EpisodeDB:
        path = self._db_paths[str(task.data["db_id"])]
        if path.stat().st_size > self.max_copy_bytes:
            return EpisodeDB(readonly_path=str(path), timeout_s=self.timeout_s, collations=self.collations)
        return super()._new_db(task)


def _read_json(path: Path) -> list[Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValidationError(f"cannot read {str(path)!r}: {e}") from e
    if not isinstance(data, list):
        raise ValidationError(f"{str(path)!r} must hold a JSON list.")
    return data

"""Generated text-to-SQL tasks over the built-in schemas.

Templates are generic over column roles (see :mod:`.schemas`) and cover filters, joins,
aggregation, group-by/having, ordering, nested queries and data modification (INSERT, UPDATE,
DELETE). Each task has gold SQL; every gold query is run once at generation and a task is kept
only if it is informative: a SELECT must return rows (and not just NULL), a modification must
change at least one row (an UPDATE always changes the values it touches).

Splits are schema-disjoint: ``train`` uses ``hr``, ``library``, ``retail`` and ``university``;
``test`` uses ``flights`` and ``clinic``. Generation is deterministic in ``seed`` and takes well
under a second per schema; results are cached in memory per process.
"""

from __future__ import annotations

import random
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agentgym.types import TaskSpec

from .db import EpisodeDB, snapshot_from_sql
from .schemas import SCHEMAS, Col, Schema, Table, build_rows, create_sql

__all__ = ["SPLIT_SCHEMAS", "BuiltinDB", "builtin_db", "generate_tasks"]

SPLIT_SCHEMAS: dict[str, tuple[str, ...]] = {
    "train": ("hr", "library", "retail", "university"),
    "test": ("flights", "clinic"),
}
MODIFY_TYPES = ("insert", "update", "delete")


@dataclass
class BuiltinDB:
    """A generated database: its schema, CREATE statements and serialised snapshot."""

    schema: Schema
    seed: int
    ddl: str
    rows: dict[str, list[tuple[Any, ...]]]
    snapshot: bytes


_DB_CACHE: dict[tuple[str, int], BuiltinDB] = {}
_TASK_CACHE: dict[tuple[str, int, int], list[TaskSpec]] = {}
_LOCK = threading.Lock()


def _lit(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, float):
        return f"{v:.2f}".rstrip("0").rstrip(".") if v != int(v) else str(int(v))
    return str(v)


def builtin_db(name: str, seed: int = 0) -> BuiltinDB:
    """The generated database of schema ``name`` (cached per process)."""
    key = (name, seed)
    with _LOCK:
        if key not in _DB_CACHE:
            schema = SCHEMAS[name]
            rows = build_rows(schema, seed)
            ddl = create_sql(schema)
            inserts = []
            for t in schema.tables:
                for r in rows[t.name]:
                    inserts.append(f"INSERT INTO {t.name} VALUES ({', '.join(_lit(v) for v in r)});")
            snap = snapshot_from_sql("BEGIN;\n" + ddl + "\n" + "\n".join(inserts) + "\nCOMMIT;")
            _DB_CACHE[key] = BuiltinDB(schema, seed, ddl, rows, snap)
        return _DB_CACHE[key]


# ---------------------------------------------------------------------------- template helpers


def _plural(phrase: str) -> str:
    if phrase.endswith("y") and not phrase.endswith(("ay", "ey", "oy", "uy")):
        return phrase[:-1] + "ies"
    return phrase + ("es" if phrase.endswith(("s", "x", "ch")) else "s")


class _Ctx:
    """What templates see: the schema, its rows, a seeded RNG and a read-only connection."""

    def __init__(self, db: BuiltinDB, rng: random.Random, conn: sqlite3.Connection) -> None:
        self.db = db
        self.schema = db.schema
        self.rng = rng
        self.conn = conn

    def values(self, t: Table, c: Col) -> list[Any]:
        idx = 1 + t.cols.index(c)
        return [r[idx] for r in self.db.rows[t.name] if r[idx] is not None]

    def pick(self, t: Table, c: Col) -> Any:
        return self.rng.choice(self.values(t, c))

    def threshold(self, t: Table, c: Col) -> Any:
        vals = sorted(set(self.values(t, c)))
        return vals[int(len(vals) * self.rng.uniform(0.2, 0.8))]

    def fk_pairs(self) -> Iterator[tuple[Table, Col, Table]]:
        for child in self.schema.tables:
            for c in child.by_role("fk"):
                yield child, c, self.schema.table(c.ref or "")


Draft = tuple[str, str, str]  # (task_type, question, sql)
Template = Callable[[_Ctx, int], list[Draft]]


def _nn(c: Col, alias: str = "") -> str:
    """A ``WHERE`` guard for nullable categorical columns (and the matching question note)."""
    return f"{alias}{c.name} IS NOT NULL" if c.null_rate else ""


def _where(*conds: str) -> str:
    conds = tuple(x for x in conds if x)
    return (" WHERE " + " AND ".join(conds)) if conds else ""


AGG_WORDS = {"AVG": "average", "MAX": "highest", "MIN": "lowest", "SUM": "total"}


def t_filter(ctx: _Ctx, n: int) -> list[Draft]:
    out: list[Draft] = []
    for t in ctx.schema.tables:
        lab = t.label
        for c in t.by_role("num"):
            for _ in range(n):
                v = ctx.threshold(t, c)
                op, word = ctx.rng.choice([(">", "greater than"), ("<", "less than"), (">=", "at least")])
                out.append(("filter", f"List the {_plural(lab.phrase)} of all {t.plural} whose {c.phrase} is "
                            f"{word} {_lit(v)}.", f"SELECT {lab.name} FROM {t.name} WHERE {c.name} {op} {_lit(v)}"))
        for c in t.by_role("cat"):
            for _ in range(n):
                v = ctx.pick(t, c)
                out.append(("filter", f"List the {_plural(lab.phrase)} of the {t.plural} whose {c.phrase} is "
                            f"{_lit(v)}.", f"SELECT {lab.name} FROM {t.name} WHERE {c.name} = {_lit(v)}"))
                for c2 in t.by_role("num")[:1]:
                    x = ctx.threshold(t, c2)
                    out.append(("filter", f"List the {_plural(lab.phrase)} of the {t.plural} whose {c.phrase} is "
                                f"{_lit(v)} and whose {c2.phrase} is below {_lit(x)}.",
                                f"SELECT {lab.name} FROM {t.name} WHERE {c.name} = {_lit(v)} AND {c2.name} < {_lit(x)}"))
    return out


def t_aggregate(ctx: _Ctx, n: int) -> list[Draft]:
    out: list[Draft] = []
    for t in ctx.schema.tables:
        for c in t.by_role("num"):
            for fn, word in AGG_WORDS.items():
                out.append(("aggregation", f"What is the {word} {c.phrase} over all {t.plural}?",
                            f"SELECT {fn}({c.name}) FROM {t.name}"))
        for c in t.by_role("cat"):
            out.append(("aggregation", f"How many different {_plural(c.phrase)} appear among the {t.plural}?"
                        " Do not count missing values.", f"SELECT COUNT(DISTINCT {c.name}) FROM {t.name}"))
            for _ in range(n):
                v = ctx.pick(t, c)
                out.append(("aggregation", f"How many {t.plural} have {c.phrase} {_lit(v)}?",
                            f"SELECT COUNT(*) FROM {t.name} WHERE {c.name} = {_lit(v)}"))
                for c2 in t.by_role("num"):
                    fn, word = ctx.rng.choice(list(AGG_WORDS.items()))
                    out.append(("aggregation", f"What is the {word} {c2.phrase} of the {t.plural} whose {c.phrase} "
                                f"is {_lit(v)}?", f"SELECT {fn}({c2.name}) FROM {t.name} WHERE {c.name} = {_lit(v)}"))
    return out


def t_group(ctx: _Ctx, n: int) -> list[Draft]:
    out: list[Draft] = []
    for t in ctx.schema.tables:
        for c in t.by_role("cat"):
            note = f" Ignore {t.plural} with no {c.phrase}." if c.null_rate else ""
            out.append(("group_by", f"For each {c.phrase}, how many {t.plural} are there? Return the {c.phrase} and "
                        f"the count.{note}", f"SELECT {c.name}, COUNT(*) FROM {t.name}{_where(_nn(c))} GROUP BY {c.name}"))
            counts = Counter(ctx.values(t, c))
            distinct = sorted(set(counts.values()))
            if len(distinct) >= 2:
                for _ in range(n):
                    k = ctx.rng.choice(distinct[:-1])
                    out.append(("having", f"Which {_plural(c.phrase)} are shared by more than {k} {t.plural}?{note}",
                                f"SELECT {c.name} FROM {t.name}{_where(_nn(c))} GROUP BY {c.name} HAVING COUNT(*) > {k}"))
            for c2 in t.by_role("num"):
                fn, word = ctx.rng.choice([("AVG", "average"), ("MAX", "highest"), ("SUM", "total")])
                out.append(("group_by", f"For each {c.phrase}, what is the {word} {c2.phrase} of the {t.plural}? "
                            f"Return the {c.phrase} and the value.{note}",
                            f"SELECT {c.name}, {fn}({c2.name}) FROM {t.name}{_where(_nn(c))} GROUP BY {c.name}"))
                for _ in range(n):
                    x = ctx.threshold(t, c2)
                    out.append(("having", f"Which {_plural(c.phrase)} have an average {c2.phrase} above {_lit(x)} "
                                f"among their {t.plural}?{note}",
                                f"SELECT {c.name} FROM {t.name}{_where(_nn(c))} GROUP BY {c.name} "
                                f"HAVING AVG({c2.name}) > {_lit(x)}"))
    return out


def t_order(ctx: _Ctx, n: int) -> list[Draft]:
    out: list[Draft] = []
    for t in ctx.schema.tables:
        lab = t.label
        for c in t.by_role("num"):
            for k in (3, 5, 10)[: max(1, n)]:
                for direction, word in (("DESC", "highest"), ("ASC", "lowest")):
                    out.append(("ordering", f"List the {_plural(lab.phrase)} of the {k} {t.plural} with the {word} "
                                f"{c.phrase}, {word} first; break ties by {lab.phrase} in alphabetical order.",
                                f"SELECT {lab.name} FROM {t.name} WHERE {c.name} IS NOT NULL "
                                f"ORDER BY {c.name} {direction}, {lab.name} ASC LIMIT {k}"))
            for c2 in t.by_role("cat")[:1]:
                for _ in range(n):
                    v = ctx.pick(t, c2)
                    out.append(("ordering", f"List the {lab.phrase} and {c.phrase} of every {t.singular} whose "
                                f"{c2.phrase} is {_lit(v)}, sorted by {c.phrase} from lowest to highest, then by "
                                f"{lab.phrase} in alphabetical order.",
                                f"SELECT {lab.name}, {c.name} FROM {t.name} WHERE {c2.name} = {_lit(v)} "
                                f"ORDER BY {c.name} ASC, {lab.name} ASC"))
    return out


def t_join(ctx: _Ctx, n: int) -> list[Draft]:
    out: list[Draft] = []
    for child, fkc, parent in ctx.fk_pairs():
        cl, pl = child.label, parent.label
        on = f"FROM {child.name} AS c JOIN {parent.name} AS p ON c.{fkc.name} = p.id"
        for pc in parent.by_role("cat"):
            for _ in range(n):
                v = ctx.pick(parent, pc)
                out.append(("join", f"List the {_plural(cl.phrase)} of the {child.plural} whose {fkc.phrase} has "
                            f"{pc.phrase} {_lit(v)}.", f"SELECT c.{cl.name} {on} WHERE p.{pc.name} = {_lit(v)}"))
        for _ in range(n):
            v = ctx.pick(parent, pl)
            out.append(("join", f"List the {_plural(cl.phrase)} of the {child.plural} whose {fkc.phrase} is "
                        f"{_lit(v)} (its {pl.phrase}).", f"SELECT c.{cl.name} {on} WHERE p.{pl.name} = {_lit(v)}"))
        out.append(("join_group_by", f"For each {fkc.phrase}, give its {pl.phrase} and the number of {child.plural} "
                    f"that have it as their {fkc.phrase}. Leave out those with none.",
                    f"SELECT p.{pl.name}, COUNT(*) {on} GROUP BY p.id"))
        for cc in child.by_role("num"):
            fn, word = ctx.rng.choice([("AVG", "average"), ("MAX", "highest"), ("SUM", "total"), ("MIN", "lowest")])
            out.append(("join_group_by", f"For each {fkc.phrase}, give its {pl.phrase} and the {word} {cc.phrase} of "
                        f"its {child.plural}. Leave out those with no {child.plural}.",
                        f"SELECT p.{pl.name}, {fn}(c.{cc.name}) {on} GROUP BY p.id"))
        sizes = sorted(set(Counter(r[1 + child.cols.index(fkc)] for r in ctx.db.rows[child.name]
                                   if r[1 + child.cols.index(fkc)] is not None).values()))
        if len(sizes) >= 2:
            for _ in range(n):
                k = ctx.rng.choice(sizes[:-1])
                out.append(("join_having", f"Give the {_plural(pl.phrase)} of the {parent.plural} that are the "
                            f"{fkc.phrase} of more than {k} {child.plural}.",
                            f"SELECT p.{pl.name} {on} GROUP BY p.id HAVING COUNT(*) > {k}"))
    return out


def t_nested(ctx: _Ctx, n: int) -> list[Draft]:
    out: list[Draft] = []
    for t in ctx.schema.tables:
        lab = t.label
        for c in t.by_role("num"):
            out.append(("nested", f"List the {_plural(lab.phrase)} of the {t.plural} whose {c.phrase} is above the "
                        f"average {c.phrase} of all {t.plural}.",
                        f"SELECT {lab.name} FROM {t.name} WHERE {c.name} > (SELECT AVG({c.name}) FROM {t.name})"))
            for fn, word in (("MAX", "highest"), ("MIN", "lowest")):
                out.append(("nested", f"Which {t.singular} has the {word} {c.phrase}? Give its {lab.phrase} "
                            f"(all of them if there is a tie).",
                            f"SELECT {lab.name} FROM {t.name} WHERE {c.name} = (SELECT {fn}({c.name}) FROM {t.name})"))
    for child, fkc, parent in ctx.fk_pairs():
        pl = parent.label
        out.append(("nested", f"Which {parent.plural} are never the {fkc.phrase} of any {child.singular}? "
                    f"Give their {_plural(pl.phrase)}.",
                    f"SELECT {pl.name} FROM {parent.name} WHERE id NOT IN "
                    f"(SELECT {fkc.name} FROM {child.name} WHERE {fkc.name} IS NOT NULL)"))
        for pc in parent.by_role("num"):
            for _ in range(n):
                x = ctx.threshold(parent, pc)
                out.append(("nested", f"List the {_plural(child.label.phrase)} of the {child.plural} whose "
                            f"{fkc.phrase} has a {pc.phrase} above {_lit(x)}.",
                            f"SELECT {child.label.name} FROM {child.name} WHERE {fkc.name} IN "
                            f"(SELECT id FROM {parent.name} WHERE {pc.name} > {_lit(x)})"))
    return out


def t_modify(ctx: _Ctx, n: int) -> list[Draft]:
    out: list[Draft] = []
    for t in ctx.schema.tables:
        cats, nums = t.by_role("cat"), t.by_role("num")
        for c in cats:
            for _ in range(n):
                v = ctx.pick(t, c)
                others = sorted(set(ctx.values(t, c)) - {v})
                if others:
                    w = ctx.rng.choice(others)
                    out.append(("update", f"Change the {c.phrase} of every {t.singular} whose {c.phrase} is {_lit(v)} "
                                f"to {_lit(w)}.", f"UPDATE {t.name} SET {c.name} = {_lit(w)} WHERE {c.name} = {_lit(v)}"))
                for c2 in nums[:1]:
                    d = ctx.rng.choice([1, 2, 5, 10, 100])
                    out.append(("update", f"Increase the {c2.phrase} of every {t.singular} whose {c.phrase} is "
                                f"{_lit(v)} by {d}.",
                                f"UPDATE {t.name} SET {c2.name} = {c2.name} + {d} WHERE {c.name} = {_lit(v)}"))
        for c in nums:
            for _ in range(n):
                x = ctx.threshold(t, c)
                out.append(("delete", f"Delete every {t.singular} whose {c.phrase} is below {_lit(x)}.",
                            f"DELETE FROM {t.name} WHERE {c.name} < {_lit(x)}"))
        for i in range(n):
            new_id = len(ctx.db.rows[t.name]) + 1 + i
            lab = f"New {t.singular.title()} {ctx.rng.randint(100, 999)}"
            names, vals, parts = ["id", t.label.name], [str(new_id), _lit(lab)], [f"{t.label.phrase} {_lit(lab)}"]
            for c in (cats[:1] + nums[:1]):
                v = ctx.pick(t, c)
                names.append(c.name)
                vals.append(_lit(v))
                parts.append(f"{c.phrase} {_lit(v)}")
            out.append(("insert", f"Add a new {t.singular} with id {new_id}, " + ", ".join(parts[:-1])
                        + f" and {parts[-1]}. Leave its other columns NULL.",
                        f"INSERT INTO {t.name} ({', '.join(names)}) VALUES ({', '.join(vals)})"))
    for child, fkc, parent in ctx.fk_pairs():
        for pc in parent.by_role("cat")[:1]:
            for _ in range(n):
                v = ctx.pick(parent, pc)
                out.append(("delete", f"Delete every {child.singular} whose {fkc.phrase} has {pc.phrase} {_lit(v)}.",
                            f"DELETE FROM {child.name} WHERE {fkc.name} IN "
                            f"(SELECT id FROM {parent.name} WHERE {pc.name} = {_lit(v)})"))
    return out


TEMPLATES: dict[str, Template] = {
    "filter": t_filter, "aggregate": t_aggregate, "group": t_group, "order": t_order,
    "join": t_join, "nested": t_nested, "modify": t_modify,
}


def _schema_tasks(name: str, seed: int, variants: int) -> list[TaskSpec]:
    db = builtin_db(name, seed)
    conn = sqlite3.connect(":memory:")
    conn.deserialize(db.snapshot)
    out: list[TaskSpec] = []
    seen: set[str] = set()
    per_type: Counter[str] = Counter()
    try:
        for tname, template in TEMPLATES.items():
            rng = random.Random(f"{name}:{seed}:{tname}")
            for task_type, question, sql in template(_Ctx(db, rng, conn), variants):
                if sql in seen:
                    continue
                seen.add(sql)
                if task_type in MODIFY_TYPES:
                    ep = EpisodeDB(db.snapshot)
                    res = ep.run(sql)
                    ep.close()
                    if not res.ok or res.rowcount <= 0:
                        continue
                    kind = "state"
                else:
                    rows = conn.execute(sql).fetchall()
                    if not rows or all(v is None for r in rows for v in r):
                        continue
                    kind = "query"
                per_type[task_type] += 1
                out.append(TaskSpec(
                    task_id=f"{name}-{task_type}-{per_type[task_type]:04d}",
                    split="",
                    task_type=task_type,
                    data={"db_id": name, "seed": seed, "question": question, "sql": sql, "kind": kind},
                ))
    finally:
        conn.close()
    return out


def generate_tasks(split: str, seed: int = 0, variants: int = 5) -> list[TaskSpec]:
    """All built-in tasks of a split, in a stable order (cached per process).

    Args:
        split: ``"train"`` or ``"test"``.
        seed: Data and parameter seed; the same seed always gives the same tasks.
        variants: Parameter draws per (template, column); more gives more tasks.
    """
    key = (split, seed, variants)
    if key not in _TASK_CACHE:
        tasks: list[TaskSpec] = []
        for name in SPLIT_SCHEMAS[split]:
            for t in _schema_tasks(name, seed, variants):
                tasks.append(TaskSpec(t.task_id, split, t.task_type, t.data))
        with _LOCK:
            _TASK_CACHE[key] = tasks
    return _TASK_CACHE[key]

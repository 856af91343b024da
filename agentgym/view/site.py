"""The viewer's documents, addressed by path: what the page loads, as JSON.

The server answers ``GET /data/<path>.json`` with :meth:`Site.document`; ``agentgym view --export``
writes every document of :meth:`Site.document_paths` as ``data/<path>.js``, so both show the same
content. Paths:

* ``index``: every run (name, kind, headline figures) and the suggested comparisons; no episode is read,
  so it is ready at once;
* ``run/<id>``: an eval run's summary, protocol, per env/task-type breakdown and episode table (one row
  per episode, as columns), or a training run's result, config, metric series, held-out curve and group
  table;
* ``run/<id>/chunk/<k>``: episodes ``k*chunk_size ..`` in full (:func:`~agentgym.view.index.episode_view`),
  loaded when one of them is opened or searched;
* ``run/<id>/gchunk/<k>``: rollout groups the same way;
* ``compare/<id>,<id>[,...]``: a task-by-task comparison of eval runs (:func:`~agentgym.view.analysis.compare`).

An export writes the comparisons the page links to (:meth:`Site.linked_comparisons`): the suggested ones, and
each training run's first eval stage against every later stage (the training page's "compare with" links).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

from agentgym.errors import DocumentNotFound
from agentgym.view.analysis import breakdown, compare, heldout_curve, metric_series, success_interval
from agentgym.view.index import (
    JsonlIndex,
    episode_head,
    episode_key,
    episode_row,
    episode_view,
    group_row,
    group_view,
    jsonable,
)
from agentgym.view.runs import RunSource, discover_runs, read_json

__all__ = ["CHUNK_SIZE", "MAX_COMPARISONS", "Site", "encode"]

CHUNK_SIZE = 64
MAX_COMPARISONS = 100
_PATH = re.compile(r"^(?:index|run/(\d{1,6})(?:/(chunk|gchunk)/(\d{1,9}))?|compare/(\d{1,6}(?:,\d{1,6}){1,15}))$")


def encode(doc: Any) -> bytes:
    """Strict JSON (no NaN), UTF-8; a text with a lone surrogate (which JSON files can hold) is escaped."""
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(doc, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def _obj(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _columns(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    if not rows:
        return {}
    return {k: [r.get(k) for r in rows] for k in rows[0]}


class Site:
    """The documents of the runs at or under ``paths``.

    Episode and group files are indexed on first use and re-read incrementally when they grow, so a
    page reloaded during a run shows the new episodes, metrics and groups.

    Args:
        paths: Run folders, trajectory JSONL files, or folders holding runs.
        chunk_size: Episodes (and groups) per chunk document.

    Raises:
        ConfigurationError: a path does not exist or holds no run.
    """

    def __init__(self, paths: Sequence[str | os.PathLike[str]], *, chunk_size: int = CHUNK_SIZE) -> None:
        self.runs: list[RunSource] = discover_runs(list(paths))
        self.chunk_size = max(1, int(chunk_size))
        self._episodes: dict[int, JsonlIndex] = {}
        self._groups: dict[int, JsonlIndex] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ indexes
    def run(self, rid: int) -> RunSource:
        if not 0 <= rid < len(self.runs):
            raise DocumentNotFound(f"no run {rid}: this viewer has runs 0..{len(self.runs) - 1}")
        return self.runs[rid]

    def episodes(self, rid: int) -> JsonlIndex:
        """The episode index of an eval or episodes run (refreshed)."""
        run = self.run(rid)
        path = run.episodes_file
        if path is None:
            raise DocumentNotFound(f"run {rid} ({run.name}) is a training run; its episodes are in its eval stages")
        with self._lock:
            idx = self._episodes.get(rid)
            if idx is None:
                idx = self._episodes[rid] = JsonlIndex(path, episode_row, episode_key, decode=episode_head)
        idx.refresh()
        return idx

    def groups(self, rid: int) -> JsonlIndex:
        """The ``groups.jsonl`` index of a training run (refreshed; empty when it logged none)."""
        run = self.run(rid)
        if run.kind != "train":
            raise DocumentNotFound(f"run {rid} ({run.name}) is not a training run: it has no rollout groups")
        with self._lock:
            idx = self._groups.get(rid)
            if idx is None:
                idx = self._groups[rid] = JsonlIndex(run.file("groups.jsonl"), group_row)
        idx.refresh()
        return idx

    # ------------------------------------------------------------------ documents
    def document(self, path: str) -> dict[str, Any]:
        """The document at ``path`` (see the module docstring).

        Raises:
            DocumentNotFound: no such document.
        """
        m = _PATH.match(path)
        if m is None:
            raise DocumentNotFound(f"no document {path!r}")
        if path == "index":
            return self.index()
        if m.group(4):
            return self.comparison([int(x) for x in m.group(4).split(",")])
        rid = int(m.group(1))
        if m.group(2) == "chunk":
            return self.chunk(rid, int(m.group(3)))
        if m.group(2) == "gchunk":
            return self.group_chunk(rid, int(m.group(3)))
        return self.run_document(rid)

    def document_paths(self) -> list[str]:
        """Every document, for a static export: the comparisons are the :meth:`linked_comparisons`."""
        out = ["index"]
        for run in self.runs:
            out.append(f"run/{run.id}")
            if run.episodes_file is not None:
                n = len(self.episodes(run.id))
                out += [f"run/{run.id}/chunk/{k}" for k in range(math.ceil(n / self.chunk_size))]
            if run.kind == "train":
                n = len(self.groups(run.id))
                out += [f"run/{run.id}/gchunk/{k}" for k in range(math.ceil(n / self.chunk_size))]
        out += ["compare/" + ",".join(map(str, ids)) for ids in self.linked_comparisons()]
        return out

    def linked_comparisons(self) -> list[list[int]]:
        """Every comparison a page links to: the :meth:`suggested_comparisons` (the sidebar and the overview),
        then, per training run, its first eval stage against each later stage (the held-out table's "compare
        with" links, one per stage after the first; not capped by ``MAX_COMPARISONS``)."""
        out = self.suggested_comparisons()
        seen = {tuple(ids) for ids in out}
        for run in self.runs:
            if run.kind != "train" or len(run.children) < 2:
                continue
            first = run.children[0]
            for c in run.children[1:]:
                if (first, c) not in seen:
                    seen.add((first, c))
                    out.append([first, c])
        return out

    def _summary(self, run: RunSource) -> dict[str, Any] | None:
        return read_json(run.file("summary.json")) if run.kind == "eval" else None

    def index(self) -> dict[str, Any]:
        runs = []
        for run in self.runs:
            entry: dict[str, Any] = {"id": run.id, "name": run.name, "path": str(run.path), "kind": run.kind,
                                     "parent": run.parent, "stage": run.stage, "children": run.children}
            if run.kind == "eval":
                summary = self._summary(run) or {}
                proto = _obj(summary.get("protocol"))
                pol = _obj(proto.get("policy"))
                entry.update(success=success_interval(summary), envs=sorted((summary.get("envs") or {}).keys()),
                             episodes=summary.get("finished_episodes"), policy=pol.get("spec") or pol.get("policy_id"),
                             complete=summary.get("complete"), has_summary=bool(summary))
            elif run.kind == "train":
                result = read_json(run.file("result.json")) or {}
                config = read_json(run.file("config.json")) or {}
                entry.update(result=jsonable(result), algorithm=(config.get("run") or {}).get("algorithm")
                             if isinstance(config.get("run"), dict) else None,
                             has_metrics=run.file("metrics.jsonl").is_file(),
                             has_groups=run.file("groups.jsonl").is_file())
            runs.append(entry)
        return {"runs": jsonable(runs), "comparisons": self.suggested_comparisons(), "chunk_size": self.chunk_size}

    def _task_keys(self, run: RunSource) -> set[tuple[str, str]]:
        """(env, task) pairs of an eval run: from its summary's protocol, else from its episodes."""
        proto = (self._summary(run) or {}).get("protocol")
        envs = proto.get("envs") if isinstance(proto, dict) else None
        if isinstance(envs, dict) and envs:
            return {(e, str(t)) for e, v in envs.items() if isinstance(v, dict)
                    for t in (v.get("task_ids") or [])}
        return {(r["env"], r["task"]) for r in self.episodes(run.id).rows}

    def suggested_comparisons(self) -> list[list[int]]:
        """Comparisons the page offers (``MAX_COMPARISONS`` at most): each training run's first eval stage
        against its last (before -> after) and all its stages in order; then every pair of the runs given
        (eval runs, and the first and last stage of each training run) that share a task."""
        out: list[list[int]] = []
        for run in self.runs:
            if run.kind == "train" and len(run.children) >= 2:
                out.append([run.children[0], run.children[-1]])
                if len(run.children) > 2:
                    out.append(list(run.children))
        ends = {c for r in self.runs if r.kind == "train" and r.children for c in (r.children[0], r.children[-1])}
        evals = [r for r in self.runs if r.episodes_file is not None and (r.parent is None or r.id in ends)]
        keys = {r.id: self._task_keys(r) for r in evals}
        for a, b in itertools.combinations(evals, 2):
            pair = [a.id, b.id]
            if a.parent is not None and a.parent == b.parent:
                continue  # listed above
            if keys[a.id] & keys[b.id]:
                out.append(pair)
            if len(out) >= MAX_COMPARISONS:
                break
        return out[:MAX_COMPARISONS]

    def run_document(self, rid: int) -> dict[str, Any]:
        run = self.run(rid)
        doc: dict[str, Any] = {"id": run.id, "name": run.name, "path": str(run.path), "kind": run.kind,
                               "parent": run.parent, "stage": run.stage, "chunk_size": self.chunk_size}
        if run.episodes_file is not None:
            idx = self.episodes(rid)
            with idx.lock:
                rows = list(idx.rows)
                skipped = idx.skipped
            summary = self._summary(run)
            doc.update(summary=jsonable(summary) if summary else None, run_json=jsonable(read_json(run.file("run.json")))
                       if run.kind == "eval" else None, episodes=len(rows), skipped_lines=skipped,
                       breakdown=breakdown(rows), table=_columns(rows))
            return doc
        result = read_json(run.file("result.json"))
        metrics = metric_series(run.file("metrics.jsonl"))
        stages = [(c, self.runs[c].stage or "", self._summary(self.runs[c])) for c in run.children]
        gidx = self.groups(rid)
        with gidx.lock:
            grows = list(gidx.rows)
            gskipped = gidx.skipped
        doc.update(result=jsonable(result), config=jsonable(read_json(run.file("config.json"))), metrics=metrics,
                   heldout=heldout_curve(stages, metrics, result), stages=run.children,
                   groups=len(grows), groups_skipped_lines=gskipped, group_table=_columns(grows))
        return doc

    def _chunk_ids(self, idx: JsonlIndex, rid: int, k: int, what: str) -> range:
        n = len(idx)
        if k * self.chunk_size >= max(n, 1) and not (k == 0 and n == 0):
            raise DocumentNotFound(f"run {rid} has {n} {what}: no chunk {k}")
        return range(k * self.chunk_size, min((k + 1) * self.chunk_size, n))

    def chunk(self, rid: int, k: int) -> dict[str, Any]:
        idx = self.episodes(rid)
        ids = self._chunk_ids(idx, rid, k, "episodes")
        recs = idx.records(ids)
        return {"run": rid, "chunk": k, "episodes": [episode_view(r, i) for i, r in zip(ids, recs, strict=False)]}

    def group_chunk(self, rid: int, k: int) -> dict[str, Any]:
        idx = self.groups(rid)
        ids = self._chunk_ids(idx, rid, k, "groups")
        recs = idx.records(ids)
        return {"run": rid, "chunk": k, "groups": [group_view(r, i) for i, r in zip(ids, recs, strict=False)]}

    def comparison(self, ids: list[int]) -> dict[str, Any]:
        if len(set(ids)) != len(ids):
            raise DocumentNotFound(f"compare/{','.join(map(str, ids))}: a run appears twice")
        tables = []
        for rid in ids:
            idx = self.episodes(rid)
            with idx.lock:
                tables.append((rid, list(idx.rows)))
        doc = compare(tables)
        doc["names"] = [self.runs[r].name for r in ids]
        return doc

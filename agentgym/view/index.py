"""Indexes of a run's JSONL files: read once, then records on demand.

:class:`JsonlIndex` reads a JSONL file line by line and keeps, per record, its byte span and a small
metadata *row*; the whole record is read back by span only when a page asks for it. The scan decodes only
what a row needs (:func:`episode_head`: a typed ``msgspec`` decoder that skips token ids, texts and
messages without building them), so a run of 10,000 episodes is indexed in about a second. The file may
still be growing (a run in progress): :meth:`JsonlIndex.refresh` reads only what was appended since,
leaves an unfinished last line for the next refresh, and starts over when the file was replaced or
shrank. Records that share a key (``info.eval_key`` of a resumed ``agentgym eval``) replace each
other in place: the last record wins and keeps the row of the first.

:func:`episode_row` and :func:`group_row` make the rows of ``episodes.jsonl`` and ``groups.jsonl``;
:func:`episode_view` and :func:`group_view` the records a page renders. Nothing here trusts the
file: wrong types give empty fields, never an exception, and every string is capped.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["MAX_TEXT", "JsonlIndex", "episode_head", "episode_row", "episode_view", "group_row", "group_view",
           "json_record", "jsonable"]

MAX_TEXT = 100_000  # characters of one string shown; the rest is cut with a visible note
RowFn = Callable[[dict[str, Any]], dict[str, Any]]
KeyFn = Callable[[dict[str, Any]], str | None]
DecodeFn = Callable[[bytes], Any]


def json_record(line: bytes) -> Any:
    """A whole JSON line: ``msgspec`` (a few times faster), or Python's ``json`` for what msgspec refuses and our
    writers allow (``NaN``, ``Infinity``, integers beyond 64 bits)."""
    try:
        return msgspec.json.decode(line)
    except msgspec.DecodeError:
        return json.loads(line)


class _TurnHead(msgspec.Struct, frozen=True):
    policy_id: Any = None
    tool_calls: list[msgspec.Raw] = []
    parse_error: Any = None


class _InfoHead(msgspec.Struct, frozen=True):
    eval_key: Any = None
    seed: Any = None
    sample: Any = None
    task_type: Any = None
    policy_id: Any = None


class _EpisodeHead(msgspec.Struct, frozen=True):
    task_id: Any = None
    env_id: Any = None
    member: Any = None
    turns: list[_TurnHead] = []
    reward: Any = None
    success: Any = None
    terminated: Any = None
    truncated: Any = None
    truncated_reason: Any = None
    early_stopped: Any = None
    error: Any = None
    error_source: Any = None
    metrics: dict[str, Any] = {}
    timing: dict[str, Any] = {}
    info: _InfoHead = _InfoHead()


_HEAD = msgspec.json.Decoder(_EpisodeHead)


def episode_head(line: bytes) -> Any:
    """The parts of a trajectory line that :func:`episode_row` and :func:`episode_key` read, as a dict of the
    same shape as the whole record (unknown and heavy fields are skipped, not built). A line the typed decoder
    refuses (``NaN``, a field of an unexpected type) is read whole by :func:`json_record`."""
    try:
        h = _HEAD.decode(line)
    except msgspec.DecodeError:  # includes ValidationError
        return json_record(line)
    i = h.info
    return {"task_id": h.task_id, "env_id": h.env_id, "member": h.member,
            "turns": [{"policy_id": t.policy_id, "tool_calls": t.tool_calls, "parse_error": t.parse_error}
                      for t in h.turns],
            "reward": h.reward, "success": h.success, "terminated": h.terminated, "truncated": h.truncated,
            "truncated_reason": h.truncated_reason, "early_stopped": h.early_stopped, "error": h.error,
            "error_source": h.error_source, "metrics": h.metrics, "timing": h.timing,
            "info": {"eval_key": i.eval_key, "seed": i.seed, "sample": i.sample, "task_type": i.task_type,
                     "policy_id": i.policy_id}}


def jsonable(v: Any) -> Any:
    """``v`` with non-finite floats as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (strict JSON for browsers)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


def cap(s: Any, limit: int = MAX_TEXT) -> str:
    """``s`` as a string of at most ``limit`` characters, with a note saying how much was cut."""
    t = s if isinstance(s, str) else ("" if s is None else json.dumps(s, default=str))
    if len(t) <= limit:
        return t
    return t[:limit] + f"\n[… {len(t) - limit:,} more characters not shown]"


def _d(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _l(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return int(v)


def _str(v: Any, limit: int = 300) -> str | None:
    if v is None:
        return None
    return cap(v if isinstance(v, str) else str(v), limit)


@dataclass(frozen=True)
class _Stat:
    size: int
    mtime_ns: int
    ino: int


class JsonlIndex:
    """Byte spans and metadata rows of one JSONL file, refreshed incrementally.

    Args:
        path: The file (it may not exist yet: an empty index).
        row_fn: The metadata row of a record (``episode_row``, ``group_row``).
        key_fn: A record's key; a later record with the same key replaces the earlier one.
        decode: Reads a line for ``row_fn`` and ``key_fn`` (default: the whole record); :meth:`records` always
            reads whole records.
    """

    def __init__(self, path: Path, row_fn: RowFn, key_fn: KeyFn | None = None,
                 decode: DecodeFn = json_record) -> None:
        self.path = path
        self.row_fn = row_fn
        self.key_fn = key_fn
        self.decode = decode
        self.rows: list[dict[str, Any]] = []
        self.spans: list[tuple[int, int]] = []
        self.skipped = 0  # lines that are not a JSON object
        self.lock = threading.RLock()
        self._keys: dict[str, int] = {}
        self._scanned = 0
        self._stat: _Stat | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def _reset(self) -> None:
        self.rows, self.spans, self._keys, self.skipped, self._scanned = [], [], {}, 0, 0

    def refresh(self) -> bool:
        """Read what was appended since the last call; returns True if anything changed."""
        with self.lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                changed = bool(self.rows) or self._stat is not None
                self._reset()
                self._stat = None
                return changed
            stat = _Stat(st.st_size, st.st_mtime_ns, st.st_ino)
            if stat == self._stat:
                return False
            if self._stat is not None and (stat.ino != self._stat.ino or stat.size < self._scanned):
                self._reset()  # replaced or truncated: read it again
            self._stat = stat
            before = (len(self.rows), self._scanned)
            with open(self.path, "rb") as f:
                f.seek(self._scanned)
                pos = self._scanned
                while True:
                    line = f.readline()
                    if not line or not line.endswith(b"\n"):
                        break  # end, or a line still being written: the next refresh reads it
                    start, pos = pos, pos + len(line)
                    self._scanned = pos
                    if not line.strip():
                        continue
                    self._add(line, start, pos)
            return (len(self.rows), self._scanned) != before

    def _add(self, line: bytes, start: int, end: int) -> None:
        try:
            rec = self.decode(line)
        except ValueError:  # a torn line from an interrupted writer, or not JSON at all
            self.skipped += 1
            return
        if not isinstance(rec, dict):
            self.skipped += 1
            return
        row = self.row_fn(rec)
        key = self.key_fn(rec) if self.key_fn is not None else None
        i = self._keys.get(key) if key is not None else None
        if i is None:
            i = len(self.rows)
            self.rows.append(row)
            self.spans.append((start, end))
            if key is not None:
                self._keys[key] = i
        else:  # a rerun of the same episode: the last record wins, in the first one's place
            self.rows[i] = row
            self.spans[i] = (start, end)
        row["id"] = i

    def records(self, ids: range | list[int]) -> list[dict[str, Any]]:
        """The whole records of rows ``ids`` (read by byte span; ids past the end are left out)."""
        with self.lock:
            spans = [(i, self.spans[i]) for i in ids if 0 <= i < len(self.spans)]
            out: list[dict[str, Any]] = []
            if not spans:
                return out
            with open(self.path, "rb") as f:
                for _i, (a, b) in spans:
                    f.seek(a)
                    raw = f.read(b - a)
                    try:
                        rec = json_record(raw)
                    except ValueError:
                        rec = None
                    out.append(rec if isinstance(rec, dict) else {})
            return out


# ------------------------------------------------------------------------------------------------ episodes
def episode_key(rec: dict[str, Any]) -> str | None:
    key = _d(rec.get("info")).get("eval_key")
    return key if isinstance(key, str) else None


def episode_row(rec: dict[str, Any]) -> dict[str, Any]:
    """The metadata of one trajectory record (whole, or its :func:`episode_head`): what the episode list shows,
    filters and sorts on."""
    info, metrics, timing = _d(rec.get("info")), _d(rec.get("metrics")), _d(rec.get("timing"))
    turns = [_d(t) for t in _l(rec.get("turns"))]
    perr = _int(metrics.get("parse_errors"))
    if perr is None:
        perr = sum(1 for t in turns if t.get("parse_error"))
    return {
        "env": _str(rec.get("env_id")) or "?",
        "task": _str(rec.get("task_id")) or "?",
        "type": _str(info.get("task_type")) or "default",
        "seed": _int(info.get("seed")),
        "sample": _int(info.get("sample")),
        "member": _int(rec.get("member")),
        "success": bool(rec.get("success") is True),
        "reward": _num(rec.get("reward")),
        "terminated": bool(rec.get("terminated") is True),
        "truncated": bool(rec.get("truncated") is True),
        "reason": _str(rec.get("truncated_reason")),
        "early_stopped": bool(rec.get("early_stopped") is True),
        "error": _str(rec.get("error")),
        "error_source": _str(rec.get("error_source")),
        "parse_errors": perr,
        "turns": len(turns),
        "tool_calls": sum(len(_l(t.get("tool_calls"))) for t in turns),
        "gen_tokens": _int(metrics.get("generated_tokens")),  # the rollout counts them in every episode's metrics
        "prompt_tokens": _int(metrics.get("prompt_tokens")),
        "wall_s": _num(timing.get("wall_s")),
        "policy": _str(info.get("policy_id")) or ",".join(
            dict.fromkeys(str(t.get("policy_id")) for t in turns if t.get("policy_id"))),
    }


def _message(m: Any) -> dict[str, Any]:
    m = _d(m)
    out: dict[str, Any] = {"role": _str(m.get("role"), 40) or "?", "content": cap(m.get("content", ""))}
    if m.get("name") is not None:
        out["name"] = _str(m.get("name"), 200)
    if m.get("tool_call_id") is not None:
        out["tool_call_id"] = _str(m.get("tool_call_id"), 200)
    if m.get("tool_calls"):
        out["tool_calls"] = [_call(c) for c in _l(m.get("tool_calls"))]
    return out


def _call(c: Any) -> dict[str, Any]:
    c = _d(c)
    fn = _d(c.get("function"))  # OpenAI's nesting, where a record kept it
    args = c.get("arguments", fn.get("arguments"))
    return {"id": _str(c.get("id"), 200), "name": _str(c.get("name", fn.get("name")), 200) or "?",
            "arguments": cap(args if isinstance(args, str) else json.dumps(jsonable(args), ensure_ascii=False,
                                                                           default=str))}


def _version(wv: Any) -> str | None:
    if isinstance(wv, list):
        vs = [v for v in (_int(x) for x in wv) if v is not None]
        if not vs:
            return None
        lo, hi = min(vs), max(vs)
        return str(lo) if lo == hi else f"{lo}–{hi}"
    v = _int(wv)
    return None if v is None else str(v)


def episode_view(rec: dict[str, Any], id: int) -> dict[str, Any]:
    """One episode as the page renders it: the opening messages, then per turn the assistant's text, its
    tool calls, the observation that followed, reward, parse error, token counts and timings.

    Token ids and logprobs are left out (only their counts); strings are capped at :data:`MAX_TEXT`.
    """
    row = episode_row(rec)
    messages = _l(rec.get("messages"))
    first_assistant = next((i for i, m in enumerate(messages) if _d(m).get("role") == "assistant"), len(messages))
    turns = []
    for t in (_d(x) for x in _l(rec.get("turns"))):
        timing = {k: v for k, v in ((k, _num(v)) for k, v in _d(t.get("timing")).items()) if v is not None}
        turns.append({
            "policy": _str(t.get("policy_id"), 200),
            "text": cap(t.get("text", "")),
            "tool_calls": [_call(c) for c in _l(t.get("tool_calls"))],
            "observation": [_message(m) for m in _l(t.get("observation"))],
            "reward": _num(t.get("reward")),
            "prompt_tokens": len(_l(t.get("prompt_token_ids"))),
            "completion_tokens": len(_l(t.get("completion_token_ids"))),
            "finish_reason": _str(t.get("finish_reason"), 100),
            "version": _version(t.get("weight_version")),
            "new_session": bool(t.get("new_session") is True),
            "parse_error": _str(t.get("parse_error"), 2000),
            "timing": timing,
        })
    info = {k: v for k, v in _d(rec.get("info")).items() if k not in ("actions",)}
    opening = messages[:first_assistant] if turns else messages
    return {  # built from finite numbers and strings, but for the dicts passed through from the file
        **row, "id": id,
        "group": _str(rec.get("group_id"), 500),
        "error": _str(rec.get("error"), 5000),
        "opening": [_message(m) for m in opening],
        "turns": turns,
        "policy_rewards": jsonable(_d(rec.get("policy_rewards"))),
        "metrics": jsonable(_d(rec.get("metrics"))),
        "timing": jsonable(_d(rec.get("timing"))),
        "info": jsonable({k: (cap(v, 2000) if isinstance(v, str) else v) for k, v in info.items()}),
    }


# ------------------------------------------------------------------------------------------------ groups
def _zero_variance(rewards: list[float]) -> bool:
    return not rewards or max(rewards) - min(rewards) <= 1e-9


def group_row(rec: dict[str, Any]) -> dict[str, Any]:
    """The metadata of one ``groups.jsonl`` line (a finished rollout group of a training run)."""
    rewards = [r for r in (_num(x) for x in _l(rec.get("rewards"))) if r is not None]
    outcome = _d(rec.get("outcome"))
    filtered = sorted({str(v) for v in outcome.values() if v})
    gates = [_d(g) for g in _l(rec.get("gate_records"))]
    stops = [g for g in gates if g.get("action") == "stop"]
    tokens = sum(sum(x for x in (_int(v) for v in _l(m)) if x is not None) for m in _l(rec.get("turn_tokens")))
    return {
        "step": _int(rec.get("step")),
        "version": _int(rec.get("version")),
        "env": _str(rec.get("env_id")) or "?",
        "task": _str(rec.get("task_id")) or "?",
        "group": _str(rec.get("group_id"), 500) or "",
        "members": len(_l(rec.get("rewards"))),
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "successes": sum(1 for s in _l(rec.get("success")) if s is True),
        "zero_variance": _zero_variance(rewards),
        "early_stopped": bool(rec.get("early_stopped") is True),
        "stop_reason": _str(rec.get("stop_reason")),
        "outcome": "filtered: " + ", ".join(filtered) if filtered else "kept",
        "gate_decisions": len(gates),
        "gate_stops": len(stops),
        "gate_enforced": any(g.get("enforced") is True for g in stops),
        "errors": sum(1 for e in _l(rec.get("errors")) if e),
        "tokens": tokens,
    }


def group_view(rec: dict[str, Any], id: int) -> dict[str, Any]:
    """One group as the page renders it: members side by side (each step's action, tool calls and tokens),
    rewards, and every gate decision with its step, score and reason."""
    n = len(_l(rec.get("rewards")))

    def per_member(key: str) -> list[Any]:
        vals = _l(rec.get(key))
        return [vals[i] if i < len(vals) else None for i in range(n)]

    members = []
    for i, (act, calls, toks, rew, succ, err, trunc, mem) in enumerate(zip(
            per_member("actions"), per_member("calls"), per_member("turn_tokens"), per_member("rewards"),
            per_member("success"), per_member("errors"), per_member("truncated"), per_member("members"),
            strict=True)):
        members.append({"member": _int(mem) if _int(mem) is not None else i,
                        "actions": [cap(a, 5000) for a in _l(act)],
                        "calls": [cap(c, 5000) for c in _l(calls)],
                        "turn_tokens": [_int(x) for x in _l(toks)],
                        "reward": _num(rew), "success": succ is True, "error": _str(err, 2000),
                        "truncated": trunc is True})
    gates = []
    for g in (_d(x) for x in _l(rec.get("gate_records"))):
        gates.append({k: (cap(v, 2000) if isinstance(v, str) else v) for k, v in g.items()})
    return jsonable({**group_row(rec), "id": id, "member_records": members, "gate_records": gates,
                     "outcome_by_policy": _d(rec.get("outcome"))})

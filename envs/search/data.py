"""Loaders for Search-R1 data: wiki-18 JSONL corpora and NQ/HotpotQA question files.

* Corpus rows: ``{"id": "...", "contents": "\\"Title\\"\\ntext"}`` (wiki-18), or ``{"id", "title", "text"}``.
* Question rows: ``{"question": ..., "golden_answers": [...]}`` (FlashRAG / Search-R1 raw files), or
  Search-R1's processed parquet rows whose answers sit in ``reward_model.ground_truth.target``.
  JSONL, JSON lists and parquet (needs ``pyarrow``) are read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentgym.envs.search.remote import parse_contents
from agentgym.envs.search.retrieval import Passage

from agentgym.errors import DependencyNotInstalled, ValidationError
from agentgym.loading import LoadReport, read_rows

__all__ = ["QARecord", "iter_wiki_corpus", "load_questions", "load_wiki_corpus"]


def iter_wiki_corpus(path: str | os.PathLike[str], limit: int | None = None) -> Iterator[Passage]:
    """Stream passages from a wiki-18 style JSONL file (plain or ``.gz``)."""
    p = Path(path)
    if not p.exists():
        raise ValidationError(f"Corpus file {p} does not exist.")
    opener: Any = open
    if p.suffix == ".gz":
        import gzip

        opener = gzip.open
    with opener(p, "rt", encoding="utf-8") as fh:
        n = 0
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValidationError(f"{p}:{lineno}: not valid JSON ({e}).") from None
            if not isinstance(row, dict):
                raise ValidationError(f"{p}:{lineno}: expected a JSON object per line.")
            doc_id = str(row.get("id", lineno - 1))
            if "contents" in row:
                title, text = parse_contents(str(row["contents"]))
            elif "text" in row:
                title, text = str(row.get("title", "")), str(row["text"])
            else:
                raise ValidationError(f"{p}:{lineno}: a corpus row needs 'contents' (wiki-18) or 'title'/'text'.")
            yield Passage(doc_id, title, text)
            n += 1
            if limit is not None and n >= limit:
                return


def load_wiki_corpus(path: str | os.PathLike[str], limit: int | None = None) -> list[Passage]:
    """Read a wiki-18 style JSONL corpus into memory."""
    return list(iter_wiki_corpus(path, limit))


class QARecord(dict):  # type: ignore[type-arg]
    """``{"id", "question", "answers", "source"}``: one question with its gold answers."""


def _answers(row: dict[str, Any]) -> list[str]:
    for key in ("golden_answers", "answers", "answer"):
        if key in row and row[key] is not None:
            val = row[key]
            break
    else:
        gt = ((row.get("reward_model") or {}).get("ground_truth") or {})
        val = gt.get("target") if isinstance(gt, dict) else gt
    if val is None:
        return []
    if isinstance(val, str):
        return [val]
    return [str(v) for v in list(val)]


def _question(row: dict[str, Any]) -> str | None:
    q = row.get("question")
    if q is None and isinstance(row.get("extra_info"), dict):
        q = row["extra_info"].get("question")
    return None if q is None else str(q)


def _read_rows(p: Path) -> list[dict[str, Any]]:
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DependencyNotInstalled("Reading parquet question files", "pyarrow") from None
        return list(pq.read_table(p).to_pylist())
    return read_rows(p)


def load_questions(path: str | os.PathLike[str], limit: int | None = None,
                   report: LoadReport | None = None) -> list[QARecord]:
    """Read Search-R1 / FlashRAG question rows (JSONL, JSON or parquet).

    A row whose id repeats an earlier row's is left out (two tasks cannot share an id); it is
    recorded in ``report`` with its reason. A row without a question or answers is an error.
    """
    p = Path(path)
    if not p.exists():
        raise ValidationError(f"Question file {p} does not exist.")
    out: list[QARecord] = []
    seen: set[str] = set()
    for i, row in enumerate(_read_rows(p)):
        q = _question(row)
        answers = _answers(row)
        if q is None or not answers:
            raise ValidationError(f"{p}: row {i} needs 'question' and 'golden_answers' (or reward_model.ground_truth.target).")
        rid = row.get("id", (row.get("extra_info") or {}).get("index", i) if isinstance(row.get("extra_info"), dict) else i)
        if str(rid) in seen:
            if report is not None:
                report.skip(f"{p.name} row {i}", "duplicate question id")
            continue
        seen.add(str(rid))
        out.append(QARecord(id=str(rid), question=q, answers=answers, source=str(row.get("data_source", p.stem))))
        if limit is not None and len(out) >= limit:
            break
    return out

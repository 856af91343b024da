"""Retrieval backends behind one small protocol: in-process BM25 (bm25s), optional dense (faiss).

Every backend answers ``search(query, k) -> list[Hit]`` and ``batch_search(queries, k)``. Passages
live in a :class:`DocStore`: in memory for small corpora, or a JSONL file plus an offsets array that
is memory-mapped (``mmap=True``) so a multi-million-passage corpus is not loaded into RAM.

A saved BM25 index is a folder::

    INDEX/
      bm25/            bm25s score matrix + vocabulary (np.load(mmap_mode="r") when mmap=True)
      docs.jsonl       one {"id", "title", "text"} per line
      offsets.npy      byte offset of each line of docs.jsonl
      meta.json        {"kind": "bm25", "num_docs": N, "version": 1}
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from agentgym.envs.search.store import INDEX_VERSION, DocStore, Hit, Passage, Retriever, read_meta
from agentgym.envs.search.text import tokenize

from agentgym.errors import ConfigurationError

__all__ = ["BM25Index", "DocStore", "Hit", "Passage", "Retriever", "load_index"]


def _quiet_bm25s() -> None:
    logging.getLogger("bm25s").setLevel(logging.ERROR)


class BM25Index:
    """In-process BM25 over a :class:`DocStore`, scored with bm25s's precomputed sparse matrix.

    Queries skip bm25s's batch machinery: the query is tokenised, mapped to vocabulary ids, the
    matching columns of bm25s's score matrix are summed, and ``argpartition`` picks the top ``k``.
    A query token repeated twice counts twice (as in bm25s). Title tokens are
    indexed with the passage text.

    Args:
        model: A fitted ``bm25s.BM25``.
        docs: The passages, in index row order.
    """

    kind = "bm25"

    def __init__(self, model: Any, docs: DocStore) -> None:
        self.model = model
        self.docs = docs
        self._vocab: dict[str, int] = model.vocab_dict
        self.num_docs = len(docs)

    # ------------------------------------------------------------------ build / save / load
    @classmethod
    def build(cls, passages: Iterable[Passage], *, k1: float = 0.9, b: float = 0.4) -> BM25Index:
        """Tokenise and index ``passages`` (title + text). k1/b default to Pyserini's BM25 settings."""
        import bm25s

        _quiet_bm25s()
        plist = list(passages)
        if not plist:
            raise ConfigurationError("Cannot build a BM25 index over an empty corpus.")
        vocab: dict[str, int] = {}
        ids: list[list[int]] = []
        for p in plist:
            toks = tokenize(f"{p.title} {p.text}")
            ids.append([vocab.setdefault(t, len(vocab)) for t in toks])
        model = bm25s.BM25(k1=k1, b=b)
        model.index((ids, vocab), show_progress=False)
        return cls(model, DocStore(plist))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save the index and its passages into the folder ``path`` (created if needed)."""
        out = Path(path)
        (out / "bm25").mkdir(parents=True, exist_ok=True)
        self.model.save(str(out / "bm25"), show_progress=False)
        self.docs.save(out)
        meta = {"kind": "bm25", "num_docs": self.num_docs, "version": INDEX_VERSION}
        (out / "meta.json").write_text(json.dumps(meta))
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, mmap: bool = False) -> BM25Index:
        """Load a folder written by :meth:`save`; ``mmap=True`` memory-maps the matrix and the passages."""
        import bm25s

        _quiet_bm25s()
        root = Path(path)
        meta = read_meta(root)
        if meta.get("kind") != "bm25":
            raise ConfigurationError(f"{root} holds a {meta.get('kind')!r} index, not a BM25 index.")
        model = bm25s.BM25.load(str(root / "bm25"), mmap=mmap, show_progress=False)
        return cls(model, DocStore(path=root, mmap=mmap))

    # ------------------------------------------------------------------ search
    def query_ids(self, query: str) -> list[int]:
        """The vocabulary ids of the query's tokens (unknown tokens dropped)."""
        v = self._vocab
        return [v[t] for t in tokenize(query) if t in v]

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for ``query`` (zeros when no query token is in the vocabulary)."""
        ids = self.query_ids(query)
        scores = np.zeros(self.num_docs, dtype=np.float32)
        if not ids:
            return scores
        # Sum the query tokens' columns of bm25s's precomputed score matrix (CSC: one column per
        # token). Row ids are unique within a column, so a fancy-index add is exact and much faster
        # than bm25s's np.add.at.
        mat = self.model.scores
        data, indices, indptr = mat["data"], mat["indices"], mat["indptr"]
        for t in ids:
            start, end = int(indptr[t]), int(indptr[t + 1])
            scores[indices[start:end]] += data[start:end]
        nonocc = getattr(self.model, "nonoccurrence_array", None)
        if nonocc is not None:  # BM25L/BM25+ variants only
            scores += np.asarray(nonocc)[ids].sum()
        return scores

    def search(self, query: str, k: int = 3) -> list[Hit]:
        """The top ``k`` passages for ``query``, best first; passages scoring 0 are left out."""
        scores = self.scores(query)
        k = max(0, min(int(k), self.num_docs))
        if k == 0:
            return []
        if k < self.num_docs:
            top = np.argpartition(-scores, k - 1)[:k]
        else:
            top = np.arange(self.num_docs)
        top = top[np.argsort(-scores[top], kind="stable")]
        hits = []
        for i in top:
            s = float(scores[i])
            if s <= 0.0:
                break
            p = self.docs[int(i)]
            hits.append(Hit(p.doc_id, p.title, p.text, s))
        return hits

    def batch_search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        return [self.search(q, k) for q in queries]


def load_index(path: str | os.PathLike[str], *, mmap: bool = False) -> Retriever:
    """Load a saved index folder of any kind (``bm25`` or ``dense``)."""
    root = Path(path)
    kind = read_meta(root).get("kind")
    if kind == "bm25":
        return BM25Index.load(root, mmap=mmap)
    if kind == "dense":
        from agentgym.envs.search.dense import DenseIndex

        return DenseIndex.load(root, mmap=mmap)
    raise ConfigurationError(f"{root}/meta.json names an unknown index kind {kind!r}.")


def timed_build(passages: Sequence[Passage]) -> tuple[BM25Index, float]:
    """Build a BM25 index and return it with the build time in seconds (for benchmarks)."""
    t0 = time.perf_counter()
    idx = BM25Index.build(passages)
    return idx, time.perf_counter() - t0

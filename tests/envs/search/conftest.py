"""Shared fixtures: one generated-world env per session, tiny wiki-18 corpora and question files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

WIKI_ROWS = [
    {"id": "0", "contents": '"Ada Lovelace"\nAda Lovelace was an English mathematician who wrote about the Analytical Engine.'},
    {"id": "1", "contents": '"Charles Babbage"\nCharles Babbage designed the Analytical Engine and the Difference Engine.'},
    {"id": "2", "contents": '"Analytical Engine"\nThe Analytical Engine was a proposed mechanical general-purpose computer.'},
    {"id": "3", "contents": '"Paris"\nParis is the capital and most populous city of France.'},
    {"id": "4", "contents": '"Lyon"\nLyon is the third-largest city of France, on the Rhone and the Saone.'},
    {"id": "5", "contents": '"Rhone"\nThe Rhone is a major river of Europe that rises in the Alps and flows through Lyon.'},
]
QUESTION_ROWS = [
    {"id": "q0", "question": "what is the capital of france?", "golden_answers": ["Paris"]},
    {"id": "q1", "question": "who designed the difference engine?", "golden_answers": ["Charles Babbage", "Babbage"]},
]


@pytest.fixture(scope="session")
def _search_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("agentgym-cache")


# Module scope, not package: tests/ has no __init__.py files, so a "package" fixture here would live
# for the whole session and point every later test (the model cache included) at this temp folder.
@pytest.fixture(autouse=True, scope="module")
def _isolated_cache(_search_cache_dir: Path) -> Iterator[None]:
    """Keep the search index cache out of the user's home during these tests, then restore the env."""
    old = os.environ.get("AGENTGYM_CACHE")
    os.environ["AGENTGYM_CACHE"] = str(_search_cache_dir)
    yield
    if old is None:
        os.environ.pop("AGENTGYM_CACHE", None)
    else:
        os.environ["AGENTGYM_CACHE"] = old


@pytest.fixture
def wiki_corpus(tmp_path: Path) -> Path:
    p = tmp_path / "wiki.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in WIKI_ROWS))
    return p


@pytest.fixture
def questions_jsonl(tmp_path: Path) -> Path:
    p = tmp_path / "nq_test.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in QUESTION_ROWS))
    return p


@pytest.fixture(scope="session")
def env():  # type: ignore[no-untyped-def]
    from agentgym.envs.search.env import SearchEnv

    e = SearchEnv()
    yield e
    e.close()

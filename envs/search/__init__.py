"""Search environment family: multi-turn retrieval QA with BM25, dense and remote retrieval.

Public names load lazily so ``import agentgym.envs.search`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BM25Index",
    "DenseIndex",
    "GeneratedWorld",
    "Hit",
    "Passage",
    "RemoteRetriever",
    "Retriever",
    "SearchEnv",
    "create_app",
    "generate_world",
    "load_index",
    "load_questions",
    "load_wiki_corpus",
]

_WHERE = {
    "BM25Index": "retrieval", "Hit": "retrieval", "Passage": "retrieval", "Retriever": "retrieval",
    "load_index": "retrieval", "DenseIndex": "dense", "RemoteRetriever": "remote", "create_app": "remote",
    "SearchEnv": "env", "GeneratedWorld": "world", "generate_world": "world", "load_questions": "data",
    "load_wiki_corpus": "data",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"agentgym.envs.search.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

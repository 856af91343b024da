"""Fixtures shared across test folders: the tiny model of the trainer tests (built from a config, no download),
its tokenizer, and its SFT'd twin (the starting point of the learning tests). Defined once here so a full run
builds each once: the trainer and harness tests both start from them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

TRAINERS = Path(__file__).resolve().parent / "trainers"


def _tiny_lookup() -> Any:
    if str(TRAINERS) not in sys.path:  # tiny_lookup registers its env by the entry point "tiny_lookup:..."
        sys.path.insert(0, str(TRAINERS))
    import tiny_lookup

    return tiny_lookup


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(_tiny_lookup().build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", init=0.1))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model: str) -> Any:
    from agentgym.policies.models import load_tokenizer

    return load_tokenizer(tiny_model)


@pytest.fixture(scope="session")
def tiny_sft_model(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model after a short SFT (tiny_lookup.build_tiny_sft_model)."""
    return _tiny_lookup().build_tiny_sft_model(tiny_model, tmp_path_factory.mktemp("tiny-sft"))

"""Fixtures for trainer tests: a tiny model (built from a config, no download) and its tokenizer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # tiny_lookup registers its env by the entry point "tiny_lookup:..."
    sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    import tiny_lookup

    return str(tiny_lookup.build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", init=0.1))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model: str) -> Any:
    from agentgym.policies.models import load_tokenizer

    return load_tokenizer(tiny_model)


@pytest.fixture(scope="session")
def tiny_sft_model(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model after a short SFT (tiny_lookup.build_tiny_sft_model)."""
    import tiny_lookup

    return tiny_lookup.build_tiny_sft_model(tiny_model, tmp_path_factory.mktemp("tiny-sft"))

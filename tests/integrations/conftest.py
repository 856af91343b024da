"""The tiny TRL player (``tiny_coin.build_tiny_player``: SmolLM2's tokenizer and template on a tiny Llama, nothing
downloaded), built once per session for the TRL tests and the README's TRL example."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # tiny_coin registers its env by the entry point "tiny_coin:..."
    sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def tiny_player(tmp_path_factory: pytest.TempPathFactory) -> str:
    import tiny_coin

    return str(tiny_coin.build_tiny_player(tmp_path_factory.mktemp("tiny-player") / "model"))

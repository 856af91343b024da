"""Fixtures for the harness tests: the tiny model and tokenizer of the trainer tests, its SFT'd twin,
and a scripted token policy over the real tokenizer (for tests about our own bookkeeping)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
TRAINERS = HERE.parent / "trainers"
for p in (HERE, TRAINERS):  # harness_agents (the agents under test), tiny_lookup (the task and model)
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


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
    """The trainer tests' starting point (tiny_lookup.build_tiny_sft_model)."""
    import tiny_lookup

    return tiny_lookup.build_tiny_sft_model(tiny_model, tmp_path_factory.mktemp("tiny-sft"))

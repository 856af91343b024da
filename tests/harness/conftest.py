"""Harness tests import the agents under test (``harness_agents``, this folder) and the trainer tests' task
(``tiny_lookup``); the tiny model, its tokenizer and its SFT'd twin are fixtures of ``tests/conftest.py``."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAINERS = HERE.parent / "trainers"
for p in (HERE, TRAINERS):  # harness_agents (the agents under test), tiny_lookup (the task and model)
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

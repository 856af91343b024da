"""Trainer tests import their task (``tiny_lookup``) and workers from this folder; the tiny model, its tokenizer
and its SFT'd twin are fixtures of ``tests/conftest.py``."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # tiny_lookup registers its env by the entry point "tiny_lookup:..."
    sys.path.insert(0, str(HERE))

"""Share the rollout test fakes (test env + policies) with the dataflow tests."""

from __future__ import annotations

import sys
from pathlib import Path

FAKES_DIR = str(Path(__file__).resolve().parents[1] / "rollout")
if FAKES_DIR not in sys.path:
    sys.path.insert(0, FAKES_DIR)

"""Plain helpers for the env-service tests, importable by test modules (conftest is not: its module name is shared)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

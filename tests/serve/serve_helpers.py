"""Plain helpers for the env-service tests, importable by test modules (conftest is not: its module name is shared)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoggedProcess:
    """A server subprocess (its own process group) whose stderr goes to an unnamed temporary file.

    Never a pipe: a pipe nobody reads fills at 64 KiB, and then the server blocks in its next
    ``write(2)`` to stderr (a logged traceback), with every request it would serve."""

    def __init__(self, cmd: Sequence[str], **popen_kw: Any) -> None:
        self.log = tempfile.TemporaryFile()  # noqa: SIM115  # closed by kill()
        self.proc = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True,
                                     **popen_kw)

    def stderr(self) -> str:
        """Everything the server has written to stderr so far."""
        return os.pread(self.log.fileno(), 1 << 24, 0).decode("utf-8", "replace")  # the file offset is untouched

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.log.close()


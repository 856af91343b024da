"""Plain helpers for the env-service tests, importable by test modules (conftest is not: its module name is shared)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
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


class DropFirstAnswer:
    """A TCP proxy on 127.0.0.1 in front of ``upstream`` (``host, port``) that, the first time a request
    containing ``marker`` passes, forwards it, waits for the server's answer, and then closes the
    client's connection instead of relaying it: the request was applied, and its answer is lost (the
    keep-alive race, made deterministic). ``dropped`` is set then."""

    def __init__(self, upstream: tuple[str, int], marker: bytes) -> None:
        self.upstream, self.marker = upstream, marker
        self.dropped = threading.Event()
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            server = socket.create_connection(self.upstream)
            self._conns += [client, server]
            armed = threading.Event()  # this connection carries the request whose answer is dropped
            threading.Thread(target=self._pump, args=(client, server, armed, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, armed, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, armed: Any, upward: bool) -> None:
        try:
            while data := src.recv(65536):
                if upward and self.marker in data and not self.dropped.is_set():
                    armed.set()  # before it is forwarded: its answer comes after this
                if not upward and armed.is_set() and not self.dropped.is_set():
                    self.dropped.set()  # the answer arrived upstream: the client never sees it
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> DropFirstAnswer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sock.close()
        for s in self._conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

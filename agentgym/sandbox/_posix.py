"""POSIX helpers for the bwrap and process backends: sandbox uids, rlimits, leftover cleanup."""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import resource
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["UidPool", "is_root", "kill_uid", "make_preexec"]

CLONE_NEWNET = 0x40000000


def is_root() -> bool:
    return os.geteuid() == 0


class UidPool:
    """Hands out unprivileged uids for sandboxed runs when the host runs as root.

    Root ignores ``RLIMIT_NPROC`` (so a fork bomb would not be stopped) and may signal any
    process, so sandboxed programs never run as root: each concurrent run gets its own uid from a
    range derived from this process's pid, which also lets the process backend kill exactly the
    run's leftovers.
    """

    BASE = 420_000
    SLOTS = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free = list(range(self.SLOTS))

    @contextlib.contextmanager
    def acquire(self) -> Iterator[int]:
        with self._lock:
            # FIFO: a uid whose last processes are still being torn down is reused last
            slot = self._free.pop(0) if self._free else threading.get_ident() % self.SLOTS
        try:
            yield self.BASE + (os.getpid() % 4096) * self.SLOTS + slot
        finally:
            with self._lock:
                if slot not in self._free:
                    self._free.append(slot)


def make_preexec(
    *,
    uid: int | None,
    timeout_s: float | None,
    memory_mb: int | None,
    nproc: int | None,
    file_mb: int | None,
    unshare_net: bool = False,
) -> Callable[[], None]:
    """A ``preexec_fn``: new session, optional net namespace, drop to ``uid``, set rlimits.

    Runs in the forked child before exec; only async-signal-tolerant calls are made.
    """
    libc = ctypes.CDLL(None, use_errno=True) if unshare_net else None

    def _pre() -> None:
        os.setsid()
        if libc is not None and libc.unshare(CLONE_NEWNET) != 0:
            os._exit(125)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        if timeout_s is not None:
            cpu = math.ceil(timeout_s) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        if memory_mb is not None:
            mem = int(memory_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if file_mb is not None:
            fs = int(file_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_FSIZE, (fs, fs))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return _pre


def kill_uid(uid: int, wait_s: float = 2.0) -> int:
    """SIGKILL every process owned by ``uid`` until none is left (or ``wait_s`` passes).

    Returns how many kill signals were sent.
    """
    import time

    killed = 0
    deadline = time.monotonic() + wait_s
    while True:
        found = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                with open(f"/proc/{name}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[-1].split()[0]
                if state in (b"Z", b"X"):
                    continue  # already dead; waiting for its (possibly foreign) parent to reap it
                found += 1
                os.kill(int(name), signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        killed += found
        if not found or time.monotonic() > deadline:
            return killed
        time.sleep(0.01)


def release_workdir(uid_cm: Any, uid: int | None, path: str) -> None:
    """End a session: kill what its uid left running, return the uid to its pool, delete the work dir."""
    import shutil

    if uid_cm is not None:
        kill_uid(uid or 0)
        uid_cm.__exit__(None, None, None)
    shutil.rmtree(path, ignore_errors=True)

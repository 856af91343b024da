"""POSIX helpers for the sandbox backends: sandbox uids, rlimits, leftover cleanup."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import math
import os
import resource
import signal
import threading
from collections.abc import Callable, Iterator

__all__ = ["UidLease", "UidPool", "is_root", "kill_uid", "make_preexec"]

CLONE_NEWNET = 0x40000000


def is_root() -> bool:
    return os.geteuid() == 0


class UidLease:
    """One uid held exclusively by this process until :meth:`release` (see :class:`UidPool`)."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self._fd = fd

    def release(self, *, clean: bool = False) -> None:
        """Give the uid back. Unless ``clean`` (no process of it can be left), kill its processes first."""
        if self._fd < 0:
            return
        if not clean:
            kill_uid(self.uid)
        with contextlib.suppress(OSError):
            os.pwrite(self._fd, b"0", 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> int:
        return self.uid

    def __exit__(self, *exc: object) -> None:
        self.release()


class UidPool:
    """Hands out unprivileged uids for sandboxed runs when the host runs as root.

    Root ignores ``RLIMIT_NPROC`` (so a fork bomb would not be stopped) and may signal any
    process, so sandboxed programs never run as root. Each run (or session, warm worker, docker
    container) gets a uid that no other sandbox instance, thread or process on this machine holds
    at the same time: uid ``BASE + n`` is held by an exclusive ``flock`` on a lock file in a
    root-only directory, which the kernel drops when the holder exits, however it exits. Killing
    "every process of the run's uid" therefore only ever reaches that run. A lease left by a holder
    that died is marked in use, and the next holder kills that uid's leftovers before using it.
    """

    BASE = 420_000
    SPAN = 4096  # also bounds the lock files kept in the lock dir

    def __init__(self, lock_dir: str | None = None) -> None:
        self._dir = lock_dir

    def lease(self) -> UidLease:
        """Lock a free uid (and clear any leftovers of a holder that died)."""
        global _cursor
        d = self._dir or _lock_dir()
        with _cursor_lock:
            start = _cursor
            _cursor = (_cursor + 1) % self.SPAN
        for i in range(self.SPAN):
            n = (start + i) % self.SPAN
            fd = os.open(os.path.join(d, f"uid-{self.BASE + n}"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if os.pread(fd, 1, 0) == b"1":
                kill_uid(self.BASE + n)  # the last holder died while holding it
            os.pwrite(fd, b"1", 0)
            return UidLease(self.BASE + n, fd)
        raise RuntimeError("every sandbox uid is in use")

    @contextlib.contextmanager
    def acquire(self) -> Iterator[int]:
        """Context manager form of :meth:`lease`: the uid, released (its processes killed) at exit."""
        lease = self.lease()
        try:
            yield lease.uid
        finally:
            lease.release()


_cursor = (os.getpid() * 64) % UidPool.SPAN  # processes start probing at different uids
_cursor_lock = threading.Lock()
_lock_dir_path: str | None = None


def _lock_dir() -> str:
    """A directory only root can write: ``/run/agentgym/uids`` (or under the temp dir)."""
    global _lock_dir_path
    if _lock_dir_path is not None:
        return _lock_dir_path
    import stat
    import tempfile

    for base in ("/run", tempfile.gettempdir()):
        d = os.path.join(base, f"agentgym-uids-{os.geteuid()}")
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError:
            continue
        st = os.lstat(d)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            _lock_dir_path = d
            return d
    raise RuntimeError("no private directory for sandbox uid locks (tried /run and the temp dir)")


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


def mount_tmpfs(path: str, size_mb: int, uid: int | None) -> None:
    """Root only: mount a tmpfs of ``size_mb`` on ``path`` (mode 0700, owned by ``uid``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    opts = f"size={int(size_mb)}m,mode=0700" + (f",uid={uid},gid={uid}" if uid is not None else "")
    if libc.mount(b"tmpfs", path.encode(), b"tmpfs", ctypes.c_ulong(2 | 4), opts.encode()) != 0:  # nosuid, nodev
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {path}: {os.strerror(err)}")


def release_workdir(lease: UidLease | None, path: str) -> None:
    """End a session: kill what its uid left running, give the uid back, delete the work dir (and
    unmount it first when it is a tmpfs of its own)."""
    import shutil

    if lease is not None:
        lease.release()
    if os.path.ismount(path):
        ctypes.CDLL(None, use_errno=True).umount2(path.encode(), 2)  # MNT_DETACH
    shutil.rmtree(path, ignore_errors=True)

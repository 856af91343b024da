"""The fallback backend: a supervised subprocess with rlimits. **Weaker than bwrap or Docker.**

Each run is started by a small supervisor (:func:`agentgym.sandbox._worker.supervise`, forked by
a pre-started zygote) that forks the program and, once it exits, kills every process it left
behind (the supervisor is a child subreaper, so every orphan of the run is its descendant and
none escapes). The program gets a
fresh temporary working directory (deleted afterwards), a cleared environment (no host secrets),
rlimits on CPU time, address space, processes and file size, ``no_new_privs`` (setuid binaries are
inert) and a seccomp filter that denies ``ptrace``; its output is capped, and the run ends at its
deadline whatever the program does. The program writes its own files, so the host never writes
into a directory a program controls.

When the host runs as **root** the program always runs as a throw-away unprivileged uid held by
this run alone (so it cannot read ``/root``, write the host's files or signal the host, and
``RLIMIT_NPROC`` applies), in new network and IPC namespaces (no network, no shared memory with
anyone) with fresh, size-capped ``/tmp``, ``/var/tmp`` and ``/dev/shm``, and a session's working
directory is a tmpfs of ``file_mb`` (its files capped in total, never on the host's disk). Running
untrusted code as root without dropping privileges is refused.

What it does **not** do: hide the filesystem (the program sees the host's files that its uid may
read). As an ordinary user it also cannot block the network, hide ``/tmp``, ``/dev/shm`` or System V
IPC (they are shared with the host and persist), cap a session's files in total (its working
directory is on the host's disk; only each file is capped), or stop the program from signalling the user's
other processes, including its supervisor (a program that kills its supervisor can leave processes
behind). Use ``bwrap`` or ``docker`` for untrusted code whenever you can.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import weakref

from agentgym.errors import SandboxError
from agentgym.sandbox._posix import UidPool, is_root, kill_uid, mount_tmpfs, release_workdir
from agentgym.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    ExecResult,
    Files,
    Language,
    Session,
    as_bytes,
    check_relpath,
    communicate,
    default_python,
    killpg,
    result_from,
)

__all__ = ["ProcessSandbox"]

_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")


class ProcessSandbox:
    """Supervised subprocess + rlimits. See the module docstring for what it does and does not isolate.

    Args:
        python: Interpreter (default: the system ``python3``, readable by unprivileged uids).
        nproc: Processes the program may create (only enforced for non-root uids).
        file_mb: Largest file the program may write; size of the private ``/tmp`` and ``/dev/shm`` (root).
        drop_privileges: Run as a throw-away uid in new namespaces. Always on as root (turning it
            off as root raises :class:`~agentgym.errors.SandboxError`); impossible otherwise.
    """

    name = "process"

    def __init__(self, *, python: str | None = None, nproc: int = 64, file_mb: int = 64,
                 drop_privileges: bool | None = None) -> None:
        self.python = python or default_python()
        self.nproc = int(nproc)
        self.file_mb = int(file_mb)
        self.drop_privileges = is_root() if drop_privileges is None else bool(drop_privileges)
        if self.drop_privileges and not is_root():
            raise SandboxError("drop_privileges=True needs the host to run as root.")
        if is_root() and not self.drop_privileges:
            raise SandboxError("refusing to run untrusted programs as root: the process backend drops to a "
                               "throw-away uid when the host is root (leave drop_privileges unset).")
        self._uids = UidPool()
        self._base = tempfile.mkdtemp(prefix="agentgym-proc-")
        os.chmod(self._base, 0o711)
        self._zygote: _Zygote | None = None
        self._zygote_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _cleanup, self._base, self.__dict__)

    @property
    def isolates_network(self) -> bool:
        """Whether programs run without network access (only when running as root)."""
        return self.drop_privileges

    def _make_dir(self, uid: int | None) -> str:
        d = tempfile.mkdtemp(dir=self._base)
        if uid is not None:
            os.chown(d, uid, uid)
        os.chmod(d, 0o700)
        return d

    def run(self, program: str, *, language: Language = "python", stdin: str | bytes | None = None,
            files: Files | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
            max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> ExecResult:
        """Run ``program`` in a fresh temp dir (see :class:`~agentgym.sandbox.base.Sandbox`)."""
        lease = self._uids.lease() if self.drop_privileges else None
        clean = False
        try:
            d = self._make_dir(lease.uid if lease is not None else None)
            try:
                res, clean = self._run_in(d, lease.uid if lease is not None else None, program, language=language,
                                          stdin=stdin, files=files, timeout_s=timeout_s, memory_mb=memory_mb,
                                          max_output_bytes=max_output_bytes)
                return res
            finally:
                shutil.rmtree(d, ignore_errors=True)
        finally:
            if lease is not None:
                lease.release(clean=clean)

    def _zygote_for_run(self) -> _Zygote:
        with self._zygote_lock:
            if self._zygote is None or not self._zygote.alive():
                if self._zygote is not None:
                    self._zygote.close()
                self._zygote = _Zygote(self.python)
            return self._zygote

    def _run_in(self, workdir: str, uid: int | None, program: str, *, language: Language,
                stdin: str | bytes | None, files: Files | None, timeout_s: float, memory_mb: int,
                max_output_bytes: int) -> tuple[ExecResult, bool]:
        """One supervised run; returns the result and whether the supervisor saw nothing left behind."""
        if language not in ("python", "bash"):
            raise ValueError(f"language must be 'python' or 'bash', not {language!r}")
        req = {
            "program": program, "language": language, "workdir": workdir, "uid": uid, "python": self.python,
            "files": {check_relpath(k): base64.b64encode(as_bytes(v)).decode() for k, v in (files or {}).items()},
            "timeout_s": float(timeout_s), "memory_mb": int(memory_mb), "nproc": self.nproc, "file_mb": self.file_mb,
            "env": dict(_ENV, HOME=workdir, TMPDIR=workdir), "namespaces": uid is not None,
        }
        run = self._start(json.dumps(req).encode())
        records = run.records

        def _kill() -> None:
            if run.poll() is None:
                run.signal(signal.SIGUSR1)  # the supervisor kills the run and all it started
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.wait(timeout=0.5)
            if run.poll() is not None and records.clean():
                return
            # the supervisor did not answer or is gone (the program stopped or killed it): kill what we reach
            run.signal(signal.SIGKILL)
            if records.pid() > 0:
                killpg(records.pid())
            if uid is not None:
                kill_uid(uid)

        try:
            cap = communicate(run, stdin=as_bytes(stdin), timeout_s=timeout_s, max_output_bytes=max_output_bytes,
                              kill=_kill)
            status, clean, error = records.finish()
        finally:
            run.close()
        if error:
            raise SandboxError(f"the process sandbox could not start the run: {error}")
        if not clean and records.program_pid > 0:
            killpg(records.program_pid)
        exit_code = os.waitstatus_to_exitcode(status) if status is not None and status >= 0 else None
        if exit_code is None and (cap.timed_out or cap.truncated or cap.returncode):
            exit_code = -9
        return result_from(cap, self.name, exit_code=exit_code), clean

    def _start(self, request: bytes) -> _Run:
        """Hand a run to the zygote; the pipes and the supervisor's handle."""
        req_fd = os.memfd_create("agentgym-request", 0)
        pipes = [os.pipe() for _ in range(4)]  # status, stdin, stdout, stderr
        (st_r, st_w), (in_r, in_w), (out_r, out_w), (err_r, err_w) = pipes
        child_ends = [req_fd, st_w, in_r, out_w, err_w]
        try:
            view = memoryview(request)
            while view:
                view = view[os.write(req_fd, view):]
            os.lseek(req_fd, 0, os.SEEK_SET)
            try:
                pid, pidfd = self._zygote_for_run().spawn(child_ends)
            except SandboxError:  # the zygote died (killed from outside?): start a new one, once
                pid, pidfd = self._zygote_for_run().spawn(child_ends)
        except BaseException:
            for fd in (st_r, in_w, out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in child_ends:
                os.close(fd)
        return _Run(pid, pidfd, st_r, in_w, out_r, err_r)

    def session(self) -> Session:
        """A session whose working directory persists between runs (as root: a tmpfs of ``file_mb``)."""
        lease = self._uids.lease() if self.drop_privileges else None
        uid = lease.uid if lease is not None else None
        try:
            workdir = self._make_dir(uid)
            if self.drop_privileges:  # root: the session's files are capped in total, never on the host's disk
                mount_tmpfs(workdir, self.file_mb, uid)
        except BaseException:
            if lease is not None:
                lease.release()
            raise

        def run(program: str, *, language: Language, stdin: str | bytes | None, files: Files | None,
                timeout_s: float, memory_mb: int, max_output_bytes: int) -> ExecResult:
            res, _clean = self._run_in(workdir, uid, program, language=language, stdin=stdin, files=files,
                                       timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes)
            return res

        return Session(self.name, run, lambda: release_workdir(lease, workdir))

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> ProcessSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cleanup(base: str, state: dict[str, object]) -> None:
    z = state.get("_zygote")
    if isinstance(z, _Zygote):
        z.close()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):  # a session still open holds a tmpfs here: detach it first
            path = os.path.join(base, name)
            if os.path.ismount(path):
                release_workdir(None, path)
    shutil.rmtree(base, ignore_errors=True)


class _Zygote:
    """The pre-started process that forks a supervisor per run (``_worker.py zygote``)."""

    def __init__(self, python: str) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [python, "-I", "-S", _WORKER, "zygote", str(child.fileno())], pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(_ENV),
                start_new_session=True, cwd="/")
        except OSError as e:
            parent.close()
            raise SandboxError(f"could not start the process sandbox's zygote ({python}): {e}") from e
        finally:
            child.close()
        self.sock = parent
        self._lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, fds: list[int]) -> tuple[int, int]:
        """Fork a supervisor holding ``fds``; its pid and a pidfd for it (-1 where unsupported)."""
        with self._lock:
            try:
                socket.send_fds(self.sock, [b"R"], fds)
                msg, got, _, _ = socket.recv_fds(self.sock, 4, 1)
            except OSError as e:
                raise SandboxError(f"the process sandbox's zygote is gone: {e}") from e
        if len(msg) < 4 or struct.unpack(">i", msg[:4])[0] <= 0:
            for fd in got:
                os.close(fd)
            raise SandboxError("the process sandbox's zygote could not start a run")
        return struct.unpack(">i", msg[:4])[0], (got[0] if got else -1)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


class _Run:
    """A run's supervisor as :func:`~agentgym.sandbox.base.communicate` sees a process: pipes,
    ``poll()`` and ``wait()``. It has ended when its status pipe closes; it is signalled through a
    pidfd, so a pid that was reused can never be hit."""

    def __init__(self, pid: int, pidfd: int, status_fd: int, stdin_fd: int, stdout_fd: int, stderr_fd: int) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self.records = _StatusReader(status_fd)
        self.stdin = os.fdopen(stdin_fd, "wb", buffering=0)
        self.stdout = os.fdopen(stdout_fd, "rb", buffering=0)
        self.stderr = os.fdopen(stderr_fd, "rb", buffering=0)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.records.ended(block=False):
            self.returncode = 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self.records.ended(block=True, timeout=timeout):
                raise subprocess.TimeoutExpired(["agentgym-sandbox"], timeout or 0.0)
            self.returncode = 0
        return self.returncode

    def signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        with contextlib.suppress(OSError):
            if self._pidfd >= 0:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)

    def close(self) -> None:
        for f in (self.stdin, self.stdout, self.stderr):
            with contextlib.suppress(OSError):
                f.close()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        self.records.close()


class _StatusReader:
    """Reads the supervisor's status records: ``P`` + pid, ``S`` + wait status + C/D, ``E`` + error."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buf = b""
        self._eof = False
        self.program_pid = -1
        os.set_blocking(fd, False)

    def _drain(self) -> None:
        while not self._eof:
            try:
                chunk = os.read(self._fd, 4096)
            except BlockingIOError:
                return
            if not chunk:
                self._eof = True
                return
            self._buf += chunk

    def ended(self, *, block: bool, timeout: float | None = None) -> bool:
        """Whether the supervisor is gone (its status pipe closed); waits up to ``timeout`` if ``block``."""
        self._drain()
        if self._eof or not block:
            return self._eof
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._eof:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            select.select([self._fd], [], [], left)
            self._drain()
        return True

    def pid(self) -> int:
        """The program's pid (its process group), once the supervisor has reported it; else -1."""
        self._drain()
        if self._buf[:1] == b"P" and len(self._buf) >= 5:
            self.program_pid = struct.unpack(">i", self._buf[1:5])[0]
        return self.program_pid

    def clean(self) -> bool:
        """The supervisor reported the run over and nothing of it left."""
        self._drain()
        return self._buf[:1] == b"P" and self._buf[5:6] == b"S" and self._buf[10:11] == b"C"

    def finish(self) -> tuple[int | None, bool, str | None]:
        """``(wait status or None, clean, error)`` once the supervisor is gone."""
        self.ended(block=True, timeout=5.0)
        buf = self._buf
        if buf[:1] == b"E":
            return None, False, buf[1:].decode(errors="replace")
        if buf[:1] == b"P" and len(buf) >= 5:
            self.program_pid = struct.unpack(">i", buf[1:5])[0]
            buf = buf[5:]
        if buf[:1] == b"S" and len(buf) >= 6:
            status = struct.unpack(">i", buf[1:5])[0]
            return (None if status < 0 else status), buf[5:6] == b"C", None
        return None, False, None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

"""The fallback backend: a supervised subprocess with rlimits. **Weaker than bwrap or Docker.**

Each run is started by a small supervisor (:func:`agentgym.sandbox._worker.supervise`) that forks
the program and, once it exits, kills every process it left behind (the supervisor is a child
subreaper, so every orphan of the run is its descendant and none escapes). The program gets a
fresh temporary working directory (deleted afterwards), a cleared environment (no host secrets),
rlimits on CPU time, address space, processes and file size, ``no_new_privs`` (setuid binaries are
inert) and a seccomp filter that denies ``ptrace``; its output is capped, and the run ends at its
deadline whatever the program does. The program writes its own files, so the host never writes
into a directory a program controls.

When the host runs as **root** the program always runs as a throw-away unprivileged uid held by
this run alone (so it cannot read ``/root``, write the host's files or signal the host, and
``RLIMIT_NPROC`` applies), in new network and IPC namespaces (no network, no shared memory with
anyone) with fresh, size-capped ``/tmp``, ``/var/tmp`` and ``/dev/shm``. Running untrusted code as
root without dropping privileges is refused.

What it does **not** do: hide the filesystem (the program sees the host's files that its uid may
read). As an ordinary user it also cannot block the network, hide ``/tmp``, ``/dev/shm`` or System V
IPC (they are shared with the host and persist), or stop the program from signalling the user's
other processes, including its supervisor (a program that kills its supervisor can leave processes
behind). Use ``bwrap`` or ``docker`` for untrusted code whenever you can.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import weakref

from agentgym.errors import SandboxError
from agentgym.sandbox._posix import UidLease, UidPool, is_root, kill_uid, release_workdir
from agentgym.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    ExecResult,
    Files,
    Language,
    as_bytes,
    check_relpath,
    communicate,
    default_python,
    killpg,
    result_from,
)

__all__ = ["ProcessSandbox", "ProcessSession"]

_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")


class ProcessSession:
    """Runs sharing one working directory (files persist; processes never do)."""

    def __init__(self, box: ProcessSandbox) -> None:
        self._box = box
        self._lease: UidLease | None = box._uids.lease() if box.drop_privileges else None
        self._uid = self._lease.uid if self._lease is not None else None
        self._dir = box._make_dir(self._uid)
        self._finalizer = weakref.finalize(self, release_workdir, self._lease, self._dir)

    @property
    def path(self) -> str:
        """The working directory on the host."""
        return self._dir

    def run(self, program: str, *, language: Language = "python", stdin: str | bytes | None = None,
            files: Files | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
            max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> ExecResult:
        if not self._finalizer.alive:
            raise SandboxError("this ProcessSession is closed")
        res, _clean = self._box._run_in(self._dir, self._uid, program, language=language, stdin=stdin, files=files,
                                        timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes)
        return res

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> ProcessSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._base, True)

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
        req_fd = os.memfd_create("agentgym-request", 0)
        st_r, st_w = os.pipe()
        try:
            data = json.dumps(req).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(req_fd, view):]
            os.lseek(req_fd, 0, os.SEEK_SET)
            try:
                proc = subprocess.Popen(
                    [self.python, "-I", "-S", _WORKER, "proc", str(req_fd), str(st_w)], env=dict(_ENV),
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(req_fd, st_w),
                    start_new_session=True, cwd="/")
            except OSError as e:
                raise SandboxError(f"could not start the sandbox supervisor ({self.python}): {e}") from e
        finally:
            os.close(req_fd)
            os.close(st_w)
        records = _StatusReader(st_r)

        def _kill() -> None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, signal.SIGUSR1)  # the supervisor kills the run and all it started
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.5)
            if proc.poll() is not None and records.clean():
                return
            # the supervisor did not answer or is gone (the program stopped or killed it): kill what we reach
            killpg(proc.pid)
            if records.pid() > 0:
                killpg(records.pid())
            if uid is not None:
                kill_uid(uid)

        try:
            cap = communicate(proc, stdin=as_bytes(stdin), timeout_s=timeout_s, max_output_bytes=max_output_bytes,
                              kill=_kill)
            status, clean, error = records.finish()
        finally:
            os.close(st_r)
        if error:
            raise SandboxError(f"the process sandbox could not start the run: {error}")
        if not clean:
            killpg(proc.pid)
            if records.program_pid > 0:
                killpg(records.program_pid)
        exit_code = os.waitstatus_to_exitcode(status) if status is not None and status >= 0 else None
        if exit_code is None and (cap.timed_out or cap.truncated or cap.returncode):
            exit_code = -9
        return result_from(cap, self.name, exit_code=exit_code), clean

    def session(self) -> ProcessSession:
        """A session whose working directory persists between runs."""
        return ProcessSession(self)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> ProcessSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _StatusReader:
    """Reads the supervisor's status records: ``P`` + pid, ``S`` + wait status + C/D, ``E`` + error."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buf = b""
        self.program_pid = -1

    def _drain(self, block: bool) -> None:
        os.set_blocking(self._fd, block)
        while True:
            try:
                chunk = os.read(self._fd, 4096)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._buf += chunk

    def pid(self) -> int:
        """The program's pid (its process group), once the supervisor has reported it; else -1."""
        self._drain(False)
        if self._buf[:1] == b"P" and len(self._buf) >= 5:
            self.program_pid = struct.unpack(">i", self._buf[1:5])[0]
        return self.program_pid

    def clean(self) -> bool:
        """The supervisor reported the run over and nothing of it left."""
        self._drain(False)
        return self._buf[:1] == b"P" and self._buf[5:6] == b"S" and self._buf[10:11] == b"C"

    def finish(self) -> tuple[int | None, bool, str | None]:
        """``(wait status or None, clean, error)`` once the supervisor is gone."""
        self._drain(True)
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

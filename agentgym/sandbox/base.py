"""The sandbox contract (:class:`Sandbox`, :class:`ExecResult`) and helpers shared by the backends.

A sandbox runs an untrusted program and always returns an :class:`ExecResult`; the program
failing, hanging, printing too much or running out of memory is *reported*, never raised. Only a
broken backend raises :class:`~agentgym.errors.SandboxError`.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from agentgym.errors import SandboxError

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIMEOUT_S",
    "ExecResult",
    "Language",
    "Limits",
    "Sandbox",
    "SandboxSession",
    "Session",
    "default_python",
    "looks_oom",
]

Language = Literal["python", "bash"]
Files = Mapping[str, str | bytes]

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20


@dataclass
class ExecResult:
    """What happened to one program run.

    Attributes:
        stdout: Captured standard output (decoded as UTF-8, invalid bytes replaced), capped.
        stderr: Captured standard error, capped.
        exit_code: The exit status; ``-N`` when killed by signal N; ``None`` if it never ran.
        timed_out: The time limit was hit and the program was killed: the wall clock passed
            ``timeout_s``, or the CPU-time limit derived from it (``ceil(timeout_s) + 1`` seconds)
            killed it with SIGXCPU, whichever came first.
        oom: The program ran out of memory (memory limit reached).
        truncated: Output exceeded ``max_output_bytes``; the program was killed and output cut.
        duration_s: Wall-clock seconds from start to the end of collection.
        backend: Which backend ran it.
        extra: Backend-specific details (free-form; empty unless a backend documents keys).
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    oom: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    backend: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A busy loop can use up its CPU-time limit a moment before the wall-clock deadline
        # fires; either way the run ran out of time.
        if self.exit_code == -signal.SIGXCPU:
            self.timed_out = True
            self.oom = False

    @property
    def ok(self) -> bool:
        """The program exited with status 0 within its limits."""
        return self.exit_code == 0 and not (self.timed_out or self.oom or self.truncated)

    def summary(self, max_chars: int = 4000) -> str:
        """A short text an agent can read: output, errors and any limit that was hit."""
        parts: list[str] = []
        if self.stdout:
            parts.append(self.stdout)
        if self.stderr:
            parts.append(("[stderr]\n" if self.stdout else "") + self.stderr)
        notes: list[str] = []
        if self.timed_out:
            notes.append("timed out and was killed")
        if self.oom:
            notes.append("ran out of memory")
        if self.truncated:
            notes.append("output too long, truncated and killed")
        if self.exit_code not in (0, None) and not self.timed_out:
            notes.append(f"exit code {self.exit_code}")
        if notes:
            parts.append("[" + "; ".join(notes) + "]")
        text = "\n".join(p.rstrip("\n") for p in parts) or "(no output)"
        if len(text) > max_chars:
            half = max_chars // 2
            text = text[:half] + f"\n... [{len(text) - max_chars} chars cut] ...\n" + text[-half:]
        return text


@dataclass(frozen=True)
class Limits:
    """Per-run resource limits.

    Attributes:
        timeout_s: Wall-clock limit (CPU time is limited to ``ceil(timeout_s) + 1`` s too).
        memory_mb: Address-space (bwrap/process) or cgroup (docker) memory limit.
        max_output_bytes: Cap on stdout + stderr together.
        nproc: Processes/threads the program may create.
        file_mb: Largest file the program may write; also the size of the tmpfs work dir.
    """

    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    nproc: int = 64
    file_mb: int = 64


@runtime_checkable
class Sandbox(Protocol):
    """Runs untrusted programs in isolation. Every backend implements this."""

    name: str

    def run(
        self,
        program: str,
        *,
        language: Language = "python",
        stdin: str | bytes | None = None,
        files: Files | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult:
        """Run ``program`` in a fresh working directory; never raises for the program's faults.

        Args:
            program: Python source or a bash script.
            language: ``"python"`` or ``"bash"``.
            stdin: Bytes (or text) fed to the program's standard input.
            files: Extra files to create in the working directory, ``{relative_path: content}``.
            timeout_s: Wall-clock limit; the whole process tree is killed when it is hit.
            memory_mb: Memory limit.
            max_output_bytes: Cap on captured stdout + stderr.
        """
        ...

    def session(self) -> SandboxSession:
        """A session whose working directory persists across runs until ``close()``."""
        ...

    def close(self) -> None:
        """Release workers, containers and temporary files."""
        ...


class SandboxSession(Protocol):
    """Runs that share one working directory (files persist; processes never do)."""

    def run(
        self,
        program: str,
        *,
        language: Language = "python",
        stdin: str | bytes | None = None,
        files: Files | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult: ...

    def close(self) -> None: ...


class RunInSession(Protocol):
    """One run in a session's directory, as a backend performs it (the arguments of ``Sandbox.run``)."""

    def __call__(self, program: str, *, language: Language, stdin: str | bytes | None, files: Files | None,
                 timeout_s: float, memory_mb: int, max_output_bytes: int) -> ExecResult: ...


class Session:
    """The one :class:`SandboxSession` of every backend: what they share, around what differs.

    A backend's ``session()`` supplies ``run`` (one run in the session's directory, however the
    backend keeps it) and ``release`` (free what the session holds: its directory, worker or
    container, its uid). ``release`` runs once, on :meth:`close` or when the session is dropped
    unclosed, so it must not refer to the session itself.
    """

    def __init__(self, backend: str, run: RunInSession, release: Callable[[], object]) -> None:
        self.backend = backend
        self._run = run
        self._finalizer = weakref.finalize(self, release)

    def run(self, program: str, *, language: Language = "python", stdin: str | bytes | None = None,
            files: Files | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
            max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> ExecResult:
        """Run ``program`` in the session's directory (see :meth:`Sandbox.run`)."""
        if not self._finalizer.alive:
            raise SandboxError(f"this {self.backend} session is closed")
        if language not in ("python", "bash"):
            raise ValueError(f"language must be 'python' or 'bash', not {language!r}")
        return self._run(program, language=language, stdin=stdin, files=files, timeout_s=timeout_s,
                         memory_mb=memory_mb, max_output_bytes=max_output_bytes)

    def close(self) -> None:
        """Release the session's directory and everything it holds (idempotent)."""
        self._finalizer()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------- helpers
_OOM_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory", "Out of memory")


def looks_oom(exit_code: int | None, stderr: str) -> bool:
    """Heuristic: did a failed program run out of memory (rlimit-based backends)?"""
    if exit_code in (0, None):
        return False
    tail = stderr[-4000:]
    return any(m in tail for m in _OOM_MARKERS)


def default_python() -> str:
    """The interpreter used inside sandboxes: the system ``python3`` (outside ``/root`` and venvs)."""
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(cand):
            return cand
    found = shutil.which("python3")
    if found:
        return found
    import sys

    return os.path.realpath(sys.executable)


def as_bytes(data: str | bytes | None) -> bytes:
    if data is None:
        return b""
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def encode_request(program: str, *, language: str, stdin: str | bytes | None, files: Files | None,
                   timeout_s: float, memory_mb: int, max_output_bytes: int, **extra: object) -> dict[str, object]:
    """The JSON request a sandboxed worker (warm bwrap, docker exec) receives: payloads base64-encoded."""
    import base64

    req: dict[str, object] = {
        "program": program,
        "language": language,
        "stdin": base64.b64encode(as_bytes(stdin)).decode() if stdin else None,
        "files": {check_relpath(k): base64.b64encode(as_bytes(v)).decode() for k, v in (files or {}).items()},
        "timeout_s": float(timeout_s),
        "memory_mb": int(memory_mb),
        "max_output_bytes": int(max_output_bytes),
    }
    req.update(extra)
    return req


def check_relpath(path: str) -> str:
    """Validate a ``files`` key: relative, no ``..``. Returns the normalized path."""
    norm = os.path.normpath(path)
    if os.path.isabs(path) or norm.startswith("..") or norm in (".", ""):
        raise ValueError(f"sandbox file path must be relative and inside the work dir: {path!r}")
    return norm


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


@dataclass
class Captured:
    stdout: bytes
    stderr: bytes
    returncode: int | None
    timed_out: bool
    truncated: bool
    duration_s: float


def communicate(
    proc: subprocess.Popen[bytes] | Any,
    *,
    stdin: bytes,
    timeout_s: float,
    max_output_bytes: int,
    kill: Callable[[], None],
    after_exit: Callable[[], None] | None = None,
    grace_s: float = 0.5,
) -> Captured:
    """Feed stdin, stream-read stdout/stderr with a combined cap, enforce a wall-clock deadline.

    Output beyond ``max_output_bytes`` is never held in memory: the program is killed as soon as
    it crosses the cap. ``kill`` must kill the whole process tree; ``after_exit`` (called once the
    main process has exited) kills leftovers that still hold the pipes open.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    out = bytearray()
    err = bytearray()
    timed_out = truncated = False
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    pending = memoryview(stdin)
    if proc.stdin is not None:
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE, None)
        else:
            proc.stdin.close()
    killed = False
    exited_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if not killed and now >= deadline:
                timed_out = True
                kill()
                killed = True
                deadline = now + grace_s
            elif killed and now >= deadline:
                break  # something still holds the pipes after the kill; stop waiting
            if exited_at is None and proc.poll() is not None:
                exited_at = now
                if after_exit is not None:
                    after_exit()
            if exited_at is not None and not killed and now - exited_at > grace_s:
                kill()  # leftovers keep the pipes open
                killed = True
                deadline = now + grace_s
            wait = max(0.0, min(deadline - now, 0.05))
            for key, _ in sel.select(wait):
                fobj = key.fileobj
                if key.data is None:  # stdin writable
                    try:
                        n = os.write(key.fd, pending[:65536])
                        pending = pending[n:]
                    except (BrokenPipeError, OSError):
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fobj)
                        with contextlib.suppress(OSError):
                            fobj.close()  # type: ignore[union-attr]
                    continue
                try:
                    chunk = os.read(key.fd, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(fobj)
                    continue
                buf: bytearray = key.data
                room = max_output_bytes - len(out) - len(err)
                if len(chunk) > room:
                    buf += chunk[: max(room, 0)]
                    if not truncated:
                        truncated = True
                        if not killed:
                            kill()
                            killed = True
                            deadline = time.monotonic() + grace_s
                else:
                    buf += chunk
    finally:
        for key in list(sel.get_map().values()):
            with contextlib.suppress(Exception):
                sel.unregister(key.fileobj)
        sel.close()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
    rc: int | None = None
    if not killed:  # the output is closed but the program may still run: it gets until its deadline
        try:
            rc = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            kill()
            killed = True
    if rc is None:
        try:
            rc = proc.wait(timeout=max(grace_s, 1.0))
        except subprocess.TimeoutExpired:
            kill()
            try:
                rc = proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable
                rc = None
    return Captured(bytes(out), bytes(err), rc, timed_out, truncated, time.monotonic() - t0)


def killpg(pid: int) -> None:
    """SIGKILL a process group, ignoring a group that is already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def result_from(c: Captured, backend: str, *, exit_code: int | None = None) -> ExecResult:
    stderr = decode(c.stderr)
    rc = c.returncode if exit_code is None else exit_code
    return ExecResult(
        stdout=decode(c.stdout),
        stderr=stderr,
        exit_code=rc,
        timed_out=c.timed_out,
        oom=looks_oom(rc, stderr) and not c.timed_out,
        truncated=c.truncated,
        duration_s=c.duration_s,
        backend=backend,
    )

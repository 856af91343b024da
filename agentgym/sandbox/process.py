"""The fallback backend: a plain subprocess with rlimits. **Weaker than bwrap or Docker.**

What it does on every machine: a fresh temporary working directory (deleted afterwards), a
cleared environment (no host secrets), rlimits on CPU time, address space, processes and file
size, a new session whose whole process group is killed on timeout, and stdout/stderr capped.

When the host runs as **root** it also runs the program as a throw-away unprivileged uid (so it
cannot read ``/root``, write the host's files, or signal the host; ``RLIMIT_NPROC`` applies), in a
new network namespace (no network), and kills every process of that uid when the run ends.

What it does **not** do: hide the filesystem (the program sees the host's files that its uid may
read, and may write world-writable places such as ``/tmp``), and, when not root, block the
network or stop the program from signalling the user's other processes. Use ``bwrap`` or
``docker`` for untrusted code whenever you can.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from agentgym.errors import SandboxError
from agentgym.sandbox._posix import UidPool, is_root, kill_uid, make_preexec, release_workdir
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


def _write_files(root: str, files: dict[str, bytes], uid: int | None) -> None:
    for rel, data in files.items():
        path = os.path.join(root, rel)
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        if uid is not None:
            os.chown(path, uid, uid)
            d = parent
            while d.startswith(root) and d != root:
                os.chown(d, uid, uid)
                d = os.path.dirname(d)


class ProcessSession:
    """Runs sharing one working directory."""

    def __init__(self, box: ProcessSandbox) -> None:
        self._box = box
        self._uid_cm = box._uids.acquire() if box.drop_privileges else None
        self._uid = self._uid_cm.__enter__() if self._uid_cm is not None else None
        self._dir = box._make_dir(self._uid)

    @property
    def path(self) -> str:
        """The working directory on the host."""
        return self._dir

    def run(self, program: str, *, language: Language = "python", stdin: str | bytes | None = None,
            files: Files | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
            max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> ExecResult:
        return self._box._run_in(self._dir, self._uid, program, language=language, stdin=stdin, files=files,
                                 timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes)

    def close(self) -> None:
        release_workdir(self._uid_cm, self._uid, self._dir)
        self._uid_cm = None

    def __enter__(self) -> ProcessSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProcessSandbox:
    """Subprocess + rlimits. See the module docstring for what it does and does not isolate.

    Args:
        python: Interpreter (default: the system ``python3``, readable by unprivileged uids).
        nproc: Processes the program may create (only enforced for non-root uids).
        file_mb: Largest file the program may write.
        drop_privileges: Run as a throw-away uid in a new network namespace (default: when root).
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
        self._uids = UidPool()
        self._base = tempfile.mkdtemp(prefix="agentgym-proc-")
        os.chmod(self._base, 0o711)

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
        if self.drop_privileges:
            with self._uids.acquire() as uid:
                d = self._make_dir(uid)
                try:
                    return self._run_in(d, uid, program, language=language, stdin=stdin, files=files,
                                        timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes)
                finally:
                    kill_uid(uid)
                    shutil.rmtree(d, ignore_errors=True)
        d = self._make_dir(None)
        try:
            return self._run_in(d, None, program, language=language, stdin=stdin, files=files, timeout_s=timeout_s,
                                memory_mb=memory_mb, max_output_bytes=max_output_bytes)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def _run_in(self, workdir: str, uid: int | None, program: str, *, language: Language,
                stdin: str | bytes | None, files: Files | None, timeout_s: float, memory_mb: int,
                max_output_bytes: int) -> ExecResult:
        if language not in ("python", "bash"):
            raise ValueError(f"language must be 'python' or 'bash', not {language!r}")
        name = "main.sh" if language == "bash" else "main.py"
        all_files = {check_relpath(k): as_bytes(v) for k, v in (files or {}).items()}
        inline = language == "bash" and len(program) < 100_000  # no script file in the work dir
        if not inline:
            all_files[name] = program.encode("utf-8")
        _write_files(workdir, all_files, uid)
        if inline:
            argv = ["/bin/bash", "-c", program, "bash"]
        else:
            argv = ["/bin/bash", name] if language == "bash" else [self.python, "-I", name]
        env = dict(_ENV, HOME=workdir, TMPDIR=workdir)
        try:
            proc = subprocess.Popen(
                argv, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                close_fds=True,
                preexec_fn=make_preexec(uid=uid, timeout_s=timeout_s, memory_mb=memory_mb,
                                        nproc=self.nproc, file_mb=self.file_mb, unshare_net=uid is not None))
        except OSError as e:
            raise SandboxError(f"could not start {argv[0]}: {e}") from e

        def _kill() -> None:
            killpg(proc.pid)
            if uid is not None:
                kill_uid(uid)

        cap = communicate(proc, stdin=as_bytes(stdin), timeout_s=timeout_s, max_output_bytes=max_output_bytes,
                          kill=_kill, after_exit=_kill if uid is not None else None)
        if uid is None:
            killpg(proc.pid)  # background jobs left in the program's process group
        return result_from(cap, self.name)

    def session(self) -> ProcessSession:
        """A session whose working directory persists between runs."""
        return ProcessSession(self)

    def close(self) -> None:
        shutil.rmtree(self._base, ignore_errors=True)

    def __enter__(self) -> ProcessSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

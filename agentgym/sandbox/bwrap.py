"""The default backend: bubblewrap (``apt install bubblewrap``).

Every run gets: no network (``--unshare-net``), read-only system directories, a fresh tmpfs
working directory and size-capped tmpfs ``/tmp`` and ``/dev/shm``, new PID/IPC/UTS/user
namespaces, rlimits on CPU time, address space, processes and file size, ``no_new_privs``, a
seccomp filter that denies ``ptrace`` and cross-process memory access, a cleared environment,
and the whole process tree killed on timeout. When the host runs as root the program runs as an
unprivileged uid that no other run holds at the same time (root ignores ``RLIMIT_NPROC``; see
:class:`~agentgym.sandbox._posix.UidPool`).

Two modes:

* **cold** (``warm=False``): one ``bwrap`` process per run (about 20-30 ms).
* **warm** (``warm=True``): a pool of pre-started sandboxed workers (:mod:`._worker`); each run
  is read and run by a process forked from the worker (so no request or output ever enters the
  memory later runs are forked from), in its own PID, mount and IPC namespaces with fresh tmpfs
  ``/work``, ``/tmp`` and ``/dev/shm``, capabilities dropped. No process, file or IPC object
  survives a run. Python programs run in a forked interpreter (``fresh_interpreter=True`` execs a
  new ``python3``).

A **session** (either mode) is a worker of its own whose ``/work``, a tmpfs of ``file_mb``, lives
as long as the session: its runs keep their files there, capped in total and never on the host's
disk, and write them inside the sandbox (a link a previous run planted leads nowhere outside).
Each run is otherwise a warm run (fresh PID, mount and IPC namespaces, ``/tmp``, ``/dev/shm``);
python programs of a cold sandbox's session get a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path

from agentgym.errors import SandboxError, SandboxUnavailable
from agentgym.sandbox._posix import UidLease, UidPool, is_root, make_preexec
from agentgym.sandbox._worker import seccomp_program
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
    encode_request,
    killpg,
    looks_oom,
    result_from,
)

__all__ = ["BwrapSandbox", "bwrap_available"]

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime", "/etc/ssl", "/etc/python3")
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "0", "TMPDIR": "/tmp"}
WORKER_PATH = Path(__file__).with_name("_worker.py")
_worker_copy: str | None = None
_worker_copy_lock = threading.Lock()


def _worker_file() -> str:
    """A world-readable copy of the worker script.

    The worker starts as an unprivileged uid, which must be able to reach the file it binds. The
    installed package may sit under a directory only root can enter (a 0700 temp dir, /root), so
    the script is copied once per process into its own 0755 directory, removed at exit.
    """
    global _worker_copy
    with _worker_copy_lock:
        if _worker_copy is None or not os.path.exists(_worker_copy):
            import atexit

            d = tempfile.mkdtemp(prefix="agentgym-sandbox-")
            os.chmod(d, 0o755)
            dst = os.path.join(d, "worker.py")
            shutil.copyfile(WORKER_PATH, dst)
            os.chmod(dst, 0o644)
            atexit.register(shutil.rmtree, d, True)
            _worker_copy = dst
        return _worker_copy
_INLINE_MAX = 100_000  # bash scripts up to this size go on the command line (MAX_ARG_STRLEN is 128 KiB)


def bwrap_available(path: str | None = None) -> str | None:
    """The bwrap binary if it exists *and* can create namespaces here, else ``None``."""
    exe = path or shutil.which("bwrap")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True, timeout=10, env=dict(_ENV),
                           preexec_fn=make_preexec(uid=65534 if is_root() else None, timeout_s=None,
                                                   memory_mb=None, nproc=None, file_mb=None))
    except (OSError, subprocess.SubprocessError):
        return None
    return exe if r.returncode == 0 else None


def _system_args() -> list[str]:
    args: list[str] = []
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for f in _ETC_FILES:
        if os.path.exists(f):
            args += ["--ro-bind", f, f]
    return args


def _base_args(exe: str, python: str, file_mb: int, die_with_parent: bool = True) -> list[str]:
    args = [exe, "--unshare-all", "--unshare-user", "--new-session", "--hostname", "sandbox", *_system_args()]
    if die_with_parent:
        args.append("--die-with-parent")
    py_real = os.path.realpath(python)
    if not any(py_real.startswith(d + "/") for d in ("/usr", "/bin", "/lib")):
        # an interpreter outside the system dirs (pyenv, conda): expose its prefix read-only
        prefix = str(Path(py_real).parent.parent)
        args += ["--ro-bind", prefix, prefix]
    size = str(file_mb * 1024 * 1024)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm", "--size", size, "--tmpfs", "/tmp"]
    args += ["--size", size, "--tmpfs", "/work"]
    args += ["--chdir", "/work", "--clearenv"]
    for k, v in _ENV.items():
        args += ["--setenv", k, v]
    return args


class _Worker:
    """One warm sandboxed worker process (see :mod:`agentgym.sandbox._worker`)."""

    def __init__(self, box: BwrapSandbox) -> None:
        self.box = box
        self._lease: UidLease | None = box._uids.lease() if is_root() else None
        uid = self._lease.uid if self._lease is not None else None
        # No --die-with-parent: PR_SET_PDEATHSIG fires when the *thread* that started the worker
        # exits. The worker exits by itself when its control pipe closes (host exit or crash).
        args = _base_args(box.exe, box.python, box.file_mb, die_with_parent=False)
        # The worker keeps capabilities *inside its own user namespace* so that it can create a
        # PID + mount namespace per run; the program itself runs with all of them dropped.
        args += ["--cap-add", "ALL", "--ro-bind", _worker_file(), "/.agentgym/worker.py",
                 box.python, "-I", "-S", "/.agentgym/worker.py"]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=dict(_ENV), preexec_fn=make_preexec(uid=uid, timeout_s=None, memory_mb=None,
                                                             nproc=4096, file_mb=None), close_fds=True)
        ready = self._recv(timeout_s=20.0)
        if not ready or not ready.get("ready"):
            self.kill()
            raise SandboxUnavailable(f"the warm bwrap worker did not start (got {ready!r}); "
                                     "check that `bwrap --unshare-all --cap-add ALL true` works on this machine.")

    def _recv(self, timeout_s: float) -> dict[str, object] | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        buf = b""
        need = 4
        header = True
        import select

        while True:
            while len(buf) < need:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                r, _, _ = select.select([fd], [], [], left)
                if not r:
                    return None
                chunk = os.read(fd, need - len(buf))
                if not chunk:
                    return None
                buf += chunk
            if header:
                need = struct.unpack(">I", buf)[0]
                buf = b""
                header = False
                if need == 0:
                    return {}
            else:
                obj: dict[str, object] = json.loads(buf)
                return obj

    def request(self, req: Mapping[str, object], timeout_s: float) -> dict[str, object] | None:
        assert self.proc.stdin is not None
        data = json.dumps(req).encode()
        try:
            self.proc.stdin.write(struct.pack(">I", len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return self._recv(timeout_s)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        killpg(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        if self._lease is not None:
            self._lease.release()
            self._lease = None


class BwrapSandbox:
    """Bubblewrap sandbox. See the module docstring for what it isolates.

    Args:
        warm: Use a pool of pre-started workers (fast) instead of one ``bwrap`` per run.
        workers: Warm pool size (concurrent runs); workers start lazily.
        python: Interpreter inside the sandbox (default: the system ``python3``).
        bwrap: Path to the ``bwrap`` binary.
        nproc: Processes the program may create.
        file_mb: Largest file, and size of each tmpfs.
        fresh_interpreter: Warm mode only: exec a new ``python3`` per run instead of running the
            program in the forked worker interpreter (slower, byte-for-byte ``python main.py``).
    """

    def __init__(self, *, warm: bool = False, workers: int = 1, python: str | None = None, bwrap: str | None = None,
                 nproc: int = 64, file_mb: int = 64, fresh_interpreter: bool = False) -> None:
        exe = bwrap_available(bwrap)
        if exe is None:
            raise SandboxUnavailable(
                "the bwrap sandbox needs bubblewrap that can create user namespaces: install it with "
                "`apt install bubblewrap` (and allow unprivileged user namespaces), or use "
                "get_sandbox('process') / get_sandbox('docker').")
        self.exe = exe
        self.warm = bool(warm)
        self.name = "bwrap-warm" if warm else "bwrap"
        self.python = python or default_python()
        self.nproc = int(nproc)
        self.file_mb = int(file_mb)
        self.fresh_interpreter = bool(fresh_interpreter)
        self._uids = UidPool()
        self._pool: queue.Queue[_Worker | None] = queue.Queue()
        self._n_workers = max(1, int(workers))
        for _ in range(self._n_workers):
            self._pool.put(None)  # placeholder, started on first use
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        # the finalizer holds the worker list: a live worker process stays reachable (never cyclic
        # garbage) and is stopped when this sandbox is closed or collected
        self._finalizer = weakref.finalize(self, _stop_workers, self._all, self._lock)

    # ------------------------------------------------------------------ public API
    def run(self, program: str, *, language: Language = "python", stdin: str | bytes | None = None,
            files: Files | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
            max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> ExecResult:
        """Run ``program`` in a fresh sandbox (see :class:`~agentgym.sandbox.base.Sandbox`)."""
        _check_language(language)
        if self.warm:
            return self._run_warm(program, language=language, stdin=stdin, files=files, timeout_s=timeout_s,
                                  memory_mb=memory_mb, max_output_bytes=max_output_bytes)
        if not is_root():
            return self._run_cold(program, language=language, stdin=stdin, files=files, timeout_s=timeout_s,
                                  memory_mb=memory_mb, max_output_bytes=max_output_bytes, uid=None)
        lease = self._uids.lease()
        clean = False
        try:
            res = self._run_cold(program, language=language, stdin=stdin, files=files, timeout_s=timeout_s,
                                 memory_mb=memory_mb, max_output_bytes=max_output_bytes, uid=lease.uid)
            # bwrap exited normally: its PID namespace, and every process in it, is gone
            clean = not (res.timed_out or res.truncated or res.exit_code is None)
            return res
        finally:
            lease.release(clean=clean)

    def session(self) -> Session:
        """A session whose ``/work`` (a tmpfs of ``file_mb``) persists between runs; processes never do."""
        held = [_Worker(self)]

        def run(program: str, *, language: Language, stdin: str | bytes | None, files: Files | None,
                timeout_s: float, memory_mb: int, max_output_bytes: int) -> ExecResult:
            req = encode_request(program, language=language, stdin=stdin, files=files, timeout_s=timeout_s,
                                 memory_mb=memory_mb, max_output_bytes=max_output_bytes, nproc=self.nproc,
                                 file_mb=self.file_mb, fresh_interpreter=self.fresh_interpreter or not self.warm,
                                 session=True)
            res = self._ask(held[0], req, timeout_s)
            if not held[0].alive():  # the worker is gone, and the session's files with it
                held[0].kill()
                held[0] = _Worker(self)
                res.stderr += "\n[the sandbox was reset: files of earlier runs are gone]"
            return res

        return Session(self.name, run, lambda: held[0].kill())

    def close(self) -> None:
        """Stop the warm workers."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> BwrapSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ cold
    def _run_cold(self, program: str, *, language: Language, stdin: str | bytes | None, files: Files | None,
                  timeout_s: float, memory_mb: int, max_output_bytes: int, uid: int | None) -> ExecResult:
        args = _base_args(self.exe, self.python, self.file_mb)
        memfds: list[int] = []
        name = "main.sh" if language == "bash" else "main.py"
        try:
            all_files: dict[str, bytes] = {check_relpath(k): as_bytes(v) for k, v in (files or {}).items()}
            inline = language == "bash" and len(program) < _INLINE_MAX  # no script file in the work dir
            if not inline:
                all_files[name] = program.encode("utf-8")
            for rel, data in all_files.items():
                fd = os.memfd_create("agentgym-file", 0)
                os.write(fd, data)
                os.lseek(fd, 0, os.SEEK_SET)
                memfds.append(fd)
                parent = os.path.dirname(rel)
                if parent:
                    args += ["--dir", f"/work/{parent}"]
                args += ["--file", str(fd), f"/work/{rel}"]
            seccomp = seccomp_program()
            if seccomp:
                fd = os.memfd_create("agentgym-seccomp", 0)
                os.write(fd, seccomp)
                os.lseek(fd, 0, os.SEEK_SET)
                memfds.append(fd)
                args += ["--seccomp", str(fd)]
            if inline:
                args += ["/bin/bash", "-c", program, "bash"]
            elif language == "bash":
                args += ["/bin/bash", f"/work/{name}"]
            else:
                args += [self.python, "-I", f"/work/{name}"]
            try:
                proc = subprocess.Popen(
                    args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=memfds,
                    env=dict(_ENV),  # bwrap itself (PID 1 in the sandbox) must not carry host secrets
                    preexec_fn=make_preexec(uid=uid, timeout_s=timeout_s, memory_mb=memory_mb, nproc=self.nproc,
                                            file_mb=self.file_mb))
            except OSError as e:
                raise SandboxError(f"could not start bwrap: {e}") from e
        finally:
            for fd in memfds:
                os.close(fd)
        cap = communicate(proc, stdin=as_bytes(stdin), timeout_s=timeout_s, max_output_bytes=max_output_bytes,
                          kill=lambda: killpg(proc.pid))
        res = result_from(cap, self.name)
        if res.exit_code is not None and res.exit_code > 0 and cap.stderr.startswith(b"bwrap:"):
            raise SandboxError(f"bwrap failed: {cap.stderr.decode(errors='replace').strip()}")
        return res

    # ------------------------------------------------------------------ warm
    @contextlib.contextmanager
    def _worker(self, timeout_s: float) -> Iterator[_Worker]:
        if self._closed:
            raise SandboxError("this BwrapSandbox is closed")
        try:
            w = self._pool.get(timeout=timeout_s + 30)
        except queue.Empty:
            raise SandboxError("no warm bwrap worker became free in time; raise workers=") from None
        try:
            if w is None or not w.alive():
                if w is not None:
                    w.kill()
                w = _Worker(self)
                with self._lock:
                    self._all.append(w)
            yield w
        finally:
            if w is not None and not w.alive():
                with self._lock:
                    if w in self._all:
                        self._all.remove(w)
                w.kill()
                w = None
            self._pool.put(w)

    def _run_warm(self, program: str, *, language: Language, stdin: str | bytes | None, files: Files | None,
                  timeout_s: float, memory_mb: int, max_output_bytes: int) -> ExecResult:
        req = encode_request(program, language=language, stdin=stdin, files=files, timeout_s=timeout_s,
                             memory_mb=memory_mb, max_output_bytes=max_output_bytes, nproc=self.nproc,
                             file_mb=self.file_mb, fresh_interpreter=self.fresh_interpreter)
        with self._worker(timeout_s) as w:
            return self._ask(w, req, timeout_s)

    def _ask(self, w: _Worker, req: Mapping[str, object], timeout_s: float) -> ExecResult:
        """One run by worker ``w``; a worker that dies or hangs is killed and the run reported failed."""
        t0 = time.monotonic()
        resp = w.request(req, timeout_s=timeout_s + 10.0)
        if resp is None:
            w.kill()
            return ExecResult(stderr="sandbox worker died during the run", exit_code=None,
                              duration_s=time.monotonic() - t0, backend=self.name)
        if resp.get("error") and "exit_code" not in resp:
            raise SandboxError(f"warm bwrap worker failed: {resp['error']}")
        if resp.get("error"):
            raise SandboxError(f"warm bwrap worker could not set up the run: {resp['error']}")
        stderr = str(resp["stderr"])
        ec = resp["exit_code"]
        exit_code = int(ec) if isinstance(ec, int) else None
        timed_out = bool(resp["timed_out"])
        return ExecResult(
            stdout=str(resp["stdout"]),
            stderr=stderr,
            exit_code=exit_code,
            timed_out=timed_out,
            oom=looks_oom(exit_code, stderr) and not timed_out,
            truncated=bool(resp["truncated"]),
            duration_s=time.monotonic() - t0,
            backend=self.name,
        )


def _stop_workers(workers: list[_Worker], lock: threading.Lock) -> None:
    with lock:
        stopping = list(workers)
        workers.clear()
    for w in stopping:
        w.kill()


def _check_language(language: str) -> None:
    if language not in ("python", "bash"):
        raise ValueError(f"language must be 'python' or 'bash', not {language!r}")

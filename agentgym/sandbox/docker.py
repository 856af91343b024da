"""The Docker backend: a pool of warm, locked-down containers driven with ``exec``.

Each container runs with ``network_mode="none"``, a read-only root filesystem, tmpfs ``/work``
and ``/tmp``, a ``/dev/shm`` capped at ``file_mb``, a private IPC namespace, memory / CPU / pids
limits, all capabilities dropped, ``no-new-privileges``, no container log (a run can write to
PID 1's output, which would otherwise grow a log file on the host without bound) and an
unprivileged uid that no other sandbox on the machine holds at the same time. Each run is one ``exec`` of a small bootstrap
(:mod:`._worker` in ``boot`` mode) that runs the program in a fresh directory under a seccomp
filter, enforces the timeout and output cap, then kills every leftover process and wipes ``/tmp``,
``/dev/shm`` and System V IPC objects before the container goes back to the pool. The host reads
the bootstrap's answer with its own deadline (the run's timeout plus ``hang_margin_s``): a program
that stops or blocks the bootstrap is killed by a second ``exec`` and the run reported as timed out.

The image is configurable. Without a registry, the default ``agentgym-empty:latest`` is an empty
image (built on first use, or with ``scripts/docker-test-image.sh``) into which the host's
``/usr /lib /lib64 /bin`` are bind-mounted read-only; with a real image pass ``host_mounts=()``
and the image's own ``python``.

The Docker engine must be running (``scripts/dockerd-start.sh`` starts one).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import queue
import select
import struct
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.errors import DependencyNotInstalled, SandboxError, SandboxUnavailable
from agentgym.sandbox._posix import UidLease, UidPool
from agentgym.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    ExecResult,
    Files,
    Language,
    Session,
    encode_request,
    looks_oom,
)

__all__ = ["DEFAULT_IMAGE", "LABEL", "DockerSandbox", "ExecOutput", "docker_available", "exec_with_deadline",
           "remove_stale_containers"]

DEFAULT_IMAGE = "agentgym-empty:latest"
LABEL = "agentgym.sandbox"
_WORKER_SRC = os.path.join(os.path.dirname(__file__), "_worker.py")
_MAX_ARG = 120_000  # bytes per argv element (Linux MAX_ARG_STRLEN is 128 KiB)
_MAX_PAYLOAD = 1_500_000
_INIT = (
    "import os, signal\n"
    "signal.signal(signal.SIGCHLD, lambda *a: None)\n"
    "signal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n"
    "while True:\n"
    "    signal.pause()\n"
    "    while True:\n"
    "        try:\n"
    "            if os.waitpid(-1, os.WNOHANG)[0] == 0: break\n"
    "        except ChildProcessError: break\n"
)
_MARKER = b"\n@@AGENTGYM@@"


def _client(timeout: float = 10.0) -> Any:
    try:
        import docker
    except ImportError as e:
        raise DependencyNotInstalled("the docker sandbox", "agentgym[docker]") from e
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):  # check the socket ourselves: the SDK leaks one on a failed connect
        import socket

        try:
            with socket.socket(socket.AF_UNIX) as probe:
                probe.settimeout(min(float(timeout), 5.0))
                probe.connect(host[len("unix://"):])
        except OSError as e:
            raise SandboxUnavailable(
                f"cannot reach the Docker engine at {host} ({type(e).__name__}: {e}). Start it (e.g. "
                "`scripts/dockerd-start.sh`, or `dockerd --bridge=none --iptables=false &` as root) "
                "or use get_sandbox('bwrap').") from None
    client = None
    try:
        client = docker.from_env(timeout=int(timeout))
        client.ping()
    except Exception as e:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()  # its connection pool would otherwise leak a socket
        raise SandboxUnavailable(
            f"cannot reach the Docker engine ({type(e).__name__}: {e}). Start it (e.g. "
            "`scripts/dockerd-start.sh`, or `dockerd --bridge=none --iptables=false &` as root) "
            "or use get_sandbox('bwrap').") from e
    return client


def docker_available() -> bool:
    """True if the docker SDK is installed and the engine answers a ping."""
    try:
        c = _client(timeout=3)
    except (SandboxUnavailable, DependencyNotInstalled):
        return False
    c.close()
    return True


def ensure_empty_image(client: Any, tag: str = DEFAULT_IMAGE) -> None:
    """Build the empty image ``tag`` locally (an empty root filesystem) if it does not exist."""
    import docker.errors

    try:
        client.images.get(tag)
        return
    except docker.errors.ImageNotFound:
        pass
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w"):
        pass
    repo, _, ver = tag.partition(":")
    client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=ver or "latest")


def remove_stale_containers(client: Any, label: str = LABEL) -> int:
    """Remove containers labelled ``label`` whose owning process is gone (e.g. killed before ``close()``)."""
    removed = 0
    # the low-level listing: the high-level one inspects each container, and another process or thread
    # may remove one between the listing and the inspection (a 404 that is not an error here)
    for c in client.api.containers(all=True, filters={"label": label}):
        owner = (c.get("Labels") or {}).get(f"{label}.owner", "")
        if not (owner.isdigit() and os.path.exists(f"/proc/{owner}")):
            with contextlib.suppress(Exception):
                client.api.remove_container(c["Id"], force=True)
                removed += 1
    return removed


@dataclass
class ExecOutput:
    """What a finished ``docker exec`` printed (each stream capped) and its exit code."""

    stdout: bytes
    stderr: bytes
    exit_code: int | None


def exec_with_deadline(api: Any, container_id: str, cmd: list[str], *, deadline: float, limit: int,
                       environment: dict[str, str] | None = None, workdir: str | None = None,
                       user: str = "", exit_code: bool = True) -> ExecOutput | None:
    """Run ``cmd`` in a container; what it printed, or ``None`` if it has not finished by ``deadline``.

    Reads Docker's multiplexed stream itself, with a deadline on every wait (the SDK's reader
    polls without one), and never keeps more than ``limit`` bytes of each stream. A command
    still running at the deadline is left to the caller to kill. ``exit_code=False`` skips the
    extra API call that reads the exit code (it is then ``None``).
    """
    ex = api.exec_create(container_id, cmd, stdout=True, stderr=True, environment=environment, workdir=workdir,
                         user=user)
    sock = api.exec_start(ex["Id"], socket=True, demux=False)
    raw_sock = getattr(sock, "_sock", sock)
    buf = bytearray()
    streams = {1: bytearray(), 2: bytearray()}
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([raw_sock], [], [], left)
            if not ready:
                return None
            raw_sock.settimeout(max(0.1, left))
            chunk = raw_sock.recv(65536)
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 8:
                stream, size = struct.unpack(">BxxxL", bytes(buf[:8]))
                if len(buf) < 8 + size:
                    break
                out = streams.get(stream)
                if out is not None and len(out) < limit:
                    out += buf[8 : 8 + min(size, limit - len(out))]
                del buf[: 8 + size]
    finally:
        for f in (sock, raw_sock):  # the exec hijacked the connection: close the socket itself too
            with contextlib.suppress(Exception):
                f.close()
    code = api.exec_inspect(ex["Id"]).get("ExitCode") if exit_code else None
    return ExecOutput(bytes(streams[1]), bytes(streams[2]), int(code) if isinstance(code, int) else None)


class DockerSandbox:
    """Warm pool of locked-down containers. See the module docstring.

    Args:
        image: Image to run. The default empty image is built locally when missing.
        pool_size: Containers kept warm (concurrent runs); they start lazily or with :meth:`warm_up`.
        host_mounts: Host directories bind-mounted read-only at the same path (for the empty image).
        python: Interpreter inside the container.
        container_memory_mb: cgroup memory limit of each container (per-run ``memory_mb`` is also
            applied as an address-space rlimit).
        cpus: CPU quota of each container.
        pids_limit: Processes per container (stops fork bombs).
        nproc: Per-run process rlimit.
        file_mb: Size of the tmpfs ``/work`` and ``/tmp``, and largest file.
        api_timeout_s: Timeout of Docker API calls (starting containers and execs).
        hang_margin_s: A run whose bootstrap has not answered this long after its timeout is
            killed from outside and reported as timed out.
    """

    name = "docker"

    def __init__(self, *, image: str = DEFAULT_IMAGE, pool_size: int = 2,
                 host_mounts: Sequence[str] = ("/usr", "/lib", "/lib64", "/bin", "/etc/alternatives"), python: str = "/usr/bin/python3",
                 container_memory_mb: int = 1024, cpus: float = 1.0, pids_limit: int = 128, nproc: int = 64,
                 file_mb: int = 64, api_timeout_s: float = 30.0, hang_margin_s: float = 2.0) -> None:
        self.image = image
        self.python = python
        self.host_mounts = tuple(m for m in host_mounts if os.path.exists(m))
        self.container_memory_mb = int(container_memory_mb)
        self.cpus = float(cpus)
        self.pids_limit = int(pids_limit)
        self.nproc = int(nproc)
        self.file_mb = int(file_mb)
        self.api_timeout_s = float(api_timeout_s)
        self.hang_margin_s = float(hang_margin_s)
        self._uids = UidPool()
        self._leases: dict[str, UidLease] = {}
        self._client = _client(timeout=120)
        with contextlib.suppress(Exception):
            remove_stale_containers(self._client)
        if image == DEFAULT_IMAGE:
            ensure_empty_image(self._client, image)
        with open(_WORKER_SRC) as f:
            self._boot_src = f.read()
        self._pool: queue.Queue[Any] = queue.Queue()
        self._slots = threading.Semaphore(max(1, int(pool_size)))
        self._pool_size = max(1, int(pool_size))
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._tag = uuid.uuid4().hex[:8]

    # ------------------------------------------------------------------ containers
    def _start(self) -> Any:
        from docker.types import LogConfig

        lease = self._uids.lease()
        uid = lease.uid
        size = f"size={self.file_mb}m,uid={uid},gid={uid},mode=0700"
        try:
            c = self._client.containers.run(
                self.image,
                [self.python, "-I", "-S", "-c", _INIT],
                detach=True,
                name=f"agentgym-sbx-{self._tag}-{uuid.uuid4().hex[:8]}",
                labels={LABEL: "1", f"{LABEL}.owner": str(os.getpid())},
                network_mode="none",
                read_only=True,
                tmpfs={"/work": f"rw,exec,nosuid,nodev,{size}", "/tmp": f"rw,nosuid,nodev,{size}"},
                volumes={m: {"bind": m, "mode": "ro"} for m in self.host_mounts},
                user=f"{uid}:{uid}",
                environment={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/work",
                             "PYTHONDONTWRITEBYTECODE": "1"},
                mem_limit=f"{self.container_memory_mb}m",
                memswap_limit=f"{self.container_memory_mb}m",
                nano_cpus=int(self.cpus * 1e9),
                pids_limit=self.pids_limit,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                ipc_mode="private",
                shm_size=f"{self.file_mb}m",
                hostname="sandbox",
                log_config=LogConfig(type="none"),  # PID 1's stdout is writable by the run: no log file on the host
                auto_remove=False,
            )
        except Exception as e:
            lease.release(clean=True)
            raise SandboxUnavailable(f"could not start a sandbox container from {self.image!r}: {e}. "
                                     "Build the test image with scripts/docker-test-image.sh.") from e
        with self._lock:
            self._live.add(c.id)
            self._leases[c.id] = lease
        return c

    def _take(self) -> Any:
        if self._closed:
            raise SandboxError("this DockerSandbox is closed")
        try:
            return self._pool.get_nowait()
        except queue.Empty:
            return self._start()

    def _give(self, c: Any) -> None:
        if self._closed or self._pool.qsize() >= self._pool_size:
            self._discard(c)
        else:
            self._pool.put(c)

    def _discard(self, c: Any) -> None:
        with contextlib.suppress(Exception):
            c.remove(force=True)
        with self._lock:
            self._live.discard(c.id)
            lease = self._leases.pop(c.id, None)
        if lease is not None:
            lease.release(clean=True)  # the container and every process in it are gone

    @contextlib.contextmanager
    def _container(self) -> Iterator[Any]:
        self._slots.acquire()
        try:
            c = self._take()
            ok = False
            try:
                yield c
                ok = True
            finally:
                if ok and not getattr(c, "_agentgym_broken", False):
                    self._give(c)
                else:
                    self._discard(c)
        finally:
            self._slots.release()

    def warm_up(self) -> None:
        """Start the whole pool now (otherwise containers start on first use)."""
        started = [self._start() for _ in range(self._pool_size - self._pool.qsize())]
        for c in started:
            self._pool.put(c)

    # ------------------------------------------------------------------ runs
    def run(self, program: str, *, language: Language = "python", stdin: str | bytes | None = None,
            files: Files | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
            max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> ExecResult:
        """Run ``program`` in a warm container (see :class:`~agentgym.sandbox.base.Sandbox`)."""
        with self._container() as c:
            res, healthy = self._exec(c, program, language=language, stdin=stdin, files=files, timeout_s=timeout_s,
                                      memory_mb=memory_mb, max_output_bytes=max_output_bytes, workdir=None)
            if not healthy:
                c._agentgym_broken = True
            return res

    def _exec(self, c: Any, program: str, *, language: Language, stdin: str | bytes | None, files: Files | None,
              timeout_s: float, memory_mb: int, max_output_bytes: int, workdir: str | None) -> tuple[ExecResult, bool]:
        if language not in ("python", "bash"):
            raise ValueError(f"language must be 'python' or 'bash', not {language!r}")
        req = encode_request(program, language=language, stdin=stdin, files=files, timeout_s=timeout_s,
                             memory_mb=memory_mb, max_output_bytes=max_output_bytes, nproc=self.nproc,
                             file_mb=self.file_mb, workdir=workdir)
        payload = base64.b64encode(json.dumps(req).encode()).decode()
        if len(payload) > _MAX_PAYLOAD:
            raise SandboxError(f"program + files + stdin are too large for the docker backend "
                               f"({len(payload)} bytes encoded, max {_MAX_PAYLOAD}).")
        chunks = [payload[i : i + _MAX_ARG] for i in range(0, len(payload), _MAX_ARG)] or [""]
        cmd = [self.python, "-I", "-S", "-c", self._boot_src, "boot", *chunks]
        t0 = time.monotonic()
        deadline = t0 + float(timeout_s) + self.hang_margin_s
        try:
            raw = self._run_exec(c, cmd, deadline, limit=4 * int(max_output_bytes) + (1 << 20))
        except Exception as e:
            return ExecResult(stderr=f"sandbox container failed: {type(e).__name__}: {e}",
                              duration_s=time.monotonic() - t0, backend=self.name), False
        if raw is None:  # the bootstrap did not answer by the deadline: the program stopped or blocked it
            healthy = self._kill_runs(c, wipe_work=workdir is None)
            return ExecResult(stderr="[the run did not end by its deadline and was killed from outside]",
                              timed_out=True, duration_s=time.monotonic() - t0, backend=self.name), healthy
        marker = raw.rfind(_MARKER)
        if marker < 0:
            tail = raw[-2000:].decode(errors="replace")
            return ExecResult(stderr=f"sandbox bootstrap failed: {tail}", duration_s=time.monotonic() - t0,
                              backend=self.name), False
        try:
            resp = json.loads(raw[marker + len(_MARKER) :])
        except ValueError:
            return ExecResult(stderr="sandbox bootstrap sent a malformed answer", duration_s=time.monotonic() - t0,
                              backend=self.name), False
        if resp.get("error"):
            raise SandboxError(f"docker sandbox bootstrap error: {resp['error']}")
        stderr = str(resp["stderr"])
        ec = resp["exit_code"]
        exit_code = int(ec) if isinstance(ec, int) else None
        timed_out = bool(resp["timed_out"])
        oom = bool(resp.get("oom")) or looks_oom(exit_code, stderr)
        return ExecResult(stdout=str(resp["stdout"]), stderr=stderr, exit_code=exit_code, timed_out=timed_out,
                          oom=oom and not timed_out, truncated=bool(resp["truncated"]),
                          duration_s=time.monotonic() - t0, backend=self.name), True

    def _run_exec(self, c: Any, cmd: list[str], deadline: float, limit: int) -> bytes | None:
        """Run ``cmd`` in ``c``; its stdout, or ``None`` if it has not finished by ``deadline``."""
        out = exec_with_deadline(self._client.api, c.id, cmd, deadline=deadline, limit=limit, workdir="/work",
                                 exit_code=False)
        return None if out is None else out.stdout

    def _kill_runs(self, c: Any, *, wipe_work: bool) -> bool:
        """Kill every process in ``c`` from a second exec and wipe its scratch space; False if that failed."""
        cmd = [self.python, "-I", "-S", "-c", self._boot_src, "kill", "work" if wipe_work else "keep"]
        try:
            raw = self._run_exec(c, cmd, time.monotonic() + 10.0, limit=1 << 16)
        except Exception:
            return False
        return raw is not None and raw.rstrip().endswith(_MARKER + b"{}")

    def session(self) -> Session:
        """A session whose directory persists between runs; holds one container until closed."""
        held = [self._take()]
        workdir = f"/work/session-{uuid.uuid4().hex[:12]}"

        def run(program: str, *, language: Language, stdin: str | bytes | None, files: Files | None,
                timeout_s: float, memory_mb: int, max_output_bytes: int) -> ExecResult:
            res, ok = self._exec(held[0], program, language=language, stdin=stdin, files=files, timeout_s=timeout_s,
                                 memory_mb=memory_mb, max_output_bytes=max_output_bytes, workdir=workdir)
            if not ok:  # the container could not be cleaned up: carry on in a fresh one (the files are lost)
                self._discard(held[0])
                held[0] = self._take()
                res.stderr += "\n[the sandbox was reset: files of earlier runs are gone]"
            return res

        return Session(self.name, run, lambda: self._discard(held[0]))

    def close(self) -> None:
        """Remove every container this sandbox started."""
        self._closed = True
        while True:
            try:
                c = self._pool.get_nowait()
            except queue.Empty:
                break
            self._discard(c)
        with self._lock:
            ids = list(self._live)
        for cid in ids:
            with contextlib.suppress(Exception):
                self._client.api.remove_container(cid, force=True)
        with self._lock:
            self._live.clear()
        with contextlib.suppress(Exception):
            self._client.close()

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if not self._closed:
                self.close()

"""One Docker container per episode, with one persistent interactive shell in it (``agentgym/OS-v0``).

:class:`OSContainer` starts a container from the OS-v0 image (see :mod:`.os_image`) as root, with
``--network none``, a memory limit (swap off), a CPU quota, a process limit, a per-file size
limit, all capabilities dropped but the few a root user's file and account work needs,
``no-new-privileges`` and no container log. It runs scripts the way AgentBench runs init and
check scripts (``bash -c CODE -- ARGS`` or ``python3 -c CODE ARGS``, as root in ``/root``, each in
its own process, under a deadline) and holds one :class:`Shell`.

The container's own root filesystem is read-only; before anything runs in it, a guard (see
``_os_guard.py``, run in a short-lived helper container) stacks an overlay on it whose upper
layer is a tmpfs of ``disk_mb``: everything written inside is capped in total and never reaches
the host's disk. Before the check scripts run, :meth:`OSContainer.seal` has the guard kill every
process the agent left and pin the code and configuration the checks execute to the image's, so
the verdict cannot be forged by anything the agent changed or left running.

:class:`Shell` is ``bash --login`` on a TTY, as AgentBench's agent gets: ``cd``, variables,
functions and background jobs persist from one command to the next. Each command is typed into
the terminal followed by a line that prints a random marker and ``$?``; the output is whatever
the terminal shows until the marker. Line editing and history expansion are off, so a script's
TABs and ``!`` reach bash as typed (readline would take a TAB for completion). A command still running at its deadline gets Ctrl-C (as a
user would press it); one that ignores it has its foreground process group killed. A shell that
exits (``exit``, ``exec``) is replaced by a new one, and the caller is told.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import select
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from agentgym.errors import DependencyNotInstalled, SandboxError, SandboxUnavailable
from agentgym.sandbox.docker import exec_with_deadline
from agentgym.sandbox.docker import remove_stale_containers as _remove_stale

__all__ = ["LABEL", "OSContainer", "ScriptResult", "Shell", "ShellResult", "docker_client", "remove_stale_containers"]

log = logging.getLogger(__name__)
LABEL = "agentgym.os"
MAX_CAPTURE = 1 << 20  # bytes of shell output kept per command (the rest is read and dropped)
_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP", "AUDIT_WRITE",
         "SYS_CHROOT", "NET_BIND_SERVICE"]
# The guard's helper: mounts and enters the task container's namespaces (SYS_ADMIN, SYS_CHROOT), reaches
# the non-dumpable PID 1's root (SYS_PTRACE), kills the agent's processes and repairs what it broke.
_GUARD_CAPS = ["SYS_ADMIN", "SYS_PTRACE", "SYS_CHROOT", "KILL", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "CHOWN"]
_GUARD_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_os_guard.py")
# PID 1 of a task container: reaps orphans and is non-dumpable, so no process of the agent's (which
# lacks CAP_SYS_PTRACE) can trace it or reach the pristine root it keeps (``/proc/1/root``).
_INIT = ("import ctypes, os, signal; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "
         "signal.signal(signal.SIGCHLD, lambda *a: None)\n"
         "while True:\n signal.pause()\n while True:\n  try:\n   if os.waitpid(-1, os.WNOHANG)[0] == 0: break\n"
         "  except ChildProcessError: break\n")
# The environment of check scripts: the image's directories first on PATH, Python ignoring the
# working directory, user site-packages and bytecode caches the agent could have planted.
CHECK_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin", "HOME": "/root",
             "LANG": "C.UTF-8", "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
_EXEC_MARGIN_S = 10.0  # host-side deadline beyond a script's own timeout
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][A-Za-z0-9]|\x1b[=>]|\x07")


def docker_client(timeout: float = 120.0) -> Any:
    """A docker SDK client for a running engine, or a clear error."""
    try:
        import docker
    except ImportError as e:
        raise DependencyNotInstalled("agentgym/OS-v0", "agentgym[docker]") from e
    try:
        client = docker.from_env(timeout=int(timeout))
        client.ping()
    except Exception as e:
        raise SandboxUnavailable(
            f"agentgym/OS-v0 runs each task in a Docker container, but the Docker engine does not answer "
            f"({type(e).__name__}: {e}). Start it (scripts/dockerd-start.sh).") from e
    return client


def remove_stale_containers(client: Any) -> int:
    """Remove OS-v0 containers whose owning process is gone (killed before it could clean up)."""
    return _remove_stale(client, LABEL)


@dataclass
class ScriptResult:
    """An init or check script's outcome."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


@dataclass
class ShellResult:
    """A shell command's outcome: the terminal's output and what happened to the command."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    interrupted: bool = False
    killed: bool = False
    restarted: bool = False
    truncated: bool = False


_STALE_MARKER = re.compile(rb"\x1e[0-9a-f]{16}:-?\d+\x1e\n?")


def clean_terminal_output(raw: bytes) -> str:
    """Terminal bytes as text: escape sequences, BEL, carriage returns and late markers removed."""
    text = _ANSI.sub(b"", _STALE_MARKER.sub(b"", raw)).decode("utf-8", "replace")
    return text.replace("\r\n", "\n").replace("\r", "")


class Shell:
    """A persistent ``bash --login`` on a TTY inside a container (see the module docstring)."""

    def __init__(self, client: Any, container_id: str, *, workdir: str = "/root") -> None:
        self._api = client.api
        self._cid = container_id
        self._workdir = workdir
        self.pid: int | None = None
        self._buf = b""
        self._start()

    def _start(self) -> None:
        ex = self._api.exec_create(self._cid, ["bash", "--login"], stdin=True, tty=True, workdir=self._workdir,
                                   environment={"TERM": "dumb", "HOME": "/root"})
        self._exec_id = ex["Id"]
        sock = self._api.exec_start(self._exec_id, socket=True, tty=True)
        self._holder = sock
        self._sock: socket.socket = getattr(sock, "_sock", sock)
        self._sock.setblocking(False)
        self._alive = True
        self._buf = b""
        # no echo, no prompts; no line editing (a typed TAB would be completion, eating script indentation)
        # and no history expansion ("!" in a string would be an event)
        self._send(b"stty -echo -onlcr 2>/dev/null; set +o emacs +o vi +H; PS1=''; PS2=''; PROMPT_COMMAND=''; "
                   b"unset HISTFILE\n")
        res = self._wait_marker(self._marker_line(), 30.0)
        if res is None:
            raise SandboxError("the container's shell did not start")
        out = self.run("echo $$", timeout_s=10.0)
        self.pid = int(out.output.strip()) if out.output.strip().isdigit() else None

    # ------------------------------------------------------------------ io
    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + 10.0
        while view:
            try:
                n = self._sock.send(view)
                view = view[n:]
            except (BlockingIOError, InterruptedError):
                if time.monotonic() > deadline:
                    raise SandboxError("the shell does not take input") from None
                select.select([], [self._sock], [], 0.2)
            except OSError:
                self._alive = False
                return

    def _marker_line(self) -> tuple[bytes, re.Pattern[bytes]]:
        nonce = secrets.token_hex(8)
        # printed as "\x1e<nonce>:<status>\x1e"; the typed line itself never contains that text
        cmd = f"printf '\\036%s%s:%d\\036\\n' {nonce[:8]} {nonce[8:]} $?\n".encode()
        return cmd, re.compile(rb"\x1e" + nonce.encode() + rb":(-?\d+)\x1e\n?")

    def _wait_marker(self, marker: tuple[bytes, re.Pattern[bytes]], timeout_s: float,
                     out: bytearray | None = None) -> int | None:
        """Send the marker line and read until it comes back; returns ``$?`` or ``None`` (timeout/EOF)."""
        cmd, pat = marker
        self._send(cmd)
        return self._read_until(pat, timeout_s, out)

    def _read_until(self, pat: re.Pattern[bytes], timeout_s: float, out: bytearray | None) -> int | None:
        deadline = time.monotonic() + timeout_s
        buf = bytearray(self._buf)
        self._buf = b""
        while True:
            m = pat.search(buf)
            if m is not None:
                if out is not None:
                    room = MAX_CAPTURE - len(out)
                    out += buf[: m.start()][: max(room, 0)]
                self._buf = bytes(buf[m.end():])
                return int(m.group(1))
            if out is not None and len(buf) > 4096:  # move settled bytes out, keep a tail for the marker
                keep = buf[-256:]
                room = MAX_CAPTURE - len(out)
                out += buf[:-256][: max(room, 0)]
                buf = bytearray(keep)
            left = deadline - time.monotonic()
            if left <= 0 or not self._alive:
                self._buf = bytes(buf)
                return None
            ready, _, _ = select.select([self._sock], [], [], min(left, 0.5))
            if not ready:
                continue
            try:
                chunk = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self._alive = False
                self._buf = bytes(buf)
                return None
            buf += chunk

    # ------------------------------------------------------------------ commands
    def run(self, command: str, *, timeout_s: float = 30.0) -> ShellResult:
        """Type ``command`` into the shell and return what the terminal shows until it finishes."""
        restarted = False
        if not self._alive:
            self._restart()
            restarted = True
        out = bytearray(self._buf)
        self._buf = b""
        self._send(command.encode("utf-8", "surrogateescape") + b"\n")
        code = self._wait_marker(self._marker_line(), timeout_s, out)
        timed_out = interrupted = killed = False
        if code is None and self._alive:
            timed_out = interrupted = True
            self._send(b"\x03")  # Ctrl-C: SIGINT to the foreground job, and the typed-ahead line is dropped
            code = self._wait_marker(self._marker_line(), 5.0, out)
            if code is None and self._alive:
                killed = self._kill_foreground()
                code = self._wait_marker(self._marker_line(), 5.0, out)
        if code is None:  # the shell exited (exit, exec) or is wedged: start a fresh one
            self._restart()
            restarted = True
        truncated = len(out) >= MAX_CAPTURE
        return ShellResult(clean_terminal_output(bytes(out)), None if timed_out else code, timed_out, interrupted,
                           killed, restarted, truncated)

    def _kill_foreground(self) -> bool:
        """SIGKILL the terminal's foreground process group (a job that ignored Ctrl-C)."""
        if self.pid is None:
            return False
        script = (f"tp=$(ps -o tpgid= -p {self.pid} | tr -d ' '); sp=$(ps -o pgid= -p {self.pid} | tr -d ' '); "
                  'if [ -n "$tp" ] && [ "$tp" != "$sp" ] && [ "$tp" != "-1" ]; then kill -KILL -- "-$tp"; fi')
        try:
            done = exec_with_deadline(self._api, self._cid, ["bash", "-c", script], deadline=time.monotonic() + 10.0,
                                      limit=4096, exit_code=False)
        except Exception:  # the container may be gone: the caller restarts the shell either way
            return False
        return done is not None

    def _restart(self) -> None:
        self.close()
        self._start()

    def close(self) -> None:
        self._alive = False
        with contextlib.suppress(Exception):
            self._sock.close()
        with contextlib.suppress(Exception):
            self._holder.close()


_SCRIPT_WRAPPER = ('d=$(mktemp -d) || exit 125; t=$1; shift; timeout -s KILL "$t" "$@" >"$d/o" 2>"$d/e" </dev/null; '
                   'c=$?; head -c 1048576 "$d/o"; head -c 1048576 "$d/e" >&2; rm -rf "$d"; exit $c')
# After seal: each check step first kills whatever an earlier step (a program of the agent's that a
# check ran) left behind, so nothing of the agent's runs beside a check.
_CHECK_WRAPPER = "kill -KILL -1 2>/dev/null; " + _SCRIPT_WRAPPER


class OSContainer:
    """A task's container: root, no network, limits; init/check scripts and one persistent shell.

    Args:
        client: A docker SDK client.
        image: The image tag (from :func:`~agentgym.envs.code.os_image.ensure_os_image`).
        memory_mb: Memory limit (swap off), like AgentBench's 1 GiB.
        cpus: CPU quota.
        pids_limit: Most processes at once (stops fork bombs).
        file_mb: Largest file a process may write (``RLIMIT_FSIZE``).
        disk_mb: Everything written in the container together (a tmpfs: it counts against
            ``memory_mb`` too).
    """

    def __init__(self, client: Any, image: str, *, memory_mb: int = 1024, cpus: float = 1.0, pids_limit: int = 256,
                 file_mb: int = 512, disk_mb: int = 512) -> None:
        from docker.types import LogConfig, Ulimit

        self._client = client
        self._image = image
        self.shell_: Shell | None = None
        self.sealed = False
        fsize = int(file_mb) * 1024 * 1024
        try:
            self.container = client.containers.run(
                image, ["python3", "-I", "-S", "-c", _INIT], detach=True, name=f"agentgym-os-{uuid.uuid4().hex[:12]}",
                labels={LABEL: "1", f"{LABEL}.owner": str(os.getpid())}, network_mode="none", user="root",
                working_dir="/root", hostname="agentgym-os", mem_limit=f"{int(memory_mb)}m",
                memswap_limit=f"{int(memory_mb)}m", nano_cpus=int(float(cpus) * 1e9), pids_limit=int(pids_limit),
                cap_drop=["ALL"], cap_add=_CAPS, security_opt=["no-new-privileges"], ipc_mode="private",
                ulimits=[Ulimit(name="fsize", soft=fsize, hard=fsize), Ulimit(name="nofile", soft=4096, hard=4096)],
                read_only=True, log_config=LogConfig(type="none"), auto_remove=False)
        except Exception as e:
            raise SandboxUnavailable(f"could not start an OS-v0 container from {image!r}: {e}") from e
        self._guard_security = ["no-new-privileges"]
        try:
            if any("apparmor" in str(o) for o in (client.info().get("SecurityOptions") or [])):
                self._guard_security.append("apparmor=unconfined")  # docker-default's AppArmor profile denies mount
            self._guard("setup", str(int(disk_mb) * 1024 * 1024))
        except BaseException:
            self.close()
            raise

    @property
    def id(self) -> str:
        return str(self.container.id)

    def shell(self) -> Shell:
        """The container's persistent shell (started on first use)."""
        if self.sealed:
            raise SandboxError("this OS-v0 container is sealed for its checks: the agent's shell is gone")
        if self.shell_ is None:
            self.shell_ = Shell(self._client, self.id)
        return self.shell_

    def seal(self) -> dict[str, Any]:
        """End the agent's turn: close its shell, kill every process it left, pin what checks execute.

        Raises:
            SandboxError: The guard could not make a trustworthy view (the message says why).
            SandboxUnavailable: The helper container could not run at all.
        """
        if self.shell_ is not None:
            self.shell_.close()
            self.shell_ = None
        self.sealed = True
        return self._guard("seal")

    def _guard(self, *args: str, timeout_s: float = 120.0) -> dict[str, Any]:
        """Run ``_os_guard.py`` with ``args`` in a privileged helper that shares this container's PIDs."""
        from docker.types import LogConfig

        with open(_GUARD_SRC, encoding="utf-8") as f:
            src = f.read()
        try:
            helper = self._client.containers.create(
                self._image, ["python3", "-I", "-S", "-c", src, *args], name=f"agentgym-os-guard-{uuid.uuid4().hex[:12]}",
                labels={LABEL: "1", f"{LABEL}.owner": str(os.getpid())}, network_mode="none", user="root",
                pid_mode=f"container:{self.id}", read_only=True, cap_drop=["ALL"], cap_add=_GUARD_CAPS,
                security_opt=self._guard_security, mem_limit="256m", memswap_limit="256m", pids_limit=32,
                log_config=LogConfig(type="json-file", config={"max-size": "1m"}))
        except Exception as e:
            raise SandboxUnavailable(f"could not start the OS-v0 guard from {self._image!r}: {e}") from e
        try:
            helper.start()
            helper.wait(timeout=timeout_s)
            raw = helper.logs(stdout=True, stderr=True)[-65536:]
        except Exception as e:
            raise SandboxUnavailable(f"the OS-v0 guard ({args[0]}) did not finish: {type(e).__name__}: {e}") from e
        finally:
            with contextlib.suppress(Exception):
                helper.remove(force=True)
        lines = [ln for ln in raw.decode("utf-8", "replace").splitlines() if ln.startswith("{")]
        try:
            answer = json.loads(lines[-1]) if lines else {}
        except ValueError:
            answer = {}
        if not answer.get("ok"):
            raise SandboxError(f"the OS-v0 guard ({args[0]}) failed: {answer.get('error') or raw[-500:]!r}")
        return dict(answer)

    def run_script(self, language: str, code: str, params: list[str] | tuple[str, ...] = (), *,
                   timeout_s: float = 60.0) -> ScriptResult:
        """Run a script as AgentBench runs init and check scripts: its own process, as root, in ``/root``.

        After :meth:`seal`, scripts run with :data:`CHECK_ENV` and kill whatever is running first.
        """
        if language == "bash":
            cmd = ["bash", "-c", code, *(["--", *params] if params else [])]
        elif language == "python":
            cmd = ["python3", "-c", code, *params]
        else:
            raise SandboxError(f"unsupported script language {language!r} (bash or python)")
        # The script's output goes to files, not to the exec's stream: a child it leaves running in the
        # background (``sleep 1000 &``, a service an init script starts on purpose) keeps those files open
        # but not the stream, so the exec returns when ``timeout`` ends the script itself.
        wrapper = _CHECK_WRAPPER if self.sealed else _SCRIPT_WRAPPER
        full = ["sh", "-c", wrapper, "agentgym-script", f"{max(1, int(timeout_s))}", *cmd]
        try:
            res = exec_with_deadline(self._client.api, self.id, full, deadline=time.monotonic() + timeout_s + _EXEC_MARGIN_S,
                                     limit=MAX_CAPTURE + 4096, environment=CHECK_ENV if self.sealed else None,
                                     workdir="/root", user="0:0")  # numeric: never looked up in the agent's /etc/passwd
        except Exception as e:
            raise SandboxError(f"the container failed to run a script: {type(e).__name__}: {e}") from e
        if res is None:
            return ScriptResult(-1, "", "[the script did not end by its deadline]", timed_out=True)
        code_ = res.exit_code if res.exit_code is not None else -1
        return ScriptResult(code_, res.stdout.decode("utf-8", "replace"), res.stderr.decode("utf-8", "replace"),
                            timed_out=code_ in (124, 137))

    def close(self) -> None:
        if self.shell_ is not None:
            self.shell_.close()
            self.shell_ = None
        with contextlib.suppress(Exception):
            self.container.remove(force=True)

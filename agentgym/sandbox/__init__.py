"""Isolated execution of untrusted code: one :class:`Sandbox` protocol, three backends.

=========  ==========================================================================
backend    isolation
=========  ==========================================================================
bwrap      Default. bubblewrap namespaces: no network, read-only system dirs, fresh tmpfs
           work dir, ``/tmp`` and ``/dev/shm``, new PID and IPC namespaces, rlimits,
           seccomp, cleared environment. ``warm=True`` keeps pre-started workers that fork a
           fresh child per run (a few ms per run).
docker     Docker SDK: ``network_mode="none"``, memory/CPU/pids limits, read-only root with a
           tmpfs work dir, a pool of warm containers driven with ``exec``, host-side deadlines.
process    **Weaker fallback** for machines with neither: a supervised subprocess with rlimits,
           seccomp, a cleared environment and a temp work dir. As root it also runs the program
           as a throw-away uid in its own network, IPC and mount namespaces (no network, private
           ``/tmp`` and ``/dev/shm``); as an ordinary user the program can reach the network,
           read what that user can read and signal that user's processes.
=========  ==========================================================================

As root every backend runs programs as uids leased from :class:`~agentgym.sandbox._posix.UidPool`:
no two runs, sessions, workers or containers on the machine share one, so cleaning up after
one run never touches another. The README's *Security* section lists what each backend
guarantees and what it does not.

Example::

    from agentgym.sandbox import get_sandbox
    box = get_sandbox()            # bwrap, or process if bwrap is missing
    res = box.run("print(6 * 7)", timeout_s=5)
    assert res.stdout == "42\\n"
"""

from __future__ import annotations

from typing import Any

from agentgym.errors import SandboxUnavailable
from agentgym.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    ExecResult,
    Language,
    Limits,
    Sandbox,
    SandboxSession,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIMEOUT_S",
    "ExecResult",
    "Language",
    "Limits",
    "Sandbox",
    "SandboxSession",
    "available_backends",
    "get_sandbox",
]

BACKENDS = ("bwrap", "bwrap-warm", "docker", "process")


def get_sandbox(name: str = "auto", **kwargs: Any) -> Sandbox:
    """Build a sandbox backend by name.

    Args:
        name: ``"bwrap"``, ``"bwrap-warm"`` (bwrap with ``warm=True``), ``"docker"``,
            ``"process"``, or ``"auto"`` (bwrap, falling back to process if bwrap cannot run).
        **kwargs: Passed to the backend's constructor.

    Raises:
        SandboxUnavailable: The backend is not installed or cannot start here; the message says
            what to install or start.
    """
    if name == "auto":
        try:
            return get_sandbox("bwrap", **kwargs)
        except SandboxUnavailable:
            return get_sandbox("process", **{k: v for k, v in kwargs.items() if k in ("python", "nproc", "file_mb")})
    if name in ("bwrap", "bwrap-warm"):
        from agentgym.sandbox.bwrap import BwrapSandbox

        if name == "bwrap-warm":
            kwargs.setdefault("warm", True)
        return BwrapSandbox(**kwargs)
    if name == "docker":
        from agentgym.sandbox.docker import DockerSandbox

        return DockerSandbox(**kwargs)
    if name == "process":
        from agentgym.sandbox.process import ProcessSandbox

        return ProcessSandbox(**kwargs)
    raise SandboxUnavailable(f"unknown sandbox backend {name!r}; choose one of {', '.join(BACKENDS)} or 'auto'.")


def available_backends() -> list[str]:
    """Backends that can run on this machine right now (docker: the daemon answers)."""
    out: list[str] = []
    from agentgym.sandbox.bwrap import bwrap_available

    if bwrap_available():
        out += ["bwrap", "bwrap-warm"]
    from agentgym.sandbox.docker import docker_available

    if docker_available():
        out.append("docker")
    out.append("process")
    return out

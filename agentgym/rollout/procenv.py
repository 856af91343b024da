"""Envs in their own processes: a blocking env call that hangs can be killed, not just abandoned.

With ``RolloutRuntime(env_workers="process")`` every env lives in a child process (``spawn``, so it is
safe next to threads, torch and vLLM) and the rollout talks to it through a :class:`ProcessEnv`
proxy over a pipe. The proxy speaks only the public env API the rollout uses (``reset``, ``step``,
``close`` and ``get_wrapper_attr`` for ``tasks``, ``splits``, ``expert_action`` and other public
attributes), so an env in a process behaves like a local one.

When a call exceeds its timeout the runtime calls :meth:`ProcessEnv.kill`: the child is killed
(SIGKILL), the call fails with :class:`~agentgym.rollout.runtime.EnvTimeout`, and the env is
discarded; a thread-pool env could only be abandoned, still running.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import threading
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium

from agentgym.errors import EnvError

__all__ = ["EnvProcessDied", "ProcessEnv"]


class EnvProcessDied(EnvError):
    """The env's process died (killed after a timeout, crashed, or out of memory)."""


def _worker(conn: Any, factory: Callable[[str], Any], env_id: str) -> None:  # runs in the child
    try:
        env = factory(env_id)
    except BaseException as e:
        conn.send(("err", _portable(e)))
        return
    spec = getattr(env, "spec", None)
    conn.send(("ok", {"spec": spec, "metadata": getattr(env, "metadata", {})}))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        op, name, args, kwargs = msg
        try:
            if op == "call":
                out = getattr(env, name)(*args, **kwargs)
            elif op == "attr_call":
                out = env.get_wrapper_attr(name)(*args, **kwargs)
            elif op == "attr":
                v = env.get_wrapper_attr(name)
                out = {"callable": True} if callable(v) else {"value": v}
            else:
                raise ValueError(f"unknown op {op!r}")
            conn.send(("ok", out))
        except BaseException as e:
            conn.send(("err", _portable(e)))
        if op == "call" and name == "close":
            break
    with contextlib.suppress(Exception):
        env.close()


def _portable(e: BaseException) -> BaseException:
    """``e`` if it pickles, else a RuntimeError carrying its type, message and traceback."""
    import pickle

    try:
        if str(pickle.loads(pickle.dumps(e))) == str(e):
            return e
    except Exception:
        pass
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-2000:]
    return EnvError(f"{type(e).__name__} in the env process: {e}\n{tb}")


def _default_factory(env_id: str) -> Any:
    from agentgym.registration import make

    return make(env_id)


class ProcessEnv(gymnasium.Env[Any, Any]):
    """A proxy to an env running in a child process (see the module docstring).

    Args:
        env_id: The registered id (passed to ``factory`` in the child).
        factory: ``env_id -> env``; must be picklable (a module-level function), since the child is spawned.
        start_timeout_s: Deadline for the child to build the env.
    """

    def __init__(self, env_id: str, factory: Callable[[str], Any] | None = None, start_timeout_s: float = 300.0) -> None:
        ctx = mp.get_context("spawn")
        self.env_id = env_id
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker, args=(child, factory or _default_factory, env_id), daemon=True,
                                 name=f"agentgym-env-{env_id}")
        self._proc.start()
        child.close()
        self._lock = threading.Lock()
        self._dead: str | None = None
        if not self._conn.poll(start_timeout_s):
            self.kill()
            raise EnvProcessDied(f"{env_id}: the env process did not start within {start_timeout_s:g} s")
        info = self._recv()
        self.spec = info.get("spec")
        self.metadata = info.get("metadata") or {}

    # ------------------------------------------------------------------ env API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:  # type: ignore[override]
        return self._call("call", "reset", seed=seed, options=options)

    def step(self, action: Any) -> Any:
        return self._call("call", "step", action)

    def close(self) -> None:
        if self._dead is None and self._proc.is_alive():
            with contextlib.suppress(EnvError, OSError):
                self._call("call", "close")
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self.kill()
        self._conn.close()

    def get_wrapper_attr(self, name: str) -> Any:
        """A public attribute of the remote env; callables come back as proxies that call it remotely."""
        if name.startswith("_"):
            raise AttributeError(name)
        got = self._call("attr", name)
        return _RemoteCallable(self, name) if got.get("callable") else got["value"]

    @property
    def unwrapped(self) -> ProcessEnv:  # type: ignore[override]
        return self

    # ------------------------------------------------------------------ process control
    def kill(self) -> None:
        """Kill the child now (called by the runtime when a call overran its timeout)."""
        self._dead = self._dead or "killed after a timeout"
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(timeout=5)

    @property
    def alive(self) -> bool:
        return self._dead is None and self._proc.is_alive()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    # ------------------------------------------------------------------ internals
    def _call(self, op: str, name: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._send((op, name, args, kwargs))
            return self._recv()

    def _send(self, msg: Any) -> None:
        if self._dead is not None:
            raise EnvProcessDied(f"{self.env_id}: the env process is gone ({self._dead})")
        try:
            self._conn.send(msg)
        except (OSError, EOFError, BrokenPipeError) as e:
            self._dead = f"pipe closed: {e}"
            raise EnvProcessDied(f"{self.env_id}: the env process is gone ({self._dead})") from None

    def _recv(self) -> Any:
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError) as e:
            code = self._proc.exitcode
            self._dead = self._dead or (f"exit code {code}" if code is not None else f"pipe closed: {e}")
            raise EnvProcessDied(f"{self.env_id}: the env process died ({self._dead})") from None
        if status == "err":
            raise value
        return value


class _RemoteCallable:
    """``env.get_wrapper_attr(name)`` of a ProcessEnv: calling it calls the attribute in the child."""

    def __init__(self, env: ProcessEnv, name: str) -> None:
        self.env = env
        self.name = name
        self.__qualname__ = f"ProcessEnv.{name}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.env._call("attr_call", self.name, *args, **kwargs)

    @property
    def __self__(self) -> ProcessEnv:
        return self.env

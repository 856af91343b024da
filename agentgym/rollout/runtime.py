"""What workflows run on: limits, a worker pool for blocking env calls, env pools, a concurrency cap.

Envs are plain blocking gymnasium envs. Every ``reset``/``step``/``make``/``close`` goes through
:meth:`RolloutRuntime.call`, which runs it in a thread pool with a timeout, so the asyncio loop
(and the policy requests it multiplexes) never stalls on a sandbox, a database or a retriever.

Envs live in the worker threads (``env_workers="thread"``, the default) or each in its own process
(``env_workers="process"``, :class:`~agentgym.rollout.procenv.ProcessEnv`). A call that exceeds its
timeout raises :class:`EnvTimeout` either way; in process mode the env's process is also killed, so
a hung step does not keep running (or holding a sandbox, a lock or memory) in a lost thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeVar

import gymnasium

from agentgym.errors import ConfigurationError, EnvError

__all__ = ["EnvFactory", "EnvTimeout", "RolloutLimits", "RolloutRuntime"]

log = logging.getLogger(__name__)
T = TypeVar("T")
EnvFactory = Callable[[str], gymnasium.Env[Any, Any]]


class EnvTimeout(EnvError, TimeoutError):
    """An env ``reset``/``step`` exceeded ``RolloutLimits.env_timeout_s`` (the env is discarded)."""


@dataclass(frozen=True)
class RolloutLimits:
    """Per-episode limits. Hitting one ends the episode with ``truncated=True`` (never ``terminated``).

    Attributes:
        max_turns: Policy turns per episode (``None``: only the env's own limit).
        max_total_tokens: Prompt + generated tokens in the episode's context (token-reporting policies).
        max_wall_s: Wall-clock seconds per episode (policy calls are cut off at the deadline).
        env_timeout_s: One env reset/step; exceeding it is an env error (the episode is lost).
        policy_timeout_s: One policy call; exceeding it truncates the episode (``policy_timeout``).
        env_start_timeout_s: Building an env (loading data, starting a sandbox or its process).
    """

    max_turns: int | None = None
    max_total_tokens: int | None = None
    max_wall_s: float | None = None
    env_timeout_s: float = 300.0
    policy_timeout_s: float = 600.0
    env_start_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_total_tokens", "max_wall_s"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ConfigurationError(f"RolloutLimits.{name} must be positive or None, got {v!r}.")
        for name in ("env_timeout_s", "policy_timeout_s", "env_start_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"RolloutLimits.{name} must be positive.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _default_factory(env_id: str) -> gymnasium.Env[Any, Any]:
    from agentgym.registration import make

    return make(env_id)


def _process_env(factory: EnvFactory, env_id: str) -> gymnasium.Env[Any, Any]:
    from agentgym.rollout.procenv import ProcessEnv

    return ProcessEnv(env_id, factory)


class RolloutRuntime:
    """Shared by all episodes of a run: thread pool, env pools and the episode concurrency cap.

    Args:
        max_concurrency: Episodes actively running at once (each holds a slot while it generates or
            steps; a member waiting at a gate's hold point gives its slot back).
        env_factory: ``env_id -> env`` (default :func:`agentgym.make`). Called in a worker thread.
        max_workers: Threads for blocking env calls (default: ``max_concurrency``, at least 4).
        reuse_envs: Keep envs in a per-id pool and ``reset`` them for the next episode.
        env_workers: ``"thread"`` (envs in the worker threads) or ``"process"`` (one child process per
            env; ``env_factory`` must then be picklable, e.g. a module-level function).
    """

    def __init__(self, max_concurrency: int = 32, env_factory: EnvFactory | None = None,
                 max_workers: int | None = None, reuse_envs: bool = True,
                 env_workers: Literal["thread", "process"] = "thread") -> None:
        if max_concurrency < 1:
            raise ConfigurationError(f"max_concurrency must be >= 1, got {max_concurrency}.")
        if env_workers not in ("thread", "process"):
            raise ConfigurationError(f"env_workers must be 'thread' or 'process', got {env_workers!r}.")
        self.max_concurrency = max_concurrency
        self.env_workers = env_workers
        self.env_factory: EnvFactory = env_factory or _default_factory
        if env_workers == "process":
            self.env_factory = functools.partial(_process_env, env_factory or _default_factory)
        self.executor = ThreadPoolExecutor(max_workers=max_workers or max(4, max_concurrency),
                                           thread_name_prefix="agentgym-env")
        self.reuse_envs = reuse_envs
        self._sem: asyncio.Semaphore | None = None
        self._pools: dict[str, list[gymnasium.Env[Any, Any]]] = {}
        self._broken: set[int] = set()
        self._closed = False
        self.active = 0  # episodes holding a slot
        self._listeners: list[Callable[[int], None]] = []

    # ------------------------------------------------------------------ concurrency
    @property
    def semaphore(self) -> asyncio.Semaphore:
        if self._sem is None:  # created lazily, inside the running loop
            self._sem = asyncio.Semaphore(self.max_concurrency)
        return self._sem

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the ``max_concurrency`` episode slots (counted in :attr:`active`)."""
        await self.acquire_slot()
        try:
            yield
        finally:
            self.release_slot()

    async def acquire_slot(self) -> None:
        await self.semaphore.acquire()
        self._set_active(self.active + 1)

    def release_slot(self) -> None:
        self.semaphore.release()
        self._set_active(self.active - 1)

    def add_listener(self, fn: Callable[[int], None]) -> None:
        """Call ``fn(active)`` whenever the number of active episodes changes (batchers use it)."""
        self._listeners.append(fn)

    def _set_active(self, n: int) -> None:
        self.active = n
        for fn in list(self._listeners):
            fn(n)

    async def call(self, fn: Callable[..., T], *args: Any, timeout: float | None = None, owner: Any = None,
                   **kwargs: Any) -> T:
        """Run a blocking call in the worker pool; :class:`EnvTimeout` after ``timeout`` seconds.

        On a timeout, ``owner`` (default: the object ``fn`` is bound to) is killed if it can be
        (``owner.kill()``: an env in its own process); a thread cannot be killed and is abandoned.
        """
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            name = getattr(fn, "__qualname__", repr(fn))
            target = owner if owner is not None else getattr(fn, "__self__", None)
            kill = getattr(target, "kill", None)
            killed = ""
            if callable(kill):
                kill()
                killed = " (its process was killed)"
            raise EnvTimeout(f"{name} did not return within {timeout:g} s{killed}") from None

    # ------------------------------------------------------------------ env pool
    @contextlib.asynccontextmanager
    async def env(self, env_id: str, timeout: float | None = None) -> AsyncIterator[gymnasium.Env[Any, Any]]:
        """Borrow an env; it goes back to the pool unless the body raised or called :meth:`discard`."""
        pool = self._pools.setdefault(env_id, [])
        while pool and getattr(pool[-1], "alive", True) is False:  # an env process that died while idle
            self._close_env(pool.pop())
        env = pool.pop() if pool else await self.call(self.env_factory, env_id, timeout=timeout)
        ok = False
        try:
            yield env
            ok = True
        finally:
            broken = id(env) in self._broken
            self._broken.discard(id(env))
            if ok and not broken and self.reuse_envs and not self._closed:
                pool.append(env)
            else:
                self._close_env(env)

    def discard(self, env: gymnasium.Env[Any, Any]) -> None:
        """Mark a borrowed env as broken: it is closed instead of going back to the pool."""
        self._broken.add(id(env))

    def _close_env(self, env: gymnasium.Env[Any, Any]) -> None:
        # close in the pool so a slow close does not block the loop; never raise from cleanup
        def _close() -> None:
            try:
                env.close()
            except Exception as e:  # pragma: no cover - best effort
                log.debug("env close failed: %s", e)

        if self._closed:
            _close()
        else:
            try:
                self.executor.submit(_close)
            except RuntimeError:  # executor already shut down
                _close()

    def close(self, wait: bool = True) -> None:
        """Close pooled envs and stop the worker threads."""
        if self._closed:
            return
        self._closed = True
        for pool in self._pools.values():
            for env in pool:
                self._close_env(env)
        self._pools.clear()
        self.executor.shutdown(wait=wait, cancel_futures=True)

    def __enter__(self) -> RolloutRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

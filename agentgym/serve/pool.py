"""Spread env sessions over several env servers, skipping dead ones.

The rollout runtime builds envs through its ``env_factory(env_id)`` hook, so pooling needs no change
to it::

    pool = RemotePool(["http://gpu-a:8100", "http://gpu-b:8100"], token=TOKEN)
    runtime = RolloutRuntime(max_concurrency=64, env_factory=pool.make)

Each new env opens its session on the live server with the fewest open sessions (ties rotate). A
server that cannot be reached is skipped for a cool-down that doubles with each failure (5 s up to
60 s) and tried again after it. An episode in flight on a server that dies ends with an
:class:`~agentgym.errors.EnvServerError` (the runtime discards that env); the next env goes to a
live server. ``RemoteEnv(url=[...])`` and ``--env-kwarg url=http://a,http://b`` share one pool per
set of URLs in the process, so ``agentgym eval`` and training get the same behaviour.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

__all__ = ["RemotePool"]


class RemotePool:
    """Load and health bookkeeping for a set of env servers (thread-safe).

    Args:
        urls: Base URLs of ``agentgym serve`` (or OpenEnv) servers.
        token: Bearer token for all of them.
        cooldown_s: How long a failed server is skipped; doubles per consecutive failure.
        max_cooldown_s: Cap of the cool-down.
        env_kwargs: Default :class:`~agentgym.serve.client.RemoteEnv` kwargs for :meth:`make`.
    """

    _shared: ClassVar[dict[tuple[tuple[str, ...], str | None], RemotePool]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, urls: Sequence[str], *, token: str | None = None, cooldown_s: float = 5.0,
                 max_cooldown_s: float = 60.0, connect_timeout_s: float = 5.0, **env_kwargs: Any) -> None:
        from agentgym.errors import ConfigurationError

        self.urls = [u.rstrip("/") for u in urls]
        if not self.urls:
            raise ConfigurationError("RemotePool needs at least one URL.")
        if len(set(self.urls)) != len(self.urls):
            raise ConfigurationError(f"a URL is listed twice: {self.urls}")
        self.token = token
        self.cooldown_s = float(cooldown_s)
        self.max_cooldown_s = float(max_cooldown_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.env_kwargs = env_kwargs
        self.live = dict.fromkeys(self.urls, 0)
        self.failures = dict.fromkeys(self.urls, 0)
        self.dead_until = dict.fromkeys(self.urls, 0.0)
        self.last_error: dict[str, str] = {}
        self._turn = itertools.count()
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, urls: Sequence[str], *, token: str | None = None, **kw: Any) -> RemotePool:
        """The process-wide pool for this set of URLs (what ``RemoteEnv(url=[...])`` uses)."""
        key = (tuple(u.rstrip("/") for u in urls), token)
        with cls._shared_lock:
            pool = cls._shared.get(key)
            if pool is None:
                pool = cls._shared[key] = cls(list(key[0]), token=token, **kw)
            return pool

    def _key(self, url: str) -> str:
        url = url.rstrip("/")
        return url if url in self.live else next((u for u in self.urls if url.startswith(u)), url)

    def candidates(self) -> list[str]:
        """Servers to try, best first: live ones by open sessions (ties rotate), then dead ones by
        when their cool-down ends (so a fully dead pool is still retried)."""
        now = time.monotonic()
        with self._lock:
            start = next(self._turn) % len(self.urls)
            order = self.urls[start:] + self.urls[:start]
            live = [u for u in order if self.dead_until[u] <= now]
            dead = [u for u in order if self.dead_until[u] > now]
            live.sort(key=lambda u: self.live[u])
            dead.sort(key=lambda u: self.dead_until[u])
        return live + dead

    def mark_dead(self, url: str, why: str = "") -> None:
        """Skip ``url`` for a cool-down (doubling with consecutive failures)."""
        u = self._key(url)
        with self._lock:
            if u not in self.failures:
                return
            self.failures[u] += 1
            self.dead_until[u] = time.monotonic() + min(self.max_cooldown_s,
                                                        self.cooldown_s * 2 ** (self.failures[u] - 1))
            self.last_error[u] = why

    def acquire(self, url: str) -> None:
        """A session was opened on ``url`` (it is alive)."""
        u = self._key(url)
        with self._lock:
            if u in self.live:
                self.live[u] += 1
                self.failures[u] = 0
                self.dead_until[u] = 0.0

    def release(self, url: str) -> None:
        """A session on ``url`` was closed."""
        u = self._key(url)
        with self._lock:
            if u in self.live and self.live[u] > 0:
                self.live[u] -= 1

    def make(self, env_id: str | None = None, **kwargs: Any) -> Any:
        """A :class:`~agentgym.serve.client.RemoteEnv` for ``env_id`` on the best server (an ``EnvFactory``)."""
        from agentgym.serve.client import RemoteEnv

        return RemoteEnv(self.urls, env_id=env_id, token=self.token, pool=self, **{**self.env_kwargs, **kwargs})

    def health(self, timeout_s: float = 2.0) -> dict[str, bool]:
        """``GET /health`` on every server now (does not change the bookkeeping)."""
        import httpx

        out: dict[str, bool] = {}
        for u in self.urls:
            try:
                out[u] = httpx.get(u + "/health", timeout=timeout_s).status_code == 200
            except httpx.HTTPError:
                out[u] = False
        return out

    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        with self._lock:
            return {u: {"sessions": self.live[u], "dead_for_s": max(0.0, self.dead_until[u] - now),
                        "failures": self.failures[u], "last_error": self.last_error.get(u)} for u in self.urls}

"""Load and health bookkeeping for several env servers (which one should the next session use?).

:class:`RemotePool` only keeps counts; it opens nothing. :func:`agentgym.serve.client.remote_env_factory`
turns a pool into the rollout runtime's ``env_factory``, so envs share one pool::

    pool = RemotePool(["http://gpu-a:8100", "http://gpu-b:8100"])
    runtime = RolloutRuntime(max_concurrency=64, env_factory=remote_env_factory(pool, token=TOKEN))

Each new env opens its session on the live server with the fewest open sessions (ties rotate). A
server that cannot be reached is skipped for a cool-down that doubles with each failure (5 s up to
60 s) and tried again after it; a server at capacity is only passed over. An episode in flight on a
server that dies ends with an :class:`~agentgym.errors.EnvServerError` (the runtime discards that
env); the next env goes to a live server. ``RemoteEnv(url=[...])`` without a pool gets a pool of its
own whose rotation starts at a random server, so independent envs spread at random.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from agentgym.errors import ConfigurationError

__all__ = ["RemotePool"]


class RemotePool:
    """Load and health bookkeeping for a set of env servers (thread-safe).

    Args:
        urls: Base URLs of ``agentgym serve`` (or OpenEnv) servers.
        cooldown_s: How long a failed server is skipped; doubles per consecutive failure.
        max_cooldown_s: Cap of the cool-down.
    """

    def __init__(self, urls: Sequence[str], *, cooldown_s: float = 5.0, max_cooldown_s: float = 60.0) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        if not self.urls:
            raise ConfigurationError("RemotePool needs at least one URL.")
        if len(set(self.urls)) != len(self.urls):
            raise ConfigurationError(f"a URL is listed twice: {self.urls}")
        self.cooldown_s = float(cooldown_s)
        self.max_cooldown_s = float(max_cooldown_s)
        self.live = dict.fromkeys(self.urls, 0)
        self.failures = dict.fromkeys(self.urls, 0)
        self.dead_until = dict.fromkeys(self.urls, 0.0)
        self.last_error: dict[str, str] = {}
        self._turn = itertools.count(random.randrange(len(self.urls)))
        self._lock = threading.Lock()

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

    def stats(self) -> dict[str, Any]:
        """Per server: open sessions, seconds left of its cool-down, consecutive failures, last error."""
        now = time.monotonic()
        with self._lock:
            return {u: {"sessions": self.live[u], "dead_for_s": max(0.0, self.dead_until[u] - now),
                        "failures": self.failures[u], "last_error": self.last_error.get(u)} for u in self.urls}

"""Settings of ``agentgym serve`` (:class:`ServeConfig`), validated before anything is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentgym.errors import ConfigurationError
from agentgym.serve.protocol import is_loopback
from agentgym.serve.runner import ConnectionLimits

__all__ = ["ServeConfig"]


@dataclass
class ServeConfig:
    """Settings of ``agentgym serve`` (every limit is per server process).

    Attributes:
        env_ids: Env ids to serve; the first is also served at the root.
        host: Interface to bind. A non-loopback address needs a token.
        port: TCP port.
        token: Bearer token; required unless the host is a loopback address. Whoever holds it has full
            trust: they can create sessions, step every served env and (unless ``expert`` is off) ask
            the env's expert for the next move.
        max_sessions: Sessions open at once (HTTP, WebSocket and MCP together).
        idle_timeout_s: A session unused for this long is closed.
        step_timeout_s: Deadline of one env reset/step/expert call; the session is discarded past it.
        max_request_bytes: Largest request body or WebSocket message.
        max_action_chars: Longest action; a longer one gets an error observation (env not stepped).
        workers: Threads running env calls (bounds env calls in flight).
        env_kwargs: Constructor kwargs per served env id (full or short id, e.g. ``"ALFWorld-v0"``);
            the key ``"*"`` applies to every env (``--kw key=value`` / ``--kw ENV:key=value``).
        client_kwargs: Env kwargs a client may set when it creates a session.
        task_data: Send each task's ``data`` (gold answers...) with ``/agentgym/tasks``.
        expert: Serve ``/agentgym/expert`` (the env's expert move: gold answers). Turn it off when the
            token is shared with the agents being evaluated.
        allowed_origins: Browser origins allowed besides loopback ones (``"*"``: any). Requests from
            other origins (a ``Origin`` header) are refused, so a web page cannot drive the server.
        allowed_hosts: ``Host`` names allowed besides loopback ones when the server binds a loopback
            address (a DNS-rebinding page sends its own name); ignored on other addresses.
        connections: Connection bounds (cap, header/body/idle timeouts).
    """

    env_ids: list[str]
    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    max_sessions: int = 256
    idle_timeout_s: float = 600.0
    step_timeout_s: float = 300.0
    max_request_bytes: int = 4 * 2**20
    max_action_chars: int = 256 * 1024
    workers: int = 32
    env_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    client_kwargs: tuple[str, ...] = ("parser", "format_penalty")
    task_data: bool = False
    expert: bool = True
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)

    def validate(self) -> None:
        if not self.env_ids:
            raise ConfigurationError("give at least one env id to serve (agentgym serve agentgym/Demo-v0).")
        if self.token is not None and not self.token:
            raise ConfigurationError("--token is empty.")
        if not is_loopback(self.host) and not self.token:
            raise ConfigurationError(
                f"refusing to serve on {self.host!r} without a token: anyone who can reach it could run env code. "
                "Pass --token (or AGENTGYM_TOKEN), or bind 127.0.0.1.")
        for name in ("max_sessions", "workers", "max_request_bytes", "max_action_chars"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("idle_timeout_s", "step_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigurationError(f"{name} must be positive, got {getattr(self, name)}.")
        for key, kw in self.env_kwargs.items():
            if not isinstance(kw, dict):
                raise ConfigurationError(f"env_kwargs[{key!r}] must be a dict of kwargs, got {type(kw).__name__}.")
        self.connections.validate()

    def kwargs_for(self, env_id: str) -> dict[str, Any]:
        """The constructor kwargs of ``env_id``: those for every env, then its own."""
        short = env_id.removeprefix("agentgym/")
        out = dict(self.env_kwargs.get("*", {}))
        for key in (short, env_id):
            out.update(self.env_kwargs.get(key, {}))
        return out

    def limits(self) -> dict[str, Any]:
        """The limits a client may read (``GET /agentgym/spec``)."""
        return {"max_sessions": self.max_sessions, "idle_timeout_s": self.idle_timeout_s,
                "step_timeout_s": self.step_timeout_s, "max_request_bytes": self.max_request_bytes,
                "max_action_chars": self.max_action_chars, "client_kwargs": list(self.client_kwargs),
                "auth": self.token is not None, "expert": self.expert}

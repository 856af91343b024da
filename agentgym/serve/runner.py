"""Run an ASGI app with uvicorn, hardened against connections that hold file descriptors and do nothing.

uvicorn alone keeps a connection whose request headers never finish open forever, and an idle
keep-alive connection for ``timeout_keep_alive``; a client that opens enough of them (no token
needed: auth runs after the headers) exhausts the process's file descriptors, and then nobody is
served. Here every connection is bounded:

* **headers** must arrive within ``header_timeout_s`` of the connection (or of the previous
  response on a keep-alive connection), a request **body** within ``body_timeout_s`` of its headers;
* an **idle** keep-alive connection is closed after ``idle_timeout_s``;
* at most ``max_connections`` are open at once (HTTP and WebSocket). A new connection beyond the cap
  closes the oldest connection that has no request in flight (half-open or idle); a request being
  served and a WebSocket session are never cut. Only if every connection is busy is the new one
  answered ``503`` and closed;
* at start the soft file-descriptor limit is raised to the hard limit, and the cap is lowered to
  half the descriptors available, so accepting never fails for want of one.

:func:`run` serves in the foreground (``agentgym serve``); :class:`ServerThread` serves in a
background thread (tests, benchmarks, notebooks). Both env servers (``agentgym serve``) and the
retrieval server use them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from agentgym.errors import ConfigurationError

__all__ = ["ConnectionLimits", "ServerThread", "raise_fd_limit", "run", "uvicorn_config"]

log = logging.getLogger(__name__)

_FD_CEILING = 1 << 20  # never ask for more than this, whatever the hard limit says
_BUSY_503 = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-connection bounds of a served app (see the module docstring).

    Attributes:
        max_connections: Connections open at once, HTTP and WebSocket together (lowered to half the
            process's file-descriptor limit).
        header_timeout_s: Time to send a request's headers.
        body_timeout_s: Time to send a request's body, after its headers.
        idle_timeout_s: An idle keep-alive connection is closed after this long.
    """

    max_connections: int = 2048
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    idle_timeout_s: float = 5.0

    def validate(self) -> None:
        if self.max_connections < 1:
            raise ConfigurationError(f"max_connections must be >= 1, got {self.max_connections}.")
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigurationError(f"{name} must be positive, got {getattr(self, name)}.")


def raise_fd_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (capped at 2**20); returns the soft limit now."""
    try:
        import resource
    except ImportError:  # not POSIX
        return 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = _FD_CEILING if hard == resource.RLIM_INFINITY else min(hard, _FD_CEILING)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return int(min(soft, _FD_CEILING))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError) as e:
        log.warning("could not raise the file-descriptor limit from %d to %d: %s", soft, want, e)
        return int(soft)
    return int(want)


def _protocol_class(limits: ConnectionLimits, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with the bounds of ``limits`` (one class per server)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    idle: dict[Any, None] = {}  # connections with no request in flight, oldest first

    class BoundedHttpProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _reading_body = False

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()  # a request in its body phase sees http.disconnect

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections and not self._evict():
                transport.write(_BUSY_503)
                transport.close()
                self.transport = transport
                return
            super().connection_made(transport)
            idle[self] = None
            self._arm(limits.header_timeout_s)

        def _evict(self) -> bool:
            """Close the oldest connection with no request in flight; False if there is none."""
            while idle:
                victim = next(iter(idle))
                idle.pop(victim, None)
                if not victim.transport.is_closing():
                    victim._disarm()
                    victim.transport.close()
                    victim.connection_lost(None)  # frees its slot now, not on the next loop turn
                    return True
            return False

        def connection_lost(self, exc: Exception | None) -> None:
            idle.pop(self, None)
            self._disarm()
            if self.parser is None:  # already lost (evicted), or refused in connection_made
                return
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._deadline is None:  # a keep-alive connection starts its next request
                self._arm(limits.header_timeout_s)

        def on_headers_complete(self) -> None:
            idle.pop(self, None)
            self._disarm()
            super().on_headers_complete()
            if not (self.parser.should_upgrade() and self._should_upgrade()):
                self._reading_body = True
                self._arm(limits.body_timeout_s)

        def on_message_complete(self) -> None:
            if self._reading_body:
                self._reading_body = False
                self._disarm()
            super().on_message_complete()

        def handle_websocket_upgrade(self) -> None:
            idle.pop(self, None)
            self._disarm()
            super().handle_websocket_upgrade()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self.pipeline:
                idle[self] = None  # uvicorn armed its keep-alive timer (idle_timeout_s)

    return BoundedHttpProtocol


def uvicorn_config(app: Any, limits: ConnectionLimits | None = None, **kw: Any) -> Any:
    """A ``uvicorn.Config`` serving ``app`` under ``limits`` (raises the fd limit first)."""
    import uvicorn

    limits = limits or ConnectionLimits()
    limits.validate()
    fds = raise_fd_limit()
    cap = max(1, min(limits.max_connections, fds // 2))
    if cap < limits.max_connections:
        log.info("max_connections lowered to %d (file-descriptor limit %d)", cap, fds)
    kw.setdefault("log_level", "warning")
    kw.setdefault("access_log", False)
    # uvicorn types timeout_keep_alive as int; it is only ever passed to loop.call_later
    keep_alive: Any = limits.idle_timeout_s
    return uvicorn.Config(app, http=_protocol_class(limits, cap), timeout_keep_alive=keep_alive, **kw)


def run(app: Any, *, host: str, port: int, limits: ConnectionLimits | None = None, **kw: Any) -> None:
    """Serve ``app`` in the foreground until interrupted."""
    import uvicorn

    uvicorn.Server(uvicorn_config(app, limits, host=host, port=port, **kw)).run()


class ServerThread:
    """Serve an ASGI app with uvicorn in a background thread; the port is chosen by the OS unless given::

        with ServerThread(app) as srv:
            httpx.get(srv.url + "/health")

    Args:
        app: The ASGI app.
        host: Interface to bind (loopback by default).
        port: 0 picks a free port.
        limits: Connection bounds.
        startup_timeout_s: How long :meth:`start` waits for the server to accept requests.
        name: Thread name prefix.
        **uvicorn_kw: Other ``uvicorn.Config`` arguments (``ws=``, ``lifespan=``...).
    """

    _counter = itertools.count()

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, limits: ConnectionLimits | None = None,
                 startup_timeout_s: float = 30.0, name: str = "server", **uvicorn_kw: Any) -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.host, self.port = host, int(self._sock.getsockname()[1])
        self.app = app
        self._server = uvicorn.Server(uvicorn_config(app, limits, **uvicorn_kw))
        self._thread: threading.Thread | None = None
        self._startup_timeout_s = startup_timeout_s
        self._name = name

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> ServerThread:
        """Start serving; raises :class:`TimeoutError` if the server is not up within the start-up timeout."""
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True,
                                        name=f"{self._name}-{self.port}-{next(self._counter)}")
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.stop()
                raise TimeoutError(f"server on {self.url} did not start within {self._startup_timeout_s:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and close the socket."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""The ASGI middleware in front of every route of ``agentgym serve``: who may call, and how much.

In order, for every HTTP request and WebSocket handshake:

1. **Host and Origin.** A request carrying an ``Origin`` header (a browser) is refused unless the
   origin is a loopback one (``http://localhost:3000``, ``http://127.0.0.1``...) or listed in
   ``allowed_origins``; on a server bound to a loopback address, a ``Host`` that is not a loopback
   name (or in ``allowed_hosts``) is refused too. So a web page the user opens can neither drive a
   token-less loopback server cross-site (a WebSocket or a "simple" POST) nor read it through DNS
   rebinding. Non-browser clients (``RemoteEnv``, OpenEnv's and MCP clients, curl) send no
   ``Origin`` and are unaffected.
2. **Token.** ``Authorization: Bearer TOKEN`` (or HTTP Basic with the token as password, so
   OpenEnv's clients can carry it in the URL), compared in constant time. Only the exact health
   routes (``/health``, ``/envs/<Name-vN>/health``) answer without it.
3. **Size.** A request body over ``max_bytes`` gets ``413`` (a declared ``Content-Length`` is
   checked before reading; a chunked body is read no further than the limit). WebSocket messages are
   capped by the server (``ws_max_size``).
"""

from __future__ import annotations

import base64
import hmac
import urllib.parse
from collections.abc import Iterable
from typing import Any

from agentgym.serve.protocol import dumps, is_loopback

__all__ = ["Guard", "send_json"]


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"detail": {"type": kind, "message": message}}


def _hostname(value: str) -> str | None:
    """The host name of a ``Host`` header value (``127.0.0.1:8000``, ``[::1]:80``, ``localhost``)."""
    try:
        return urllib.parse.urlsplit("//" + value).hostname
    except ValueError:
        return None


class Guard:
    """Host/Origin checks, bearer-token auth and request size limits, before any route.

    Args:
        app: The ASGI app behind the guard.
        token: The bearer token (``None``: no auth).
        max_bytes: Largest request body.
        public_paths: Paths answered without a token (the exact health routes).
        loopback_only: The server binds a loopback address: only loopback ``Host`` names are served.
        allowed_origins: Browser origins allowed besides loopback ones (``"*"``: any).
        allowed_hosts: Host names allowed besides loopback ones.
    """

    def __init__(self, app: Any, token: str | None, max_bytes: int, *, public_paths: Iterable[str] = ("/health",),
                 loopback_only: bool = True, allowed_origins: Iterable[str] = (),
                 allowed_hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.max_bytes = max_bytes
        self.public_paths = frozenset(public_paths)
        self.loopback_only = loopback_only
        self.allowed_origins = frozenset(o.rstrip("/").lower() for o in allowed_origins)
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)

    # ------------------------------------------------------------------------------------- checks
    def _refusal(self, scope: dict[str, Any]) -> tuple[int, str, str] | None:
        """``(status, kind, message)`` if the request must be refused, else ``None``."""
        origin = host = None
        authorization: bytes | None = None
        for k, v in scope.get("headers", ()):
            if k == b"origin":
                origin = v.decode("latin-1")
            elif k == b"host":
                host = v.decode("latin-1")
            elif k == b"authorization" and authorization is None:
                authorization = v
        if origin is not None and not self._origin_allowed(origin):
            return 403, "Forbidden", (f"requests from the web origin {origin[:100]!r} are refused (a page in a "
                                      "browser must not drive this server); allow it with --allow-origin")
        if host is not None and self.loopback_only:
            name = _hostname(host)
            if name is None or not (is_loopback(name) or name.lower() in self.allowed_hosts):
                return 403, "Forbidden", (f"Host {host[:100]!r} is not a loopback name and this server binds a "
                                          "loopback address (DNS rebinding?); allow it with --allow-host")
        if self.token is not None and scope["path"] not in self.public_paths and not self._token_ok(authorization):
            return 401, "Unauthorized", "missing or wrong token (Authorization: Bearer TOKEN)"
        return None

    def _origin_allowed(self, origin: str) -> bool:
        o = origin.strip().rstrip("/").lower()
        if "*" in self.allowed_origins or o in self.allowed_origins:
            return True
        try:
            parts = urllib.parse.urlsplit(o)
        except ValueError:
            return False
        return parts.scheme in ("http", "https") and parts.hostname is not None and is_loopback(parts.hostname)

    def _token_ok(self, authorization: bytes | None) -> bool:
        if authorization is None or self.token is None:
            return False
        scheme, _, cred = authorization.partition(b" ")
        cred = cred.strip()
        if scheme.lower() == b"basic":  # OpenEnv's clients: http://user:TOKEN@host:port
            try:
                cred = base64.b64decode(cred, validate=True).partition(b":")[2]
            except ValueError:
                return False
        elif scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(cred, self.token)

    # ------------------------------------------------------------------------------------- ASGI
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            status, err, message = refusal
            if kind == "websocket":  # before accept: the server answers the handshake with 403
                await send({"type": "websocket.close", "code": 1008, "reason": err})
                return
            extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
            await send_json(send, status, _error(err, message), extra)
            return
        if kind == "websocket":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), None)
        if length is not None:
            try:
                too_big = int(length) > self.max_bytes
            except ValueError:
                too_big = True
            if too_big:
                await send_json(send, 413, _error("PayloadTooLarge", f"request body over {self.max_bytes} bytes"),
                                [(b"connection", b"close")])
                return
            await self.app(scope, receive, send)
            return
        # no Content-Length (chunked): buffer up to the limit, then replay
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            size += len(msg.get("body", b""))
            if size > self.max_bytes:
                await send_json(send, 413, _error("PayloadTooLarge", f"request body over {self.max_bytes} bytes"),
                                [(b"connection", b"close")])
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def send_json(send: Any, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send a whole JSON response through the raw ASGI ``send``."""
    data = dumps(body)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})

"""The viewer's HTTP server (the standard library's, one thread per connection).

``GET /`` is the page, ``/app.js`` and ``/app.css`` its bundle (shipped in the package, no build step), and
``GET /data/<path>.json`` a :class:`~agentgym.view.site.Site` document. Nothing else is served.

Transcripts hold agent-written text and may hold secrets, so a page the user visits in the same browser
must not be able to read them:

* **Host**: a server bound to a loopback address answers only requests addressed to a loopback name and its
  own port (``127.0.0.1:PORT``, ``localhost:PORT``, ``[::1]:PORT``), which defeats DNS rebinding.
* **Origin / Sec-Fetch-Site**: data is served only to the page itself (``Sec-Fetch-Site`` ``same-origin`` or
  ``none``; an ``Origin`` header must be this server's), and every response carries
  ``Cross-Origin-Resource-Policy: same-origin``, so another site can neither ``fetch`` it nor include it
  as a script or image. ``frame-ancestors 'none'`` keeps the page out of other sites' frames.
* **Token**: as with ``agentgym serve``, a non-loopback address needs a token; a token is compared in
  constant time and accepted as ``Authorization: Bearer T``, as the ``agentgym_view_<port>`` cookie (one name
  per port: browsers share cookies across the ports of a host), or once as ``?token=T``, which sets the cookie
  (HttpOnly, SameSite=Strict) and redirects to the clean URL.
* **CSP**: scripts and styles only from the server itself; transcripts are inserted as text, never as HTML.
"""

from __future__ import annotations

import hmac
import http.server
import logging
import socket
import threading
import urllib.parse
from importlib import resources
from typing import Any

from agentgym.errors import ConfigurationError, DocumentNotFound
from agentgym.serve.protocol import is_loopback
from agentgym.view.site import Site, encode

__all__ = ["COOKIE", "CSP", "ViewServer", "page_html", "static_file"]

log = logging.getLogger(__name__)

COOKIE = "agentgym_view"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
_MODE_META = '<meta name="agentgym-view-mode" content="server">'
_MAX_PATH = 2048


def static_file(name: str) -> bytes:
    """A file of the page's bundle (``index.html``, ``app.js``, ``app.css``), from the installed package."""
    return resources.files("agentgym.view.static").joinpath(name).read_bytes()


def page_html(mode: str) -> bytes:
    """``index.html`` for ``server`` (data over HTTP) or ``static`` (data files beside it) mode."""
    html = static_file("index.html").decode("utf-8")
    if _MODE_META not in html:
        raise ConfigurationError("agentgym/view/static/index.html lost its mode marker; reinstall agentgym.")
    return html.replace(_MODE_META, f'<meta name="agentgym-view-mode" content="{mode}">').encode("utf-8")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, sock: socket.socket, view: ViewServer) -> None:
        self.view = view
        self.address_family = sock.family
        super().__init__(sock.getsockname()[:2], _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    timeout = 30  # a client that stops sending mid-request is dropped
    protocol_version = "HTTP/1.1"
    server_version = "agentgym-view"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # ------------------------------------------------------------------ responses
    def _send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, message: str, extra: dict[str, str] | None = None) -> None:
        self._send(status, encode({"error": message}), "application/json; charset=utf-8", extra)

    # ------------------------------------------------------------------ checks
    def _host_ok(self) -> bool:
        view = self.server.view
        if not view.loopback:
            return True  # a token guards it; the name users reach it by is theirs to choose
        host = (self.headers.get("Host") or "").strip().lower()
        return host in view.allowed_hosts

    def _token_ok(self, query: dict[str, list[str]]) -> tuple[bool, bool]:
        """(authorized, came from the query string)."""
        token = self.server.view.token
        if token is None:
            return True, False
        want = token.encode()
        auth = self.headers.get("Authorization") or ""
        scheme, _, cred = auth.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(cred.strip().encode(), want):
            return True, False
        for part in (self.headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.server.view.cookie and hmac.compare_digest(urllib.parse.unquote(value).encode(), want):
                return True, False
        for value in query.get("token", []):
            if hmac.compare_digest(value.encode(), want):
                return True, True
        return False, False

    def _same_origin(self) -> bool:
        site = self.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            return False
        origin = self.headers.get("Origin")
        if origin is not None:
            return origin.lower() == f"http://{(self.headers.get('Host') or '').lower()}"
        return True

    # ------------------------------------------------------------------ routes
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if len(self.path) > _MAX_PATH:
            self._error(414, "URL too long")
            return
        if not self._host_ok():
            self._error(403, "wrong Host header: open the viewer at the address `agentgym view` printed")
            return
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, max_num_fields=8)
        ok, from_query = self._token_ok(query)
        if not ok:
            self._error(401, "missing or wrong token: open the URL `agentgym view` printed (it carries ?token=)",
                        {"WWW-Authenticate": "Bearer"})
            return
        if from_query:  # set the cookie and drop the token from the address bar
            view = self.server.view
            cookie = f"{view.cookie}={urllib.parse.quote(view.token or '')}; HttpOnly; SameSite=Strict; Path=/"
            self._send(303, b"", "text/plain", {"Location": url.path or "/", "Set-Cookie": cookie})
            return
        path = url.path
        if path in ("/", "/index.html"):
            self._send(200, self.server.view.page, "text/html; charset=utf-8")
            return
        name = path.lstrip("/")
        if name in _STATIC:
            self._send(200, static_file(name), _STATIC[name])
            return
        if not (path.startswith("/data/") and path.endswith(".json")):
            self._error(404, f"no such page: {path}")
            return
        if not self._same_origin():
            self._error(403, "cross-origin request refused: run data is served only to the viewer's own page")
            return
        doc_path = urllib.parse.unquote(path[len("/data/"):-len(".json")])
        try:
            body = encode(self.server.view.site.document(doc_path))
        except DocumentNotFound as e:
            self._error(404, str(e))
            return
        except OSError as e:  # a run file removed or unreadable while the viewer runs
            self._error(500, f"could not read the run's files: {e}")
            return
        self._send(200, body, "application/json; charset=utf-8")

    def do_POST(self) -> None:
        self._error(405, "the viewer is read-only", {"Allow": "GET, HEAD"})

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST


class ViewServer:
    """Serve a :class:`Site` in a background thread (the CLI, tests, notebooks)::

        with ViewServer(Site(["runs/my-eval"])) as srv:
            print(srv.url)

    Args:
        site: The documents to serve.
        host: Interface to bind; a non-loopback address needs ``token``.
        port: TCP port (0: a free one).
        token: Required from every client when given.

    Raises:
        ConfigurationError: a non-loopback host without a token, an empty token, or a port in use.
    """

    def __init__(self, site: Site, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        if token is not None and not token:
            raise ConfigurationError("--token is empty.")
        self.loopback = is_loopback(host)
        if not self.loopback and not token:
            raise ConfigurationError(
                f"refusing to serve transcripts on {host!r} without a token: anyone who can reach it could read "
                "them. Pass --token (or AGENTGYM_TOKEN), or bind 127.0.0.1.")
        self.site = site
        self.token = token
        self.page = page_html("server")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as e:
            sock.close()
            raise ConfigurationError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port.") from None
        sock.listen(64)
        self.host = host
        self.port = int(sock.getsockname()[1])
        shown = f"[{host.strip('[]')}]" if ":" in host else host
        names = ("127.0.0.1", "localhost", "[::1]", shown.lower())
        self.allowed_hosts = {f"{h}:{self.port}" for h in names} | (set(names) if self.port == 80 else set())
        self.cookie = f"{COOKIE}_{self.port}"
        self._httpd = _Server(sock, self)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The page's address (with ``?token=`` when a token is set)."""
        shown = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
        base = f"http://{shown}:{self.port}/"
        return base + (f"?token={urllib.parse.quote(self.token)}" if self.token else "")

    def serve_forever(self) -> None:
        """Serve in this thread until :meth:`stop` (or KeyboardInterrupt)."""
        self._httpd.serve_forever(poll_interval=0.2)

    def start(self) -> ViewServer:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name=f"agentgym-view-{self.port}")
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout_s)
        self._httpd.server_close()

    def __enter__(self) -> ViewServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


"""``RemoteEnv``: an env on another process or machine, behind the same env contract as a local one.

``RemoteEnv`` is itself an :class:`~agentgym.core.AgentEnv` (registered as ``agentgym/Remote-v0``),
so the checker, ``agentgym eval`` (with ``--policy expert``), the rollout engine and training use
it unchanged::

    env = gymnasium.make("agentgym/Remote-v0", url="http://127.0.0.1:8100", env_id="agentgym/SQL-v0")
    obs, info = env.reset(seed=0)          # info["tools"], info["parser"], info["task_id"] as locally

It talks to ``agentgym serve`` (HTTP by default, or its WebSocket with ``transport="ws"``) and to
any OpenEnv server (``openenv-core``'s ``create_app``; over its ``/ws`` session protocol): an
OpenEnv env becomes an AgentGym env. See :class:`RemoteEnv` for how its actions and observations
are mapped.

Faults: every attempt of a call has a total deadline (``timeout_s``, however slowly the server
sends) and every response a size cap (``max_response_bytes``); a response that is not acceptable
JSON (bad syntax, absurd integers or nesting) is an :class:`~agentgym.errors.EnvServerError`. Calls
that cannot apply twice are retried on transport errors (reads, ``reset``, and session creation
and ``step``, which carry a ``request_id`` the server deduplicates); a call that fails for good raises
:class:`~agentgym.errors.EnvServerError`, which ends the episode in flight with an error while the
run goes on. A server at capacity is waited for (``capacity_wait_s``), then
:class:`~agentgym.errors.EnvServerAtCapacity`. Server errors map onto :mod:`agentgym.errors`.
Credentials in a URL (``http://user:TOKEN@host``) are sent as HTTP Basic auth and never appear in
a message. With a list of URLs, sessions are spread over the servers and dead ones are skipped
(:class:`~agentgym.serve.pool.RemotePool`; :func:`remote_env_factory` shares one pool).
"""

from __future__ import annotations

import base64
import contextlib
import heapq
import itertools
import json
import logging
import os
import re
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium

from agentgym.core import AgentEnv
from agentgym.errors import ConfigurationError, EnvServerAtCapacity, EnvServerError, ResetNeeded, TaskNotFound
from agentgym.parsers import get_parser
from agentgym.serve.pool import RemotePool
from agentgym.serve.protocol import MalformedJSON, dumps, error_from_body, is_loopback, loads, task_from_wire
from agentgym.tools import Tool, ToolSet
from agentgym.types import Message, TaskSpec, ToolSpec

__all__ = ["RemoteEnv", "remote_env_factory"]

DEFAULT_MAX_RESPONSE_BYTES = 2**26  # 64 MiB, as the WebSocket path's message cap

log = logging.getLogger(__name__)
_CODE_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.S)
_CODE_FIELDS = ("code", "source", "program", "script")


class _Gone(Exception):
    """The session is gone; a new one (on this server, or another if ``dead``) may succeed."""

    def __init__(self, message: str, dead: bool = True) -> None:
        super().__init__(message)
        self.dead = dead


class _Watchdog:
    """One daemon thread that runs callbacks at deadlines (a ``threading.Timer`` per call costs a thread).

    ``RemoteEnv`` uses it to cut a call whose server keeps it waiting past its deadline: httpx's
    timeouts bound each read, not the call, so a server that trickles bytes holds a call forever.
    """

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []  # [when, seq, callback, cancelled]
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._cancelled = 0
        self._pid = -1

    def schedule(self, when: float, callback: Callable[[], None]) -> list[Any]:
        entry = [when, next(self._seq), callback, False]
        with self._cv:
            if self._pid != os.getpid():  # first use, or a forked child: the thread is not there
                self._pid = os.getpid()
                self._heap, self._cancelled = [], 0
                threading.Thread(target=self._run, daemon=True, name="agentgym-remote-watchdog").start()
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._cv.notify()
        return entry

    def cancel(self, entry: list[Any]) -> None:
        with self._cv:
            if not entry[3]:
                entry[3] = True
                entry[2] = _no_callback  # the entry waits in the heap till its deadline: hold nothing alive
                self._cancelled += 1
                if self._cancelled > 1024 and self._cancelled * 2 > len(self._heap):
                    self._heap = [e for e in self._heap if not e[3]]
                    heapq.heapify(self._heap)
                    self._cancelled = 0

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap:
                    self._cv.wait()
                entry = self._heap[0]
                if entry[3]:
                    heapq.heappop(self._heap)
                    self._cancelled = max(0, self._cancelled - 1)
                    continue
                delay = entry[0] - time.monotonic()
                if delay > 0:
                    self._cv.wait(delay)
                    continue
                heapq.heappop(self._heap)
                entry[3] = True
            try:
                entry[2]()
            except Exception as e:  # a callback must not kill the watchdog
                log.debug("watchdog callback failed: %s", e)


def _no_callback() -> None:
    pass


_WATCHDOG = _Watchdog()


def _split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without ``user:password@``, and the credentials it carried."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    netloc = parts.netloc.rpartition("@")[2]
    clean = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return clean, (urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or ""))


class RemoteEnv(AgentEnv):
    """An env served by ``agentgym serve`` or by any OpenEnv server.

    Args:
        url: The server's base URL (``http://host:port``, or ``.../envs/SQL-v0`` for one of several
            envs), or a list (or comma-separated string) of URLs to spread sessions over.
            ``http://user:TOKEN@host`` sends HTTP Basic auth (prefer ``token=``/``AGENTGYM_TOKEN``).
        env_id: Which served env to use (default: the one at ``url``). Ignored by OpenEnv servers.
        token: Bearer token (default: ``$AGENTGYM_TOKEN``).
        transport: ``"http"``, ``"ws"`` or ``"auto"`` (HTTP for ``agentgym serve``; OpenEnv servers
            are stateful only over their WebSocket, so ``"auto"`` picks ``"ws"`` for them).
        timeout_s: Deadline of one attempt of a call, in total (the server's own step timeout should
            be shorter).
        probe_timeout_s: Deadline of ``GET /agentgym/spec``, the probe that tells ``agentgym serve``
            from an OpenEnv server (answered from memory; no env call behind it).
        connect_timeout_s: Deadline to connect.
        retries: Extra attempts of a retryable call.
        backoff_s: First backoff; doubles each retry.
        max_response_bytes: Largest response (HTTP body or WebSocket message) accepted.
        capacity_wait_s: How long to wait for a free session when every server is at capacity
            (retrying with backoff); then :class:`~agentgym.errors.EnvServerAtCapacity`.
        parser: Override the served env's parser (sent as an env kwarg; needs the server to allow it).
        format_penalty: Sent as an env kwarg, like ``parser``.
        env_kwargs: Other env kwargs for the session (the server allows ``parser`` and
            ``format_penalty`` unless started with ``--client-kwargs``).
        openenv_tasks: OpenEnv servers have no task list: each split gets this many tasks, task
            ``seed-N`` being ``reset(seed=N)`` (train: N < openenv_tasks, test: N >= 10**6).
        success_reward: OpenEnv servers report no success: an episode that ends with a step reward
            above this counts as solved.
        pool: A :class:`~agentgym.serve.pool.RemotePool` to pick the server from and report to
            (:func:`remote_env_factory` passes one); default: a pool of this env's own when ``url``
            lists several servers.
    """

    family = "remote"
    splits: tuple[str, ...] = ()  # type: ignore[misc]  # read from the server

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        env_id: str | None = None,
        *,
        token: str | None = None,
        transport: str = "auto",
        timeout_s: float = 360.0,
        probe_timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        retries: int = 2,
        backoff_s: float = 0.2,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        capacity_wait_s: float = 60.0,
        parser: str | None = None,
        format_penalty: float | None = None,
        env_kwargs: dict[str, Any] | None = None,
        openenv_tasks: int = 100,
        success_reward: float = 0.0,
        pool: RemotePool | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if transport not in ("auto", "http", "ws"):
            raise ConfigurationError(f"transport must be 'auto', 'http' or 'ws', got {transport!r}.")
        raw = [u.strip() for u in (url.split(",") if isinstance(url, str) else url or ()) if u and u.strip()]
        if not raw:
            raise ConfigurationError("RemoteEnv needs url= (http://host:port of `agentgym serve` or an OpenEnv server).")
        urls: list[str] = []
        self._basic: tuple[str, str] | None = None
        for u in raw:
            clean, creds = _split_credentials(u)
            if not clean.startswith(("http://", "https://", "ws://", "wss://")):
                raise ConfigurationError(f"env server URL {clean!r} must start with http:// or https://.")
            urls.append(clean)
            self._basic = self._basic or creds
        if max_response_bytes < 1 or timeout_s <= 0 or probe_timeout_s <= 0 or capacity_wait_s < 0:
            raise ConfigurationError("RemoteEnv needs max_response_bytes >= 1, timeout_s > 0, probe_timeout_s > 0 "
                                     "and capacity_wait_s >= 0.")
        self.token = token if token is not None else os.environ.get("AGENTGYM_TOKEN") or None
        if pool is None and len(urls) > 1:
            pool = RemotePool(urls)
        self.pool = pool
        self.urls = urls
        self.requested_env_id = env_id
        self.transport_pref = transport
        self.timeout_s = float(timeout_s)
        self.probe_timeout_s = float(probe_timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.retries = max(0, int(retries))
        self.backoff_s = float(backoff_s)
        self.max_response_bytes = int(max_response_bytes)
        self.capacity_wait_s = float(capacity_wait_s)
        kw = dict(env_kwargs or {})
        if parser is not None:
            kw["parser"] = parser
        if format_penalty is not None:
            kw["format_penalty"] = format_penalty
        self.session_kwargs = kw
        self.openenv_tasks = int(openenv_tasks)
        self.success_reward = float(success_reward)
        # set by _connect
        self.url = ""  # the server root in use
        self.base = ""  # the env's base URL on it
        self.kind = ""  # "agentgym" | "openenv"
        self.transport = ""
        self.session_id: str | None = None
        self.spec_info: dict[str, Any] = {}
        self.env_id: str | None = None
        self.tool_specs: list[ToolSpec] = []
        self._toolset = ToolSet()
        self.max_action_chars: int | None = None
        self._http: Any = None
        self._streams: list[Any] = []  # the HTTP client's network streams (cut when a call overruns)
        self._ws: Any = None
        self._tasks: dict[str, list[TaskSpec]] = {}
        self._openenv_field: str | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._step_reward = 0.0
        self._connect()

    # ================================================================================ connection
    def _auth_header(self) -> str | None:
        if self.token:
            return f"Bearer {self.token}"
        if self._basic is not None:
            return "Basic " + base64.b64encode(f"{self._basic[0]}:{self._basic[1]}".encode()).decode()
        return None

    def _headers(self) -> dict[str, str]:
        h = {"content-type": "application/json", "accept": "application/json"}
        auth = self._auth_header()
        if auth:
            h["authorization"] = auth
        return h

    def _client(self) -> Any:
        if self._http is None:
            import httpx

            host = urllib.parse.urlsplit(self.url).hostname or ""
            self._streams = []
            self._http = httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s),
                                      headers=self._headers(), trust_env=not is_loopback(host), verify=_ssl_context(),
                                      # reuse an idle connection only well within the server's idle timeout
                                      # (uvicorn's and ours: 5 s), or a request races the server's close
                                      limits=httpx.Limits(max_connections=4, max_keepalive_connections=2,
                                                          keepalive_expiry=2.0))
        return self._http

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        """httpx's trace hook: remember every connection this client opens (to cut it on overrun)."""
        if event == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            if stream is not None:
                self._streams = [s for s in self._streams if _sock_of(s) is not None] + [stream]

    def _cut(self) -> None:
        """The call overran its deadline: shut its connections down (a blocked read returns at once)."""
        for stream in list(self._streams):
            sock = _sock_of(stream)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _connect(self) -> None:
        """Open a session, waiting up to ``capacity_wait_s`` (with backoff) while every server is full."""
        deadline = time.monotonic() + self.capacity_wait_s
        delay = max(0.05, self.backoff_s)
        while True:
            try:
                self._connect_once()
                return
            except EnvServerAtCapacity as e:
                if time.monotonic() + delay > deadline:
                    raise EnvServerAtCapacity(f"{e} (waited {self.capacity_wait_s:g} s for a free session)",
                                              status=e.status) from None
                log.info("RemoteEnv: every server is at capacity; retrying in %.2f s", delay)
                time.sleep(delay)
                delay = min(2 * delay, 2.0)

    def _connect_once(self) -> None:
        """Pick a server, learn what it serves, and open a session there."""
        tried: list[str] = []
        candidates = self.pool.candidates() if self.pool is not None else list(self.urls)
        last: Exception | None = None
        full: EnvServerAtCapacity | None = None
        for url in candidates:
            self._drop_transport()
            self.url = url.rstrip("/").replace("ws://", "http://", 1).replace("wss://", "https://", 1)
            try:
                self._open()
            except EnvServerAtCapacity as e:  # alive but full: try the next one, it is not dead
                self._drop_transport()
                full = e
                continue
            except (_Gone, EnvServerError) as e:
                retryable = isinstance(e, _Gone) or e.retryable or e.status is None
                if self.pool is None or not retryable:
                    self._drop_transport()
                    if isinstance(e, _Gone):
                        raise EnvServerError(f"env server {self.url} is unreachable: {e}") from None
                    raise
                self.pool.mark_dead(url, str(e))
                tried.append(url)
                last = e
                continue
            except BaseException:  # a configuration error (wrong env id, token): nothing stays open
                self._drop_transport()
                raise
            if self.pool is not None:
                self.pool.acquire(url)
            return
        self._drop_transport()
        if full is not None:
            raise full
        raise EnvServerError(f"no env server could be reached (tried {', '.join(tried) or 'none'}; last error: {last})",
                             retryable=True)

    def _open(self) -> None:
        spec_body = self._get_spec(self.url)
        if spec_body is None:  # not agentgym serve: an OpenEnv server
            self._open_openenv()
            return
        self.kind = "agentgym"
        envs = list(spec_body.get("envs") or [])
        here = spec_body["env"]["env_id"]
        want = self.requested_env_id
        self.base = self.url
        if want is not None and want not in (here, here.removeprefix("agentgym/")):
            full = want if want.startswith("agentgym/") else "agentgym/" + want
            if full not in envs:
                raise ConfigurationError(f"{self.url} does not serve {want!r}; it serves: {', '.join(envs)}")
            root = self.url.split("/envs/")[0]
            self.base = f"{root}/envs/{full.removeprefix('agentgym/')}"
            spec_body = self._get_spec(self.base)
            if spec_body is None:
                raise EnvServerError(f"{self.base} does not answer /agentgym/spec")
        self.transport = "ws" if self.transport_pref == "ws" else "http"
        if self.transport == "http":
            # the server answers a retry with the same request_id with the same session: safe to retry
            out = self._http_call("POST", "/agentgym/sessions", {"env_kwargs": self.session_kwargs,
                                                                 "request_id": uuid.uuid4().hex}, idempotent=True)
            self.session_id = out["session_id"]
            spec_body = out["spec"]
        else:
            if self.session_kwargs:
                raise ConfigurationError("env kwargs (parser, format_penalty...) need transport='http'.")
            self._ws_open(self.base)
            # the first answer on the connection: a server at capacity says so here, not at reset
            spec_body = self._ws_call({"type": "agentgym/spec"})["data"]
        self._apply_spec(spec_body)

    def _get_spec(self, base: str) -> dict[str, Any] | None:
        """``GET /agentgym/spec``, or ``None`` if the server is not ``agentgym serve`` (404).

        A probe (the route may not exist), answered from memory: bounded by ``probe_timeout_s``, not
        by the env-step deadline ``timeout_s``."""
        self.base = base
        try:
            return self._http_call("GET", "/agentgym/spec", None, idempotent=True,  # type: ignore[no-any-return]
                                   timeout_s=min(self.probe_timeout_s, self.timeout_s))
        except EnvServerError as e:
            if e.status == 404:
                return None
            raise

    def _apply_spec(self, body: dict[str, Any]) -> None:
        env = body["env"]
        self.spec_info = body
        self.env_id = env["env_id"]
        self.splits = tuple(env.get("splits") or ())
        self.default_split = env.get("default_split") or (self.splits[0] if self.splits else "train")  # type: ignore[misc]
        self.tool_specs = list(env.get("tools") or [])
        self._toolset = _spec_toolset(self.tool_specs)
        self.parser = get_parser(env.get("parser") or ("hermes" if self.tool_specs else "react"))
        self.max_action_chars = (body.get("limits") or {}).get("max_action_chars")
        self.remote_family = env.get("family")

    def _drop_transport(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception as e:  # best effort
                log.debug("websocket close failed: %s", e)
            self._ws = None
        if self._http is not None:
            self._http.close()
            self._http = None
        self.session_id = None

    def _reconnect(self, why: str, dead: bool = True) -> None:
        """A new session: on this server, or (with a pool, if this one is ``dead``) another live one."""
        log.info("RemoteEnv: reconnecting (%s)", why)
        if self.pool is not None:
            self.pool.release(self.url)
            if dead:
                self.pool.mark_dead(self.url, why)
        self._connect()

    # ================================================================================ HTTP
    def _http_call(self, method: str, path: str, body: Any, *, idempotent: bool,
                   params: dict[str, Any] | None = None, timeout_s: float | None = None) -> Any:
        """One JSON call with bounded retries, each attempt within ``timeout_s`` (default: the env's).
        Raises EnvServerError (or a mapped error class). A server at capacity is not retried here:
        :meth:`_connect` waits for it (``capacity_wait_s``)."""
        import httpx

        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        url = self.base + path
        content = dumps(body) if body is not None else None
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                status, data = self._http_attempt(method, url, content, params, timeout_s)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # never reached the server: always safe
                last = f"{type(e).__name__}: {e}"
                continue
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as e:
                last = f"{type(e).__name__}: {e}"
                if idempotent:
                    continue
                raise EnvServerError(f"{url}: the connection failed mid-request ({last}); not retried "
                                     "(the call may have been applied)") from None
            except httpx.TimeoutException as e:
                raise EnvServerError(f"{url}: no answer within {timeout_s:g} s ({type(e).__name__})") from None
            except httpx.HTTPError as e:
                raise EnvServerError(f"{url}: {type(e).__name__}: {e}") from None
            try:
                decoded = loads(data)
            except MalformedJSON as e:
                if status < 300:
                    raise EnvServerError(f"{url}: the server sent a response that is not acceptable JSON ({e})") from None
                decoded = {"detail": data[:300].decode("utf-8", "replace")}
            if status < 300:
                return decoded
            err = error_from_body(status, decoded, url)
            if (isinstance(err, EnvServerError) and err.retryable and idempotent and attempt < self.retries
                    and not isinstance(err, EnvServerAtCapacity)):
                last = str(err)
                continue
            raise err
        raise EnvServerError(f"env server {url} failed after {self.retries + 1} attempts ({last})", retryable=True)

    def _http_attempt(self, method: str, url: str, content: bytes | None, params: dict[str, Any] | None,
                      timeout_s: float | None = None) -> tuple[int, bytes]:
        """One request, whole within ``timeout_s`` (default: the env's) and at most ``max_response_bytes`` long."""
        import httpx

        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        client = self._client()
        cut: list[bool] = []

        def overrun() -> None:
            cut.append(True)
            self._cut()

        timer = _WATCHDOG.schedule(time.monotonic() + timeout_s, overrun)
        try:
            request = client.build_request(method, url, content=content, params=params,
                                           extensions={"trace": self._trace})
            response = client.send(request, stream=True)
            try:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.max_response_bytes:
                    raise EnvServerError(f"{url}: the response is larger than {self.max_response_bytes} bytes "
                                         f"(max_response_bytes; it declares {declared})")
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self.max_response_bytes:
                        raise EnvServerError(f"{url}: the response is larger than {self.max_response_bytes} bytes "
                                             "(max_response_bytes)")
                    chunks.append(chunk)
            finally:
                response.close()
        except httpx.HTTPError:
            if cut:
                self._drop_client()
                raise EnvServerError(f"{url}: no complete answer within {timeout_s:g} s") from None
            raise
        except EnvServerError:
            self._drop_client()  # the rest of the body is unread: the connection is useless
            raise
        finally:
            _WATCHDOG.cancel(timer)
        if cut:  # the deadline fired as the answer completed: it did complete
            self._drop_client()
        return response.status_code, b"".join(chunks)

    def _drop_client(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    # ================================================================================ WebSocket
    def _ws_open(self, base: str) -> None:
        from websockets.sync.client import connect

        ws_url = base.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/ws"
        host = urllib.parse.urlsplit(ws_url).hostname or ""
        auth = self._auth_header()
        headers = {"Authorization": auth} if auth else None
        try:
            self._ws = connect(ws_url, additional_headers=headers, open_timeout=self.connect_timeout_s,
                               max_size=self.max_response_bytes, compression=None,
                               proxy=None if is_loopback(host) else True, close_timeout=1, ping_interval=None)
        except Exception as e:
            text = str(e)
            if "401" in text or "403" in text or "1008" in text:
                raise ConfigurationError(f"{ws_url}: the server refused the connection ({text}); pass its token") from None
            raise _Gone(f"{type(e).__name__}: {e}") from None

    def _ws_call(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self._ws is None:
            raise _Gone("no connection")
        try:
            self._ws.send(dumps(msg).decode())
            raw = self._ws.recv(timeout=self.timeout_s)
        except TimeoutError:
            raise EnvServerError(f"{self.base}/ws: no answer within {self.timeout_s:g} s") from None
        except Exception as e:  # ConnectionClosed, OSError: the session went with the connection
            raw = self._last_words()
            if raw is None:
                raise _Gone(f"{type(e).__name__}: {e}") from None
        try:
            out = loads(raw)
        except MalformedJSON as e:
            raise EnvServerError(f"{self.base}/ws: the server sent a message that is not acceptable JSON ({e})") from None
        if not isinstance(out, dict):
            raise EnvServerError(f"{self.base}/ws: the server sent a message that is not a JSON object")
        if out.get("type") == "error":
            data: dict[str, Any] = out["data"] if isinstance(out.get("data"), dict) else {}
            if data.get("code") == "CAPACITY_REACHED":  # OpenEnv's servers and agentgym serve
                raise EnvServerAtCapacity(f"{self.base}: the server is at capacity ({str(data.get('message'))[:300]})")
            kind = data.get("error_type") or "EnvError"  # OpenEnv servers send only their codes
            status = data.get("status")
            raise error_from_body(status if isinstance(status, int) else 500,
                                  {"detail": {"type": kind, "message": str(data.get("message", ""))}},
                                  self.base + "/ws")
        return out

    def _last_words(self) -> str | bytes | None:
        """A message the server sent before it closed the connection (an OpenEnv server at capacity
        sends its error and closes at once, so the send of the next call may already fail)."""
        try:
            return self._ws.recv(timeout=0)  # type: ignore[no-any-return]
        except Exception:
            return None

    # ================================================================================ OpenEnv servers
    def _open_openenv(self) -> None:
        self.kind = "openenv"
        self.transport = "ws"
        if self.transport_pref == "http":
            raise ConfigurationError(f"{self.url} is an OpenEnv server; its HTTP /reset and /step are stateless, "
                                     "so RemoteEnv talks to it over its WebSocket (transport='ws' or 'auto').")
        meta: dict[str, Any] = {}
        try:
            meta = self._http_call("GET", "/metadata", None, idempotent=True)
        except EnvServerError as e:
            if e.status is None:
                raise
        schema = self._http_call("GET", "/schema", None, idempotent=True)
        action_schema = schema.get("action") or {}
        props = {k: v for k, v in (action_schema.get("properties") or {}).items() if k != "metadata"}
        strings = [k for k, v in props.items() if v.get("type") == "string"]
        self._openenv_field = strings[0] if len(props) == 1 and len(strings) == 1 else None
        self._ws_open(self.url)
        tools: list[ToolSpec] = []
        reply = self._ws_call({"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": 1}})
        for t in ((reply.get("data") or {}).get("result") or {}).get("tools") or []:
            tools.append({"type": "function", "function": {
                "name": str(t.get("name")), "description": str(t.get("description") or ""),
                "parameters": t.get("inputSchema") or t.get("input_schema") or {"type": "object", "properties": {}}}})
        name = str(meta.get("name") or self.url)
        self._apply_spec({"env": {"env_id": name, "family": "openenv", "splits": ["train", "test"],
                                  "default_split": "train", "tools": tools,
                                  "parser": "hermes" if tools else "react"},
                          "limits": {}, "openenv": {"metadata": meta, "action_schema": action_schema}})
        if self.session_kwargs.get("parser"):
            self.parser = get_parser(self.session_kwargs["parser"])

    def _openenv_obs(self, payload: dict[str, Any], first: bool) -> list[Message]:
        obs = payload.get("observation") or {}
        if "tool_name" in obs:  # an MCP CallToolObservation
            return [{"role": "tool", "tool_call_id": "", "name": str(obs["tool_name"]), "content": _tool_text(obs)}]
        return [{"role": "user", "content": _render_obs(obs, first)}]

    # ================================================================================ the env API
    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        if split not in self._tasks:
            if self.kind == "openenv":
                if split not in self.splits:
                    raise TaskNotFound(f"{self.env_id} has no split {split!r}; splits: {', '.join(self.splits)}")
                off = 0 if split == "train" else 10**6
                self._tasks[split] = [TaskSpec(f"seed-{off + i}", split, "openenv") for i in range(self.openenv_tasks)]
            elif self.transport == "ws":
                out = self._with_session(lambda: self._ws_call({"type": "agentgym/tasks", "data": {"split": split}}))
                self._tasks[split] = [task_from_wire(t) for t in out["data"]["tasks"]]
            else:
                out = self._http_call("GET", "/agentgym/tasks", None, idempotent=True, params={"split": split})
                self._tasks[split] = [task_from_wire(t) for t in out["tasks"]]
        return self._tasks[split]

    def _with_session(self, fn: Any) -> Any:
        """Run ``fn``; if the session is gone (and nothing was lost), reconnect once and rerun it."""
        try:
            return fn()
        except _Gone as e:
            self._reconnect(str(e), e.dead)
            try:
                return fn()
            except _Gone as e2:
                raise EnvServerError(f"env server {self.base} is unreachable: {e2}") from None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on the server (same ``seed``/``options`` as a local env)."""
        if self._closed:
            raise ResetNeeded("this RemoteEnv is closed")
        gymnasium.Env.reset(self, seed=seed)
        opts = dict(options or {})
        task = opts.pop("task", None)
        if isinstance(task, TaskSpec):
            opts["task_id"] = task.task_id
        self._state = "new"
        if self.kind == "openenv":
            messages, info = self._reset_openenv(seed, opts)
        else:
            body: dict[str, Any] = {"seed": seed, "options": {k: v for k, v in opts.items() if v is not None}}
            out = self._reset_call(body)
            o = out["observation"]
            messages, info = list(o["messages"]), dict(o["info"])
        self._state = "running"
        self._turn = 0
        self._last_messages = messages
        self.task = TaskSpec(str(info.get("task_id")), "", str(info.get("task_type", "default")))
        return messages, info

    def _reset_call(self, body: dict[str, Any]) -> dict[str, Any]:
        def go() -> dict[str, Any]:
            if self.transport == "ws":
                return self._ws_call({"type": "reset", "data": body})["data"]  # type: ignore[no-any-return]
            try:
                return self._http_call("POST", "/reset", {**body, "session_id": self.session_id}, idempotent=True)  # type: ignore[no-any-return]
            except EnvServerError as e:
                if e.status == 404:  # the session expired (or the server restarted): a new one
                    raise _Gone(str(e), dead=False) from None
                if e.status is None or e.retryable:  # unreachable or full: another server, if any
                    raise _Gone(str(e)) from None
                raise

        return self._with_session(go)  # type: ignore[no-any-return]

    def _reset_openenv(self, seed: int | None, opts: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        task_id = opts.get("task_id")
        if task_id is None and opts.get("split") is not None:
            pool = self.tasks(str(opts["split"]))
            i = int(opts["index"]) if opts.get("index") is not None else int(self.np_random.integers(len(pool)))
            task_id = pool[i % len(pool)].task_id
        if task_id is not None:
            m = re.fullmatch(r"seed-(\d+)", str(task_id))
            if m is None:
                raise TaskNotFound(f"{self.env_id} (an OpenEnv server) has tasks seed-N only, not {task_id!r}")
            seed = int(m.group(1))
        elif seed is None:
            seed = int(self.np_random.integers(self.openenv_tasks))
        task_id = f"seed-{seed}"
        data: dict[str, Any] = {"seed": seed}
        out = self._with_session(lambda: self._ws_call({"type": "reset", "data": data}))["data"]
        self._step_reward = 0.0
        self.metrics = {}  # counted here (tool calls, parse errors), per episode as a local env
        messages = self._openenv_obs(out, first=True)
        info = {"task_id": task_id, "task_type": "openenv", "tools": list(self.tool_specs),
                "parser": self.parser.name, "metrics": {}}
        return messages, info

    def step(self, action: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Send one assistant turn; returns only the new messages (as a local env)."""
        if self._state == "new":
            raise ResetNeeded("RemoteEnv.step() called before reset().")
        if self._state == "done":
            raise ResetNeeded("RemoteEnv.step() called after the episode ended; call reset().")
        self._turn += 1
        if self.kind == "openenv":
            messages, reward, terminated, truncated, info = self._step_openenv(action)
        else:
            out = self._step_call(self._encode(action))
            o = out["observation"]
            messages, info = list(o["messages"]), dict(o["info"])
            reward, terminated, truncated = float(out.get("reward") or 0.0), bool(o["terminated"]), bool(o["truncated"])
        if terminated or truncated:
            self._state = "done"
        self._last_messages = messages
        return messages, reward, terminated, truncated, info

    def _encode(self, action: Any) -> dict[str, Any]:
        if not isinstance(action, (str, dict)):
            try:
                json.dumps(action)
            except (TypeError, ValueError):
                action = str(action)
        limit = self.max_action_chars
        if limit is not None:
            size = len(action) if isinstance(action, str) else len(dumps(action))
            if size > limit:  # the server answers an oversized action with an error observation; send it a stub
                text = action if isinstance(action, str) else dumps(action).decode()
                action = text[: limit + 1]
        return {"type": "message", "message": action}

    def _step_call(self, action: dict[str, Any]) -> dict[str, Any]:
        request_id = uuid.uuid4().hex
        try:
            if self.transport == "ws":
                return self._ws_call({"type": "step", "data": action, "request_id": request_id})["data"]  # type: ignore[no-any-return]
            return self._http_call("POST", "/step", {"session_id": self.session_id, "action": action,  # type: ignore[no-any-return]
                                                     "request_id": request_id}, idempotent=True)
        except _Gone as e:
            self._state = "done"
            if self.pool is not None:
                self.pool.mark_dead(self.url, str(e))
            raise EnvServerError(f"env server {self.base}: the session was lost mid-episode ({e})") from None
        except EnvServerError as e:
            self._state = "done"
            if self.pool is not None and e.status is None:  # unreachable: skip it for the next envs
                self.pool.mark_dead(self.url, str(e))
            raise

    def _step_openenv(self, action: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        parsed = self.parser.parse(action, self._toolset if len(self._toolset) else None)
        info: dict[str, Any] = {"task_id": self.task.task_id if self.task else None, "tool_calls": parsed.tool_calls,
                                "command": parsed.command}
        payloads: list[tuple[dict[str, Any], str | None]] = []
        if parsed.error is None and parsed.tool_calls:
            payloads = [({"type": "call_tool", "tool_name": c["name"], "arguments": c["arguments"]}, c["id"])
                        for c in parsed.tool_calls]
        else:
            raw = action if isinstance(action, str) else (action.get("content") if isinstance(action, dict) else None)
            text = parsed.command if parsed.command is not None else raw
            if parsed.error is None and isinstance(raw, str) and self._openenv_field in _CODE_FIELDS:
                m = _CODE_FENCE.search(raw)  # a program: the whole turn, or its fenced block
                payloads = [({self._openenv_field: m.group(1) if m else raw}, None)]
            elif parsed.error is None and isinstance(text, str) and self._openenv_field is not None:
                payloads = [({self._openenv_field: text}, None)]
            elif parsed.error is None and isinstance(text, str) and text.strip().startswith("{"):
                try:  # the agent's text: a huge integer or deep nesting is a parse error, not an exception
                    obj = loads(text)
                    payloads = [(obj, None)] if isinstance(obj, dict) else []
                except MalformedJSON:
                    payloads = []
        if not payloads:
            reason = parsed.error or "no action found"
            self.count("parse_errors")
            info.update(parse_error=reason, metrics=dict(self.metrics))
            hint = self.parser.format_instructions(self._toolset) if self.tool_specs else (
                f"Send {self._openenv_field!r} as plain text." if self._openenv_field else "Send a JSON action object.")
            return [{"role": "user", "content": f"Error: {reason}. {hint}"}], 0.0, False, False, info
        messages: list[Message] = []
        reward, done = 0.0, False
        for payload, call_id in payloads:
            out = self._with_session_step(payload)
            for msg in self._openenv_obs(out, first=False):
                if call_id is not None and msg["role"] == "tool":
                    msg["tool_call_id"] = call_id
                    self.count("tool_calls")
                    if (out.get("observation") or {}).get("error"):
                        self.count("tool_errors")
                messages.append(msg)
            r = out.get("reward")
            reward += float(r) if isinstance(r, (int, float)) else 0.0
            if out.get("done"):
                done = True
                break
        info["metrics"] = dict(self.metrics)
        if done:
            info["success"] = reward > self.success_reward
        return messages, reward, done, False, info

    def _with_session_step(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._ws_call({"type": "step", "data": payload})["data"]  # type: ignore[no-any-return]
        except _Gone as e:
            self._state = "done"
            raise EnvServerError(f"OpenEnv server {self.url}: the session was lost mid-episode ({e})") from None

    def expert_action(self) -> str | Message | None:
        """The served env's expert move (``None`` for OpenEnv servers, which have no expert)."""
        if self.kind == "openenv" or self._state != "running":
            return None
        if self.transport == "ws":
            try:
                out = self._ws_call({"type": "agentgym/expert"})["data"]
            except _Gone as e:
                raise EnvServerError(f"env server {self.base}: the session was lost ({e})") from None
        else:
            out = self._http_call("GET", "/agentgym/expert", None, idempotent=True, params={"session_id": self.session_id})
        return out.get("action")  # type: ignore[no-any-return]

    def admissible_actions(self) -> list[str] | None:
        return None  # sent in info by the server

    def remote_state(self) -> dict[str, Any]:
        """OpenEnv's ``/state`` of this session (episode id, step count...)."""
        if self.transport == "ws":
            return self._ws_call({"type": "state"})["data"]  # type: ignore[no-any-return]
        return self._http_call("GET", "/state", None, idempotent=True, params={"session_id": self.session_id})  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close the session on the server (best effort, short deadline) and the connection."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self.transport == "http" and self.session_id is not None and self._http is not None:
                self._http_attempt("DELETE", f"{self.base}/agentgym/sessions/{self.session_id}", None, None,
                                   timeout_s=min(2.0, self.timeout_s))
            elif self._ws is not None:
                self._ws.send('{"type":"close"}')
                self._await_server_close(min(2.0, self.timeout_s))
        except Exception as e:  # a dead server: nothing to close
            log.debug("RemoteEnv close: %s", e)
        finally:
            self._drop_transport()
            if self.pool is not None and self.url:
                self.pool.release(self.url)
        super().close()

    def _await_server_close(self, timeout_s: float) -> None:
        """After ``{"type": "close"}``, let the server close the WebSocket first (bounded). A client-side
        close races the server's own: openenv-core's server then logs a traceback per session."""
        from websockets.exceptions import ConnectionClosed

        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                self._ws.recv(timeout=left)  # a late answer to an earlier call: dropped
            except (ConnectionClosed, TimeoutError):
                return

    def __repr__(self) -> str:
        return f"RemoteEnv({self.base or self.urls!r}, env_id={self.env_id!r}, transport={self.transport!r})"


def _spec_toolset(specs: list[ToolSpec]) -> ToolSet:
    """A ToolSet of remote tools (names, schemas, first parameters), for the parsers; never called locally."""
    import pydantic

    def _remote(**_kw: Any) -> str:
        raise EnvServerError("a remote tool cannot run locally")

    out = ToolSet()
    for s in specs:
        f = s["function"]
        params = dict(f.get("parameters") or {})
        out.add(Tool(f["name"], f.get("description", ""), _remote, pydantic.BaseModel, params,
                     param_names=list((params.get("properties") or {}).keys())))
    return out


def _sock_of(stream: Any) -> socket.socket | None:
    """The open socket of an httpcore network stream, or None."""
    try:
        sock = stream.get_extra_info("socket")
    except Exception:
        return None
    return sock if isinstance(sock, socket.socket) and sock.fileno() != -1 else None


def remote_env_factory(pool: RemotePool, **env_kwargs: Any) -> Callable[..., RemoteEnv]:
    """An ``env_factory`` for the rollout runtime whose envs share ``pool`` (least-loaded placement,
    dead servers skipped for everyone): ``factory(env_id=None, **kwargs)`` opens a :class:`RemoteEnv`
    on the pool's best server. ``env_kwargs`` (``token``, ``timeout_s``...) apply to every env."""

    def make(env_id: str | None = None, **kwargs: Any) -> RemoteEnv:
        return RemoteEnv(list(pool.urls), env_id=env_id, pool=pool, **{**env_kwargs, **kwargs})

    return make


_SSL: list[Any] = []
_SSL_LOCK = threading.Lock()


def _ssl_context() -> Any:
    """One TLS context for every client: building one costs ~50 ms, and each RemoteEnv has a client."""
    with _SSL_LOCK:
        if not _SSL:
            import httpx

            _SSL.append(httpx.create_ssl_context())
        return _SSL[0]


def _tool_text(obs: dict[str, Any]) -> str:
    err = obs.get("error")
    if isinstance(err, dict) and err.get("message"):
        return f"Error: {err['message']}"
    res = obs.get("result")
    if isinstance(res, dict):
        parts = [c.get("text", "") for c in res.get("content") or [] if isinstance(c, dict) and c.get("type") == "text"]
        if parts:
            return "\n".join(parts)
        if "data" in res:
            return res["data"] if isinstance(res["data"], str) else json.dumps(res["data"], default=str)
    return res if isinstance(res, str) else json.dumps(res, default=str)


def _render_obs(obs: dict[str, Any], first: bool) -> str:
    fields = {k: v for k, v in obs.items() if v not in (None, "", [], {})}
    strings = [v for v in fields.values() if isinstance(v, str)]
    if len(fields) == 1 and len(strings) == 1:
        return strings[0]
    if not fields:
        return "The environment is ready." if first else "(no output)"
    return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v, default=str)}" for k, v in fields.items())

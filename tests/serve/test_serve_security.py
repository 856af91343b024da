"""The security suite of the env server and ``RemoteEnv``: each attack of issue 23 (items 3, 4, 5, 8)
tried against real servers on 127.0.0.1. Every test here failed before the fix it names."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from serve_helpers import VENV_BIN, LoggedProcess, free_port

from agentgym.errors import ConfigurationError, EnvServerError
from agentgym.serve.client import RemoteEnv
from agentgym.serve.runner import ConnectionLimits
from agentgym.serve.server import EnvServer

DEMO = "agentgym/Demo-v0"
BIG_INT = "1" * 5000  # over Python's 4,300-digit limit for int parsing
GIVE_UP = '<tool_call>{"name": "give_up", "arguments": {}}</tool_call>'


# ------------------------------------------------------------------------------------------------ helpers
class HostileServer:
    """A TCP server on 127.0.0.1 that answers every HTTP request with ``respond(conn)``; it stops by
    itself after ``lifetime_s`` and closes every connection when stopped."""

    def __init__(self, respond: Callable[[socket.socket, threading.Event], None], lifetime_s: float = 90.0) -> None:
        self.respond = respond
        self.stop_event = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.deadline = time.monotonic() + lifetime_s
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.stop_event.is_set() and time.monotonic() < self.deadline:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.conns.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            self.respond(conn, self.stop_event)
        except OSError:
            pass
        finally:
            conn.close()

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self.thread.join(10)
        self.sock.close()


def trickle(head: bytes, tail: bytes) -> Callable[[socket.socket, threading.Event], None]:
    """Send ``head``, then ``tail`` one byte every 0.3 s (until stopped)."""

    def respond(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head)
        for b in tail:
            if stop.wait(0.3):
                return
            conn.sendall(bytes([b]))

    return respond


def body(payload: bytes, declare_length: bool = True) -> Callable[[socket.socket, threading.Event], None]:
    def respond(conn: socket.socket, stop: threading.Event) -> None:
        if declare_length:
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                         b"content-length: %d\r\n\r\n" % len(payload))
            conn.sendall(payload)
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        for i in range(0, len(payload), 1 << 20):
            part = payload[i:i + (1 << 20)]
            conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        conn.sendall(b"0\r\n\r\n")

    return respond


def remote_env_in_thread(url: str, bound_s: float = 60.0, **kw: Any) -> BaseException | RemoteEnv:
    """Build ``RemoteEnv(url, **kw)`` in a worker thread; what it raised (or the env), within ``bound_s``
    (a hang fails the test instead of blocking it)."""
    pool = ThreadPoolExecutor(1)
    fut = pool.submit(RemoteEnv, url, **kw)
    pool.shutdown(wait=False)
    try:
        return fut.result(timeout=bound_s)
    except BaseException as e:  # what the call raised
        if isinstance(e, TimeoutError) and not fut.done():
            pytest.fail(f"RemoteEnv({url!r}) still waiting after {bound_s:g} s")
        return e


def wait_until(cond: Callable[[], bool], what: str, bound_s: float = 60.0) -> None:
    deadline = time.monotonic() + bound_s
    while not cond():
        assert time.monotonic() < deadline, f"not within {bound_s:g} s: {what}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def server() -> Iterator[EnvServer]:
    with EnvServer([DEMO, "agentgym/ServeTest-v0"], token="tok") as srv:
        yield srv


AUTH = {"authorization": "Bearer tok"}


# ------------------------------------------------------------------------------------- item 5: RemoteEnv
@pytest.mark.parametrize("where", ["body", "headers"])
def test_remote_env_call_has_a_total_deadline(where: str) -> None:
    """A server that trickles one byte every 0.3 s (httpx's timeouts are per read) no longer holds a call."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n"
    respond = trickle(head, b"x" * 100000) if where == "body" else trickle(b"HTTP/1.1 200 OK\r\n", b"x-pad: " + b"y" * 9000)
    with HostileServer(respond) as srv:
        t0 = time.monotonic()
        err = remote_env_in_thread(srv.url, timeout_s=2, retries=0)
        assert isinstance(err, EnvServerError) and "within 2 s" in str(err), err
        assert time.monotonic() - t0 < 30


def test_a_hung_server_costs_the_spec_probe_its_short_bound() -> None:
    """A server that accepts and never answers held RemoteEnv's first call (the ``/agentgym/spec``
    probe, a route an OpenEnv server does not have) for the whole step deadline (360 s); now the
    probe has its own bound (``probe_timeout_s``), whatever ``timeout_s`` is."""

    def hang(conn: socket.socket, stop: threading.Event) -> None:
        stop.wait()

    with HostileServer(hang) as srv:
        err = remote_env_in_thread(srv.url, probe_timeout_s=1, retries=0)
        assert isinstance(err, EnvServerError) and "/agentgym/spec: no complete answer within 1 s" in str(err), err
    assert RemoteEnv.__init__.__kwdefaults__["probe_timeout_s"] < RemoteEnv.__init__.__kwdefaults__["timeout_s"] / 10


@pytest.mark.parametrize("declare_length", [True, False])
def test_remote_env_refuses_an_oversized_response(declare_length: bool) -> None:
    """A 96 MiB answer is refused past the 64 MiB cap (declared or chunked), not parsed whole."""
    payload = b'{"pad": "' + b"x" * (96 * 2**20) + b'"}'
    with HostileServer(body(payload, declare_length)) as srv:
        err = remote_env_in_thread(srv.url, retries=0)
        assert isinstance(err, EnvServerError) and "larger than 67108864 bytes" in str(err), err


@pytest.mark.parametrize("payload", [b"[" * 200_000 + b"]" * 200_000, b'{"env": ' + BIG_INT.encode() + b"}"],
                         ids=["deep-nesting", "huge-integer"])
def test_remote_env_refuses_malformed_json(payload: bytes) -> None:
    """Deeply nested JSON raised RecursionError in RemoteEnv: now an EnvServerError."""
    with HostileServer(body(payload)) as srv:
        err = remote_env_in_thread(srv.url, retries=0)
        assert isinstance(err, EnvServerError) and "not acceptable JSON" in str(err), err


def test_credentials_in_the_url_never_reach_a_message(server: EnvServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """``http://user:TOKEN@host`` works (HTTP Basic), and no error message repeats the token."""
    monkeypatch.delenv("AGENTGYM_TOKEN", raising=False)
    env = RemoteEnv(f"http://me:tok@127.0.0.1:{server.port}")
    env.reset(seed=0)
    assert "tok@" not in repr(env) and all("tok" not in u for u in env.urls)
    env.close()
    dead = f"http://me:S3CRET-T0KEN@127.0.0.1:{free_port()}"
    for kw in ({}, {"transport": "ws"}):
        with pytest.raises(EnvServerError) as e:
            RemoteEnv(dead, retries=0, **kw)
        assert "S3CRET" not in str(e.value) and "***" not in str(e.value)
    with pytest.raises(ConfigurationError) as e2:  # a wrong token: the message says so, without it
        RemoteEnv(f"http://me:WR0NG-T0KEN@127.0.0.1:{server.port}")
    assert "WR0NG" not in str(e2.value) and "token" in str(e2.value)


# ------------------------------------------------------------------------------------------ item 8: server
def test_only_the_exact_health_routes_skip_auth(server: EnvServer) -> None:
    url = server.url
    sid = httpx.post(url + "/agentgym/sessions", json={}, headers=AUTH).json()["session_id"]
    assert httpx.delete(url + "/agentgym/sessions/health").status_code == 401  # was answered without a token
    assert httpx.get(url + "/agentgym/spec/health").status_code == 401
    assert httpx.get(url + "/health").json() == {"status": "healthy"}
    assert httpx.get(url + "/envs/ServeTest-v0/health").json() == {"status": "healthy"}
    assert httpx.get(url + "/envs/Demo-v0/health").json() == {"status": "healthy"}
    assert sid in server.service.sessions
    httpx.delete(url + f"/agentgym/sessions/{sid}", headers=AUTH)


def test_huge_integers_and_deep_nesting_get_a_400(server: EnvServer) -> None:
    url = server.url
    for path, raw in (("/reset", '{"seed": %s}' % BIG_INT), ("/step", '{"action": {"message": %s}}' % BIG_INT),
                      ("/agentgym/sessions", "[" * 100_000 + "]" * 100_000)):
        r = httpx.post(url + path, content=raw, headers={**AUTH, "content-type": "application/json"})
        assert r.status_code == 400, (path, r.status_code, r.text[:200])
        assert r.json()["detail"]["type"] == "BadRequest" and "JSON" in r.json()["detail"]["message"]
    rpc = '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "guess", "arguments": {"n": %s}}}'
    r = httpx.post(url + "/mcp", content=rpc % BIG_INT, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == -32700, r.text[:200]
    assert "4300" in r.json()["error"]["message"]  # says why
    from websockets.sync.client import connect

    with connect(url.replace("http", "ws") + "/ws", additional_headers=AUTH, proxy=None) as ws:
        ws.send('{"type": "reset", "data": {"seed": %s}}' % BIG_INT)
        assert json.loads(ws.recv(timeout=30))["data"]["code"] == "INVALID_JSON"
        ws.send('{"type": "reset", "data": {"seed": 0}}')  # the connection and its session survive
        assert json.loads(ws.recv(timeout=30))["type"] == "observation"


def test_expert_route_can_be_turned_off() -> None:
    with EnvServer(DEMO, token="t", expert=False) as srv:
        env = RemoteEnv(srv.url, token="t")
        env.reset(seed=0)
        assert env.spec_info["limits"]["expert"] is False
        with pytest.raises(ConfigurationError, match="expert"):
            env.expert_action()
        r = httpx.get(srv.url + "/agentgym/expert", params={"session_id": env.session_id},
                      headers={"authorization": "Bearer t"})
        assert r.status_code == 403 and r.json()["detail"]["type"] == "Forbidden"
        env.close()
        ws_env = RemoteEnv(srv.url, token="t", transport="ws")
        ws_env.reset(seed=0)
        with pytest.raises(ConfigurationError, match="expert"):
            ws_env.expert_action()
        ws_env.close()


# ------------------------------------------------------------------------------- item 4: browsers
def test_cross_site_requests_to_a_tokenless_loopback_server_are_refused() -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    with EnvServer(DEMO, allowed_origins=("https://app.example",)) as srv:
        ws_url = srv.url.replace("http", "ws") + "/ws"
        with pytest.raises(InvalidStatus) as e:  # a page on evil.example opening a session
            connect(ws_url, origin="http://evil.example", proxy=None, open_timeout=30)  # type: ignore[arg-type]
        assert e.value.response.status_code == 403
        with pytest.raises(InvalidStatus):
            connect(srv.url.replace("http", "ws") + "/mcp", origin="http://evil.example", proxy=None, open_timeout=30)  # type: ignore[arg-type]
        for method, path in (("POST", "/reset"), ("POST", "/step"), ("POST", "/mcp"), ("GET", "/agentgym/tasks")):
            r = httpx.request(method, srv.url + path, content=b"{}", headers={"origin": "http://evil.example",
                                                                              "content-type": "text/plain"})
            assert r.status_code == 403 and r.json()["detail"]["type"] == "Forbidden", (path, r.status_code)
        # DNS rebinding: evil.example resolved to 127.0.0.1, same-origin requests carry its Host
        r = httpx.get(srv.url + "/agentgym/tasks", params={"split": "test"}, headers={"host": "evil.example:80"})
        assert r.status_code == 403
        # allowed: no Origin (every non-browser client), loopback origins, the configured origin
        for origin in (None, "http://localhost:5173", "http://127.0.0.1:3000", "https://app.example"):
            headers = {"origin": origin} if origin else {}
            assert httpx.post(srv.url + "/reset", json={"seed": 0}, headers=headers).status_code == 200, origin
            with connect(ws_url, origin=origin, proxy=None, open_timeout=30) as ws:  # type: ignore[arg-type]
                ws.send('{"type": "reset", "data": {"seed": 0}}')
                assert json.loads(ws.recv(timeout=30))["type"] == "observation"
        for transport in ("http", "ws"):  # RemoteEnv is unaffected
            env = RemoteEnv(srv.url, transport=transport)
            env.reset(seed=0)
            assert env.step(GIVE_UP)[2]
            env.close()


# ------------------------------------------------------------------------ item 3: connection exhaustion
def _raise_own_fd_limit(need: int) -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"needs a hard file-descriptor limit of {need}, this machine allows {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    return soft, hard


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("server_hard_limit", [False, True], ids=["soft-1024", "hard-1024"])
def test_token_holder_is_served_while_2000_half_open_connections_are_held(server_hard_limit: bool) -> None:
    """2,000 connections with unfinished headers (no token needed) exhausted a server started under a
    1,024 soft fd limit. Now the server raises its soft limit (soft-1024) and, where it cannot
    (hard-1024), closes the oldest idle connection for each new one: the token holder is served."""
    n = 2000
    old = _raise_own_fd_limit(n + 512)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = (1024, 1024) if server_hard_limit else (1024, hard)
    server = LoggedProcess([str(VENV_BIN / "agentgym"), "serve", DEMO, "--port", str(port), "--token", "tok",
                            "--header-timeout", "600"],  # the attackers' connections stay open server-side
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))
    held: list[socket.socket] = []
    try:
        wait_until(lambda: _healthy(url, server), "the server answers /health", 120)
        for _ in range(n):  # the attack: each connection sends half a request and waits
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            held.append(s)
        r = httpx.get(url + "/agentgym/spec", headers=AUTH, timeout=30)
        assert r.status_code == 200 and r.json()["env"]["env_id"] == DEMO
        env = RemoteEnv(url, token="tok", timeout_s=30, retries=0)
        env.reset(seed=0)
        assert env.step(GIVE_UP)[2]
        env.close()
        assert server.proc.poll() is None
    finally:
        for s in held:
            s.close()
        server.kill()
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def _healthy(url: str, server: LoggedProcess) -> bool:
    if server.proc.poll() is not None:
        raise AssertionError(f"server exited: {server.stderr()[-4000:]}")
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_half_open_and_idle_connections_are_closed() -> None:
    """A connection that never finishes its headers, or idles after a response, is closed by the server."""
    limits = ConnectionLimits(header_timeout_s=0.5, idle_timeout_s=0.5)
    with EnvServer(DEMO, connections=limits) as srv:
        half = socket.create_connection((srv.host, srv.port), timeout=60)
        half.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert half.recv(1024) == b""  # closed by the server, not by this socket's 60 s timeout
        idle = socket.create_connection((srv.host, srv.port), timeout=60)
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        while b'"healthy"' not in got:
            got += idle.recv(65536)
        assert idle.recv(1024) == b""  # then closed once idle
        half.close()
        idle.close()
        assert httpx.get(srv.url + "/health").status_code == 200


def test_connection_cap_closes_idle_connections_first() -> None:
    """At the cap, a new connection closes the oldest idle one; a request being served is never cut."""
    import select

    limits = ConnectionLimits(max_connections=20, header_timeout_s=600)  # only the cap closes anything here
    with EnvServer("agentgym/ServeTest-v0", connections=limits) as srv:
        env = RemoteEnv(srv.url, timeout_s=60)
        env.reset(seed=0)
        busy = ThreadPoolExecutor(1)
        slow = busy.submit(env.step, "sleep 2")  # a request in flight across the attack
        wait_until(lambda: any(s.lock.locked() for s in srv.service.sessions.values()), "the slow step is running")
        held = [socket.create_connection((srv.host, srv.port), timeout=30) for _ in range(60)]
        gone: set[socket.socket] = set()
        try:
            for s in held:
                s.sendall(b"GET /health HTTP/1.1\r\n")
            assert httpx.get(srv.url + "/health", timeout=30).status_code == 200  # a newcomer is served
            assert slow.result(timeout=60)[0][0]["content"] == "slept"  # the busy request was not cut

            def is_closed(s: socket.socket) -> bool:
                # The server may close with FIN (recv gives b"") or, since our partial request is
                # unread in its buffer, with RST: both mean the server dropped the connection.
                try:
                    return s.recv(1) == b""
                except ConnectionResetError:
                    return True

            deadline = time.monotonic() + 30
            while len(gone) < 60 - 20 and time.monotonic() < deadline:
                readable, _, _ = select.select([s for s in held if s not in gone], [], [], 0.05)
                gone.update(s for s in readable if is_closed(s))
            assert len(gone) >= 60 - 20  # beyond the cap the oldest idle connections went
        finally:
            for s in held:
                s.close()
        busy.shutdown()
        env.close()

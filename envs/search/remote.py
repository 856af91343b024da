"""Search-R1-compatible retrieval over HTTP: a client (:class:`RemoteRetriever`) and a FastAPI app.

The wire format is Search-R1's ``retrieval_server.py``::

    POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": true}   ("query": "..." also accepted)
    ->  {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 12.3}, ...], ...]}

With ``return_scores: false`` each inner list holds the documents themselves. ``contents`` follows
the wiki-18 convention: the title (in double quotes) on the first line, the text after it. The app
also answers ``GET /health``.

The server protects itself: a request body over ``max_request_bytes`` gets ``413`` (read no further
than the limit, whatever ``Content-Length`` claims), and each client address may send
``rate_per_s`` requests per second on average (bursts up to ``burst``), beyond which it gets
``429`` with ``Retry-After``. The client retries a ``429`` after the time the server asks for.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
import urllib.parse
import weakref
from collections.abc import Sequence
from typing import Any

from agentgym.envs.search.retrieval import Hit, Retriever
from pydantic import BaseModel, Field

from agentgym.errors import ConfigurationError, RetrievalError
from agentgym.serve.runner import ConnectionLimits, ServerThread

__all__ = ["RemoteRetriever", "RetrieverServer", "create_app", "hit_to_document", "parse_contents"]

MAX_QUERIES_PER_REQUEST = 4096
MAX_TOPK = 100
MAX_QUERY_CHARS = 4096
DEFAULT_MAX_REQUEST_BYTES = 4 << 20
DEFAULT_RATE_PER_S = 1000.0
DEFAULT_BURST = 2000


def parse_contents(contents: str) -> tuple[str, str]:
    """Split wiki-18 ``contents`` into (title, text); the title line may be in double quotes."""
    title, _, text = contents.partition("\n")
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, text.strip()


def hit_to_document(hit: Hit) -> dict[str, Any]:
    """A :class:`Hit` as a wiki-18 document."""
    return {"id": hit.doc_id, "contents": f'"{hit.title}"\n{hit.text}'}


def _document_to_hit(doc: Any, score: float) -> Hit:
    if isinstance(doc, str):
        title, text = parse_contents(doc)
        return Hit("", title, text, score)
    if not isinstance(doc, dict):
        raise ValueError(f"document is {type(doc).__name__}, expected an object")
    if "contents" in doc:
        title, text = parse_contents(str(doc["contents"]))
    else:
        title, text = str(doc.get("title", "")), str(doc.get("text", ""))
    return Hit(str(doc.get("id", "")), title, text, score)


class RemoteRetriever:
    """Client of a ``/retrieve`` server (Search-R1's, or ``agentgym serve-retriever``).

    Uses one keep-alive ``http.client`` connection per thread (cheaper per request than httpx).
    Connection errors, timeouts and 5xx answers are retried ``retries`` times with exponential
    backoff; then :class:`~agentgym.errors.RetrievalError` is raised. Every request has a deadline, so
    a dead or hung server costs at most about ``(retries + 1) * timeout_s + backoff`` seconds.

    Args:
        url: Base URL (``http://host:port``) or the full ``.../retrieve`` URL.
        timeout_s: Per-request deadline (connect, read, write).
        retries: Extra attempts after the first.
        backoff_s: First backoff; doubles each retry.
    """

    def __init__(self, url: str, *, timeout_s: float = 10.0, retries: int = 2, backoff_s: float = 0.1) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"Retrieval URL {url!r} must start with http:// or https://.")
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.timeout_s = float(timeout_s)
        self.retries = max(0, int(retries))
        self.backoff_s = float(backoff_s)
        parts = urllib.parse.urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port
        self._path = parts.path or "/retrieve"
        self._local = threading.local()  # one keep-alive connection per thread
        self._retry_after = 0.0
        self._conns: list[http.client.HTTPConnection] = []  # every thread's, closed by close() or at collection
        self._conns_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_all, self._conns, self._conns_lock)

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=self.timeout_s)
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._conns_lock, contextlib.suppress(ValueError):
                self._conns.remove(conn)

    def _post(self, body: bytes) -> tuple[int, bytes]:
        conn = self._conn()
        try:
            conn.request("POST", self._path, body, {"Content-Type": "application/json", "Accept": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except BaseException:
            self._drop()
            raise
        ra = resp.getheader("Retry-After") or ""
        self._retry_after = float(ra) if ra.replace(".", "", 1).isdigit() else 0.0
        if resp.will_close:
            self._drop()
        return resp.status, data

    def close(self) -> None:
        """Close every thread's connection."""
        self._local = threading.local()
        self._finalizer()
        self._finalizer = weakref.finalize(self, _close_all, self._conns, self._conns_lock)

    def __enter__(self) -> RemoteRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batch_search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        qs = list(queries)
        body = json.dumps({"queries": qs, "topk": int(k), "return_scores": True}).encode()
        last: str = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                status, data = self._post(body)
            except (OSError, http.client.HTTPException) as e:  # refused, reset, timeout, bad status line
                last = f"{type(e).__name__}: {e}"
                continue
            if status >= 500:
                last = f"HTTP {status}"
                continue
            if status == 429:  # rate-limited: wait as long as the server asks (bounded), then retry
                last = "HTTP 429 (rate limited)"
                time.sleep(min(self.timeout_s, max(self.backoff_s, self._retry_after)))
                continue
            if status == 413:
                raise RetrievalError(f"{self.url} refused the request as too large (HTTP 413); send fewer or shorter "
                                     "queries per call.")
            if status >= 400:
                raise RetrievalError(f"{self.url} rejected the request: HTTP {status} {data[:200].decode(errors='replace')}")
            try:
                return self._parse(json.loads(data), len(qs))
            except (ValueError, KeyError, TypeError) as e:
                raise RetrievalError(f"{self.url} sent a malformed response: {e}") from None
        raise RetrievalError(f"retrieval server {self.url} failed after {self.retries + 1} attempts ({last}).")

    @staticmethod
    def _parse(body: Any, n: int) -> list[list[Hit]]:
        result = body["result"]
        if not isinstance(result, list) or len(result) != n:
            raise ValueError(f"expected {n} result lists")
        out: list[list[Hit]] = []
        for row in result:
            hits = []
            for item in row:
                if isinstance(item, dict) and "document" in item:
                    hits.append(_document_to_hit(item["document"], float(item.get("score", 0.0))))
                else:
                    hits.append(_document_to_hit(item, 0.0))
            out.append(hits)
        return out

    def search(self, query: str, k: int = 3) -> list[Hit]:
        return self.batch_search([query], k)[0]


def _close_all(conns: list[http.client.HTTPConnection], lock: threading.Lock) -> None:
    with lock:
        closing = list(conns)
        conns.clear()
    for c in closing:
        with contextlib.suppress(Exception):
            c.close()


class QueryRequest(BaseModel):
    """The body of ``POST /retrieve``: ``queries`` (Search-R1), or ``query`` (SkyRL's client sends one string)."""

    queries: list[str] | None = Field(default=None, max_length=MAX_QUERIES_PER_REQUEST)
    query: str | list[str] | None = None
    topk: int | None = Field(default=None, ge=1, le=MAX_TOPK)
    return_scores: bool = False

    def all_queries(self) -> list[str]:
        if self.queries is not None:
            return self.queries
        if isinstance(self.query, str):
            return [self.query]
        return list(self.query or [])


class _Limits:
    """ASGI middleware: cap request bodies and rate-limit each client address (token bucket)."""

    def __init__(self, app: Any, *, max_request_bytes: int, rate_per_s: float, burst: int) -> None:
        self.app = app
        self.max_request_bytes = int(max_request_bytes)
        self.rate_per_s = float(rate_per_s)
        self.burst = max(1.0, float(burst))
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, last refill)
        self._lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        if self.rate_per_s > 0:
            wait = self._take((scope.get("client") or ("?", 0))[0])
            if wait > 0:
                await _reply(send, 429, {"detail": "too many requests; slow down"},
                             {"retry-after": f"{max(wait, 0.01):.2f}"})
                return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_request_bytes):
            await _reply(send, 413, {"detail": f"request body over {self.max_request_bytes} bytes"})
            return
        received = 0
        too_big = False

        async def limited_receive() -> Any:
            nonlocal received, too_big
            msg = await receive()
            if msg.get("type") == "http.request":
                received += len(msg.get("body", b""))
                if received > self.max_request_bytes:
                    too_big = True
                    return {"type": "http.disconnect"}
            return msg

        sent = False

        async def tracking_send(msg: Any) -> None:
            nonlocal sent
            if too_big:
                return
            sent = True
            await send(msg)

        await self.app(scope, limited_receive, tracking_send)
        if too_big and not sent:
            await _reply(send, 413, {"detail": f"request body over {self.max_request_bytes} bytes"})

    def _take(self, client: str) -> float:
        """Spend a token of ``client``'s bucket; 0 if allowed, else seconds until one is free."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate_per_s)
            if tokens >= 1.0:
                self._buckets[client] = (tokens - 1.0, now)
                return 0.0
            self._buckets[client] = (tokens, now)
            if len(self._buckets) > 100_000:  # forget idle clients
                self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < 60}
            return (1.0 - tokens) / self.rate_per_s


async def _reply(send: Any, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    hdrs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": data})


def create_app(retriever: Retriever, *, default_topk: int = 3, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
               rate_per_s: float = DEFAULT_RATE_PER_S, burst: int = DEFAULT_BURST) -> Any:
    """An ASGI app serving ``retriever`` with Search-R1's ``/retrieve`` API.

    Args:
        retriever: What to serve.
        default_topk: ``topk`` when a request omits it.
        max_request_bytes: Largest request body accepted (413 beyond it).
        rate_per_s: Requests per second each client address may send on average (429 beyond it);
            0 turns rate limiting off.
        burst: How many requests a client may send at once before the rate applies.
    """
    app = _create_fastapi(retriever, default_topk=default_topk)
    return _Limits(app, max_request_bytes=max_request_bytes, rate_per_s=rate_per_s, burst=burst)


def _create_fastapi(retriever: Retriever, *, default_topk: int) -> Any:
    from fastapi import FastAPI, HTTPException
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse

    app = FastAPI(title="AgentGym retriever", description="Search-R1-compatible /retrieve endpoint.")
    num_docs = len(getattr(retriever, "docs", ()) or ())

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "kind": getattr(retriever, "kind", "custom"), "num_docs": num_docs}

    inline = getattr(retriever, "kind", None) == "bm25"  # sub-millisecond: skip the threadpool hop

    @app.post("/retrieve")
    async def retrieve(req: QueryRequest) -> Any:
        queries = req.all_queries()
        if req.queries is None and req.query is None:
            raise HTTPException(status_code=422, detail="send 'queries' (a list of strings) or 'query'")
        if len(queries) > MAX_QUERIES_PER_REQUEST:
            raise HTTPException(status_code=422, detail=f"at most {MAX_QUERIES_PER_REQUEST} queries per request")
        for q in queries:
            if len(q) > MAX_QUERY_CHARS:
                raise HTTPException(status_code=422, detail=f"a query is longer than {MAX_QUERY_CHARS} characters")
        k = req.topk or default_topk
        if inline and len(queries) <= 16:
            results = retriever.batch_search(queries, k)
        else:
            results = await run_in_threadpool(retriever.batch_search, queries, k)
        if req.return_scores:
            body = [[{"document": hit_to_document(h), "score": h.score} for h in hits] for hits in results]
        else:
            body = [[hit_to_document(h) for h in hits] for hits in results]
        return JSONResponse({"result": body})

    return app


class RetrieverServer(ServerThread):
    """Serve a retriever with uvicorn in a background thread (tests, benchmarks, notebooks).

    Use as a context manager; the port is chosen by the OS unless given::

        with RetrieverServer(index) as srv:
            RemoteRetriever(srv.url).search("query")

    Args:
        retriever: What to serve.
        host: Interface to bind (loopback by default).
        port: 0 picks a free port.
        default_topk: ``topk`` when a request omits it.
        startup_timeout_s: How long :meth:`start` waits for the server to accept requests.
        max_request_bytes / rate_per_s / burst: The server's limits (see :func:`create_app`).
        limits: Connection bounds (cap, header and idle timeouts; see :mod:`agentgym.serve.runner`).
    """

    def __init__(self, retriever: Retriever, *, host: str = "127.0.0.1", port: int = 0, default_topk: int = 3,
                 startup_timeout_s: float = 20.0, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 rate_per_s: float = DEFAULT_RATE_PER_S, burst: int = DEFAULT_BURST,
                 limits: ConnectionLimits | None = None) -> None:
        app = create_app(retriever, default_topk=default_topk, max_request_bytes=max_request_bytes,
                         rate_per_s=rate_per_s, burst=burst)
        super().__init__(app, host=host, port=port, limits=limits, startup_timeout_s=startup_timeout_s,
                         name="retriever", lifespan="off")

    def start(self) -> RetrieverServer:
        try:
            super().start()
        except TimeoutError as e:
            raise RetrievalError(str(e)) from None
        return self

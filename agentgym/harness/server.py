"""HTTP in front of a :class:`~agentgym.harness.endpoint.PolicyEndpoint`: OpenAI's API, rollouts, rewards, envs.

==================================================================  ===========================================
``GET  /health``                                                    ``{"status": "healthy"}`` (no token)
``GET  /v1/models``                                                 the served policies
``POST /v1/chat/completions``, ``POST /v1/completions``             OpenAI's APIs; the rollout id in the
                                                                    ``X-Rollout-Id`` header (none: not recorded)
``.../rollout/{id}/v1/...``                                         the same, the rollout id in the path: an
                                                                    agent only changes its ``base_url``
``POST /proxy/rollout/{id}/attempt/{a}/mode/{train|val}/openai/v1/  Agent Lightning's proxy routes
chat/completions`` (and ``completions``, ``models``)
``POST /api/rollouts/{id}/attempt/{a}/events``                      Agent Lightning's events (``reward`` sets
                                                                    the rollout's reward)
``POST /rollout/{id}/reward``                                       ``{"value": 1.0, "success": true}``
``GET  /rollout/{id}``                                              the rollout's counts and rewards so far
``POST /rollout/{id}/finish``                                       close it; returns its trajectory
                                                                    (``serve-policy``; a workflow closes its own)
``GET  /rollout/{id}/env``                                          the task: messages, tools (harness workflow)
``POST /rollout/{id}/env/step``                                     act on the env: ``{"tool_calls": [...]}``
                                                                    (OpenAI's shape) or ``{"content": "..."}``
==================================================================  ===========================================

Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status. Every
route but ``/health`` sits behind :class:`agentgym.serve.guard.Guard` (bearer token, request size,
``Origin``/``Host`` checks), and the connections are bounded by :mod:`agentgym.serve.runner`, as in
``agentgym serve``: a non-loopback address needs a token.

:class:`EndpointServer` serves on the caller's event loop (where the policies live), on a TCP port and
optionally on a Unix socket (for containers started with ``--network none``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentgym.errors import ConfigurationError
from agentgym.harness.endpoint import PolicyEndpoint
from agentgym.harness.openai_api import (
    EndpointError,
    chat_chunks,
    chat_response,
    completion_chunks,
    completion_response,
    error_body,
)
from agentgym.serve import runner
from agentgym.serve.guard import Guard
from agentgym.serve.protocol import MalformedJSON, is_loopback, loads

__all__ = ["EndpointServer", "create_app"]

ROLLOUT_HEADER = "x-rollout-id"


def _error(err: EndpointError) -> JSONResponse:
    return JSONResponse(error_body(err), status_code=err.status)


async def _body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        return {}
    try:
        return loads(raw)
    except MalformedJSON as e:
        raise EndpointError(400, f"the request body is not valid JSON: {e}") from None


def _sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    async def gen() -> AsyncIterator[bytes]:
        for c in chunks:
            yield b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream", headers={"cache-control": "no-cache"})


def create_app(endpoint: PolicyEndpoint, *, token: str | None = None, max_request_bytes: int = 8 * 2**20,
               loopback_only: bool = True, allowed_origins: tuple[str, ...] = (), allowed_hosts: tuple[str, ...] = (),
               http_finish: bool = True) -> Any:
    """The ASGI app (behind the guard) serving ``endpoint``; ``app.endpoint`` is the endpoint.

    Args:
        http_finish: Allow ``POST /rollout/{id}/finish`` (a harness workflow closes its rollouts itself).
    """
    app = FastAPI(title="AgentGym policy endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    ep = endpoint

    @app.exception_handler(EndpointError)
    async def _on_error(_request: Request, exc: EndpointError) -> JSONResponse:
        return _error(exc)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    async def chat(request: Request, rollout_id: str | None) -> Response:
        req, reply = await ep.chat(await _body(request), rollout_id=rollout_id)
        lp = bool(req.logprobs)
        if req.stream:
            return _sse(chat_chunks(reply, logprobs=lp, include_usage=req.include_usage()))
        return JSONResponse(chat_response(reply, logprobs=lp))

    async def complete(request: Request, rollout_id: str | None) -> Response:
        req, reply = await ep.complete(await _body(request), rollout_id=rollout_id)
        lp = bool(req.logprobs)
        if req.stream:
            return _sse(completion_chunks(reply, logprobs=lp, include_usage=req.include_usage()))
        return JSONResponse(completion_response(reply, logprobs=lp))

    def openai_routes(router: APIRouter, prefix: str, rollout_of: Any) -> None:
        @router.get(prefix + "/models")
        async def models(request: Request) -> dict[str, Any]:
            rollout_of(request)
            return ep.models()

        @router.post(prefix + "/chat/completions")
        async def chat_completions(request: Request) -> Response:
            return await chat(request, rollout_of(request))

        @router.post(prefix + "/completions")
        async def completions(request: Request) -> Response:
            return await complete(request, rollout_of(request))

    router = APIRouter()
    openai_routes(router, "/v1", lambda r: r.headers.get(ROLLOUT_HEADER) or None)
    openai_routes(router, "/rollout/{rollout_id}/v1", lambda r: r.path_params["rollout_id"])

    def agl_rollout(request: Request) -> str:
        mode = request.path_params["mode"]
        if mode not in ("train", "val"):
            raise EndpointError(404, f"unsupported proxy mode {mode!r} (train or val)")
        rid = request.path_params["rollout_id"]
        if rid not in ep.rollouts and ep.auto_rollouts:
            ep.open_rollout(rid, mode=mode, info={"attempt_id": request.path_params["attempt_id"]})
        return str(rid)

    openai_routes(router, "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1", agl_rollout)

    @router.post("/api/rollouts/{rollout_id}/attempt/{attempt_id}/events")
    async def agl_event(rollout_id: str, attempt_id: str, request: Request) -> dict[str, Any]:
        body = await _body(request)
        if not isinstance(body, dict) or not isinstance(body.get("event_type"), str):
            raise EndpointError(400, "an event is {\"event_type\": str, \"data\": {...}}", param="event_type")
        data = body.get("data") or {}
        if not isinstance(data, dict):
            raise EndpointError(400, "an event's data is an object", param="data")
        if len(json.dumps(data, default=str)) > 64 * 1024:
            raise EndpointError(413, "an event's data is at most 64 KiB")
        ep.post_event(rollout_id, body["event_type"], data)
        return {"event_type": body["event_type"], "rollout_id": rollout_id, "attempt_id": attempt_id, "data": data}

    @router.post("/rollout/{rollout_id}/reward")
    async def reward(rollout_id: str, request: Request) -> dict[str, Any]:
        body = await _body(request)
        if not isinstance(body, dict):
            raise EndpointError(400, "a reward is {\"value\": number, \"success\": bool}")
        ev = ep.post_reward(rollout_id, body.get("value"), success=body.get("success"))
        return {"rollout_id": rollout_id, "value": ev.value, "success": ev.success}

    @router.get("/rollout/{rollout_id}")
    async def status(rollout_id: str) -> dict[str, Any]:
        r = ep.rollout(rollout_id, create=False)
        return {"rollout_id": rollout_id, "mode": r.mode, "in_flight": r.in_flight, "metrics": r.trace.metrics(),
                "rewards": r.reward_log()}

    @router.post("/rollout/{rollout_id}/finish")
    async def finish(rollout_id: str, request: Request) -> dict[str, Any]:
        if not http_finish:
            raise EndpointError(403, "rollouts of this endpoint are finished by their harness", kind="permission_error")
        body = await _body(request)
        if not isinstance(body, dict):
            raise EndpointError(400, "finish takes {\"task_id\": str} or nothing")
        r = ep.rollout(rollout_id, create=False)
        if r.in_flight:
            raise EndpointError(409, f"rollout {rollout_id!r} has {r.in_flight} request(s) in flight")
        if isinstance(body.get("task_id"), str):
            r.info["task_id"] = body["task_id"]
        traj = ep.close_rollout(rollout_id).trajectory()
        return traj.to_dict()

    @router.get("/rollout/{rollout_id}/env")
    async def env_state(rollout_id: str) -> dict[str, Any]:
        r = ep.rollout(rollout_id, create=False)
        if r.env is None:
            raise EndpointError(404, f"rollout {rollout_id!r} has no env here")
        return r.env.describe()

    @router.post("/rollout/{rollout_id}/env/step")
    async def env_step(rollout_id: str, request: Request) -> dict[str, Any]:
        r = ep.rollout(rollout_id, create=False)
        if r.env is None:
            raise EndpointError(404, f"rollout {rollout_id!r} has no env here")
        r.touch()
        return await r.env.step(await _body(request))

    app.include_router(router)
    guarded = Guard(app, token, max_request_bytes, public_paths=("/health",), loopback_only=loopback_only,
                    allowed_origins=allowed_origins, allowed_hosts=allowed_hosts)
    guarded.endpoint = endpoint  # type: ignore[attr-defined]
    return guarded


class _InLoopServer:
    """uvicorn's server without its signal handlers (it runs inside someone else's event loop)."""

    def __new__(cls, config: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        return Server(config)


class EndpointServer:
    """Serve a :class:`PolicyEndpoint` on the running event loop (the one its policies live on)::

        async with EndpointServer(endpoint, token=secret) as srv:
            client = openai.AsyncOpenAI(base_url=srv.base_url("r1"), api_key=secret)

    Args:
        endpoint: What to serve.
        host / port: TCP address (``port=0``: the OS picks one). A non-loopback host needs a token.
        token: The bearer token clients send (OpenAI clients send their ``api_key``).
        uds: Also serve on this Unix socket path (for containers without a network).
        limits: Connection bounds (:class:`agentgym.serve.runner.ConnectionLimits`).
        max_request_bytes: Largest request body.
        http_finish: Allow ``POST /rollout/{id}/finish``.
        shutdown_timeout_s: How long :meth:`stop` lets in-flight requests finish.
    """

    def __init__(self, endpoint: PolicyEndpoint, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 uds: str | None = None, limits: runner.ConnectionLimits | None = None,
                 max_request_bytes: int = 8 * 2**20, http_finish: bool = True, shutdown_timeout_s: float = 5.0,
                 allowed_origins: tuple[str, ...] = (), allowed_hosts: tuple[str, ...] = ()) -> None:
        if token is not None and not token:
            raise ConfigurationError("the endpoint's token is empty")
        if not is_loopback(host) and not token:
            raise ConfigurationError(f"refusing to serve the policies on {host!r} without a token: anyone who can "
                                     "reach it could generate and post rewards. Pass a token, or bind 127.0.0.1.")
        self.endpoint = endpoint
        self.host = host
        self.token = token
        self.uds = uds
        self.app = create_app(endpoint, token=token, max_request_bytes=max_request_bytes,
                              loopback_only=is_loopback(host), http_finish=http_finish,
                              allowed_origins=allowed_origins, allowed_hosts=allowed_hosts)
        self._limits = limits
        self._shutdown_timeout_s = shutdown_timeout_s
        self._sockets: list[socket.socket] = []
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(fam, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        self._sockets.append(sock)
        self.port = int(sock.getsockname()[1])
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def base_url(self, rollout_id: str | None = None) -> str:
        """The OpenAI ``base_url`` for a rollout (``None``: unrecorded requests)."""
        return f"{self.url}/rollout/{rollout_id}/v1" if rollout_id else f"{self.url}/v1"

    async def start(self, timeout_s: float = 30.0) -> EndpointServer:
        """Start serving; raises :class:`TimeoutError` if it is not up within ``timeout_s``."""
        if self.uds is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.uds)
            us = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            us.bind(self.uds)
            os.chmod(self.uds, 0o666)
            self._sockets.append(us)
        config = runner.uvicorn_config(self.app, self._limits, timeout_graceful_shutdown=self._shutdown_timeout_s,
                                       lifespan="off")
        self._server = _InLoopServer(config)
        self._task = asyncio.ensure_future(self._server.serve(sockets=list(self._sockets)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self._server.started:
            if self._task.done():
                await self._task  # raises what stopped it
                raise TimeoutError("the policy endpoint stopped while starting")
            if loop.time() > deadline:
                await self.stop()
                raise TimeoutError(f"the policy endpoint did not start within {timeout_s:g} s")
            await asyncio.sleep(0.01)
        return self

    async def stop(self) -> None:
        """Stop serving (in-flight requests get ``shutdown_timeout_s``), close the sockets."""
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._task), self._shutdown_timeout_s + 5.0)
            if not self._task.done():
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
            self._task = None
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()
        self._sockets = []
        if self.uds is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.uds)

    async def __aenter__(self) -> EndpointServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

"""MCP for one served env: streamable HTTP on ``POST``/``DELETE /mcp`` (and the JSON-RPC handler the
WebSocket routes share).

Two kinds of client use it:

* **Standard MCP clients** (the ``mcp`` SDK, the OpenAI Agents SDK's ``MCPServerStreamableHttp``)
  follow MCP's lifecycle (handshake-era protocol versions 2024-11-05 to 2025-11-25): ``initialize``
  opens a session and starts an episode; its id comes back in the ``Mcp-Session-Id`` header, which
  every later request carries (``MCP-Protocol-Version`` too, where the version has it). The task is
  chosen by the endpoint URL's query (``/mcp?task_id=guess-31``, or ``?split=test&index=3``,
  ``?seed=0``). The task prompt is the ``initialize`` result's ``instructions``, the resource
  ``agentgym://task`` and the prompt ``task``. ``tools/call`` steps the episode; reward, done and
  info ride in the result's ``_meta.agentgym``. An episode lasts one MCP session: after it ends,
  ``tools/call`` answers an error; a new session (``initialize``) starts the next task. ``DELETE
  /mcp`` ends the session; an unknown or expired session id gets ``404``. A request whose body is
  not JSON gets ``400`` with a JSON-RPC parse error. ``server/discover`` (the stateless 2026 era)
  is answered "method not found", so clients fall back to the handshake.
* **OpenEnv's clients** (``MCPToolClient`` in production mode) send no ``initialize``: they create a
  session with ``openenv/session/create`` and pass its id as ``params.session_id``; the first
  ``tools/call`` resets the episode (``params.reset`` picks the task).

Responses are plain JSON (``application/json``); the server never opens an SSE stream (``GET /mcp``
answers 405, as the transport allows).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

import agentgym
from agentgym.serve.protocol import MalformedJSON, dumps, loads
from agentgym.serve.routes.common import ok, shielded
from agentgym.serve.service import ServeError, Service, Session, error_of

__all__ = ["SUPPORTED_VERSIONS", "TASK_URI", "McpHandler", "mcp_router", "rpc_error", "rpc_ok"]

# JSON-RPC 2.0 error codes (as MCP's and OpenEnv's)
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR, SERVER_ERROR = (
    -32700, -32600, -32601, -32602, -32603, -32000)

SUPPORTED_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]
TASK_URI = "agentgym://task"
SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"


def rpc_ok(rid: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def rpc_error(rid: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": rid, "error": err}


def _reset_body(query: Mapping[str, str]) -> dict[str, Any]:
    """The reset options of an MCP endpoint URL's query (``task_id``, ``split``, ``index``, ``seed``)."""
    body: dict[str, Any] = {}
    for key in ("task_id", "split"):
        if query.get(key):
            body[key] = str(query[key])
    for key in ("index", "seed"):
        if query.get(key):
            value = str(query[key])
            if not value.isdigit() or len(value) > 18:
                raise ServeError("BadRequest", f"?{key}= must be a non-negative integer, got {value[:40]!r}")
            body[key] = int(value)
    return body


class McpHandler:
    """MCP JSON-RPC requests for one served env, over HTTP or a WebSocket."""

    def __init__(self, service: Service, env_id: str) -> None:
        self.service = service
        self.env_id = env_id

    async def initialize(self, s: Session, params: dict[str, Any], query: Mapping[str, str]) -> dict[str, Any]:
        """MCP's ``initialize`` on session ``s``: negotiate the version and start the episode."""
        asked = params.get("protocolVersion")
        version = asked if asked in SUPPORTED_VERSIONS else LATEST_VERSION
        if s.status == "new":
            await self.service.reset(s, _reset_body(query))
        s.mcp_version = version
        return {"protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False},
                                 "resources": {"subscribe": False, "listChanged": False},
                                 "prompts": {"listChanged": False}},
                "serverInfo": {"name": self.env_id, "version": agentgym.__version__},
                "instructions": s.prompt,
                "_meta": {"agentgym": {"task_id": s.task_id, "episode_id": s.episode_id}}}

    async def _started(self, s: Session, params: dict[str, Any]) -> Session:
        """``s`` with an episode under way (MCP has no reset: OpenEnv's sessions start on first use)."""
        if s.status == "new":
            await self.service.reset(s, params["reset"] if isinstance(params.get("reset"), dict) else {})
        return s

    async def call(self, msg: Any, session: Session | None, query: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        """Answer one JSON-RPC message (``session``: the MCP or WebSocket session it belongs to);
        ``None`` for a notification or a response, which get no answer."""
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            return rpc_error(msg.get("id") if isinstance(msg, dict) else None, INVALID_REQUEST, "Invalid Request")
        if "method" not in msg and ("result" in msg or "error" in msg):
            return None  # a client's response (the server sends no requests)
        method, rid = msg.get("method"), msg.get("id")
        if not isinstance(method, str):
            return rpc_error(rid, INVALID_REQUEST, "Invalid Request")
        if "id" not in msg:
            return None  # a notification: notifications/initialized, notifications/cancelled...
        params = msg.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return rpc_error(rid, INVALID_PARAMS, "Params must be an object")
        try:
            return rpc_ok(rid, await self._dispatch(method, params, session, query or {}))
        except _RpcError as e:
            return rpc_error(rid, e.code, e.message)
        except Exception as e:
            err = error_of(e)
            return rpc_error(rid, SERVER_ERROR, err.message, {"type": err.kind})

    def _session(self, session: Session | None, params: dict[str, Any]) -> Session:
        return session or self.service.get(params.get("session_id"), self.env_id)

    async def _dispatch(self, method: str, params: dict[str, Any], session: Session | None,
                        query: Mapping[str, str]) -> Any:
        service, env_id = self.service, self.env_id
        if method == "ping":
            return {}
        if method == "initialize":
            if session is None:
                raise _RpcError(INVALID_REQUEST, "initialize opens a session: send it without a session")
            return await self.initialize(session, params, query)
        if method == "tools/list":
            return {"tools": service.mcp_tools(env_id)}
        if method == "tools/call":
            name, args = params.get("name"), params.get("arguments")
            if not isinstance(name, str) or not name:
                raise _RpcError(INVALID_PARAMS, "Missing 'name' in params")
            s = await self._started(self._session(session, params), params)
            raw = await service.step(s, {"type": "call_tool", "tool_name": name, "arguments": args or {}},
                                     params.get("request_id"))
            out = loads(raw)
            o = out["observation"]
            res = dict(o["result"])
            res.update(isError=res["is_error"], structuredContent=res["structured_content"])
            res["_meta"] = {"agentgym": {"reward": out["reward"], "done": out["done"],
                                         "terminated": o["terminated"], "truncated": o["truncated"],
                                         "messages": o["messages"], "info": o["info"]}}
            return res
        if method == "resources/list":
            return {"resources": [{"uri": TASK_URI, "name": "task", "mimeType": "text/plain",
                                   "description": f"The prompt of the current {env_id} task"}]}
        if method == "resources/read":
            if params.get("uri") != TASK_URI:
                raise _RpcError(INVALID_PARAMS, f"Unknown resource: {str(params.get('uri'))[:200]}; "
                                f"this server has {TASK_URI}")
            s = await self._started(self._session(session, params), params)
            return {"contents": [{"uri": TASK_URI, "mimeType": "text/plain", "text": s.prompt}]}
        if method == "resources/templates/list":
            return {"resourceTemplates": []}
        if method == "prompts/list":
            return {"prompts": [{"name": "task", "description": f"The current {env_id} task, as a user message"}]}
        if method == "prompts/get":
            if params.get("name") != "task":
                raise _RpcError(INVALID_PARAMS, f"Unknown prompt: {str(params.get('name'))[:200]}; this server has "
                                "'task'")
            s = await self._started(self._session(session, params), params)
            return {"description": f"{env_id} task {s.task_id}",
                    "messages": [{"role": "user", "content": {"type": "text", "text": s.prompt}}]}
        if method == "logging/setLevel":
            return {}
        if method == "openenv/session/create":
            if session is not None:
                return {"session_id": session.id}
            kw = params.get("env_kwargs") or {}
            s = await service.create(env_id, kw if isinstance(kw, dict) else {})
            return {"session_id": s.id}
        if method == "openenv/session/close":
            sid = params.get("session_id")
            if not sid:
                raise _RpcError(INVALID_PARAMS, "Invalid params - 'session_id' is required")
            if session is not None and sid == session.id:
                raise _RpcError(INVALID_REQUEST, "Cannot close active WebSocket-managed session via MCP method")
            s0 = service.sessions.get(sid) if isinstance(sid, str) else None
            if s0 is None or s0.env_id != env_id:
                raise _RpcError(INVALID_PARAMS, f"Unknown session_id: {str(sid)[:100]}")
            await service.close(s0)
            return {"session_id": sid, "closed": True}
        raise _RpcError(METHOD_NOT_FOUND, f"Method not found: {method[:100]}")


class _RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(body), status_code=status, headers=headers, media_type="application/json")


def mcp_router(service: Service, env_id: str, *, in_schema: bool = True) -> APIRouter:
    """``POST /mcp`` and ``DELETE /mcp`` (MCP's streamable HTTP transport) for ``env_id``."""
    router = APIRouter(include_in_schema=in_schema)
    handler = McpHandler(service, env_id)

    def mcp_session(request: Request) -> Session | Response | None:
        """The session named by ``Mcp-Session-Id`` (a 404 response if it is gone), or None."""
        sid = request.headers.get(SESSION_HEADER)
        if sid is None:
            return None
        s = service.sessions.get(sid)
        if s is None or s.closed or s.env_id != env_id or s.mcp_version is None:
            return _reply(rpc_error(None, INVALID_REQUEST, "Session not found (expired, closed, or the server "
                                    "restarted): send initialize again"), 404)
        return s

    @router.post("/mcp")
    async def mcp_post(request: Request) -> Response:
        try:
            msg = loads(await request.body())
        except MalformedJSON as e:
            return _reply(rpc_error(None, PARSE_ERROR, f"Parse error: {e}"), 400)
        version = request.headers.get(VERSION_HEADER)
        if version is not None and version not in SUPPORTED_VERSIONS:
            return _reply(rpc_error(None, INVALID_REQUEST, f"Unsupported MCP-Protocol-Version {version[:40]!r}; "
                                    f"supported: {', '.join(SUPPORTED_VERSIONS)}"), 400)
        session = mcp_session(request)
        if isinstance(session, Response):
            return session
        batch = isinstance(msg, list)
        messages = msg if batch else [msg]
        if not messages:
            return _reply(rpc_error(None, INVALID_REQUEST, "Invalid Request: empty batch"), 400)
        replies: list[dict[str, Any]] = []
        reply: dict[str, Any] | None
        headers: dict[str, str] = {}
        for m in messages:
            if isinstance(m, dict) and m.get("method") == "initialize" and "id" in m and not batch:
                reply, sid = await shielded(functools.partial(_initialize, m, request))
                if sid is not None:
                    headers[SESSION_HEADER] = sid
            else:
                reply = await shielded(functools.partial(handler.call, m, session, request.query_params))
            if reply is not None:
                replies.append(reply)
        if not replies:
            return Response(status_code=202)
        return ok(replies if batch else replies[0], headers=headers)

    async def _initialize(msg: dict[str, Any], request: Request) -> tuple[dict[str, Any], str | None]:
        """A new MCP session: an env session whose episode starts now."""
        params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
        try:
            s = await service.create(env_id)
        except Exception as e:
            err = error_of(e)
            return rpc_error(msg["id"], SERVER_ERROR, err.message, {"type": err.kind}), None
        try:
            result = await handler.initialize(s, params or {}, request.query_params)
        except Exception as e:
            await service.close(s)
            err = error_of(e)
            return rpc_error(msg["id"], SERVER_ERROR, err.message, {"type": err.kind}), None
        return rpc_ok(msg["id"], result), s.id

    @router.delete("/mcp")
    async def mcp_delete(request: Request) -> Response:
        session = mcp_session(request)
        if isinstance(session, Response):
            return session
        if session is None:
            return _reply(rpc_error(None, INVALID_REQUEST, "send the Mcp-Session-Id header of the session to end"), 400)
        await shielded(lambda: service.close(session))
        return Response(status_code=204)

    return router

"""WebSocket routes for one served env: OpenEnv's ``/ws`` session protocol and MCP over ``WS /mcp``.

Each connection is one session (created when it opens, closed when it ends). On ``/ws`` a message is
``{"type": "reset" | "step" | "state" | "close" | "mcp", "data": ...}`` (OpenEnv's), plus AgentGym's
``agentgym/expert``, ``agentgym/tasks`` and ``agentgym/spec``; on ``/mcp`` it is an MCP JSON-RPC
message. A malformed message is answered with an error and the connection stays open.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from typing import Any

from fastapi import APIRouter, WebSocket

from agentgym.serve.protocol import MalformedJSON, dumps, loads
from agentgym.serve.routes.common import shielded
from agentgym.serve.routes.mcp import PARSE_ERROR, SERVER_ERROR, McpHandler, rpc_error
from agentgym.serve.service import ServeError, Service, Session, error_of

__all__ = ["websocket_router"]

log = logging.getLogger(__name__)


def _ws_error(err: ServeError, code: str) -> str:
    return json.dumps({"type": "error", "data": {"message": err.message, "code": code, "error_type": err.kind,
                                                 "status": err.status}})


def websocket_router(service: Service, env_id: str) -> APIRouter:
    """``WS /ws`` and ``WS /mcp`` for ``env_id``."""
    router = APIRouter()
    spec = service.specs[env_id]
    mcp = McpHandler(service, env_id)
    max_bytes = service.config.max_request_bytes

    async def message(s: Session, kind: Any, msg: dict[str, Any], ws: WebSocket) -> str | None:
        data: dict[str, Any] = msg["data"] if isinstance(msg.get("data"), dict) else {}
        try:
            if s.closed:
                raise ServeError("SessionNotFound", "the session expired; open a new connection")
            if kind == "reset":
                return dumps({"type": "observation", "data": await service.reset(s, data)}).decode()
            if kind == "step":
                if not isinstance(msg.get("data"), dict):
                    raise ServeError("BadRequest", "step needs data (the action object)")
                out = await service.step(s, msg["data"], msg.get("request_id"))
                return '{"type":"observation","data":' + out.decode() + "}"
            if kind == "state":
                return json.dumps({"type": "state", "data": s.state()})
            if kind == "mcp":
                return dumps({"type": "mcp", "data": await mcp.call(data, s, ws.query_params)}).decode()
            if kind == "agentgym/expert":
                return dumps({"type": "agentgym/expert", "data": await service.expert(s)}).decode()
            if kind == "agentgym/tasks":
                tasks = await service.tasks(env_id, str(data.get("split") or spec["default_split"]))
                return '{"type":"agentgym/tasks","data":' + tasks.decode() + "}"
            if kind == "agentgym/spec":
                return dumps({"type": "agentgym/spec", "data": service.spec_body(env_id)}).decode()
            return _ws_error(ServeError("BadRequest", f"Unknown message type: {str(kind)[:40]}"), "UNKNOWN_TYPE")
        except Exception as e:
            err = error_of(e)
            code = "VALIDATION_ERROR" if err.status in (400, 403, 413) else "EXECUTION_ERROR"
            return _ws_error(err, code)

    async def loop(ws: WebSocket, mcp_only: bool) -> None:
        await ws.accept()
        try:
            s = await service.create(env_id)
        except Exception as e:
            err = error_of(e)
            code = "CAPACITY_REACHED" if err.kind == "AtCapacity" else "FACTORY_ERROR"
            with contextlib.suppress(Exception):
                if mcp_only:
                    await ws.send_text(json.dumps(rpc_error(None, SERVER_ERROR, err.message, {"type": err.kind})))
                else:
                    await ws.send_text(_ws_error(err, code))
                await ws.close()
            return
        try:
            while True:
                raw = await ws.receive_text()
                if len(raw) > max_bytes:
                    await ws.send_text(_ws_error(ServeError("PayloadTooLarge", f"message over {max_bytes} bytes"),
                                                 "VALIDATION_ERROR"))
                    continue
                try:
                    msg = loads(raw)
                except MalformedJSON as e:
                    if mcp_only:
                        await ws.send_text(json.dumps(rpc_error(None, PARSE_ERROR, f"Parse error: {e}")))
                    else:
                        await ws.send_text(_ws_error(ServeError("BadRequest", f"Invalid JSON: {e}"), "INVALID_JSON"))
                    continue
                if mcp_only:
                    reply = await shielded(functools.partial(mcp.call, msg, s, ws.query_params))
                    if reply is not None:
                        await ws.send_text(dumps(reply).decode())
                    continue
                if not isinstance(msg, dict):
                    await ws.send_text(_ws_error(ServeError("BadRequest", "a message must be a JSON object"),
                                                 "VALIDATION_ERROR"))
                    continue
                kind = msg.get("type")
                if kind == "close":
                    break
                out = await message(s, kind, msg, ws)
                if out is not None:
                    await ws.send_text(out)
        except Exception as e:  # WebSocketDisconnect, or a send to a closed socket: the client is gone
            log.debug("websocket session %s ended: %s", s.id[:8], type(e).__name__)
        finally:
            await service.close(s)
            with contextlib.suppress(Exception):
                await ws.close()

    @router.websocket("/ws")
    async def ws_env(ws: WebSocket) -> None:
        await loop(ws, mcp_only=False)

    @router.websocket("/mcp")
    async def ws_mcp(ws: WebSocket) -> None:
        await loop(ws, mcp_only=True)

    return router

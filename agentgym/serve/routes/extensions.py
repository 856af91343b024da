"""AgentGym's additions under ``/agentgym/`` for one served env: what ``RemoteEnv`` needs beyond OpenEnv.

==================================  ==========================================================
``GET  /agentgym/spec``             tools, parser, splits, limits
``GET  /agentgym/tasks``            ``?split=``: the split's task ids (``--task-data`` adds gold data)
``POST /agentgym/sessions``         create a session (``{"env_kwargs": {...}, "request_id": "..."}``) -> ``{"session_id", "spec"}``;
                                    a retry with the same ``request_id`` gets the same session
``DELETE /agentgym/sessions/{id}``  close it
``GET  /agentgym/expert``           ``?session_id=``: the env expert's next action (off with ``--no-expert``)
==================================  ==========================================================
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from agentgym.serve.routes.common import guarded, json_body, ok
from agentgym.serve.service import ServeError, Service

__all__ = ["extensions_router"]


def extensions_router(service: Service, env_id: str, *, in_schema: bool = True) -> APIRouter:
    """AgentGym's extension routes for ``env_id``."""
    router = APIRouter(prefix="/agentgym", include_in_schema=in_schema)
    spec = service.specs[env_id]

    @router.get("/spec")
    async def get_spec() -> Response:
        return ok(service.spec_body(env_id))

    @router.get("/tasks")
    async def get_tasks(split: str | None = None) -> Response:
        return await guarded(lambda: service.tasks(env_id, split or spec["default_split"]))

    @router.post("/sessions")
    async def new_session(request: Request) -> Response:
        async def go() -> Any:
            body = await json_body(request)
            kw = body.get("env_kwargs") or {}
            if not isinstance(kw, dict):
                raise ServeError("BadRequest", "env_kwargs must be an object")
            s = await service.create(env_id, kw, body.get("request_id"))
            return {"session_id": s.id, "spec": service.spec_body(env_id)}

        return await guarded(go)

    @router.delete("/sessions/{sid}")
    async def del_session(sid: str) -> Response:
        async def go() -> Any:
            s = service.sessions.get(sid)
            if s is not None and s.env_id == env_id:
                await service.close(s)
            return {"session_id": sid, "closed": True}

        return await guarded(go)

    @router.get("/expert")
    async def get_expert(session_id: str | None = None) -> Response:
        return await guarded(lambda: service.expert(service.get(session_id, env_id)))

    return router

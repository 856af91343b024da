"""OpenEnv's HTTP API for one served env: ``/health``, ``/metadata``, ``/schema``, ``/reset``,
``/step``, ``/state``.

``/reset`` and ``/step`` are stateless without a ``session_id``, as in OpenEnv: a fresh env serves
the one call and is closed (a stateless ``/step`` resets the fresh env with the body's ``seed``,
``task_id``, ``split``, ``index`` and ``options`` first, so it is a one-step episode). With a
``session_id`` (``POST /agentgym/sessions``) they drive that session.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

import agentgym
from agentgym.serve.protocol import AgentAction, AgentObservation, AgentState
from agentgym.serve.routes.common import fail, guarded, json_body, ok
from agentgym.serve.service import ServeError, Service

__all__ = ["openenv_router"]

_SCHEMA = {"action": AgentAction.model_json_schema(), "observation": AgentObservation.model_json_schema(),
           "state": AgentState.model_json_schema()}


def openenv_router(service: Service, env_id: str, *, in_schema: bool = True) -> APIRouter:
    """OpenEnv's HTTP routes for ``env_id``."""
    router = APIRouter(include_in_schema=in_schema)
    spec = service.specs[env_id]

    @router.get("/health")
    async def health() -> Response:
        return ok({"status": "healthy"})

    @router.get("/metadata")
    async def metadata() -> Response:
        return ok({"name": env_id, "description": spec["description"] or env_id, "readme_content": None,
                   "version": agentgym.__version__, "author": "AgentGym", "documentation_url": None})

    @router.get("/schema")
    async def get_schema() -> Response:
        return ok(_SCHEMA)

    @router.post("/reset")
    async def reset(request: Request) -> Response:
        async def go() -> Any:
            body = await json_body(request)
            sid = body.get("session_id")
            if sid is None:  # OpenEnv's stateless reset: a fresh env, reset, closed
                s = await service.create(env_id)
                try:
                    return await service.reset(s, body)
                finally:
                    await service.close(s)
            return await service.reset(service.get(sid, env_id), body)

        return await guarded(go)

    @router.post("/step")
    async def step(request: Request) -> Response:
        async def go() -> Any:
            body = await json_body(request)
            sid = body.get("session_id")
            if sid is None:  # OpenEnv's stateless step: a one-step episode on a fresh env
                return await service.one_step_episode(env_id, body)
            return await service.step(service.get(sid, env_id), body.get("action"), body.get("request_id"))

        return await guarded(go)

    @router.get("/state")
    async def state(session_id: str | None = None) -> Response:
        if session_id is None:
            return ok({"episode_id": None, "step_count": 0, "env_id": env_id, "status": "new"})
        try:
            return ok(service.get(session_id, env_id).state())
        except ServeError as e:
            return fail(e)

    return router

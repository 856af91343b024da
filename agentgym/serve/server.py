"""``agentgym serve``: every registered env over HTTP, WebSocket and MCP, in OpenEnv's protocol.

One process serves one or more env ids. Each is reachable at ``/envs/<Name-vN>/...``; the first is
also served at the root, so an OpenEnv client pointed at ``http://host:port`` just works. Per env:

==========================  ============================================================================
``GET  /health``            ``{"status": "healthy"}`` (no token needed)
``GET  /metadata``          OpenEnv's EnvironmentMetadata
``GET  /schema``            JSON schemas of the action, observation and state
``POST /reset``             OpenEnv's reset; with ``session_id`` in the body it resets that session
``POST /step``              OpenEnv's step; with ``session_id`` it steps that session (``request_id``
                            makes a retry safe); without, a one-step episode on a fresh env
``GET  /state``             OpenEnv's State of ``?session_id=``
``WS   /ws``                OpenEnv's session protocol (reset/step/state/close/mcp messages), one
                            session per connection
``POST /mcp``               MCP over streamable HTTP: the MCP lifecycle (``initialize``,
                            ``Mcp-Session-Id``, tools, the task as a resource and a prompt) and
                            OpenEnv's ``openenv/session/create`` / ``openenv/session/close``
``WS   /mcp``               MCP JSON-RPC over a WebSocket (one session per connection)
``POST /agentgym/sessions`` create a session (``{"env_kwargs": {...}, "request_id": "..."}``) -> ``{"session_id", "spec"}``
                            (a retry with the same ``request_id`` gets the same session)
``DELETE /agentgym/sessions/{id}``  close it
``GET  /agentgym/spec``     tools, parser, splits, limits (what ``RemoteEnv`` needs)
``GET  /agentgym/tasks``    ``?split=``: the split's task ids (``--task-data`` adds gold data)
``GET  /agentgym/expert``   ``?session_id=``: the env expert's next action (off with ``--no-expert``)
==========================  ============================================================================

The routes live in :mod:`agentgym.serve.routes` (one router per protocol), the sessions and env calls
in :mod:`agentgym.serve.service`, who may call in :mod:`agentgym.serve.guard`, and the connection
bounds in :mod:`agentgym.serve.runner`.

Safety: the token is full trust (sessions on every served env, and the expert's moves unless
``--no-expert``). Without one only a loopback address may be bound, and browsers are kept out by the
``Origin``/``Host`` checks; see :mod:`agentgym.serve.guard`. Requests and WebSocket messages are
size-limited; an action longer than ``max_action_chars`` is answered with an error observation (bad
agent output is never an exception). Sessions are capped globally and expire when idle; every env call
runs in a worker thread under a deadline (a session whose env call times out is discarded). Errors are
structured (:mod:`agentgym.serve.protocol`) and never carry a traceback. Connections are capped and
timed out (:mod:`agentgym.serve.runner`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

import agentgym
from agentgym.errors import EnvError
from agentgym.serve import runner
from agentgym.serve.config import ServeConfig
from agentgym.serve.guard import Guard
from agentgym.serve.protocol import is_loopback
from agentgym.serve.routes.extensions import extensions_router
from agentgym.serve.routes.mcp import mcp_router
from agentgym.serve.routes.openenv import openenv_router
from agentgym.serve.routes.websocket import websocket_router
from agentgym.serve.service import ServeError, Service

__all__ = ["EnvServer", "ServeConfig", "ServeError", "create_app", "serve"]


def create_app(config: ServeConfig) -> Any:
    """The ASGI app serving ``config.env_ids`` (behind the :class:`~agentgym.serve.guard.Guard`).

    The service is reachable as ``app.service``.
    """
    service = Service(config)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        await service.startup()
        try:
            yield
        finally:
            await service.shutdown()

    app = FastAPI(title="AgentGym env server", version=agentgym.__version__, lifespan=lifespan,
                  description="AgentGym envs in the OpenEnv protocol (HTTP, WebSocket, MCP), with AgentGym's "
                              "extensions under /agentgym/.")
    app.state.service = service
    public = set()
    for i, env_id in enumerate(service.ids):
        prefixes = ["/envs/" + env_id.removeprefix("agentgym/")] + ([""] if i == 0 else [])
        for prefix in prefixes:
            in_schema = not prefix
            app.include_router(openenv_router(service, env_id, in_schema=in_schema), prefix=prefix)
            app.include_router(extensions_router(service, env_id, in_schema=in_schema), prefix=prefix)
            app.include_router(mcp_router(service, env_id, in_schema=in_schema), prefix=prefix)
            app.include_router(websocket_router(service, env_id), prefix=prefix)
            public.add(prefix + "/health")
    guarded = Guard(app, config.token, config.max_request_bytes, public_paths=public,
                    loopback_only=is_loopback(config.host), allowed_origins=config.allowed_origins,
                    allowed_hosts=config.allowed_hosts)
    guarded.service = service  # type: ignore[attr-defined]
    return guarded


def _uvicorn_kw(config: ServeConfig) -> dict[str, Any]:
    return {"ws": "websockets-sansio", "ws_max_size": config.max_request_bytes}


def serve(config: ServeConfig, app: Any = None) -> None:
    """Run the server in the foreground (``agentgym serve``); ``app``: one :func:`create_app` built."""
    config.validate()
    runner.run(app if app is not None else create_app(config), host=config.host, port=config.port,
               limits=config.connections, **_uvicorn_kw(config))


class EnvServer(runner.ServerThread):
    """Run ``agentgym serve`` in a background thread (tests, benchmarks, notebooks)::

        with EnvServer(["agentgym/Demo-v0"]) as srv:
            env = RemoteEnv(srv.url)

    The port is chosen by the OS unless given. Other :class:`ServeConfig` fields pass as keywords.
    """

    def __init__(self, env_ids: list[str] | str, *, host: str = "127.0.0.1", port: int = 0,
                 startup_timeout_s: float = 30.0, **config: Any) -> None:
        ids = [env_ids] if isinstance(env_ids, str) else list(env_ids)
        self.config = ServeConfig(ids, host=host, port=port, **config)
        self.config.validate()
        super().__init__(create_app(self.config), host=host, port=port, limits=self.config.connections,
                         startup_timeout_s=startup_timeout_s, name="agentgym-serve", **_uvicorn_kw(self.config))

    @property
    def service(self) -> Service:
        return self.app.service  # type: ignore[no-any-return]

    def start(self) -> EnvServer:
        try:
            super().start()
        except TimeoutError as e:
            raise EnvError(str(e)) from None
        return self

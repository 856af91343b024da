"""``agentgym serve ENV_ID [ENV_ID ...]``: serve envs over HTTP/WebSocket/MCP in the OpenEnv protocol.

Not to be confused with ``agentgym serve-retriever`` (Search-R1's ``/retrieve`` for a search index).
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer

__all__ = ["parse_env_kwargs", "register"]


def parse_env_kwargs(pairs: list[str] | None) -> dict[str, dict[str, Any]]:
    """``--kw`` values: ``key=value`` for every served env, ``ENV:key=value`` for one (``ENV`` is a full
    or short id). Values are JSON where they parse (numbers, bools, lists), else strings."""
    out: dict[str, dict[str, Any]] = {}
    for p in pairs or []:
        lhs, eq, raw = p.partition("=")
        if not eq or not lhs:
            raise typer.BadParameter(f"expected key=value or ENV:key=value, got {p!r}")
        env, colon, key = lhs.rpartition(":")
        if not key or (colon and not env):
            raise typer.BadParameter(f"expected key=value or ENV:key=value, got {p!r}")
        try:
            value: Any = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON (or an absurd number): the string itself
            value = raw
        out.setdefault(env if colon else "*", {})[key] = value
    return out


def serve_cmd(
    env_ids: Annotated[list[str], typer.Argument(help="Env ids to serve (the first is also served at the root).")],
    host: Annotated[str, typer.Option(help="Interface to bind. A non-loopback address needs --token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port.")] = 8000,
    token: Annotated[str | None, typer.Option(help="Bearer token clients must send (default: $AGENTGYM_TOKEN). "
                                              "Whoever holds it has full trust.")] = None,
    max_sessions: Annotated[int, typer.Option(help="Sessions open at once, all envs together.")] = 256,
    idle_timeout: Annotated[float, typer.Option(help="Close a session idle this many seconds.")] = 600.0,
    step_timeout: Annotated[float, typer.Option(help="Deadline of one env reset/step; the session is closed past it.")] = 300.0,
    max_request_bytes: Annotated[int, typer.Option(help="Largest request body / WebSocket message.")] = 4 * 2**20,
    max_action_chars: Annotated[int, typer.Option(help="Longest action; longer ones get an error observation.")] = 256 * 1024,
    workers: Annotated[int, typer.Option(help="Threads running env calls.")] = 32,
    kw: Annotated[list[str] | None, typer.Option("--kw", help="Env kwarg: key=value for every served env, "
                                                 "ENV:key=value for one (repeatable).")] = None,
    client_kwargs: Annotated[str, typer.Option(help="Env kwargs clients may set per session (comma-separated).")] = "parser,format_penalty",
    task_data: Annotated[bool, typer.Option("--task-data/--no-task-data", help="Send tasks' data (gold answers) with /agentgym/tasks.")] = False,
    expert: Annotated[bool, typer.Option("--expert/--no-expert", help="Serve the env's expert moves "
                                         "(/agentgym/expert). Turn off when agents under evaluation hold the token.")] = True,
    allow_origin: Annotated[list[str] | None, typer.Option("--allow-origin", help="A browser origin allowed to call "
                                                           "besides loopback ones, e.g. https://app.example ('*': any; repeatable).")] = None,
    allow_host: Annotated[list[str] | None, typer.Option("--allow-host", help="A Host name allowed besides loopback "
                                                         "ones on a loopback-bound server (repeatable).")] = None,
    max_connections: Annotated[int, typer.Option(help="Connections open at once; beyond it the oldest idle one is closed.")] = 2048,
    header_timeout: Annotated[float, typer.Option(help="Seconds a client has to send a request's headers.")] = 10.0,
    connection_idle_timeout: Annotated[float, typer.Option(help="Close an idle keep-alive connection after this many seconds.")] = 5.0,
) -> None:
    """Serve registered envs so OpenEnv clients, MCP clients, RemoteEnv and other machines can use them."""
    from rich.console import Console

    from agentgym.errors import AgentGymError
    from agentgym.serve import runner
    from agentgym.serve.server import ServeConfig, create_app, serve

    console = Console(stderr=True)
    try:
        config = ServeConfig(
            env_ids=list(env_ids), host=host, port=port,
            token=token if token is not None else os.environ.get("AGENTGYM_TOKEN") or None,
            max_sessions=max_sessions, idle_timeout_s=idle_timeout, step_timeout_s=step_timeout,
            max_request_bytes=max_request_bytes, max_action_chars=max_action_chars, workers=workers,
            env_kwargs=parse_env_kwargs(kw), client_kwargs=tuple(k.strip() for k in client_kwargs.split(",") if k.strip()),
            task_data=task_data, expert=expert, allowed_origins=tuple(allow_origin or ()),
            allowed_hosts=tuple(allow_host or ()),
            connections=runner.ConnectionLimits(max_connections=max_connections, header_timeout_s=header_timeout,
                                                idle_timeout_s=connection_idle_timeout))
        config.validate()
        app = create_app(config)
    except AgentGymError as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(2) from None
    service = app.service
    shown = host if ":" not in host else f"[{host}]"
    for i, env_id in enumerate(service.ids):
        path = "" if i == 0 else "/envs/" + env_id.removeprefix("agentgym/")
        console.print(f"[green]serving[/] {env_id} at http://{shown}:{port}{path}  (ws: /ws, mcp: /mcp)", highlight=False)
    if config.token is None:
        console.print("[yellow]no token[/]: any local process can use these envs (browsers are refused)", highlight=False)
    serve(config, app)


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the main app."""
    app.command("serve")(serve_cmd)

"""``agentgym serve ENV_ID [ENV_ID ...]``: serve envs over HTTP/WebSocket/MCP in the OpenEnv protocol.

Not to be confused with ``agentgym serve-retriever`` (Search-R1's ``/retrieve`` for a search index).
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

__all__ = ["register"]


def serve_cmd(
    env_ids: Annotated[list[str], typer.Argument(help="Env ids to serve (the first is also served at the root).")],
    host: Annotated[str, typer.Option(help="Interface to bind. A non-loopback address needs --token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port.")] = 8000,
    token: Annotated[str | None, typer.Option(help="Bearer token clients must send (default: $AGENTGYM_TOKEN).")] = None,
    max_sessions: Annotated[int, typer.Option(help="Sessions open at once, all envs together.")] = 256,
    idle_timeout: Annotated[float, typer.Option(help="Close a session idle this many seconds.")] = 600.0,
    step_timeout: Annotated[float, typer.Option(help="Deadline of one env reset/step; the session is closed past it.")] = 300.0,
    max_request_bytes: Annotated[int, typer.Option(help="Largest request body / WebSocket message.")] = 4 * 2**20,
    max_action_chars: Annotated[int, typer.Option(help="Longest action; longer ones get an error observation.")] = 256 * 1024,
    workers: Annotated[int, typer.Option(help="Threads running env calls.")] = 32,
    kw: Annotated[list[str] | None, typer.Option("--kw", help="Env kwarg key=value for every served env (repeatable).")] = None,
    client_kwargs: Annotated[str, typer.Option(help="Env kwargs clients may set per session (comma-separated).")] = "parser,format_penalty",
    task_data: Annotated[bool, typer.Option("--task-data/--no-task-data", help="Send tasks' data (gold answers) with /agentgym/tasks.")] = False,
) -> None:
    """Serve registered envs so OpenEnv clients, RemoteEnv and other machines can use them."""
    from rich.console import Console

    from agentgym.cli import _parse_kwargs
    from agentgym.errors import AgentGymError
    from agentgym.serve.server import ServeConfig, create_app

    console = Console(stderr=True)
    config = ServeConfig(
        env_ids=list(env_ids), host=host, port=port, token=token if token is not None else os.environ.get("AGENTGYM_TOKEN") or None,
        max_sessions=max_sessions, idle_timeout_s=idle_timeout, step_timeout_s=step_timeout,
        max_request_bytes=max_request_bytes, max_action_chars=max_action_chars, workers=workers,
        env_kwargs=_parse_kwargs(kw), client_kwargs=tuple(k.strip() for k in client_kwargs.split(",") if k.strip()),
        task_data=task_data)
    try:
        config.validate()
        app = create_app(config)
    except AgentGymError as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(2) from None
    import uvicorn

    from agentgym.serve.server import _uvicorn_config

    service = app.service
    shown = host if ":" not in host else f"[{host}]"
    for i, env_id in enumerate(service.ids):
        path = "" if i == 0 else "/envs/" + env_id.removeprefix("agentgym/")
        console.print(f"[green]serving[/] {env_id} at http://{shown}:{port}{path}  (ws: /ws, mcp: /mcp)", highlight=False)
    if config.token is None:
        console.print("[yellow]no token[/]: any local process can use these envs", highlight=False)
    uvicorn.Server(_uvicorn_config(app, config, host=host, port=port)).run()


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the main app."""
    app.command("serve")(serve_cmd)

"""``agentgym serve-policy SPEC [SPEC ...]``: rollout policies behind an OpenAI-compatible endpoint.

Agents written against the OpenAI API (the ``openai`` client, the Agents SDK, LangGraph, Agent
Lightning agents) point their ``base_url`` at ``http://HOST:PORT/rollout/ROLLOUT_ID/v1`` and every
request of that rollout is recorded token-exactly; ``--out`` appends each finished rollout
(``POST /rollout/ID/finish``, idle expiry, or shutdown) as a trajectory, ready for SFT or inspection.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

__all__ = ["register"]


def serve_policy_cmd(
    specs: Annotated[list[str], typer.Argument(help="Policies: [NAME=]SPEC, e.g. hf:smollm2-135m-instruct or "
                                               "small=vllm:PATH (NAME is the model name clients send).")],
    host: Annotated[str, typer.Option(help="Interface to bind. A non-loopback address needs --token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port.")] = 8010,
    token: Annotated[str | None, typer.Option(help="Bearer token clients send as their API key (default: "
                                              "$AGENTGYM_TOKEN). Whoever holds it has full trust.")] = None,
    parser: Annotated[str, typer.Option(help="How completions become tool calls: hermes, json or react.")] = "hermes",
    max_tokens: Annotated[int, typer.Option(help="Completion tokens when a request names none.")] = 512,
    max_tokens_cap: Annotated[int, typer.Option(help="The most completion tokens a request may get.")] = 4096,
    temperature: Annotated[float, typer.Option(help="Temperature when a request names none.")] = 1.0,
    request_timeout: Annotated[float, typer.Option(help="Deadline of one generation, seconds (504 past it).")] = 600.0,
    max_rollouts: Annotated[int, typer.Option(help="Rollouts open at once.")] = 4096,
    max_requests_per_rollout: Annotated[int, typer.Option(help="Model calls one rollout may make.")] = 1024,
    rollout_idle_timeout: Annotated[float, typer.Option(help="Close a rollout idle this many seconds.")] = 3600.0,
    out: Annotated[str | None, typer.Option(help="Append every finished rollout to this JSONL file.")] = None,
    max_request_bytes: Annotated[int, typer.Option(help="Largest request body.")] = 8 * 2**20,
    allow_origin: Annotated[list[str] | None, typer.Option("--allow-origin", help="A browser origin allowed besides "
                                                           "loopback ones (repeatable).")] = None,
    allow_host: Annotated[list[str] | None, typer.Option("--allow-host", help="A Host name allowed besides loopback "
                                                         "ones on a loopback-bound server (repeatable).")] = None,
    max_connections: Annotated[int, typer.Option(help="Connections open at once.")] = 2048,
    header_timeout: Annotated[float, typer.Option(help="Seconds a client has to send a request's headers.")] = 10.0,
    connection_idle_timeout: Annotated[float, typer.Option(help="Close an idle keep-alive connection after "
                                                           "this many seconds.")] = 5.0,
) -> None:
    """Serve rollout policies over OpenAI's API, recording each rollout's token-exact trace."""
    import asyncio

    from rich.console import Console

    from agentgym.errors import AgentGymError
    from agentgym.harness.endpoint import PolicyEndpoint, Rollout
    from agentgym.harness.server import create_app
    from agentgym.policies import from_spec
    from agentgym.policy import capabilities_of
    from agentgym.rollout.jsonl import append_jsonl
    from agentgym.serve import runner
    from agentgym.serve.protocol import is_loopback

    console = Console(stderr=True)
    token = token if token is not None else os.environ.get("AGENTGYM_TOKEN") or None
    policies = {}
    try:
        if token is not None and not token:
            raise typer.BadParameter("--token is empty")
        if not is_loopback(host) and not token:
            raise typer.BadParameter(f"refusing to serve the policies on {host!r} without a token: anyone who can "
                                     "reach it could generate and post rewards. Pass --token, or bind 127.0.0.1.")
        for item in specs:
            name, eq, spec = item.partition("=")
            if not eq or "://" in name or ":" in name:
                name, spec = "", item
            policy = from_spec(spec, **({"policy_id": name} if name else {}))
            if capabilities_of(policy).env_side:
                raise typer.BadParameter(f"{item!r} acts through an env; serve a model policy")
            if policy.policy_id in policies:
                raise typer.BadParameter(f"two policies are named {policy.policy_id!r}: give each a NAME=")
            policies[policy.policy_id] = policy

        def write(r: Rollout) -> None:
            if out is not None and r.trace.num_turns:
                append_jsonl(out, [r.trajectory()])

        endpoint = PolicyEndpoint(policies, parser=parser, max_tokens=max_tokens, max_tokens_cap=max_tokens_cap,
                                  temperature=temperature, request_timeout_s=request_timeout, auto_rollouts=True,
                                  max_rollouts=max_rollouts, max_requests_per_rollout=max_requests_per_rollout,
                                  rollout_idle_s=rollout_idle_timeout, on_close=write)
        app = create_app(endpoint, token=token, max_request_bytes=max_request_bytes, loopback_only=is_loopback(host),
                         allowed_origins=tuple(allow_origin or ()), allowed_hosts=tuple(allow_host or ()))
        limits = runner.ConnectionLimits(max_connections=max_connections, header_timeout_s=header_timeout,
                                         idle_timeout_s=connection_idle_timeout)
    except AgentGymError as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(2) from None
    shown = host if ":" not in host else f"[{host}]"
    console.print(f"[green]serving[/] {', '.join(policies)} at http://{shown}:{port}/rollout/ROLLOUT_ID/v1 "
                  f"(unrecorded: /v1; Agent Lightning: /proxy/rollout/ID/attempt/A/mode/train/openai/v1)",
                  highlight=False)
    if token is None:
        console.print("[yellow]no token[/]: any local process can use these policies (browsers are refused)",
                      highlight=False)
    try:
        runner.run(app, host=host, port=port, limits=limits)
    finally:
        endpoint.close_all()

        async def close() -> None:
            for p in policies.values():
                await p.aclose()

        asyncio.run(close())


def register(app: typer.Typer) -> None:
    """Add ``serve-policy`` to the main app."""
    app.command("serve-policy")(serve_policy_cmd)

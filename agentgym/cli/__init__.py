"""The ``agentgym`` command line (typer + rich).

Core commands live here: ``list``, ``check``, ``play`` and ``--version``. Other subcommands are
registered by the modules in :data:`SUBCOMMAND_MODULES`, each defining ``register(app)``; heavy
imports happen inside the command functions so ``agentgym --help`` stays fast.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Annotated, Any

import typer

from agentgym import __version__
from agentgym.cli.common import fail, key_values
from agentgym.errors import ConfigurationError

__all__ = ["app", "main"]

SUBCOMMAND_MODULES: list[str] = [
    "agentgym.cli.models",
    "agentgym.cli.eval",
    "agentgym.cli.retriever",
    "agentgym.cli.serve",
    "agentgym.cli.serve_policy",
    "agentgym.cli.train",
    "agentgym.cli.view",
]

app = typer.Typer(
    name="agentgym",
    help="Multi-turn agent environments for training and evaluating tool-calling LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"agentgym {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")] = False,
) -> None:
    """AgentGym command line."""


def _parse_kwargs(pairs: list[str] | None) -> dict[str, Any]:
    """``key=value`` pairs of a command-line option (:func:`agentgym.cli.common.key_values`)."""
    try:
        return key_values(pairs or [])
    except ConfigurationError as e:
        raise typer.BadParameter(str(e)) from None


@app.command("list")
def list_cmd(
    counts: Annotated[bool, typer.Option("--counts/--no-counts", help="Build each env to count tools and tasks.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List every registered env: id, family, tools, splits and task counts."""
    from rich.console import Console
    from rich.table import Table

    import agentgym

    rows = []
    for entry in agentgym.list_envs():
        row: dict[str, Any] = {"id": entry.id, "family": entry.family, "tools": "", "splits": "", "status": "ok",
                               "description": entry.description, "plugin": entry.plugin}
        if counts:
            try:
                env = agentgym.make(entry.id)
                base: Any = env.unwrapped
                row["tools"] = ", ".join(base.tools.names) if len(base.tools) else f"(text, {base.parser.name})"
                row["splits"] = ", ".join(f"{s}:{len(base.tasks(s))}" for s in base.splits)
                env.close()
            except Exception as e:  # a missing extra or path: show why instead of failing the listing
                row["status"] = f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"
        rows.append(row)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"AgentGym envs ({len(rows)})")
    for col in ("id", "family", "tools", "splits (tasks)", "notes"):
        table.add_column(col, overflow="fold")
    for r in rows:
        note = r["description"] if r["status"] == "ok" else f"[yellow]{r['status']}[/]"
        if r["plugin"]:
            note = f"[plugin {r['plugin']}] {note}"
        table.add_row(r["id"], r["family"], r["tools"], r["splits"], note)
    Console().print(table)


@app.command("check")
def check_cmd(
    env_id: Annotated[str, typer.Argument(help="Env id, e.g. agentgym/SQL-v0 (the prefix may be omitted).")],
    kw: Annotated[list[str] | None, typer.Option("--kw", help="Env kwarg key=value (repeatable).")] = None,
) -> None:
    """Run the env checker (gymnasium's check_env plus the LLM checks). Exit status 1 when a check fails."""
    import agentgym
    from agentgym.checker import CheckFailed
    from agentgym.errors import AgentGymError

    try:
        env = agentgym.make(env_id, **_parse_kwargs(kw))
    except AgentGymError as e:
        fail(str(e))
    try:
        report = agentgym.check_env(env)
    except CheckFailed as e:
        typer.echo(str(e.report) if e.report is not None else str(e))
        fail(f"{len(e.report.failed) if e.report is not None else 1} check(s) failed.", 1)
    finally:
        env.close()
    typer.echo(str(report))


@app.command("play")
def play_cmd(
    env_id: Annotated[str, typer.Argument(help="Env id, e.g. agentgym/ALFWorld-v0.")],
    seed: Annotated[int, typer.Option(help="Seed for the task draw.")] = 0,
    task_id: Annotated[str | None, typer.Option(help="Play this task instead of a seeded draw.")] = None,
    split: Annotated[str | None, typer.Option(help="Split to draw from.")] = None,
    kw: Annotated[list[str] | None, typer.Option("--kw", help="Env kwarg key=value (repeatable).")] = None,
) -> None:
    """Play an env by hand: type actions, see observations, reward and admissible actions.

    Type a raw action (a command, or a <tool_call>...</tool_call> block), or `/call NAME {json}` to call
    a tool, `/expert` for the expert's move, `/tools`, `/help`, or `/quit`. Ends at EOF.
    """
    from rich.console import Console
    from rich.panel import Panel

    import agentgym
    from agentgym.errors import AgentGymError

    console = Console(highlight=False)
    try:
        env = agentgym.make(env_id, **_parse_kwargs(kw))
        options: dict[str, Any] = {}
        if task_id:
            options["task_id"] = task_id
        if split:
            options["split"] = split
        obs, info = env.reset(seed=seed, options=options or None)
    except AgentGymError as e:
        fail(str(e))
        return
    base: Any = env.unwrapped

    def show(messages: list[Any], info: dict[str, Any]) -> None:
        for m in messages:
            console.print(Panel(m["content"], title=m["role"] + (f" ({m['name']})" if m.get("name") else ""),
                                title_align="left", expand=False))
        adm = info.get("admissible_actions")
        if adm:
            console.print("[dim]admissible:[/] " + " | ".join(adm[:40]) + (" ..." if len(adm) > 40 else ""))
        if info.get("parse_error"):
            console.print(f"[yellow]parse error:[/] {info['parse_error']}")

    console.print(f"[bold]{env_id}[/] task [cyan]{info.get('task_id')}[/]  (type /help for commands)")
    show(obs, info)
    total = 0.0
    steps = 0
    while True:
        console.print("[bold green]>[/] ", end="")
        line = sys.stdin.readline()
        if not line:
            console.print("\n(end of input)")
            break
        action: Any = line.rstrip("\n")
        if action.strip() in ("/quit", "/exit"):
            break
        if action.strip() == "/help":
            console.print("/call NAME {json}  call a tool | /expert  the expert's move | /tools | /quit")
            continue
        if action.strip() == "/tools":
            for t in base.tools:
                console.print(f"[cyan]{t.name}[/]: {json.dumps(t.parameters.get('properties', {}))}")
            continue
        if action.strip() == "/expert":
            action = base.expert_action()
            if action is None:
                console.print("[yellow]this env has no expert[/]")
                continue
            console.print(f"[dim]expert:[/] {action if isinstance(action, str) else json.dumps(action)}")
        elif action.startswith("/call "):
            parts = action[6:].strip().split(" ", 1)
            try:
                args = json.loads(parts[1]) if len(parts) > 1 else {}
            except json.JSONDecodeError as e:
                console.print(f"[red]bad JSON arguments:[/] {e}")
                continue
            action = {"role": "assistant", "content": "",
                      "tool_calls": [{"id": "call_0", "name": parts[0], "arguments": args}]}
        obs, reward, terminated, truncated, info = env.step(action)
        steps += 1
        total += float(reward)
        show(obs, info)
        console.print(f"[dim]reward {reward:g} (total {total:g}), step {steps}[/]")
        if terminated or truncated:
            why = "terminated" if terminated else "truncated"
            console.print(f"[bold]episode {why}[/]: success={info.get('success', False)} total reward={total:g}")
            break
    env.close()


def _load_subcommands() -> None:
    for name in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # not written yet / removed: the rest of the CLI still works
                continue
            raise
        mod.register(app)


_load_subcommands()


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()

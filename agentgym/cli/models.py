"""``agentgym models``: list and prepare the offline models."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["register"]

models_app = typer.Typer(help="List and prepare models (the default offline model needs no network).", no_args_is_help=True)


@models_app.command("list")
def list_cmd() -> None:
    """Show the known models, where they live and whether they are prepared."""
    from rich.console import Console
    from rich.table import Table

    from agentgym.policies.models import list_models

    table = Table(title="AgentGym models")
    table.add_column("name", no_wrap=True)
    table.add_column("prepared")
    table.add_column("path", overflow="fold")
    table.add_column("source", overflow="fold")
    for m in list_models():
        table.add_row(m["name"], m["prepared"], m["path"], m["source"])
    Console().print(table)


@models_app.command("prepare")
def prepare_cmd(
    name: Annotated[str, typer.Argument(help="Model to prepare, e.g. smollm2-135m-instruct.")] = "smollm2-135m-instruct",
    force: Annotated[bool, typer.Option("--force", help="Convert again even if already prepared.")] = False,
) -> None:
    """Convert a packaged GGUF model into a safetensors folder in the cache (once)."""
    from rich.console import Console

    from agentgym.errors import AgentGymError
    from agentgym.policies.models import prepare_model

    console = Console(stderr=True)
    try:
        path = prepare_model(name, force=force, progress=lambda msg: console.print(f"[cyan]{msg}[/]"))
    except AgentGymError as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(1) from e
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    """Add ``agentgym models`` to the main app."""
    app.add_typer(models_app, name="models")

"""``agentgym view RUN [RUN ...]``: read eval and training runs in the browser (or ``--export DIR``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register"]


def _browser_available() -> bool:
    """A graphical browser can be opened: never a terminal browser taking over the terminal."""
    import sys

    if sys.platform.startswith("linux") or "bsd" in sys.platform:
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


def view_cmd(
    runs: Annotated[list[Path], typer.Argument(help="Run folders (agentgym eval --out, agentgym train), trajectory "
                                                    ".jsonl files, or folders holding runs.")],
    export: Annotated[Path | None, typer.Option("--export", help="Write the viewer as static files to this folder "
                                                                 "instead of serving it.")] = None,
    host: Annotated[str, typer.Option(help="Interface to bind. A non-loopback address needs --token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port (0: a free one).")] = 0,
    token: Annotated[str | None, typer.Option(help="Token the browser must present (default: $AGENTGYM_TOKEN); "
                                                   "the printed URL carries it.")] = None,
    browser: Annotated[bool, typer.Option("--browser/--no-browser", help="Open the page in a browser when one "
                                                                         "is available.")] = True,
) -> None:
    """Read eval and training runs in the browser: summaries, episodes as chats, comparisons, curves, groups."""
    from rich.console import Console

    from agentgym.errors import ConfigurationError
    from agentgym.view import Site, ViewServer, export_site

    console = Console(stderr=True, highlight=False)
    try:
        site = Site(runs)
        if export is not None:
            index = export_site(site, export)
            console.print(f"[green]wrote[/] {index} ({len(site.runs)} runs): open it in a browser; the folder "
                          "can be shared as it is", soft_wrap=True)
            return
        server = ViewServer(site, host=host, port=port,
                            token=token if token is not None else os.environ.get("AGENTGYM_TOKEN") or None)
    except ConfigurationError as e:
        console.print(f"[bold red]error:[/] {e}")
        raise typer.Exit(2) from None
    for run in site.runs:
        if run.parent is None:
            console.print(f"  {run.kind:<8} {run.name}" + (f"  ({len(run.children)} eval stages)" if run.children else ""))
    console.print(f"[green]agentgym view[/] at {server.url}  (Ctrl-C to stop)", soft_wrap=True)
    if browser and _browser_available():
        import contextlib
        import webbrowser

        with contextlib.suppress(webbrowser.Error):
            webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def register(app: typer.Typer) -> None:
    """Add ``view`` to the main app."""
    app.command("view")(view_cmd)

"""What every ``agentgym`` subcommand shares: ``key=value`` arguments and the error exit."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NoReturn

import typer

from agentgym.errors import ConfigurationError

__all__ = ["fail", "key_values"]


def key_values(pairs: Iterable[str]) -> dict[str, Any]:
    """``["key=value", ...]`` as a dict; values are parsed as JSON where possible (numbers, bools, lists).

    Raises:
        ConfigurationError: an item has no ``=`` or no key.
    """
    out: dict[str, Any] = {}
    for p in pairs:
        key, sep, raw = str(p).partition("=")
        if not sep or not key:
            raise ConfigurationError(f"expected key=value, got {p!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def fail(msg: str, code: int = 2) -> NoReturn:
    """Print ``error: msg`` to stderr and exit with ``code`` (2: bad arguments)."""
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code)

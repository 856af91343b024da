"""@tool schemas and ToolSet dispatch: validation errors, timeouts and exceptions are results."""

from __future__ import annotations

import threading
import time
from typing import Literal

import pytest

from agentgym.errors import ConfigurationError
from agentgym.tools import ToolSet, parse_google_docstring, tool

RELEASE = threading.Event()  # a hanging tool call returns only when the test sets this


@tool(timeout_s=2.0)
def slow(seconds: float) -> str:
    """Sleep, or hang until released (``seconds < 0``).

    Args:
        seconds: How long.
    """
    if seconds < 0:
        RELEASE.wait(600)
    else:
        time.sleep(seconds)
    return "done"


@tool
def lookup(name: str, mode: Literal["exact", "fuzzy"] = "exact", limit: int = 3) -> dict[str, object]:
    """Look a name up in the directory.

    Longer description line.

    Args:
        name: The name to find.
            Continued description.
        mode: How to match.
        limit (int): At most this many.

    Returns:
        A record.
    """
    if name == "boom":
        raise ValueError("no such person")
    return {"name": name, "mode": mode, "limit": limit}


def test_schema_from_signature_and_docstring() -> None:
    spec = ToolSet([lookup]).specs()[0]
    fn = spec["function"]
    assert spec["type"] == "function" and fn["name"] == "lookup"
    assert fn["description"].startswith("Look a name up in the directory.")
    assert "Returns: A record." in fn["description"]
    props = fn["parameters"]["properties"]
    assert props["name"] == {"type": "string", "description": "The name to find. Continued description."}
    assert props["mode"]["enum"] == ["exact", "fuzzy"] and props["mode"]["default"] == "exact"
    assert props["limit"]["type"] == "integer"
    assert fn["parameters"]["required"] == ["name"]


def test_docstring_parser() -> None:
    summary, args, returns = parse_google_docstring(lookup.__doc__)
    assert summary.startswith("Look a name up") and set(args) == {"name", "mode", "limit"}
    assert returns == "A record."


def test_dispatch_ok_and_errors() -> None:
    ts = ToolSet([lookup, slow])
    r = ts.call({"id": "1", "name": "lookup", "arguments": {"name": "ada", "limit": "2"}})
    assert r.ok and r.value == {"name": "ada", "mode": "exact", "limit": 2}
    assert '"ada"' in r.content
    r = ts.call({"id": "1", "name": "lookup", "arguments": {"limit": 2}})
    assert not r.ok and r.error_kind == "bad_arguments" and "name" in r.content
    r = ts.call({"id": "1", "name": "lookup", "arguments": {"name": "x", "mode": "other"}})
    assert not r.ok and r.error_kind == "bad_arguments"
    r = ts.call({"id": "1", "name": "lookup", "arguments": {"name": "x", "extra": 1}})
    assert not r.ok and "extra" in r.content
    r = ts.call({"id": "1", "name": "lookup", "arguments": {"name": "boom"}})
    assert not r.ok and r.error_kind == "exception" and "no such person" in r.content
    r = ts.call({"id": "1", "name": "nope", "arguments": {}})
    assert not r.ok and r.error_kind == "unknown_tool" and "lookup" in r.content
    r = ts.call({"id": "1", "name": "lookup", "arguments": "x"})  # type: ignore[typeddict-item]
    assert not r.ok and r.error_kind == "bad_arguments"


def test_timeout_returns_an_observation() -> None:
    ts = ToolSet([slow])
    try:  # the call hangs until released: returning at all is the deadline at work
        r = ts.call({"id": "1", "name": "slow", "arguments": {"seconds": -1}})
        assert not r.ok and r.error_kind == "timeout" and "timed out after 2 s" in r.content
    finally:
        RELEASE.set()
    assert ts.call({"id": "1", "name": "slow", "arguments": {"seconds": 0}}).ok


def test_methods_bind_and_duplicates() -> None:
    class Box:
        def __init__(self) -> None:
            self.items: list[str] = []

        @tool
        def put(self, item: str) -> str:
            """Put an item in the box.

            Args:
                item: What.
            """
            self.items.append(item)
            return f"{len(self.items)} items"

    box = Box()
    ts = ToolSet.from_object(box)
    assert ts.names == ["put"]
    assert ts.call({"id": "1", "name": "put", "arguments": {"item": "a"}}).content == "1 items"
    assert box.items == ["a"]
    with pytest.raises(ConfigurationError, match="Duplicate"):
        ToolSet([lookup, lookup])
    with pytest.raises(ConfigurationError, match="Invalid tool name"):
        tool(name="bad name")(lambda: None)

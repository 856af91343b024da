"""Typed tools: ``@tool`` derives an OpenAI function schema from a signature and docstring.

Example::

    class MyEnv(AgentEnv):
        @tool(timeout_s=5)
        def search(self, query: str, k: int = 3) -> str:
            '''Search the corpus.

            Args:
                query: What to look for.
                k: How many passages to return.
            '''

``ToolSet.from_object(env)`` collects the decorated methods, bound to the env. ``ToolSet.call``
never raises for the agent's mistakes: an unknown tool, invalid arguments, a timeout or an
exception inside the tool all come back as a :class:`ToolResult` with ``ok=False`` and a message
for the agent.
"""

from __future__ import annotations

import inspect
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, get_type_hints

import pydantic

from agentgym.errors import ConfigurationError, EnvError
from agentgym.types import ToolCall, ToolSpec

__all__ = ["Tool", "ToolResult", "ToolSet", "check_arguments", "parse_google_docstring", "tool"]

_TOOL_ATTR = "__agentgym_tool__"
MAX_TOOL_OUTPUT_CHARS = 100_000
MAX_ARGUMENT_DEPTH = 64
MAX_INT_DIGITS = 4300  # Python's default int <-> str conversion limit (sys.get_int_max_str_digits)
_INT_LIMIT = 10**MAX_INT_DIGITS


def check_arguments(args: Any) -> str | None:
    """Why ``args`` is not a plain JSON object a tool can take, or ``None`` if it is.

    Tool arguments must be JSON values: objects with string keys, arrays, strings, booleans,
    ``null``, floats, and integers of at most 4,300 digits (a longer one cannot even be printed by
    Python without raising, so it would crash whatever logs or renders the call). Nesting is capped.
    """
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    stack: list[tuple[Any, int]] = [(args, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_ARGUMENT_DEPTH:
            return f"arguments are nested more than {MAX_ARGUMENT_DEPTH} levels deep"
        if isinstance(v, bool) or v is None or isinstance(v, (str, float)):
            continue
        if isinstance(v, int):
            if not -_INT_LIMIT < v < _INT_LIMIT:
                return f"an argument holds an integer with more than {MAX_INT_DIGITS} digits"
            continue
        if isinstance(v, dict):
            for k, x in v.items():
                if not isinstance(k, str):
                    return "argument object keys must be strings"
                stack.append((x, depth + 1))
            continue
        if isinstance(v, (list, tuple)):
            stack.extend((x, depth + 1) for x in v)
            continue
        return f"arguments must be JSON values, not {type(v).__name__}"
    return None


def parse_google_docstring(doc: str | None) -> tuple[str, dict[str, str], str]:
    """Split a Google-style docstring into (summary, {arg: description}, returns)."""
    if not doc:
        return "", {}, ""
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    returns: list[str] = []
    section = "summary"
    current: str | None = None
    for raw in lines:
        line = raw.rstrip()
        header = line.strip().rstrip(":").lower()
        if line.strip().endswith(":") and header in {"args", "arguments", "parameters"}:
            section, current = "args", None
            continue
        if line.strip().endswith(":") and header in {"returns", "return"}:
            section = "returns"
            continue
        if line.strip().endswith(":") and header in {"raises", "example", "examples", "note", "notes", "yields"}:
            section = "other"
            continue
        if section == "summary":
            summary.append(line.strip())
        elif section == "args":
            m = re.match(r"^\s{0,8}(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", line)
            if m and (len(line) - len(line.lstrip())) <= 4:
                current = m.group(1).lstrip("*")
                args[current] = m.group(3).strip()
            elif current and line.strip():
                args[current] = (args[current] + " " + line.strip()).strip()
        elif section == "returns" and line.strip():
            returns.append(line.strip())
    text = "\n".join(summary).strip()
    text = re.sub(r"\n{2,}", "\n\n", text)
    return text, args, " ".join(returns)


def _strip_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


@dataclass
class Tool:
    """A callable with a JSON schema. Build with :func:`tool`; bind methods with :meth:`bind`."""

    name: str
    description: str
    fn: Callable[..., Any]
    args_model: type[pydantic.BaseModel]
    parameters: dict[str, Any]
    timeout_s: float | None = None
    param_names: list[str] = field(default_factory=list)

    @property
    def spec(self) -> ToolSpec:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @property
    def primary_param(self) -> str | None:
        """The first parameter: where a ReAct-style ``name[arg]`` argument goes."""
        return self.param_names[0] if self.param_names else None

    def bind(self, obj: Any) -> Tool:
        return Tool(
            name=self.name,
            description=self.description,
            fn=self.fn.__get__(obj, type(obj)),
            args_model=self.args_model,
            parameters=self.parameters,
            timeout_s=self.timeout_s,
            param_names=self.param_names,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _build_tool(fn: Callable[..., Any], name: str | None, description: str | None, timeout_s: float | None) -> Tool:
    sig = inspect.signature(fn)
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolvable forward refs: fall back to raw annotations
        hints = {}
    summary, arg_docs, returns = parse_google_docstring(fn.__doc__)
    fields: dict[str, Any] = {}
    names: list[str] = []
    for pname, p in sig.parameters.items():
        if pname in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = hints.get(pname, p.annotation if p.annotation is not inspect.Parameter.empty else Any)
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[pname] = (ann, pydantic.Field(default, description=arg_docs.get(pname) or None))
        names.append(pname)
    tool_name = name or fn.__name__
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}", tool_name):
        raise ConfigurationError(f"Invalid tool name {tool_name!r}: use letters, digits, '_' or '-'.")
    model = pydantic.create_model(  # type: ignore[call-overload]
        f"{tool_name}_args", __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )
    params = _strip_titles(model.model_json_schema())
    params.setdefault("properties", {})
    params.setdefault("required", [])
    params.pop("additionalProperties", None)
    desc = description or summary or tool_name
    if returns and description is None:
        desc = f"{desc}\n\nReturns: {returns}"
    return Tool(tool_name, desc, fn, model, params, timeout_s, names)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
) -> Any:
    """Mark a function or method as a tool.

    Args:
        fn: The function (when used as a bare ``@tool``).
        name: Tool name; defaults to the function name.
        description: Overrides the docstring summary.
        timeout_s: Per-call deadline. ``None`` runs the call inline (fastest). With a deadline the call
            runs in a worker thread; on expiry the agent gets a timeout observation. Tools that can
            block should also enforce their own deadline (sqlite progress handler, sandbox timeout).
    """

    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        t = _build_tool(f, name, description, timeout_s)
        setattr(f, _TOOL_ATTR, t)
        return f

    return deco(fn) if fn is not None else deco


@dataclass
class ToolResult:
    """The outcome of one tool call. ``content`` is what the agent sees."""

    name: str
    content: str
    ok: bool = True
    error_kind: str | None = None  # unknown_tool | bad_arguments | timeout | exception
    value: Any = None
    duration_s: float = 0.0


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif value is None:
        text = ""
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = str(value)
    if len(text) > MAX_TOOL_OUTPUT_CHARS:
        text = text[:MAX_TOOL_OUTPUT_CHARS] + f"\n[output truncated to {MAX_TOOL_OUTPUT_CHARS} characters]"
    return text


def _format_validation_error(tool_name: str, err: pydantic.ValidationError) -> str:
    parts = []
    for e in err.errors()[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ())) or "(arguments)"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return f"Error: invalid arguments for {tool_name}: " + "; ".join(parts)


class ToolSet:
    """An ordered collection of tools, dispatched by name with validation and optional timeouts."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    @classmethod
    def from_object(cls, obj: Any) -> ToolSet:
        """Collect ``@tool`` methods of ``obj`` (in definition order, base classes first), bound to it."""
        klass_of = type(obj)
        order: list[str] = []
        for klass in reversed(klass_of.__mro__):
            for attr in vars(klass):
                resolved = getattr(klass_of, attr, None)
                if attr not in order and isinstance(getattr(resolved, _TOOL_ATTR, None), Tool):
                    order.append(attr)
        ts = cls()
        for attr in order:
            ts.add(getattr(getattr(klass_of, attr), _TOOL_ATTR).bind(obj))
        return ts

    def add(self, t: Tool | Callable[..., Any]) -> None:
        if not isinstance(t, Tool):
            t = getattr(t, _TOOL_ATTR, None) or _build_tool(t, None, None, None)
        if t.name in self._tools:
            raise ConfigurationError(f"Duplicate tool name {t.name!r}.")
        self._tools[t.name] = t

    def remove(self, name: str) -> None:
        self._tools.pop(name, None)

    def subset(self, names: Iterable[str]) -> ToolSet:
        return ToolSet(self._tools[n] for n in names if n in self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def call(self, call: ToolCall) -> ToolResult:
        """Run one call. Never raises for the agent's mistakes; raises only for a broken env."""
        name = call.get("name", "")
        t = self._tools.get(name) if isinstance(name, str) else None
        if t is None:
            known = ", ".join(self._tools) or "(none)"
            return ToolResult(str(name), f"Error: unknown tool {name!r}. Available tools: {known}.", False, "unknown_tool")
        args = call.get("arguments")
        problem = check_arguments(args)
        if problem is not None:
            return ToolResult(name, f"Error: invalid arguments for {name}: {problem}.", False, "bad_arguments")
        try:
            validated = t.args_model.model_validate(args)
        except pydantic.ValidationError as e:
            return ToolResult(name, _format_validation_error(name, e), False, "bad_arguments")
        kwargs = {k: getattr(validated, k) for k in t.param_names}
        start = time.perf_counter()
        if t.timeout_s is None:
            return self._invoke(t, kwargs, start)
        box: list[ToolResult] = []
        worker = threading.Thread(target=lambda: box.append(self._invoke(t, kwargs, start)), daemon=True)
        worker.start()
        worker.join(t.timeout_s)
        if not box:
            return ToolResult(
                name, f"Error: {name} timed out after {t.timeout_s:g} s.", False, "timeout",
                duration_s=time.perf_counter() - start,
            )
        return box[0]

    @staticmethod
    def _invoke(t: Tool, kwargs: dict[str, Any], start: float) -> ToolResult:
        try:
            value = t.fn(**kwargs)
        except EnvError:
            raise
        except Exception as e:  # the tool failed on the agent's input: an observation, not a crash
            return ToolResult(t.name, f"Error: {type(e).__name__}: {e}", False, "exception",
                              duration_s=time.perf_counter() - start)
        return ToolResult(t.name, _to_text(value), True, None, value, time.perf_counter() - start)

"""Action parsers: turn an assistant's output into tool calls or a plain-text command.

Three parsers ship, behind one :class:`ActionParser` protocol:

* ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks in the text
  (Qwen/Hermes/SmolLM2 style).
* ``json``: the structured ``tool_calls`` of OpenAI-compatible APIs (an assistant ``Message``),
  or a bare JSON object/array of ``{"name", "arguments"}`` in the text.
* ``react``: ``Action: name[arg]`` (a tool call) or a plain-text command (``Action: go to desk 1``,
  or just ``go to desk 1``), as in ALFWorld and ReAct prompts.

Parsers never raise. Anything they cannot make sense of comes back with ``error`` set, which the
env turns into an observation for the agent and ``info["parse_error"]``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentgym.errors import ConfigurationError
from agentgym.tools import ToolSet, check_arguments
from agentgym.types import Message, ToolCall

__all__ = [
    "ActionParser",
    "HermesParser",
    "JSONParser",
    "ParsedAction",
    "ReActParser",
    "get_parser",
    "list_parsers",
]

MAX_ACTION_CHARS = 200_000
_MAX_CALLS = 16


@dataclass
class ParsedAction:
    """The result of parsing one action.

    Attributes:
        text: The assistant's text content (tool-call markup included).
        tool_calls: Parsed calls (arguments already dicts).
        command: A plain-text command (react parser), or ``None``.
        error: Why parsing failed, for the agent to read; ``None`` on success.
        message: The assistant message to append to the history.
    """

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    command: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def message(self) -> Message:
        msg: Message = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = list(self.tool_calls)
        return msg


@runtime_checkable
class ActionParser(Protocol):
    """Turns an action (raw text or an assistant message) into a :class:`ParsedAction`."""

    name: str

    def parse(self, action: Any, tools: ToolSet | None = None) -> ParsedAction: ...

    def format_instructions(self, tools: ToolSet) -> str:
        """A short description of the expected format, for system prompts and error messages."""
        ...


def _action_text(action: Any) -> tuple[str, list[Any] | None, str | None]:
    """Return (text, raw structured tool_calls or None, error) for any action value."""
    if isinstance(action, str):
        return action, None, None
    if isinstance(action, dict):
        content = action.get("content")
        text = content if isinstance(content, str) else ""
        if content is not None and not isinstance(content, str):
            return "", None, "assistant message content must be a string"
        raw = action.get("tool_calls")
        if raw is not None and not isinstance(raw, list):
            return text, None, "tool_calls must be a list"
        return text, raw, None
    return "", None, f"actions must be a string or an assistant message, got {type(action).__name__}"


def _normalise_call(obj: Any, index: int, tools: ToolSet | None) -> tuple[ToolCall | None, str | None]:
    """Accept ``{"name", "arguments"}`` or OpenAI's ``{"id", "type", "function": {...}}``."""
    if not isinstance(obj, dict):
        return None, f"tool call #{index + 1} must be a JSON object with 'name' and 'arguments'"
    call_id: str = obj["id"] if isinstance(obj.get("id"), str) else f"call_{index}"
    fn: dict[str, Any] = obj["function"] if isinstance(obj.get("function"), dict) else obj
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        return None, f"tool call #{index + 1} has no 'name' string"
    args: Any = fn.get("arguments", fn.get("parameters", {}))
    if isinstance(args, str):
        args, jerr = _loads(args) if args.strip() else ({}, None)
        if jerr:
            return None, f"arguments of {name} are not valid JSON ({jerr})"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, f"arguments of {name} must be a JSON object"
    problem = check_arguments(args)
    if problem is not None:
        return None, f"invalid arguments for {name}: {problem}"
    if tools is not None and name not in tools:
        known = ", ".join(tools.names) or "(none)"
        return None, f"unknown tool {name!r}; available tools: {known}"
    call: ToolCall = {"id": call_id, "name": name, "arguments": args}
    return call, None


def _loads(text: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, f"invalid JSON ({e.msg} at position {e.pos})"
    except RecursionError:
        return None, "invalid JSON (nested too deeply)"
    except ValueError as e:  # e.g. an integer literal longer than Python's int conversion limit
        return None, f"invalid JSON ({str(e).split(';')[0]})"


def _structured(raw: list[Any], text: str, tools: ToolSet | None) -> ParsedAction:
    calls: list[ToolCall] = []
    for i, obj in enumerate(raw[:_MAX_CALLS]):
        call, err = _normalise_call(obj, i, tools)
        if err:
            return ParsedAction(text, error=err)
        assert call is not None
        calls.append(call)
    if len(raw) > _MAX_CALLS:
        return ParsedAction(text, error=f"too many tool calls in one turn (at most {_MAX_CALLS})")
    return ParsedAction(text, calls)


def _too_long(text: str) -> ParsedAction | None:
    if len(text) > MAX_ACTION_CHARS:
        return ParsedAction(text[:1000], error=f"the action is too long ({len(text)} characters; at most {MAX_ACTION_CHARS})")
    return None


def _common(action: Any, tools: ToolSet | None) -> tuple[str, ParsedAction | None]:
    """What every parser does first: reject non-text, take structured calls, cap the length."""
    text, raw, err = _action_text(action)
    if err:
        return text, ParsedAction(text, error=err)
    if raw:
        return text, _structured(raw, text, tools)
    return text, _too_long(text)


class HermesParser:
    """``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks."""

    name = "hermes"
    _BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, action: Any, tools: ToolSet | None = None) -> ParsedAction:
        text, done = _common(action, tools)
        if done is not None:
            return done
        opens = text.count("<tool_call>")
        if opens == 0:
            if "</tool_call>" in text:
                return ParsedAction(text, error="found </tool_call> without a matching <tool_call>")
            return ParsedAction(text)
        bodies = self._BLOCK.findall(text)
        if len(bodies) != opens or text.count("</tool_call>") != opens:
            return ParsedAction(text, error="unbalanced <tool_call> tags: each call must be <tool_call>{...}</tool_call>")
        objs: list[Any] = []
        for body in bodies:
            obj, jerr = _loads(body.strip())
            if jerr:
                return ParsedAction(text, error=f"the tool call is not valid JSON: {jerr}")
            objs.append(obj)
        return _structured(objs, text, tools)

    def format_instructions(self, tools: ToolSet) -> str:
        return (
            "To call a tool, write <tool_call>{\"name\": TOOL_NAME, \"arguments\": {...}}</tool_call>. "
            f"Available tools: {', '.join(tools.names)}."
        )


class JSONParser:
    """OpenAI-style structured ``tool_calls``, or a JSON object/array of calls in the text."""

    name = "json"

    def parse(self, action: Any, tools: ToolSet | None = None) -> ParsedAction:
        text, done = _common(action, tools)
        if done is not None:
            return done
        body = text.strip()
        fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.DOTALL)
        if fence:
            body = fence.group(1)
        if not body.startswith(("{", "[")):
            return ParsedAction(text)  # plain text, no tool call
        obj, jerr = _loads(body)
        if jerr:
            return ParsedAction(text, error=f"the tool call is not valid JSON: {jerr}")
        if isinstance(obj, dict) and isinstance(obj.get("tool_calls"), list):
            obj = obj["tool_calls"]
        return _structured(obj if isinstance(obj, list) else [obj], text, tools)

    def format_instructions(self, tools: ToolSet) -> str:
        return f"Call tools through the API's tool_calls field. Available tools: {', '.join(tools.names)}."


class ReActParser:
    """``Action: name[arg]`` tool calls and plain-text commands."""

    name = "react"
    _ACTION = re.compile(r"^\s*Action\s*(?:\d+)?\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)
    _CALL = re.compile(r"^([A-Za-z_][\w\-]*)\[(.*)\]$", re.DOTALL)
    _STOP = re.compile(r"^\s*(Observation|Thought)\s*\d*\s*:", re.IGNORECASE | re.MULTILINE)

    def parse(self, action: Any, tools: ToolSet | None = None) -> ParsedAction:
        text, done = _common(action, tools)
        if done is not None:
            return done
        last = None
        if ":" in text:  # cheap pre-check before the multiline regex
            for last in self._ACTION.finditer(text):  # noqa: B007 (we want the last match)
                pass
        if last is not None:
            # Everything after the last "Action:" up to the next ReAct keyword line.
            rest = text[last.start(1):]
            stop = self._STOP.search(rest)
            cmd = (rest[: stop.start()] if stop else rest).strip()
        else:
            stripped = text.strip()
            cmd = stripped.split("\n", 1)[0].strip() if stripped else ""
        cmd = cmd.lstrip(">").strip().strip("`").strip()
        m = self._CALL.match(cmd) if cmd.endswith("]") else None
        if m and tools is not None and m.group(1) in tools:
            name, arg = m.group(1), m.group(2).strip()
            param = tools[name].primary_param
            args: dict[str, Any] = {param: arg} if param else {}
            return ParsedAction(text, [{"id": "call_0", "name": name, "arguments": args}])
        if m and tools is not None and len(tools):
            # name[...] that names no tool: a mistake the agent should hear about.
            known = ", ".join(tools.names)
            return ParsedAction(text, error=f"unknown tool {m.group(1)!r}; available tools: {known}")
        return ParsedAction(text, command=cmd)

    def format_instructions(self, tools: ToolSet) -> str:
        if len(tools):
            return f"Write 'Action: TOOL_NAME[argument]'. Available tools: {', '.join(tools.names)}."
        return "Write one command per turn, e.g. 'Action: look'."


_PARSERS: dict[str, type] = {"hermes": HermesParser, "json": JSONParser, "react": ReActParser}


def list_parsers() -> list[str]:
    return sorted(_PARSERS)


def get_parser(spec: str | ActionParser) -> ActionParser:
    """Return a parser by name (``hermes``, ``json``, ``react``) or pass an instance through."""
    if not isinstance(spec, str):
        if not isinstance(spec, ActionParser):
            raise ConfigurationError(f"{spec!r} is not an ActionParser (needs .name and .parse()).")
        return spec
    try:
        return _PARSERS[spec]()  # type: ignore[no-any-return]
    except KeyError:
        raise ConfigurationError(f"Unknown parser {spec!r}; choose one of {', '.join(list_parsers())}.") from None

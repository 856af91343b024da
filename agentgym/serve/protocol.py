"""The wire format of ``agentgym serve``: OpenEnv's HTTP/WebSocket/MCP shapes, extended compatibly.

An AgentGym env served over the network speaks OpenEnv (``openenv-core``): its clients need nothing
else. What OpenEnv has no slot for lives in fields and endpoints its clients never send or read.

**Actions** (the ``action`` of ``POST /step`` and the ``data`` of a WebSocket ``step`` message)::

    {"type": "message", "message": "<assistant text>" | {"role": "assistant", "content": ..., "tool_calls": [...]}}
    {"type": "call_tool", "tool_name": "guess", "arguments": {"n": 3}}      # OpenEnv's MCP CallToolAction
    {"type": "list_tools"}                                                  # OpenEnv's MCP ListToolsAction
    {"message": "go to cabinet 1"}                                          # "type" defaults to "message"

**Observations** (``{"observation": ..., "reward": float | None, "done": bool}``, as OpenEnv)::

    {"messages": [<new chat messages>], "info": {<the env's info dict>},
     "terminated": bool, "truncated": bool}
    # a call_tool step adds OpenEnv's CallToolObservation fields:
    #   "tool_name", "result" (an MCP CallToolResult: content, structured_content, data, is_error), "error"
    # a list_tools step is {"tools": [{"name", "description", "input_schema"}]} (the episode does not advance)

``done`` is ``terminated or truncated``; the two stay distinct in the observation.

**Errors** are ``{"detail": {"type": <agentgym.errors class name>, "message": ...}}`` with an HTTP
status (WebSocket: ``{"type": "error", "data": {"message", "code", "error_type"}}``); the client maps
``type`` back onto :mod:`agentgym.errors`. Tracebacks never leave the server.

See ``README.md`` ("Env services") for every endpoint and the full OpenEnv mapping.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentgym.errors import (
    AgentGymError,
    ConfigurationError,
    EnvError,
    EnvServerAtCapacity,
    EnvServerError,
    ResetNeeded,
    TaskNotFound,
    ValidationError,
)
from agentgym.types import TaskSpec

__all__ = [
    "ERROR_STATUS",
    "PROTOCOL",
    "AgentAction",
    "AgentObservation",
    "AgentState",
    "MalformedJSON",
    "dumps",
    "error_from_body",
    "is_loopback",
    "loads",
    "task_from_wire",
    "task_to_wire",
]

PROTOCOL = "agentgym-openenv/1"


# ---------------------------------------------------------------------------------------------------------
# /schema models (the hot path parses dicts by hand; these document the shapes and are tested against them)
class AgentAction(BaseModel):
    """One assistant turn, in OpenEnv's action envelope.

    ``message`` is the schema's one required field, so a client that maps a plain-text reply onto the
    action's required field (verifiers' OpenEnv taskset does) sends ``{"message": text}``; the MCP
    actions (``call_tool``, ``list_tools``) leave it out, and the server reads them by ``type``.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"required": ["message"]})

    type: Literal["message", "call_tool", "list_tools"] = Field(
        default="message", description="message: an assistant turn; call_tool/list_tools: OpenEnv MCP actions")
    message: Any = Field(default=None, description="The assistant's raw text, or an assistant message with tool_calls")
    tool_name: str | None = Field(default=None, description="call_tool: the tool to call")
    arguments: dict[str, Any] = Field(default_factory=dict, description="call_tool: the tool's arguments")
    metadata: dict[str, Any] = Field(default_factory=dict, description="OpenEnv's action metadata (ignored)")


class AgentObservation(BaseModel):
    """What one reset/step returns inside OpenEnv's ``observation``."""

    model_config = ConfigDict(extra="allow")

    messages: list[dict[str, Any]] = Field(default_factory=list, description="Only the new chat messages")
    info: dict[str, Any] = Field(default_factory=dict, description="task_id, tools, parser, tool_calls, metrics, success...")
    terminated: bool = Field(default=False, description="The task ended (solved, failed or answered)")
    truncated: bool = Field(default=False, description="A limit was hit (turns, time)")
    metadata: dict[str, Any] = Field(default_factory=dict, description="OpenEnv's observation metadata; on reset "
                                     "the task prompt as text (prompt) and its task_id")


class AgentState(BaseModel):
    """``GET /state``: OpenEnv's State plus the session's episode bookkeeping."""

    model_config = ConfigDict(extra="allow")

    episode_id: str | None = None
    step_count: int = 0
    env_id: str | None = None
    task_id: str | None = None
    status: Literal["new", "running", "done"] = "new"
    episodes: int = 0


# ---------------------------------------------------------------------------------------------------------
def _default(o: Any) -> Any:
    if hasattr(o, "item") and callable(o.item):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist") and callable(o.tolist):  # numpy arrays
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if isinstance(o, BaseModel):
        return o.model_dump()
    if isinstance(o, bytes):
        return o.decode("utf-8", errors="replace")
    return str(o)


def dumps(obj: Any) -> bytes:
    """JSON bytes of ``obj``; values JSON cannot hold (numpy, sets, dataclasses) are converted."""
    return json.dumps(obj, default=_default, separators=(",", ":")).encode()


class MalformedJSON(ValueError):
    """Bytes that are not acceptable JSON (see :func:`loads`)."""


def loads(raw: bytes | str) -> Any:
    """``json.loads`` where every way bad input fails raises :class:`MalformedJSON`: bad syntax, bad
    UTF-8, an integer over Python's 4,300-digit limit, nesting deeper than the recursion limit."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise MalformedJSON("JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise MalformedJSON(str(e)[:300]) from None


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def task_to_wire(task: TaskSpec, with_data: bool = False) -> dict[str, Any]:
    d: dict[str, Any] = {"task_id": task.task_id, "split": task.split, "task_type": task.task_type}
    if with_data:
        d["data"] = task.data
    return d


def task_from_wire(d: dict[str, Any]) -> TaskSpec:
    return TaskSpec(str(d["task_id"]), str(d.get("split", "")), str(d.get("task_type", "default")),
                    dict(d.get("data") or {}))


# ---------------------------------------------------------------------------------------------------------
# errors: the server sends the class name, the client raises the class
ERROR_STATUS: dict[str, int] = {
    "BadRequest": 400,
    "ConfigurationError": 400,
    "ValidationError": 400,
    "Unauthorized": 401,
    "Forbidden": 403,
    "UnknownEnvError": 404,
    "SessionNotFound": 404,
    "TaskNotFound": 404,
    "ResetNeeded": 409,
    "PayloadTooLarge": 413,
    "EnvError": 500,
    "InternalError": 500,
    "AtCapacity": 503,
    "EnvTimeout": 504,
}


def error_from_body(status: int, body: Any, where: str) -> AgentGymError:
    """The :mod:`agentgym.errors` exception for an error response (``where``: the URL, for the message)."""
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, dict):
        kind, msg = str(detail.get("type", "")), str(detail.get("message", ""))
    else:
        kind, msg = "", str(detail if detail is not None else body)[:300]
    text = f"{where}: {msg}" if msg else f"{where}: HTTP {status}"
    if kind == "ResetNeeded":
        return ResetNeeded(text)
    if kind == "TaskNotFound":
        return TaskNotFound(text)
    if kind == "ValidationError":
        return ValidationError(text)
    if kind in ("ConfigurationError", "UnknownEnvError", "BadRequest"):
        return ConfigurationError(text)
    if kind == "Unauthorized" or status == 401:
        return ConfigurationError(f"{text} (pass the server's token: RemoteEnv(..., token=...) or AGENTGYM_TOKEN)")
    if kind == "Forbidden" or status == 403:
        return ConfigurationError(text)
    if kind == "EnvTimeout":
        from agentgym.rollout.runtime import EnvTimeout

        return EnvTimeout(text)
    if kind == "SessionNotFound":
        return EnvServerError(f"{text} (the session expired or the server restarted; the episode is lost)",
                              status=status)
    if kind == "AtCapacity":
        return EnvServerAtCapacity(text, status=status)
    if status == 503:
        return EnvServerError(text, status=status, retryable=True)
    if kind == "PayloadTooLarge" or status == 413:
        return EnvServerError(text, status=status)
    if kind == "EnvError":
        return EnvError(text)
    if status >= 500:
        return EnvServerError(text, status=status, retryable=status in (502, 503))
    return EnvServerError(text, status=status)

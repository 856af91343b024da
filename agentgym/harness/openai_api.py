"""The OpenAI wire format the policy endpoint speaks: request validation, message conversion, responses.

Requests are validated with pydantic models that accept OpenAI's optional parameters they do not use
(``stream_options``, ``parallel_tool_calls``, ``user``, ``metadata``...; unknown keys are ignored, as
OpenAI-compatible servers do) and reject what cannot be honoured with an :class:`EndpointError`
(a clear ``4xx`` in OpenAI's ``{"error": {...}}`` shape): ``n > 1``, image parts, malformed
``tool_calls``, out-of-range sampling parameters, too many messages or tools.

Messages become AgentGym :class:`~agentgym.types.Message` dicts (tool-call arguments parsed into
dicts; content parts joined; ``developer`` read as ``system``), rendered with the model's own chat
template. Responses follow OpenAI's ``chat.completion`` / ``chat.completion.chunk`` /
``text_completion`` objects and carry vLLM's ``return_token_ids`` extension fields: top-level
``prompt_token_ids`` (per choice for ``/v1/completions``, as vLLM does), per-choice ``token_ids``,
and ``logprobs`` in OpenAI's shape. An ``agentgym`` object adds the rollout id, the turn's segment
and its weight versions.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from agentgym.errors import AgentGymError
from agentgym.types import Message, ToolCall, ToolSpec

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "EndpointError",
    "Reply",
    "chat_chunks",
    "chat_response",
    "completion_chunks",
    "completion_response",
    "error_body",
    "openai_tool_calls",
    "parse_chat_request",
    "parse_completion_request",
    "to_messages",
    "to_tool_specs",
]

MAX_MESSAGES = 4096
MAX_TOOLS = 256
MAX_STOP = 8


class EndpointError(AgentGymError):
    """A request the endpoint answers with an HTTP error (OpenAI's ``{"error": {...}}`` body).

    Attributes:
        status: HTTP status (400 bad request, 404 unknown model or rollout, 409 conflict, 429 a limit,
            503 not serving).
        kind: OpenAI's error ``type`` (``invalid_request_error``...).
        param: The offending parameter, where one is to blame.
    """

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param
        self.code = code


def error_body(err: EndpointError) -> dict[str, Any]:
    return {"error": {"message": str(err), "type": err.kind, "param": err.param, "code": err.code}}


class _Lenient(BaseModel):
    """OpenAI request objects: unknown keys are ignored (clients send many optional ones)."""

    model_config = ConfigDict(extra="ignore")


class _Function(_Lenient):
    name: str = Field(min_length=1, max_length=256)
    arguments: str | dict[str, Any] = "{}"


class _ToolCallIn(_Lenient):
    id: str | None = Field(default=None, max_length=512)
    type: Literal["function"] = "function"
    function: _Function


class _MessageIn(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[_ToolCallIn] | None = Field(default=None, max_length=64)
    tool_call_id: str | None = Field(default=None, max_length=512)


class _FunctionSpecIn(_Lenient):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _ToolIn(_Lenient):
    type: Literal["function"] = "function"
    function: _FunctionSpecIn


class _SamplingIn(_Lenient):
    model: str = Field(default="", max_length=512)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: bool | int | None = None
    return_token_ids: bool | None = None

    def stop_list(self) -> list[str] | None:
        if self.stop is None:
            return None
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if len(stops) > MAX_STOP:
            raise EndpointError(400, f"at most {MAX_STOP} stop strings", param="stop")
        return [s for s in stops if s] or None

    def token_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.get("include_usage"))


class ChatRequest(_SamplingIn):
    """``POST /v1/chat/completions`` (the fields the endpoint reads)."""

    messages: list[_MessageIn] = Field(min_length=1, max_length=MAX_MESSAGES)
    tools: list[_ToolIn] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | dict[str, Any] | None = None

    def parses_tools(self) -> bool:
        """False when the client asked the model not to call tools (``tool_choice="none"``)."""
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(_SamplingIn):
    """``POST /v1/completions``: one prompt (text or token ids)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    suffix: str | None = None


def _validate(model: type[BaseModel], body: Any) -> Any:
    if not isinstance(body, dict):
        raise EndpointError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise EndpointError(400, f"{e.error_count()} invalid field(s); first: {loc}: {first['msg']}",
                            param=loc or None) from None


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a chat request body (raises :class:`EndpointError` 400)."""
    req: ChatRequest = _validate(ChatRequest, body)
    if req.n != 1:
        raise EndpointError(400, "n must be 1: every sample is its own rollout turn; send one request per sample",
                            param="n")
    req.stop_list()
    return req


def parse_completion_request(body: Any) -> CompletionRequest:
    """Validate a completion request body (raises :class:`EndpointError` 400)."""
    req: CompletionRequest = _validate(CompletionRequest, body)
    if req.n != 1:
        raise EndpointError(400, "n must be 1: send one request per sample", param="n")
    if req.echo or req.suffix:
        raise EndpointError(400, "echo and suffix are not supported", param="echo" if req.echo else "suffix")
    p = req.prompt
    if isinstance(p, list) and p and not isinstance(p[0], int):
        if len(p) != 1:
            raise EndpointError(400, "one prompt per request (batches are not supported)", param="prompt")
        req.prompt = p[0]
    if isinstance(req.prompt, list) and not req.prompt:
        raise EndpointError(400, "the prompt is empty", param="prompt")
    req.stop_list()
    return req


# ---------------------------------------------------------------------------------------- conversion
def _content_text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])
        else:
            raise EndpointError(400, f"{where}: content part of type {kind!r} is not supported (text only)",
                                param=f"{where}.content")
    return "".join(parts)


def _arguments(fn: _Function, where: str) -> dict[str, Any]:
    args = fn.arguments
    if isinstance(args, dict):
        return args
    if not args.strip():
        return {}
    try:
        parsed = json.loads(args)
    except (json.JSONDecodeError, RecursionError, ValueError):
        raise EndpointError(400, f"{where}: arguments of {fn.name!r} are not valid JSON", param=where) from None
    if not isinstance(parsed, dict):
        raise EndpointError(400, f"{where}: arguments of {fn.name!r} must be a JSON object", param=where)
    return parsed


def to_messages(req: ChatRequest) -> list[Message]:
    """The request's messages as AgentGym messages (what the chat template renders)."""
    out: list[Message] = []
    for i, m in enumerate(req.messages):
        where = f"messages.{i}"
        role = "system" if m.role == "developer" else m.role
        msg: Message = {"role": role, "content": _content_text(m.content, where)}  # type: ignore[typeddict-item]
        if m.tool_calls:
            if role != "assistant":
                raise EndpointError(400, f"{where}: only assistant messages carry tool_calls", param=where)
            calls: list[ToolCall] = []
            for j, tc in enumerate(m.tool_calls):
                calls.append({"id": tc.id or f"call_{j}", "name": tc.function.name,
                              "arguments": _arguments(tc.function, f"{where}.tool_calls.{j}")})
            msg["tool_calls"] = calls
        if role == "tool":
            if not m.tool_call_id:
                raise EndpointError(400, f"{where}: a tool message needs tool_call_id", param=where)
            msg["tool_call_id"] = m.tool_call_id
        if m.name is not None and role in ("tool", "user"):
            msg["name"] = m.name
        out.append(msg)
    return out


def to_tool_specs(req: ChatRequest) -> list[ToolSpec] | None:
    """The request's tools as :class:`~agentgym.types.ToolSpec` (``None`` for none)."""
    if not req.tools:
        return None
    specs: list[ToolSpec] = []
    for t in req.tools:
        params = t.function.parameters or {"type": "object", "properties": {}}
        specs.append({"type": "function", "function": {"name": t.function.name,
                                                        "description": t.function.description or "",
                                                        "parameters": params}})
    return specs


def openai_tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """AgentGym tool calls in OpenAI's response shape (``arguments`` a JSON string)."""
    return [{"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
            for c in calls]


# ---------------------------------------------------------------------------------------- responses
@dataclass
class Reply:
    """One answered request, everything a response (streamed or not) is built from.

    Attributes:
        model: The model name answered with.
        text: The whole completion text.
        content: The assistant ``content`` (the text without the tool-call markup; ``None`` if empty
            and there are tool calls).
        tool_calls: Parsed calls (empty: none).
        prompt_ids / token_ids: The prompt the policy saw and the ids it generated.
        logprobs: ``[len(token_ids)]`` behaviour logprobs (empty: the policy reported none).
        tokens: The text of each generated token (for OpenAI's logprobs objects).
        finish_reason: ``stop``, ``length``, ``tool_calls``...
        agentgym: The ``agentgym`` extension object (rollout id, turn, segment, versions).
    """

    model: str
    text: str
    content: str | None
    tool_calls: list[ToolCall]
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    tokens: list[str]
    finish_reason: str
    agentgym: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def usage(self) -> dict[str, int]:
        p, c = len(self.prompt_ids), len(self.token_ids)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def chat_logprobs(self) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
                            for t, lp in zip(self.tokens, self.logprobs, strict=True)]}

    def text_logprobs(self) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        offsets, pos = [], 0
        for t in self.tokens:
            offsets.append(pos)
            pos += len(t)
        return {"tokens": list(self.tokens), "token_logprobs": list(self.logprobs), "top_logprobs": None,
                "text_offset": offsets}

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = openai_tool_calls(self.tool_calls)
        return msg


def chat_response(r: Reply, *, logprobs: bool) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    return {"id": f"chatcmpl-{r.id}", "object": "chat.completion", "created": r.created, "model": r.model,
            "choices": [{"index": 0, "message": r.message(), "logprobs": r.chat_logprobs() if logprobs else None,
                         "finish_reason": r.finish_reason, "token_ids": list(r.token_ids)}],
            "usage": r.usage(), "prompt_token_ids": list(r.prompt_ids), "agentgym": r.agentgym}


def chat_chunks(r: Reply, *, logprobs: bool, include_usage: bool) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed answer (role, content, tool calls, finish)."""
    head = {"id": f"chatcmpl-{r.id}", "object": "chat.completion.chunk", "created": r.created, "model": r.model}
    out: list[dict[str, Any]] = [{**head, "prompt_token_ids": list(r.prompt_ids), "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]}]
    body: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": r.chat_logprobs() if logprobs else None,
                            "finish_reason": None, "token_ids": list(r.token_ids)}
    if r.content:
        body["delta"]["content"] = r.content
    if r.tool_calls:
        body["delta"]["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(openai_tool_calls(r.tool_calls))]
    out.append({**head, "choices": [body]})
    out.append({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": r.finish_reason}],
                "agentgym": r.agentgym})
    if include_usage:
        out.append({**head, "choices": [], "usage": r.usage()})
    return out


def completion_response(r: Reply, *, logprobs: bool) -> dict[str, Any]:
    """A ``text_completion`` object (``prompt_token_ids`` per choice, as vLLM's completions do)."""
    return {"id": f"cmpl-{r.id}", "object": "text_completion", "created": r.created, "model": r.model,
            "choices": [{"index": 0, "text": r.text, "logprobs": r.text_logprobs() if logprobs else None,
                         "finish_reason": r.finish_reason, "token_ids": list(r.token_ids),
                         "prompt_token_ids": list(r.prompt_ids)}],
            "usage": r.usage(), "agentgym": r.agentgym}


def completion_chunks(r: Reply, *, logprobs: bool, include_usage: bool) -> list[dict[str, Any]]:
    head = {"id": f"cmpl-{r.id}", "object": "text_completion", "created": r.created, "model": r.model}
    out: list[dict[str, Any]] = [
        {**head, "choices": [{"index": 0, "text": r.text, "logprobs": r.text_logprobs() if logprobs else None,
                              "finish_reason": None, "token_ids": list(r.token_ids),
                              "prompt_token_ids": list(r.prompt_ids)}]},
        {**head, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": r.finish_reason}],
         "agentgym": r.agentgym}]
    if include_usage:
        out.append({**head, "choices": [], "usage": r.usage()})
    return out

"""``agentgym serve``: every registered env over HTTP, WebSocket and MCP, in OpenEnv's protocol.

One process serves one or more env ids. Each is reachable at ``/envs/<Name-vN>/...``; the first is
also served at the root, so an OpenEnv client pointed at ``http://host:port`` just works. Per env:

==========================  ============================================================================
``GET  /health``            ``{"status": "healthy"}`` (no token needed)
``GET  /metadata``          OpenEnv's EnvironmentMetadata
``GET  /schema``            JSON schemas of the action, observation and state
``POST /reset``             OpenEnv's reset; with ``session_id`` in the body it resets that session
``POST /step``              OpenEnv's step; needs ``session_id``; ``request_id`` makes a retry safe
``GET  /state``             OpenEnv's State of ``?session_id=``
``WS   /ws``                OpenEnv's session protocol (reset/step/state/close/mcp messages), one
                            session per connection
``POST /mcp``               MCP JSON-RPC: ``tools/list``, ``tools/call`` and OpenEnv's
                            ``openenv/session/create`` / ``openenv/session/close``
``WS   /mcp``               MCP JSON-RPC over a WebSocket (one session per connection)
``POST /agentgym/sessions`` create a session (``{"env_kwargs": {...}}``) -> ``{"session_id", "spec"}``
``DELETE /agentgym/sessions/{id}``  close it
``GET  /agentgym/spec``     tools, parser, splits, limits (what ``RemoteEnv`` needs)
``GET  /agentgym/tasks``    ``?split=``: the split's task ids (``--task-data`` adds gold data)
``GET  /agentgym/expert``   ``?session_id=``: the env expert's next action
==========================  ============================================================================

Safety: a bearer token (``Authorization: Bearer T``, or HTTP Basic with the token as password so
OpenEnv's clients can pass it in the URL), compared in constant time; a non-loopback address is
refused without one. Requests and WebSocket messages are size-limited; an action longer than
``max_action_chars`` is answered with an error observation (bad agent output is never an
exception). Sessions are capped globally and expire when idle; every env call runs in a worker
thread under a deadline (a session whose env call times out is discarded). Errors are structured
(:mod:`agentgym.serve.protocol`) and never carry a traceback.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hmac
import itertools
import json
import logging
import secrets
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import Response

import agentgym
from agentgym.errors import (
    AgentGymError,
    ConfigurationError,
    EnvError,
)
from agentgym.serve.protocol import (
    ERROR_STATUS,
    PROTOCOL,
    AgentAction,
    AgentObservation,
    AgentState,
    dumps,
    is_loopback,
    task_to_wire,
)

__all__ = ["EnvServer", "ServeConfig", "ServeError", "create_app", "serve"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# JSON-RPC 2.0 error codes (as OpenEnv's mcp_types)
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR, SERVER_ERROR = (
    -32700, -32600, -32601, -32602, -32603, -32000)


@dataclass
class ServeConfig:
    """Settings of ``agentgym serve`` (every limit is per server process).

    Attributes:
        env_ids: Env ids to serve; the first is also served at the root.
        token: Bearer token; required unless the host is a loopback address.
        max_sessions: Sessions open at once (HTTP, WebSocket and MCP together).
        idle_timeout_s: A session unused for this long is closed.
        step_timeout_s: Deadline of one env reset/step/expert call; the session is discarded past it.
        max_request_bytes: Largest request body or WebSocket message.
        max_action_chars: Longest action; a longer one gets an error observation (env not stepped).
        workers: Threads running env calls (bounds env calls in flight).
        env_kwargs: Constructor kwargs for every served env (``--kw``).
        client_kwargs: Env kwargs a client may set when it creates a session.
        task_data: Send each task's ``data`` (gold answers...) with ``/agentgym/tasks``.
    """

    env_ids: list[str]
    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    max_sessions: int = 256
    idle_timeout_s: float = 600.0
    step_timeout_s: float = 300.0
    max_request_bytes: int = 4 * 2**20
    max_action_chars: int = 256 * 1024
    workers: int = 32
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    client_kwargs: tuple[str, ...] = ("parser", "format_penalty")
    task_data: bool = False

    def validate(self) -> None:
        if not self.env_ids:
            raise ConfigurationError("give at least one env id to serve (agentgym serve agentgym/Demo-v0).")
        if self.token is not None and not self.token:
            raise ConfigurationError("--token is empty.")
        if not is_loopback(self.host) and not self.token:
            raise ConfigurationError(
                f"refusing to serve on {self.host!r} without a token: anyone who can reach it could run env code. "
                "Pass --token (or AGENTGYM_TOKEN), or bind 127.0.0.1.")
        for name in ("max_sessions", "workers", "max_request_bytes", "max_action_chars"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("idle_timeout_s", "step_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be positive, got {getattr(self, name)}.")

    def limits(self) -> dict[str, Any]:
        return {"max_sessions": self.max_sessions, "idle_timeout_s": self.idle_timeout_s,
                "step_timeout_s": self.step_timeout_s, "max_request_bytes": self.max_request_bytes,
                "max_action_chars": self.max_action_chars, "client_kwargs": list(self.client_kwargs),
                "auth": self.token is not None}


class ServeError(Exception):
    """A request the server refuses: becomes ``{"detail": {"type", "message"}}`` with ``status``."""

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status or ERROR_STATUS.get(kind, 500)

    def body(self) -> dict[str, Any]:
        return {"detail": {"type": self.kind, "message": self.message}}


def _error_of(e: BaseException) -> ServeError:
    """A structured error for an exception raised by an env (never its traceback)."""
    if isinstance(e, ServeError):
        return e
    if isinstance(e, AgentGymError):
        for kind in ("ResetNeeded", "TaskNotFound", "UnknownEnvError", "ValidationError", "ConfigurationError"):
            if any(c.__name__ == kind for c in type(e).__mro__):
                return ServeError(kind, str(e)[:2000])
        if isinstance(e, EnvError):
            return ServeError("EnvError", f"{type(e).__name__}: {str(e)[:2000]}")
        return ServeError("EnvError", f"{type(e).__name__}: {str(e)[:2000]}")
    ref = uuid.uuid4().hex[:10]
    log.error("env call failed [ref %s]", ref, exc_info=e)
    return ServeError("InternalError", f"the env raised {type(e).__name__} (details in the server log, ref {ref})")


# ------------------------------------------------------------------------------------------------- sessions
@dataclass
class Session:
    """One client's env instance and its episode bookkeeping."""

    id: str
    env_id: str
    env: Any
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    status: str = "new"  # new | running | done
    step_count: int = 0
    total_steps: int = 0
    episodes: int = 0
    episode_id: str | None = None
    task_id: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    last_request_id: str | None = None
    last_response: bytes | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def state(self) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "step_count": self.step_count, "env_id": self.env_id,
                "task_id": self.task_id, "status": self.status, "episodes": self.episodes,
                "session_id": self.id}


class Service:
    """Sessions, worker threads and env calls, shared by every served env id."""

    def __init__(self, config: ServeConfig) -> None:
        config.validate()
        self.config = config
        self.executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="agentgym-serve")
        self.sessions: dict[str, Session] = {}
        self.reserved = 0  # slots taken by sessions whose env is being built
        self.specs: dict[str, dict[str, Any]] = {}
        self._probes: dict[str, Any] = {}
        self._tasks_cache: dict[tuple[str, str], bytes] = {}
        self._reaper: asyncio.Task[None] | None = None
        self.ids = [agentgym.env_entry(e).id for e in config.env_ids]  # UnknownEnvError early
        if len(set(self.ids)) != len(self.ids):
            raise ConfigurationError(f"an env id is listed twice: {config.env_ids}")
        for env_id in self.ids:
            self.specs[env_id] = self._spec(env_id)

    # ---------------------------------------------------------------------------------- env specs
    def _make(self, env_id: str, kwargs: dict[str, Any] | None = None) -> Any:
        # gymnasium's passive checker is a development aid; it also breaks an env whose first reset
        # raised (TaskNotFound), which a server must survive
        return agentgym.make(env_id, disable_env_checker=True, **{**self.config.env_kwargs, **(kwargs or {})})

    def _spec(self, env_id: str) -> dict[str, Any]:
        """What a client needs before its first reset, read from one probe instance of the env."""
        entry = agentgym.env_entry(env_id)
        env = self._make(env_id)
        self._probes[env_id] = env
        base = env.unwrapped
        splits = list(getattr(base, "splits", ()) or ())
        tools = base.tools.specs() if hasattr(base, "tools") and len(base.tools) else []
        return {
            "env_id": env_id,
            "family": entry.family,
            "description": entry.description,
            "splits": splits,
            "default_split": getattr(base, "default_split", splits[0] if splits else None),
            "parser": getattr(getattr(base, "parser", None), "name", None),
            "tools": tools,
            "max_episode_steps": getattr(getattr(env, "spec", None), "max_episode_steps", None),
        }

    def spec_body(self, env_id: str) -> dict[str, Any]:
        return {"protocol": PROTOCOL, "agentgym_version": agentgym.__version__, "env": self.specs[env_id],
                "envs": list(self.ids), "limits": self.config.limits()}

    async def tasks(self, env_id: str, split: str) -> bytes:
        key = (env_id, split)
        if key not in self._tasks_cache:
            spec = self.specs[env_id]
            if split not in spec["splits"]:
                raise ServeError("TaskNotFound", f"{env_id} has no split {split!r}; splits: {', '.join(spec['splits'])}")
            probe = self._probes[env_id]
            tasks = await self.run(lambda: list(probe.get_wrapper_attr("tasks")(split)))
            data = self.config.task_data
            self._tasks_cache[key] = dumps({"env_id": env_id, "split": split,
                                            "tasks": [task_to_wire(t, data) for t in tasks]})
        return self._tasks_cache[key]

    # ---------------------------------------------------------------------------------- threads
    async def run(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run a blocking call in the worker pool under the step deadline."""
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self.executor, fn)
        return await asyncio.wait_for(fut, timeout or self.config.step_timeout_s)

    async def env_call(self, s: Session, fn: Callable[[], T]) -> T:
        """An env call for session ``s``; a timeout discards the session (its env may be wedged).

        The deadline is a timer on the executor future (cheaper per call than ``wait_for``); the
        thread cannot be stopped, so the env is closed once the call returns.
        """
        loop = asyncio.get_running_loop()
        cf = self.executor.submit(fn)
        fut = asyncio.wrap_future(cf, loop=loop)
        fired: list[bool] = []

        def expire() -> None:
            fired.append(True)
            fut.cancel()

        timer = loop.call_later(self.config.step_timeout_s, expire)
        try:
            return await fut
        except asyncio.CancelledError:
            if not fired:
                raise
            self._forget(s)
            cf.add_done_callback(lambda _f: self._close_env_soon(s.env))
            raise ServeError("EnvTimeout", f"the env call did not return within {self.config.step_timeout_s:g} s; "
                             "the session was closed") from None
        finally:
            timer.cancel()

    def _close_env_soon(self, env: Any) -> None:
        def _close() -> None:
            try:
                env.close()
            except Exception as e:  # best effort
                log.debug("env close failed: %s", e)

        try:
            self.executor.submit(_close)
        except RuntimeError:  # executor shut down
            _close()

    # ---------------------------------------------------------------------------------- sessions
    async def create(self, env_id: str, kwargs: dict[str, Any] | None = None) -> Session:
        kwargs = dict(kwargs or {})
        bad = sorted(k for k in kwargs if k not in self.config.client_kwargs)
        if bad:
            raise ServeError("ConfigurationError", f"this server does not accept env kwargs {bad}; clients may set: "
                             f"{', '.join(self.config.client_kwargs) or '(none)'}")
        if len(self.sessions) + self.reserved >= self.config.max_sessions:
            raise ServeError("AtCapacity", f"the server is at capacity ({self.config.max_sessions} sessions); "
                             "retry later or use another server")
        self.reserved += 1
        try:
            env = await self.run(functools.partial(self._make, env_id, kwargs))
        except ServeError:
            raise
        except asyncio.TimeoutError:
            raise ServeError("EnvTimeout", f"building {env_id} took longer than {self.config.step_timeout_s:g} s") from None
        except Exception as e:
            raise _error_of(e) from None
        finally:
            self.reserved -= 1
        s = Session(secrets.token_urlsafe(18), env_id, env)
        self.sessions[s.id] = s
        return s

    def get(self, sid: Any, env_id: str) -> Session:
        if not isinstance(sid, str) or not sid:
            raise ServeError("BadRequest", "send session_id (POST /agentgym/sessions or MCP openenv/session/create "
                             "creates one), or use the /ws WebSocket")
        s = self.sessions.get(sid)
        if s is None or s.closed:
            raise ServeError("SessionNotFound", "unknown session (expired after being idle, closed, or the server "
                             "restarted)")
        if s.env_id != env_id:
            raise ServeError("SessionNotFound", f"session belongs to {s.env_id}, not {env_id}")
        return s

    def _forget(self, s: Session) -> None:
        s.closed = True
        self.sessions.pop(s.id, None)

    async def close(self, s: Session) -> None:
        if s.closed:
            return
        self._forget(s)
        async with s.lock:  # let an env call in flight finish first
            self._close_env_soon(s.env)

    async def reap_forever(self) -> None:
        interval = max(0.05, min(self.config.idle_timeout_s / 4, 5.0))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for s in list(self.sessions.values()):
                if now - s.last_used > self.config.idle_timeout_s and not s.lock.locked():
                    log.info("closing idle session %s (%s)", s.id[:8], s.env_id)
                    await self.close(s)

    async def startup(self) -> None:
        self._reaper = asyncio.create_task(self.reap_forever())

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reaper
        for s in list(self.sessions.values()):
            self._forget(s)
            self._close_env_soon(s.env)
        for env in self._probes.values():
            self._close_env_soon(env)
        self._probes.clear()
        self.executor.shutdown(wait=False, cancel_futures=False)

    # ---------------------------------------------------------------------------------- episode ops
    async def reset(self, s: Session, body: dict[str, Any]) -> dict[str, Any]:
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ServeError("BadRequest", f"seed must be a non-negative integer or null, got {seed!r}")
        options = dict(body.get("options") or {}) if isinstance(body.get("options") or {}, dict) else None
        if options is None:
            raise ServeError("BadRequest", "options must be an object")
        for k in ("task_id", "split", "index"):
            if body.get(k) is not None:
                options[k] = body[k]
        options.pop("task", None)  # a TaskSpec object cannot come over the wire
        async with s.lock:
            s.touch()
            obs, info = await self.env_call(s, lambda: s.env.reset(seed=seed, options=options or None))
            s.status, s.step_count, s.metrics = "running", 0, {}
            s.episodes += 1
            s.task_id = info.get("task_id")
            s.episode_id = str(body.get("episode_id") or f"{s.id[:8]}-{s.episodes}")
            s.last_request_id = s.last_response = None
            s.touch()
        return {"observation": {"messages": obs, "info": info, "terminated": False, "truncated": False},
                "reward": None, "done": False}

    async def step(self, s: Session, action: Any, request_id: Any = None) -> bytes:
        """One step; returns the encoded response (cached per ``request_id`` so a retry is answered again)."""
        if not isinstance(action, dict):
            raise ServeError("BadRequest", "action must be an object, e.g. {\"message\": \"...\"}")
        kind = action.get("type", "message")
        if kind == "list_tools":
            tools = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                      "input_schema": t["function"].get("parameters", {})} for t in self.specs[s.env_id]["tools"]]
            return dumps({"observation": {"tools": tools}, "reward": 0.0, "done": False})
        if request_id is not None and not isinstance(request_id, str):
            raise ServeError("BadRequest", "request_id must be a string")
        async with s.lock:
            s.touch()
            if request_id is not None and request_id == s.last_request_id and s.last_response is not None:
                return s.last_response  # a retry of a step that was applied
            body = await self._step_locked(s, action, kind)
            out = dumps(body)
            s.last_request_id, s.last_response = request_id, out
            s.touch()
        return out

    async def _step_locked(self, s: Session, action: dict[str, Any], kind: Any) -> dict[str, Any]:
        if s.status != "running":
            raise ServeError("ResetNeeded", "the episode ended; call reset" if s.status == "done"
                             else "call reset before step")
        tool_name: str | None = None
        if kind == "message":
            payload = action.get("message")
            size = len(payload) if isinstance(payload, str) else len(dumps(payload))
            if size > self.config.max_action_chars:
                return self._oversized(s, size)
        elif kind == "call_tool":
            tool_name, args = action.get("tool_name"), action.get("arguments", {})
            if not isinstance(tool_name, str) or not tool_name:
                raise ServeError("BadRequest", "call_tool needs tool_name (a string)")
            if not isinstance(args, dict):
                raise ServeError("BadRequest", "call_tool arguments must be an object")
            size = len(dumps(args))
            if size > self.config.max_action_chars:
                return self._oversized(s, size)
            payload = {"role": "assistant", "content": "",
                       "tool_calls": [{"id": f"call_{s.step_count}", "name": tool_name, "arguments": args}]}
        else:
            raise ServeError("BadRequest", f"unknown action type {kind!r}; use message, call_tool or list_tools")
        obs, reward, terminated, truncated, info = await self.env_call(s, lambda: s.env.step(payload))
        before, s.metrics = s.metrics, dict(info.get("metrics") or {})
        s.step_count += 1
        s.total_steps += 1
        if terminated or truncated:
            s.status = "done"
        o: dict[str, Any] = {"messages": obs, "info": info, "terminated": bool(terminated),
                             "truncated": bool(truncated)}
        if tool_name is not None:
            o.update(call_tool_fields(tool_name, obs, info, before, s.metrics))
        return {"observation": o, "reward": float(reward), "done": bool(terminated or truncated)}

    def _oversized(self, s: Session, size: int) -> dict[str, Any]:
        """An action over ``max_action_chars``: an error observation; the env is not stepped."""
        s.metrics["oversized_actions"] = s.metrics.get("oversized_actions", 0) + 1
        s.metrics["parse_errors"] = s.metrics.get("parse_errors", 0) + 1
        reason = f"action too long ({size} characters; the limit is {self.config.max_action_chars})"
        msg = {"role": "user", "content": f"Error: {reason}. Send a shorter action."}
        info: dict[str, Any] = {"task_id": s.task_id, "parse_error": reason, "tool_calls": [], "command": None,
                "metrics": dict(s.metrics)}
        return {"observation": {"messages": [msg], "info": info, "terminated": False, "truncated": False},
                "reward": 0.0, "done": False}

    async def expert(self, s: Session) -> dict[str, Any]:
        async with s.lock:
            s.touch()
            if s.status != "running":
                raise ServeError("ResetNeeded", "no episode is running; call reset")

            def _act() -> Any:
                try:
                    fn = s.env.get_wrapper_attr("expert_action")
                except AttributeError:
                    return None
                return fn()

            return {"action": await self.env_call(s, _act)}


def call_tool_fields(tool_name: str, messages: list[Any], info: dict[str, Any], before: dict[str, Any],
                     after: dict[str, Any]) -> dict[str, Any]:
    """OpenEnv's CallToolObservation fields for a step that ran one tool call.

    ``result`` is an MCP CallToolResult; ``error`` is set (as OpenEnv's MCPEnvironment does) when the
    call failed: unknown tool, bad arguments, timeout or an exception in the tool (read from
    ``info["parse_error"]`` and the metrics the step reported).
    """
    text = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))

    def grew(key: str) -> bool:
        return float(after.get(key, 0) or 0) > float(before.get(key, 0) or 0)

    error = None
    perr = str(info.get("parse_error") or "")
    if perr:
        error = {"error_type": "tool_not_found" if "unknown tool" in perr else "invalid_args", "message": text[:2000]}
    for key, etype in (("tool_unknown_tool", "tool_not_found"), ("tool_bad_arguments", "invalid_args"),
                       ("tool_timeout", "timeout"), ("tool_exception", "execution_error")):
        if error is None and grew(key):
            error = {"error_type": etype, "message": text[:2000]}
    result = {"content": [{"type": "text", "text": text}], "structured_content": {"result": text}, "data": text,
              "is_error": error is not None}
    return {"tool_name": tool_name, "result": result, "error": error}


# ------------------------------------------------------------------------------------------------- ASGI guard
class Guard:
    """ASGI middleware: bearer-token auth (constant-time) and request size limits, before any route."""

    def __init__(self, app: Any, token: str | None, max_bytes: int) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.max_bytes = max_bytes

    def _authorized(self, scope: dict[str, Any]) -> bool:
        if self.token is None or scope["path"].endswith("/health"):
            return True
        for k, v in scope.get("headers", ()):
            if k != b"authorization":
                continue
            scheme, _, cred = v.partition(b" ")
            cred = cred.strip()
            if scheme.lower() == b"basic":  # OpenEnv's clients: http://user:TOKEN@host:port
                try:
                    cred = base64.b64decode(cred, validate=True).partition(b":")[2]
                except ValueError:
                    return False
            elif scheme.lower() != b"bearer":
                return False
            return hmac.compare_digest(cred, self.token)
        return False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if not self._authorized(scope):
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 1008, "reason": "unauthorized"})
                return
            await _send_json(send, 401, ServeError("Unauthorized", "missing or wrong token (Authorization: "
                                                   "Bearer TOKEN)").body(), [(b"www-authenticate", b"Bearer")])
            return
        if kind == "websocket":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), None)
        if length is not None:
            try:
                too_big = int(length) > self.max_bytes
            except ValueError:
                too_big = True
            if too_big:
                await _send_json(send, 413, ServeError("PayloadTooLarge", f"request body over {self.max_bytes} "
                                                       "bytes").body(), [(b"connection", b"close")])
                return
            await self.app(scope, receive, send)
            return
        # no Content-Length (chunked): buffer up to the limit, then replay
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            size += len(msg.get("body", b""))
            if size > self.max_bytes:
                await _send_json(send, 413, ServeError("PayloadTooLarge", f"request body over {self.max_bytes} "
                                                       "bytes").body(), [(b"connection", b"close")])
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _send_json(send: Any, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = dumps(body)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


# ------------------------------------------------------------------------------------------------- the app
def create_app(config: ServeConfig) -> Any:
    """The ASGI app serving ``config.env_ids`` (wrapped in the auth/size guard)."""
    service = Service(config)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        await service.startup()
        try:
            yield
        finally:
            await service.shutdown()

    app = FastAPI(title="AgentGym env server", version=agentgym.__version__, lifespan=lifespan,
                  description="AgentGym envs in the OpenEnv protocol (HTTP, WebSocket, MCP), with AgentGym's "
                              "extensions under /agentgym/.")
    app.state.service = service

    def ok(body: Any) -> Response:
        return Response(body if isinstance(body, bytes) else dumps(body), media_type="application/json")

    def fail(e: BaseException) -> Response:
        err = _error_of(e)
        return Response(dumps(err.body()), status_code=err.status, media_type="application/json")

    async def json_body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ServeError("BadRequest", f"the body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ServeError("BadRequest", "the body must be a JSON object")
        return body

    async def guarded(fn: Callable[[], Any]) -> Response:
        """Run a handler to completion even if the client goes away (session bookkeeping stays right)."""

        async def run() -> Any:
            return await fn()

        task = asyncio.ensure_future(run())
        try:
            return ok(await asyncio.shield(task))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            return fail(e)

    schema = {"action": AgentAction.model_json_schema(), "observation": AgentObservation.model_json_schema(),
              "state": AgentState.model_json_schema()}

    def add_env_routes(prefix: str, env_id: str) -> None:
        spec = service.specs[env_id]

        @app.get(prefix + "/health", include_in_schema=not prefix)
        async def health() -> Response:
            return ok({"status": "healthy"})

        @app.get(prefix + "/metadata")
        async def metadata() -> Response:
            return ok({"name": env_id, "description": spec["description"] or env_id, "readme_content": None,
                       "version": agentgym.__version__, "author": "AgentGym", "documentation_url": None})

        @app.get(prefix + "/schema")
        async def get_schema() -> Response:
            return ok(schema)

        @app.get(prefix + "/agentgym/spec")
        async def get_spec() -> Response:
            return ok(service.spec_body(env_id))

        @app.get(prefix + "/agentgym/tasks")
        async def get_tasks(split: str | None = None) -> Response:
            return await guarded(lambda: service.tasks(env_id, split or spec["default_split"]))

        @app.post(prefix + "/agentgym/sessions")
        async def new_session(request: Request) -> Response:
            async def go() -> Any:
                body = await json_body(request)
                kw = body.get("env_kwargs") or {}
                if not isinstance(kw, dict):
                    raise ServeError("BadRequest", "env_kwargs must be an object")
                s = await service.create(env_id, kw)
                return {"session_id": s.id, "spec": service.spec_body(env_id)}

            return await guarded(go)

        @app.delete(prefix + "/agentgym/sessions/{sid}")
        async def del_session(sid: str) -> Response:
            async def go() -> Any:
                s = service.sessions.get(sid)
                if s is not None and s.env_id == env_id:
                    await service.close(s)
                return {"session_id": sid, "closed": True}

            return await guarded(go)

        @app.get(prefix + "/agentgym/expert")
        async def get_expert(session_id: str | None = None) -> Response:
            return await guarded(lambda: service.expert(service.get(session_id, env_id)))

        @app.post(prefix + "/reset")
        async def reset(request: Request) -> Response:
            async def go() -> Any:
                body = await json_body(request)
                sid = body.get("session_id")
                if sid is None:  # OpenEnv's stateless reset: a fresh env, reset, closed
                    s = await service.create(env_id)
                    try:
                        return await service.reset(s, body)
                    finally:
                        await service.close(s)
                return await service.reset(service.get(sid, env_id), body)

            return await guarded(go)

        @app.post(prefix + "/step")
        async def step(request: Request) -> Response:
            async def go() -> Any:
                body = await json_body(request)
                s = service.get(body.get("session_id"), env_id)
                return await service.step(s, body.get("action"), body.get("request_id"))

            return await guarded(go)

        @app.get(prefix + "/state")
        async def state(session_id: str | None = None) -> Response:
            if session_id is None:
                return ok({"episode_id": None, "step_count": 0, "env_id": env_id, "status": "new"})
            try:
                return ok(service.get(session_id, env_id).state())
            except ServeError as e:
                return fail(e)

        @app.post(prefix + "/mcp")
        async def mcp_http(request: Request) -> Response:
            raw = await request.body()
            try:
                msg = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                return ok(_rpc_error(None, PARSE_ERROR, "Parse error"))
            return ok(await asyncio.shield(asyncio.ensure_future(mcp_call(msg, None))))

        async def mcp_call(msg: Any, ws_session: Session | None) -> dict[str, Any]:
            """One MCP JSON-RPC request (``ws_session``: the WebSocket's own session)."""
            if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or not isinstance(msg.get("method"), str):
                return _rpc_error(msg.get("id") if isinstance(msg, dict) else None, INVALID_REQUEST, "Invalid Request")
            rid, method, params = msg.get("id"), msg["method"], msg.get("params", {})
            if not isinstance(params, dict):
                return _rpc_error(rid, INVALID_PARAMS, "Params must be an object")
            try:
                if method == "tools/list":
                    return _rpc_ok(rid, {"tools": [{"name": t["function"]["name"],
                                                    "description": t["function"].get("description", ""),
                                                    "inputSchema": t["function"].get("parameters", {})}
                                                   for t in spec["tools"]]})
                if method == "openenv/session/create":
                    if ws_session is not None:
                        return _rpc_ok(rid, {"session_id": ws_session.id})
                    kw = params.get("env_kwargs") or {}
                    s = await service.create(env_id, kw if isinstance(kw, dict) else {})
                    return _rpc_ok(rid, {"session_id": s.id})
                if method == "openenv/session/close":
                    sid = params.get("session_id")
                    if not sid:
                        return _rpc_error(rid, INVALID_PARAMS, "Invalid params - 'session_id' is required")
                    if ws_session is not None and sid == ws_session.id:
                        return _rpc_error(rid, INVALID_REQUEST, "Cannot close active WebSocket-managed session via MCP method")
                    s0 = service.sessions.get(sid)
                    if s0 is None or s0.env_id != env_id:
                        return _rpc_error(rid, INVALID_PARAMS, f"Unknown session_id: {sid}")
                    await service.close(s0)
                    return _rpc_ok(rid, {"session_id": sid, "closed": True})
                if method == "tools/call":
                    name, args = params.get("name"), params.get("arguments", {})
                    if not name:
                        return _rpc_error(rid, INVALID_PARAMS, "Missing 'name' in params")
                    s = ws_session or service.get(params.get("session_id"), env_id)
                    if s.status == "new":  # MCP has no reset: the first call starts an episode
                        reset_opts: dict[str, Any] = params["reset"] if isinstance(params.get("reset"), dict) else {}
                        await service.reset(s, reset_opts)
                    out = json.loads(await service.step(s, {"type": "call_tool", "tool_name": name,
                                                            "arguments": args}, params.get("request_id")))
                    o = out["observation"]
                    res = dict(o["result"])
                    res["_meta"] = {"agentgym": {"reward": out["reward"], "done": out["done"],
                                                 "terminated": o["terminated"], "truncated": o["truncated"],
                                                 "messages": o["messages"], "info": o["info"]}}
                    return _rpc_ok(rid, res)
                return _rpc_error(rid, METHOD_NOT_FOUND, f"Method not found: {method}")
            except Exception as e:
                err = _error_of(e)
                return _rpc_error(rid, SERVER_ERROR, err.message, {"type": err.kind})

        async def ws_loop(ws: WebSocket, mcp_only: bool) -> None:
            await ws.accept()
            try:
                s = await service.create(env_id)
            except Exception as e:
                err = _error_of(e)
                code = "CAPACITY_REACHED" if err.kind == "AtCapacity" else "FACTORY_ERROR"
                with contextlib.suppress(Exception):
                    if mcp_only:
                        await ws.send_text(json.dumps(_rpc_error(None, SERVER_ERROR, err.message, {"type": err.kind})))
                    else:
                        await ws.send_text(_ws_error(err, code))
                    await ws.close()
                return
            try:
                while True:
                    raw = await ws.receive_text()
                    if len(raw) > config.max_request_bytes:
                        await ws.send_text(_ws_error(ServeError("PayloadTooLarge", f"message over {config.max_request_bytes} bytes"),
                                                     "VALIDATION_ERROR"))
                        continue
                    try:
                        msg = json.loads(raw)
                    except json.JSONDecodeError as e:
                        if mcp_only:
                            await ws.send_text(json.dumps(_rpc_error(None, PARSE_ERROR, f"Parse error: {e}")))
                        else:
                            await ws.send_text(_ws_error(ServeError("BadRequest", f"Invalid JSON: {e}"), "INVALID_JSON"))
                        continue
                    if mcp_only:
                        reply = await asyncio.shield(asyncio.ensure_future(mcp_call(msg, s)))
                        await ws.send_text(json.dumps(reply))
                        continue
                    if not isinstance(msg, dict):
                        await ws.send_text(_ws_error(ServeError("BadRequest", "a message must be a JSON object"),
                                                     "VALIDATION_ERROR"))
                        continue
                    kind = msg.get("type")
                    if kind == "close":
                        break
                    await ws.send_text(await ws_message(s, kind, msg))
            except Exception as e:  # WebSocketDisconnect, or a send to a closed socket: the client is gone
                log.debug("websocket session %s ended: %s", s.id[:8], type(e).__name__)
            finally:
                await service.close(s)
                with contextlib.suppress(Exception):
                    await ws.close()

        async def ws_message(s: Session, kind: Any, msg: dict[str, Any]) -> str:
            data: dict[str, Any] = msg["data"] if isinstance(msg.get("data"), dict) else {}
            try:
                if s.closed:
                    raise ServeError("SessionNotFound", "the session expired; open a new connection")
                if kind == "reset":
                    return dumps({"type": "observation", "data": await service.reset(s, data)}).decode()
                if kind == "step":
                    if not isinstance(msg.get("data"), dict):
                        raise ServeError("BadRequest", "step needs data (the action object)")
                    out = await service.step(s, msg["data"], msg.get("request_id"))
                    return '{"type":"observation","data":' + out.decode() + "}"
                if kind == "state":
                    return json.dumps({"type": "state", "data": s.state()})
                if kind == "mcp":
                    return json.dumps({"type": "mcp", "data": await mcp_call(data, s)})
                if kind == "agentgym/expert":
                    return dumps({"type": "agentgym/expert", "data": await service.expert(s)}).decode()
                if kind == "agentgym/tasks":
                    tasks = await service.tasks(env_id, str(data.get("split") or spec["default_split"]))
                    return '{"type":"agentgym/tasks","data":' + tasks.decode() + "}"
                if kind == "agentgym/spec":
                    return dumps({"type": "agentgym/spec", "data": service.spec_body(env_id)}).decode()
                return _ws_error(ServeError("BadRequest", f"Unknown message type: {kind}"), "UNKNOWN_TYPE")
            except Exception as e:
                err = _error_of(e)
                code = "VALIDATION_ERROR" if err.status in (400, 413) else "EXECUTION_ERROR"
                return _ws_error(err, code)

        @app.websocket(prefix + "/ws")
        async def ws_env(ws: WebSocket) -> None:
            await ws_loop(ws, mcp_only=False)

        @app.websocket(prefix + "/mcp")
        async def ws_mcp(ws: WebSocket) -> None:
            await ws_loop(ws, mcp_only=True)

    for i, env_id in enumerate(service.ids):
        add_env_routes("/envs/" + env_id.removeprefix("agentgym/"), env_id)
        if i == 0:
            add_env_routes("", env_id)

    guarded_app = Guard(app, config.token, config.max_request_bytes)
    guarded_app.service = service  # type: ignore[attr-defined]
    return guarded_app


def _rpc_ok(rid: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def _rpc_error(rid: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": rid, "error": err}


def _ws_error(err: ServeError, code: str) -> str:
    return json.dumps({"type": "error", "data": {"message": err.message, "code": code, "error_type": err.kind,
                                                 "status": err.status}})


# ------------------------------------------------------------------------------------------------- running
def _uvicorn_config(app: Any, config: ServeConfig, **kw: Any) -> Any:
    import uvicorn

    return uvicorn.Config(app, log_level="warning", access_log=False, ws="websockets-sansio",
                          ws_max_size=config.max_request_bytes, timeout_keep_alive=75, **kw)


def serve(config: ServeConfig) -> None:
    """Run the server in the foreground (``agentgym serve``)."""
    import uvicorn

    config.validate()
    app = create_app(config)
    uvicorn.Server(_uvicorn_config(app, config, host=config.host, port=config.port)).run()


class EnvServer:
    """Run ``agentgym serve`` in a background thread (tests, benchmarks, notebooks)::

        with EnvServer(["agentgym/Demo-v0"]) as srv:
            env = RemoteEnv(srv.url)

    The port is chosen by the OS unless given. Other :class:`ServeConfig` fields pass as keywords.
    """

    _counter = itertools.count()

    def __init__(self, env_ids: list[str] | str, *, host: str = "127.0.0.1", port: int = 0,
                 startup_timeout_s: float = 30.0, **config: Any) -> None:
        import uvicorn

        ids = [env_ids] if isinstance(env_ids, str) else list(env_ids)
        self.config = ServeConfig(ids, host=host, port=port, **config)
        self.config.validate()
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, int(self._sock.getsockname()[1])
        self.app = create_app(self.config)
        self._server = uvicorn.Server(_uvicorn_config(self.app, self.config))
        self._thread: threading.Thread | None = None
        self._startup_timeout_s = startup_timeout_s

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def service(self) -> Service:
        return self.app.service  # type: ignore[no-any-return]

    def start(self) -> EnvServer:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True,
                                        name=f"agentgym-serve-{self.port}-{next(self._counter)}")
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.stop()
                raise EnvError(f"env server on {self.url} did not start within {self._startup_timeout_s:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self) -> EnvServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()



"""The state behind ``agentgym serve``, whatever the protocol: sessions, worker threads, env calls.

Every route (OpenEnv HTTP, AgentGym's extensions, MCP, WebSocket) goes through one :class:`Service`.
A :class:`Session` is one client's env instance; env calls run in a thread pool under a deadline (a
session whose env call times out is discarded); idle sessions are reaped. Failures become a
:class:`ServeError` (a kind from :data:`~agentgym.serve.protocol.ERROR_STATUS` and a message, never
a traceback).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import secrets
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import agentgym
from agentgym import registration
from agentgym.errors import (
    AgentGymError,
    ConfigurationError,
    ResetNeeded,
    TaskNotFound,
    UnknownEnvError,
    ValidationError,
)
from agentgym.serve.config import ServeConfig
from agentgym.serve.protocol import ERROR_STATUS, PROTOCOL, dumps, task_to_wire

__all__ = ["ServeError", "Service", "Session", "call_tool_fields", "error_of"]

log = logging.getLogger(__name__)
T = TypeVar("T")
CREATION_MEMORY_S = 120.0  # how long a session creation's request_id is remembered (a retry comes within seconds)
_MAX_CREATIONS = 65536  # and how many are remembered at most

# what gymnasium.make takes itself, whatever the env's constructor
_MAKE_KWARGS = frozenset({"max_episode_steps", "autoreset", "apply_api_compatibility", "disable_env_checker",
                          "render_mode"})


class ServeError(Exception):
    """A request the server refuses: becomes ``{"detail": {"type", "message"}}`` with ``status``."""

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status or ERROR_STATUS.get(kind, 500)

    def body(self) -> dict[str, Any]:
        return {"detail": {"type": self.kind, "message": self.message}}


_KINDS: tuple[tuple[type[AgentGymError], str], ...] = (
    (ResetNeeded, "ResetNeeded"), (TaskNotFound, "TaskNotFound"), (UnknownEnvError, "UnknownEnvError"),
    (ValidationError, "ValidationError"), (ConfigurationError, "ConfigurationError"))


def error_of(e: BaseException) -> ServeError:
    """A structured error for an exception raised by an env (never its traceback)."""
    if isinstance(e, ServeError):
        return e
    if isinstance(e, AgentGymError):
        for cls, kind in _KINDS:
            if isinstance(e, cls):
                return ServeError(kind, str(e)[:2000])
        return ServeError("EnvError", f"{type(e).__name__}: {str(e)[:2000]}")
    ref = uuid.uuid4().hex[:10]
    log.error("env call failed [ref %s]", ref, exc_info=e)
    return ServeError("InternalError", f"the env raised {type(e).__name__} (details in the server log, ref {ref})")


def prompt_text(messages: list[Any]) -> str:
    """The text of an observation's messages (the task prompt after a reset)."""
    return "\n\n".join(str(m.get("content") or "") for m in messages if isinstance(m, dict) and m.get("content"))


def unknown_kwargs(env_id: str, kwargs: dict[str, Any]) -> list[str]:
    """The names in ``kwargs`` that ``env_id``'s constructor does not take. A class whose ``__init__``
    passes ``**kwargs`` on is followed up its MRO; a function with ``**kwargs`` takes everything."""
    if not kwargs:
        return []
    entry_point: Any = registration.spec(env_id).entry_point
    try:
        if isinstance(entry_point, str):
            from gymnasium.envs.registration import load_env_creator

            entry_point = load_env_creator(entry_point)
        inits = ([k.__dict__["__init__"] for k in entry_point.__mro__ if "__init__" in k.__dict__]
                 if isinstance(entry_point, type) else [entry_point])
        names: set[str] = set()
        for init in inits:
            params = inspect.signature(init).parameters
            names.update(params)
            if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
                break
        else:
            return []
    except (TypeError, ValueError, ImportError, AttributeError):
        return []
    return sorted(k for k in kwargs if k not in names and k not in _MAKE_KWARGS)


# ------------------------------------------------------------------------------------------------- sessions
@dataclass
class Session:
    """One client's env instance and its episode bookkeeping.

    ``mcp_version`` is set for a session opened by an MCP ``initialize`` (its ``Mcp-Session-Id`` is
    ``id``); ``prompt`` is the text of the last reset's observation.
    """

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
    prompt: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    last_request_id: str | None = None
    last_response: bytes | None = None
    mcp_version: str | None = None
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
        self.sessions: dict[str, Session] = {}
        self.reserved = 0  # slots taken by sessions whose env is being built
        # session creations by the client's request_id, so a retried POST gets the same session:
        # (env_id, request_id) -> (expiry, the creation), oldest first; bounded in time and count
        self._creations: dict[tuple[str, str], tuple[float, asyncio.Future[Session]]] = {}
        self.specs: dict[str, dict[str, Any]] = {}
        self._probes: dict[str, Any] = {}
        self._tasks_cache: dict[tuple[str, str], bytes] = {}
        self._reaper: asyncio.Task[None] | None = None
        self.ids = [agentgym.env_entry(e).id for e in config.env_ids]  # UnknownEnvError early
        if len(set(self.ids)) != len(self.ids):
            raise ConfigurationError(f"an env id is listed twice: {config.env_ids}")
        served = set(self.ids) | {i.removeprefix("agentgym/") for i in self.ids} | {"*"}
        stray = sorted(k for k in config.env_kwargs if k not in served)
        if stray:
            raise ConfigurationError(f"env kwargs given for {', '.join(stray)}, which is not served here "
                                     f"(served: {', '.join(self.ids)})")
        for env_id in self.ids:
            bad = unknown_kwargs(env_id, config.kwargs_for(env_id))
            if bad:
                short = env_id.removeprefix("agentgym/")
                raise ConfigurationError(
                    f"{env_id} does not take the env kwarg{'s' * (len(bad) > 1)} {', '.join(bad)}; "
                    f"give a kwarg to one env only with --kw {short}:key=value")
        self.executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="agentgym-serve")
        try:
            for env_id in self.ids:
                self.specs[env_id] = self._spec(env_id)
        except BaseException:
            self._close_probes()
            self.executor.shutdown(wait=False)
            raise

    # ---------------------------------------------------------------------------------- env specs
    def _make(self, env_id: str, kwargs: dict[str, Any] | None = None) -> Any:
        # gymnasium's passive checker is a development aid; it also breaks an env whose first reset
        # raised (TaskNotFound), which a server must survive
        return agentgym.make(env_id, disable_env_checker=True, **{**self.config.kwargs_for(env_id), **(kwargs or {})})

    def _spec(self, env_id: str) -> dict[str, Any]:
        """What a client needs before its first reset, read from one probe instance of the env."""
        entry = agentgym.env_entry(env_id)
        try:
            env = self._make(env_id)
        except TypeError as e:  # a kwarg the constructor's signature did not reveal
            raise ConfigurationError(f"{env_id} could not be built with env kwargs "
                                     f"{self.config.kwargs_for(env_id)}: {e}") from None
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

    def mcp_tools(self, env_id: str) -> list[dict[str, Any]]:
        """The env's tools as MCP tool descriptions."""
        return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                 "inputSchema": t["function"].get("parameters") or {"type": "object", "properties": {}}}
                for t in self.specs[env_id]["tools"]]

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
    async def create(self, env_id: str, kwargs: dict[str, Any] | None = None, request_id: Any = None) -> Session:
        """A new session of ``env_id``. With a ``request_id``, a retry of the same creation (its answer
        was lost: the connection failed mid-request) gets the same session, not a second one, for
        :data:`CREATION_MEMORY_S`; a retry that arrives while the first is still building awaits it."""
        if request_id is None:
            return await self._create(env_id, kwargs)
        if not isinstance(request_id, str) or not 0 < len(request_id) <= 128:
            raise ServeError("BadRequest", "request_id must be a string of 1 to 128 characters")
        now = time.monotonic()
        while self._creations:  # forget expired creations (insertion order is expiry order)
            key0, (expiry, _) = next(iter(self._creations.items()))
            if expiry > now and len(self._creations) <= _MAX_CREATIONS:
                break
            del self._creations[key0]
        key = (env_id, request_id)
        known = self._creations.get(key)
        if known is not None:
            await asyncio.wait([known[1]])  # the first attempt may still be building the env
            first = known[1]
            if not first.cancelled() and first.exception() is None and not first.result().closed:
                return first.result()
            # it failed (so it created nothing) or its session is closed already: create afresh
        fut: asyncio.Future[Session] = asyncio.get_running_loop().create_future()
        self._creations.pop(key, None)
        self._creations[key] = (now + CREATION_MEMORY_S, fut)
        try:
            s = await self._create(env_id, kwargs)
        except BaseException:
            if self._creations.get(key, (0.0, None))[1] is fut:
                del self._creations[key]
            fut.cancel()
            raise
        fut.set_result(s)
        return s

    async def _create(self, env_id: str, kwargs: dict[str, Any] | None = None) -> Session:
        kwargs = dict(kwargs or {})
        bad = sorted(k for k in kwargs if k not in self.config.client_kwargs)
        if bad:
            raise ServeError("ConfigurationError", f"this server does not accept env kwargs {bad}; clients may set: "
                             f"{', '.join(self.config.client_kwargs) or '(none)'}")
        bad = unknown_kwargs(env_id, kwargs)
        if bad:
            raise ServeError("ConfigurationError", f"{env_id} does not take the env kwargs {bad}")
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
            raise error_of(e) from None
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

    def _close_probes(self) -> None:
        for env in self._probes.values():
            self._close_env_soon(env)
        self._probes.clear()

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reaper
        for s in list(self.sessions.values()):
            self._forget(s)
            self._close_env_soon(s.env)
        self._close_probes()
        self.executor.shutdown(wait=False, cancel_futures=False)

    # ---------------------------------------------------------------------------------- episode ops
    async def reset(self, s: Session, body: dict[str, Any]) -> dict[str, Any]:
        """Start an episode: ``body`` has OpenEnv's ``seed``/``episode_id`` and ``task_id``/``split``/
        ``index``/``options``. The observation's ``metadata`` carries the prompt as text."""
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ServeError("BadRequest", f"seed must be a non-negative integer or null, got {str(seed)[:40]!r}")
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
            s.prompt = prompt_text(obs)
            s.last_request_id = s.last_response = None
            s.touch()
        return {"observation": {"messages": obs, "info": info, "terminated": False, "truncated": False,
                                "metadata": {"prompt": s.prompt, "task_id": s.task_id}},
                "reward": None, "done": False}

    async def step(self, s: Session, action: Any, request_id: Any = None) -> bytes:
        """One step; returns the encoded response (cached per ``request_id`` so a retry is answered again)."""
        if not isinstance(action, dict):
            raise ServeError("BadRequest", "action must be an object, e.g. {\"message\": \"...\"}")
        kind = action.get("type", "message")
        if kind == "list_tools":
            tools = [{"name": t["name"], "description": t["description"], "input_schema": t["inputSchema"]}
                     for t in self.mcp_tools(s.env_id)]
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

    async def one_step_episode(self, env_id: str, body: dict[str, Any]) -> bytes:
        """OpenEnv's stateless ``POST /step``: a fresh env, reset with the body's seed/task fields,
        stepped once with its ``action``, closed."""
        if not isinstance(body.get("action"), dict):
            raise ServeError("BadRequest", "a stateless step needs action (an object); send session_id to step a "
                             "session")
        s = await self.create(env_id)
        try:
            await self.reset(s, body)
            return await self.step(s, body["action"])
        finally:
            await self.close(s)

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
            raise ServeError("BadRequest", f"unknown action type {str(kind)[:40]!r}; use message, call_tool or "
                             "list_tools")
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
        if not self.config.expert:
            raise ServeError("Forbidden", "this server does not serve the expert (started with --no-expert)")
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

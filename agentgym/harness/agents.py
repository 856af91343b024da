"""External agents a harness workflow hands tasks to: a Python callable, a command, a container, or an
Agent Lightning agent class.

Every agent gets the same plain data, an :class:`AgentTask` (a dict for callables, JSON for the
others), and talks to the policy endpoint over HTTP with an OpenAI client: nothing in it needs to know
AgentGym. A command or container also finds the OpenAI settings in its environment
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``), and the whole task as JSON on its standard input and, when it
fits one environment string (100 kB), in ``AGENTGYM_TASK``.

What ends a run, each becoming the rollout's error (never the training run's):

* a deadline (:class:`~agentgym.errors.AgentTimeout`): a coroutine is cancelled, a process group or
  container is killed. A *synchronous* callable runs in a thread, which cannot be killed: it is
  abandoned, and its rollout is closed so its later requests get ``404``. Run agents you do not
  trust to stop as a command or a container;
* a crash (:class:`~agentgym.errors.AgentCrashed`): the callable raised, the process exited non-zero.

Containers run with ``--network none`` (and memory, CPU and process limits). They reach the endpoint
through a Unix socket mounted into the container, bridged to ``127.0.0.1:PORT`` inside it by a
small forwarder (:mod:`agentgym.harness._forward`, run with the image's ``python3``), so an
unmodified agent still uses a plain ``http://127.0.0.1`` base URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agentgym.errors import AgentCrashed, AgentTimeout, ConfigurationError

__all__ = [
    "Agent",
    "AgentLightningAgent",
    "AgentTask",
    "CallableAgent",
    "CommandAgent",
    "ContainerAgent",
    "load_callable",
]

OUTPUT_TAIL = 4000  # characters of a failed process's output kept in the error
MAX_TASK_VAR = 100_000  # bytes: a longer task goes on standard input only
CONTAINER_PORT = 8000
SOCKET_DIR = "/run/agentgym"
FORWARDER = Path(__file__).with_name("_forward.py")


@dataclass
class AgentTask:
    """What an agent is handed (plain data).

    Attributes:
        rollout_id: The rollout its requests belong to (already in ``base_url``).
        task_id: The env task.
        base_url: OpenAI ``base_url`` for this rollout.
        api_key: The endpoint's token (OpenAI clients send it as ``Authorization: Bearer``).
        model: A model name to send (any name works with one served policy).
        messages: The env's opening messages, in OpenAI's shape.
        tools: The env's tools as OpenAI function specs.
        prompt: The last user message's text (for agents that take one question).
        env_url: ``GET`` the task, ``POST {env_url}/step`` an action: ``{"tool_calls": [...]}`` in
            OpenAI's shape, or ``{"content": "..."}``; the answer has ``messages`` (tool results),
            ``reward``, ``done``. ``None`` when the harness gives no env access.
        reward_url: ``POST {"value": 1.0}`` here when the harness takes reward calls (else ``None``).
        data: The task's data (gold answers...), only when the harness is told to hand it over
            (agents that score themselves).
    """

    rollout_id: str
    task_id: str
    base_url: str
    api_key: str
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    prompt: str = ""
    env_url: str | None = None
    reward_url: str | None = None
    data: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def rebased(self, old: str, new: str) -> AgentTask:
        """The task with every endpoint URL moved from ``old`` to ``new`` (inside a container)."""
        def move(u: str | None) -> str | None:
            return new + u[len(old):] if u is not None and u.startswith(old) else u

        d = self.to_dict()
        for k in ("base_url", "env_url", "reward_url"):
            d[k] = move(d[k])
        return AgentTask(**d)


@runtime_checkable
class Agent(Protocol):
    """Runs one task to the end. ``run`` returns what the agent returned (callables: a reward or
    ``None``), raises :class:`~agentgym.errors.AgentCrashed` when it fails, and is cancelled at the
    deadline (it must then stop its process). ``endpoint_url`` is the endpoint's own URL (so a
    container can be pointed at its forwarder)."""

    name: str

    @property
    def needs_socket(self) -> bool: ...

    async def run(self, task: AgentTask, *, endpoint_url: str, socket_path: str | None = None) -> Any: ...


def load_callable(spec: str) -> Any:
    """``"package.module:attr"`` -> the object (a function or class).

    Raises:
        ConfigurationError: malformed, not importable, or no such attribute.
    """
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise ConfigurationError(f"expected 'package.module:name', got {spec!r}")
    try:
        obj: Any = importlib.import_module(mod)
    except ImportError as e:
        raise ConfigurationError(f"cannot import {mod!r} (for {spec!r}): {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(f"{mod!r} has no {attr!r}") from None
    return obj


class CallableAgent:
    """A Python callable ``fn(task: dict)`` (sync: run in a thread; async: a task on the loop).

    It returns ``None``, a reward (a number, used when the harness takes reward calls), or anything
    a final-state reward function reads. An exception is a crash.
    """

    needs_socket = False

    def __init__(self, fn: Callable[[dict[str, Any]], Any] | str) -> None:
        self.fn = load_callable(fn) if isinstance(fn, str) else fn
        if not callable(self.fn):
            raise ConfigurationError(f"the agent {fn!r} is not callable")
        self.name = getattr(self.fn, "__qualname__", type(self.fn).__name__)

    async def run(self, task: AgentTask, *, endpoint_url: str, socket_path: str | None = None) -> Any:
        try:
            if inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(type(self.fn).__call__):
                return await self.fn(task.to_dict())
            result = await _in_thread(self.fn, task.to_dict(), self.name)
            if inspect.isawaitable(result):
                return await result
            return result
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise AgentCrashed(f"the agent {self.name} raised {type(e).__name__}: {e}") from e


async def _in_thread(fn: Callable[[Any], Any], arg: Any, name: str) -> Any:
    """``fn(arg)`` in a thread of its own (a shared pool would cap concurrent agents at its size, and a
    hung agent would hold one of its threads forever)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            (fut.set_result if ok else fut.set_exception)(value)

    def body() -> None:
        try:
            out = fn(arg)
        except BaseException as e:  # delivered to the awaiting coroutine
            with contextlib.suppress(RuntimeError):  # the loop is gone
                loop.call_soon_threadsafe(settle, False, e)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, True, out)

    threading.Thread(target=body, name=f"agentgym-agent-{name}"[:60], daemon=True).start()
    return await fut


async def _run_process(argv: Sequence[str], *, env: Mapping[str, str], stdin: bytes, cwd: str | None,
                       what: str, kill: Callable[[asyncio.subprocess.Process], Any] | None = None) -> str:
    """Run a process to the end (its own process group); its output tail. Cancelling kills it."""
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT, env=dict(env), cwd=cwd,
                                                    start_new_session=True)
    except OSError as e:
        raise AgentCrashed(f"{what} could not start: {e}") from e
    tail = bytearray()

    async def pump() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            tail.extend(chunk)
            del tail[:-OUTPUT_TAIL]

    async def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        proc.stdin.close()

    reader = asyncio.ensure_future(pump())
    try:
        await feed()
        await proc.wait()
        await reader
    except BaseException:
        if kill is not None:
            await kill(proc)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 10.0)
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader
        raise
    out = tail.decode("utf-8", errors="replace")
    if proc.returncode != 0:
        raise AgentCrashed(f"{what} exited with code {proc.returncode}; its output ends: {out[-1500:]!r}")
    return out


def _task_vars(task: AgentTask) -> dict[str, str]:
    """The variables every process agent gets. ``AGENTGYM_TASK`` only when it fits one environment string
    (Linux caps each at 128 KiB); the task is on standard input either way."""
    out = {"OPENAI_BASE_URL": task.base_url, "OPENAI_API_KEY": task.api_key}
    blob = json.dumps(task.to_dict())
    if len(blob.encode()) <= MAX_TASK_VAR:
        out["AGENTGYM_TASK"] = blob
    return out


def _process_env(task: AgentTask, extra: Mapping[str, str], inherit: bool) -> dict[str, str]:
    base = dict(os.environ) if inherit else {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    base.update(_task_vars(task))
    base.update(extra)
    return base


class CommandAgent:
    """A command (``argv``) run once per task in its own process group; exit code 0 is success.

    Args:
        argv: The command.
        env: Extra environment variables.
        cwd: Working directory.
        inherit_env: Pass this process's environment (besides ``PATH``, ``HOME``, ``LANG`` and the
            OpenAI/AgentGym variables).
    """

    needs_socket = False

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                 inherit_env: bool = True) -> None:
        if not argv:
            raise ConfigurationError("a command agent needs a command")
        self.argv = [str(a) for a in argv]
        self.env = dict(env or {})
        self.cwd = cwd
        self.inherit_env = inherit_env
        self.name = Path(self.argv[0]).name

    async def run(self, task: AgentTask, *, endpoint_url: str, socket_path: str | None = None) -> Any:
        return await _run_process(self.argv, env=_process_env(task, self.env, self.inherit_env),
                                  stdin=json.dumps(task.to_dict()).encode(), cwd=self.cwd,
                                  what=f"the agent command {self.name!r}")


_AGL_LAUNCHER = (  # what agentlightning.controller.local_reconciler runs: import the class, run() it
    "import asyncio, importlib, inspect, sys\n"
    "spec = sys.argv[1]\n"
    "mod, _, name = spec.partition(':') if ':' in spec else spec.rpartition('.')\n"
    "result = getattr(importlib.import_module(mod), name)().run()\n"
    "if inspect.isawaitable(result):\n"
    "    asyncio.run(result)\n"
)


def _resolve_input(task_input: Any, path: str) -> Any:
    """Agent Lightning's ``local.env_map`` rule: ``input`` / ``input.a.b.0`` into the task; else literal."""
    if path == "input":
        return task_input
    if not path.startswith("input."):
        return path
    value = task_input
    for part in path.split(".")[1:]:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise ConfigurationError(f"env_map path {path!r} is not in the task")
    return value


class AgentLightningAgent:
    """An agent class written for Agent Lightning 1.0 (``module:Class`` with a ``run()`` method), run
    as its local runner runs it: a subprocess with ``AGL_OPENAI_BASE_URL`` (the proxy URL
    ``/proxy/rollout/{id}/attempt/0/mode/train/openai/v1``), ``AGL_EVENT_URL``
    (``/api/rollouts/{id}/attempt/0/events``, where it posts its ``reward`` event) and ``AGL_KEY``,
    plus ``env_map``'s variables taken from the task (``{"QUESTION": "input.prompt"}``).

    Args:
        agent_class: ``"package.module:Class"`` (importable by ``python``).
        python: The interpreter (the agent's own environment; Agent Lightning needs Python >= 3.12).
        env_map: Variable -> ``input.<path>`` into the :class:`AgentTask` dict (or a literal).
        mode: ``train`` or ``val`` (in the URL, as Agent Lightning's controller sets it).
        env: Extra environment variables; ``cwd``, ``inherit_env`` as :class:`CommandAgent`.
    """

    needs_socket = False

    def __init__(self, agent_class: str, *, python: str | None = None, env_map: Mapping[str, str] | None = None,
                 mode: str = "train", env: Mapping[str, str] | None = None, cwd: str | None = None,
                 inherit_env: bool = True) -> None:
        if ":" not in agent_class and "." not in agent_class:
            raise ConfigurationError(f"agent_class is 'package.module:Class', got {agent_class!r}")
        if mode not in ("train", "val"):
            raise ConfigurationError(f"mode is 'train' or 'val', got {mode!r}")
        self.agent_class = agent_class
        self.python = python or sys.executable
        self.env_map = dict(env_map or {})
        self.mode = mode
        self.env = dict(env or {})
        self.cwd = cwd
        self.inherit_env = inherit_env
        self.name = agent_class

    async def run(self, task: AgentTask, *, endpoint_url: str, socket_path: str | None = None) -> Any:
        rid, attempt = task.rollout_id, "0"
        env = {"AGL_KEY": task.api_key,
               "AGL_OPENAI_BASE_URL": f"{endpoint_url}/proxy/rollout/{rid}/attempt/{attempt}/mode/{self.mode}/openai/v1",
               "AGL_EVENT_URL": f"{endpoint_url}/api/rollouts/{rid}/attempt/{attempt}/events", **self.env}
        data = task.to_dict()
        for name, path in self.env_map.items():
            value = _resolve_input(data, path)
            env[name] = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return await _run_process([self.python, "-c", _AGL_LAUNCHER, self.agent_class],
                                  env=_process_env(task, env, self.inherit_env), stdin=b"", cwd=self.cwd,
                                  what=f"the Agent Lightning agent {self.agent_class!r}")


class ContainerAgent:
    """A command run in a fresh Docker container per task, with ``--network none``.

    Args:
        image: A local image with ``python3`` (for the forwarder) and the agent.
        argv: The command inside the container.
        env: Extra environment variables.
        memory / cpus / pids: Container limits.
        docker: The docker client binary.
        extra_args: More ``docker run`` arguments (mounts of the agent's code...).
    """

    needs_socket = True

    def __init__(self, image: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 memory: str = "2g", cpus: float = 1.0, pids: int = 256, docker: str = "docker",
                 extra_args: Sequence[str] = ()) -> None:
        if not image or not argv:
            raise ConfigurationError("a container agent needs an image and a command")
        self.image = image
        self.argv = [str(a) for a in argv]
        self.env = dict(env or {})
        self.memory, self.cpus, self.pids = memory, cpus, pids
        self.docker = docker
        self.extra_args = list(extra_args)
        self.name = f"{image} {Path(self.argv[0]).name}"

    async def run(self, task: AgentTask, *, endpoint_url: str, socket_path: str | None = None) -> Any:
        if socket_path is None:
            raise ConfigurationError("a container agent reaches the endpoint through its Unix socket")
        inner = f"http://127.0.0.1:{CONTAINER_PORT}"
        t = task.rebased(endpoint_url, inner)
        name = f"agentgym-agent-{uuid.uuid4().hex[:12]}"
        sock_dir = str(Path(socket_path).parent)
        argv = [self.docker, "run", "--rm", "-i", "--network", "none", "--name", name,
                "--memory", self.memory, "--cpus", str(self.cpus), "--pids-limit", str(self.pids),
                "-v", f"{sock_dir}:{SOCKET_DIR}", "-v", f"{FORWARDER}:/agentgym/forward.py:ro",
                ]
        for k, v in {**_task_vars(t), **self.env}.items():
            argv += ["-e", f"{k}={v}"]
        argv += [*self.extra_args, self.image, "python3", "/agentgym/forward.py",
                 f"{SOCKET_DIR}/{Path(socket_path).name}", str(CONTAINER_PORT), "--", *self.argv]

        async def kill(_proc: asyncio.subprocess.Process) -> None:
            k = await asyncio.create_subprocess_exec(self.docker, "kill", name, stdout=asyncio.subprocess.DEVNULL,
                                                     stderr=asyncio.subprocess.DEVNULL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(k.wait(), 30.0)

        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG")}
        return await _run_process(argv, env=env, stdin=json.dumps(t.to_dict()).encode(), cwd=None,
                                  what=f"the agent container {self.image!r}", kill=kill)


def raise_timeout(agent: Any, seconds: float) -> AgentTimeout:
    return AgentTimeout(f"the agent {getattr(agent, 'name', agent)!r} did not finish within {seconds:g} s; it was "
                        "stopped")

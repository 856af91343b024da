"""OpenEnv servers built with the real ``openenv-core``, for the interop tests (run as a script).

``python openenv_apps.py PORT DIR`` serves, with ``openenv-core``'s own ``create_app``:

* ``/echo``: the echo env that ``openenv init echo_env`` generates from the package's template
  (into ``DIR``), a plain (non-MCP) action ``{"message": str}``;
* ``/mcp_echo``: an ``MCPEnvironment`` with FastMCP tools ``echo_message`` and ``echo_with_length``,
  shaped like OpenEnv's ``echo_env``;
* ``/echo_one``: the same echo env with room for one session at a time (``max_concurrent_envs=1``);
* ``/coding``: a coding env shaped like OpenEnv's ``coding_env`` (``{"code": str}`` ->
  stdout/stderr/exit_code; the code runs in a ``python -I`` subprocess with a deadline).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field
from starlette.applications import Starlette
from starlette.routing import Mount


class MCPEchoEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("echo_env")

        @mcp.tool
        def echo_message(message: str) -> str:
            """Echo back the provided message.

            Args:
                message: The message to echo back
            """
            return message

        @mcp.tool
        def echo_with_length(message: str) -> dict:
            """Echo back the message with its length.

            Args:
                message: The message to echo back
            """
            return {"message": message, "length": len(message)}

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return Observation(done=False, reward=0.0, metadata={"status": "ready"})

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": f"unknown action {type(action).__name__}"})

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return super().step(action, timeout_s=timeout_s, **kwargs)

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    @property
    def state(self) -> State:
        return self._state


class CodeAction(Action):
    code: str = Field(..., description="Python code to run")


class CodeObservation(Observation):
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0


class CodingEnvironment(Environment):
    """Runs each action's code; reward 1 and done when the code prints ``42``."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self._dir = tempfile.TemporaryDirectory()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> CodeObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return CodeObservation(stdout="Write Python that prints the answer to everything.", done=False, reward=0.0)

    def step(self, action: CodeAction, timeout_s: float | None = None, **kwargs: Any) -> CodeObservation:  # type: ignore[override]
        self._state.step_count += 1
        try:
            p = subprocess.run([sys.executable, "-I", "-c", action.code], capture_output=True, text=True,
                               timeout=timeout_s or 10, cwd=self._dir.name)
            out, err, code = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired:
            out, err, code = "", "timeout", -1
        solved = out.strip() == "42"
        return CodeObservation(stdout=out, stderr=err, exit_code=code, done=solved, reward=1.0 if solved else 0.0)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self._dir.cleanup()


def build_app(echo_dir: str) -> Starlette:
    if not (Path(echo_dir) / "echo_env").exists():  # `openenv init echo_env`, in this process
        from openenv.cli.commands.init import init

        init(env_name="echo_env", output_dir=echo_dir)
    sys.path.insert(0, echo_dir)
    from echo_env.models import EchoAction, EchoObservation
    from echo_env.server.echo_env_environment import EchoEnvironment

    return Starlette(routes=[
        Mount("/echo", create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo_env", max_concurrent_envs=8)),
        Mount("/echo_one", create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo_one", max_concurrent_envs=1)),
        Mount("/mcp_echo", create_app(MCPEchoEnvironment, Action, Observation, env_name="mcp_echo", max_concurrent_envs=8)),
        Mount("/coding", create_app(CodingEnvironment, CodeAction, CodeObservation, env_name="coding", max_concurrent_envs=8)),
    ])


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(build_app(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")

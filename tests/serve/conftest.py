"""Fixtures for the env-service tests: servers on 127.0.0.1 (in a thread, or a subprocess to kill)."""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

import agentgym
from agentgym.core import AgentEnv, StepResult
from agentgym.serve.server import EnvServer
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec

HERE = Path(__file__).resolve().parent
from serve_helpers import VENV_BIN, LoggedProcess, free_port  # noqa: E402


class ServeTestEnv(AgentEnv):
    """A tool env whose text turns can misbehave on purpose: ``sleep S`` blocks, ``crash`` raises."""

    family = "test"

    def tasks(self, split: str = "train") -> list[TaskSpec]:
        return [TaskSpec(f"{split}-{i}", split, "t", {"n": i}) for i in range(4)]

    def reset_task(self, task: TaskSpec) -> list[Message]:
        return [{"role": "user", "content": f"task {task.task_id}"}]

    @tool
    def done(self, answer: int) -> str:
        """Finish.

        Args:
            answer: Any integer.
        """
        self.finish(1.0, True)
        return "ok"

    def on_text(self, text: str) -> StepResult:
        if text.startswith("sleep "):
            time.sleep(float(text.split()[1]))
            return StepResult([{"role": "user", "content": "slept"}])
        if text == "crash":
            raise RuntimeError("boom at /very/secret/path")
        return super().on_text(text)

    def expert_action(self) -> str:
        return '<tool_call>{"name": "done", "arguments": {"answer": 1}}</tool_call>'


agentgym.register_env("agentgym/ServeTest-v0", ServeTestEnv, family="test", max_episode_steps=20)


def wait_healthy(url: str, server: LoggedProcess | None = None, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server is not None and server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}: {server.stderr()[-4000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up within {timeout_s} s")


class ServeProcess(LoggedProcess):
    """``agentgym serve`` in a subprocess (so a test can kill it)."""

    def __init__(self, env_ids: Sequence[str], *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__([str(VENV_BIN / "agentgym"), "serve", *env_ids, "--port", str(self.port), *args])
        try:
            wait_healthy(self.url, self)
        except Exception:
            self.kill()
            raise


@pytest.fixture
def serve_process() -> Iterator[type[ServeProcess]]:
    started: list[ServeProcess] = []

    class Tracked(ServeProcess):
        def __init__(self, env_ids: Sequence[str], *args: str) -> None:
            super().__init__(env_ids, *args)
            started.append(self)

    yield Tracked
    for p in started:
        p.kill()


@pytest.fixture(scope="module")
def demo_server() -> Iterator[EnvServer]:
    with EnvServer(["agentgym/Demo-v0", "agentgym/ServeTest-v0"]) as srv:
        yield srv


class OpenEnvServer(LoggedProcess):
    """OpenEnv envs served by openenv-core's own create_app (openenv_apps.py), started in the
    background; ``url`` waits until it answers."""

    def __init__(self, out: Path) -> None:
        self.port = free_port()
        self.out = out
        super().__init__([sys.executable, str(HERE / "openenv_apps.py"), str(self.port), str(out)])
        self._up = False

    @property
    def url(self) -> str:
        url = f"http://127.0.0.1:{self.port}"
        if not self._up:
            wait_healthy(url + "/echo", self, timeout_s=180)
            assert (self.out / "echo_env" / "server" / "echo_env_environment.py").exists()  # made by `openenv init`
            self._up = True
        return url

    def stop(self) -> None:
        self.kill()


@pytest.fixture(scope="module")
def openenv_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenEnvServer]:
    if importlib.util.find_spec("openenv") is None:
        pytest.skip("needs openenv-core (pip install agentgym[openenv])")
    srv = OpenEnvServer(tmp_path_factory.mktemp("openenv"))
    try:
        yield srv
    finally:
        srv.stop()

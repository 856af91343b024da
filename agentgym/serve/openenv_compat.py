"""An AgentGym env as an ``openenv-core`` Environment, for serving with OpenEnv's own server.

``agentgym serve`` is the supported way to serve AgentGym envs in the OpenEnv protocol. This adapter
exists so the same env can run under ``openenv-core``'s ``create_app`` (the benchmark compares the
two servers on one env, and a Space built with OpenEnv's tooling can host an AgentGym env)::

    from openenv.core.env_server.http_server import create_app
    from agentgym.serve.openenv_compat import openenv_app_args

    app = create_app(*openenv_app_args("agentgym/ALFWorld-v0"), max_concurrent_envs=64)

The action and observation models have the fields of :mod:`agentgym.serve.protocol`, so one client
payload works against both servers. Needs ``pip install agentgym[openenv]``.
"""

from __future__ import annotations

import uuid
from typing import Any

from agentgym.errors import DependencyNotInstalled

__all__ = ["openenv_app_args"]


def openenv_app_args(env_id: str, **env_kwargs: Any) -> tuple[Any, Any, Any]:
    """``(EnvironmentClass, ActionClass, ObservationClass)`` for ``openenv``'s ``create_app``."""
    try:
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import Action, Observation, State
    except ImportError:
        raise DependencyNotInstalled("serving with openenv-core", "agentgym[openenv]") from None
    from pydantic import Field

    import agentgym

    class AgentGymAction(Action):
        """One assistant turn (``agentgym.serve.protocol.AgentAction``)."""

        type: str = Field(default="message")
        message: Any = Field(default=None)
        tool_name: str | None = Field(default=None)
        arguments: dict[str, Any] = Field(default_factory=dict)

    class AgentGymObservation(Observation):
        """New messages and the env's info (``agentgym.serve.protocol.AgentObservation``)."""

        messages: list[dict[str, Any]] = Field(default_factory=list)
        info: dict[str, Any] = Field(default_factory=dict)
        terminated: bool = Field(default=False)
        truncated: bool = Field(default=False)

    class AgentGymEnvironment(Environment):  # type: ignore[misc]
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self.env = agentgym.make(env_id, **env_kwargs)
            self._state = State(episode_id=None, step_count=0)

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
            options = {k: kw[k] for k in ("task_id", "split", "index") if kw.get(k) is not None}
            obs, info = self.env.reset(seed=seed, options=options or None)
            self._state = State(episode_id=episode_id or uuid.uuid4().hex[:12], step_count=0)
            return AgentGymObservation(messages=obs, info=info, done=False, reward=None)

        def step(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
            if action.type == "call_tool":
                payload: Any = {"role": "assistant", "content": "", "tool_calls": [
                    {"id": f"call_{self._state.step_count}", "name": action.tool_name, "arguments": action.arguments}]}
            else:
                payload = action.message
            obs, reward, terminated, truncated, info = self.env.step(payload)
            self._state.step_count += 1
            return AgentGymObservation(messages=obs, info=info, terminated=terminated, truncated=truncated,
                                       done=bool(terminated or truncated), reward=float(reward))

        @property
        def state(self) -> Any:
            return self._state

        def close(self) -> None:
            self.env.close()

    AgentGymEnvironment.__name__ = AgentGymEnvironment.__qualname__ = (
        "AgentGym_" + env_id.removeprefix("agentgym/").replace("-", "_"))
    return AgentGymEnvironment, AgentGymAction, AgentGymObservation

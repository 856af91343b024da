"""An AgentGym env episode as OpenAI Agents SDK tools (``openai-agents``).

    from agents import Agent, Runner
    from agentgym.integrations.openai_agents import env_tools

    tools = env_tools(agentgym.make("agentgym/Demo-v0"), task_id="guess-7", seed=0)   # one episode
    agent = Agent(name="player", model=model, tools=tools, tool_use_behavior=tools.stop_when_done)
    result = await Runner.run(agent, tools.input, max_turns=20)
    tools.reward, tools.success        # the episode's return and success, from the env

``env_tools`` resets the env and returns the env's tools as ``FunctionTool`` objects with the env's own
JSON schemas (``strict_json_schema=False``, so optional parameters stay optional), bound to that
episode: each call is one ``env.step`` with a structured tool call, so the env's validation, error
observations, turn limit and reward apply. ``tools.stop_when_done`` is a ``tool_use_behavior`` that
ends the run as soon as the episode has ended (its final output is the env's last observation), so the
agent neither keeps calling tools past the end nor runs into ``MaxTurnsExceeded``. Calls in one model
response run one after another (an env steps one action at a time); a call after the end gets an
error text and never reaches the env.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from agentgym.errors import DependencyNotInstalled
from agentgym.integrations.episode import ToolEpisode
from agentgym.types import Message

__all__ = ["EnvTools", "env_tools"]


def _agents() -> Any:
    try:
        import agents
    except ImportError as e:
        raise DependencyNotInstalled("agentgym.integrations.openai_agents", "agentgym[openai-agents]") from e
    return agents


class EnvTools(list):  # type: ignore[type-arg]
    """The env's tools as ``FunctionTool`` objects (a list: pass it as ``Agent(tools=...)``).

    Attributes:
        episode: The :class:`~agentgym.integrations.ToolEpisode` (transcript, steps, ``calls_after_end``).
        input: The episode's opening messages as Agents SDK input items (system prompt included).
        last_output: The text of the env's last observation.
    """

    def __init__(self, episode: ToolEpisode) -> None:
        super().__init__()
        self.episode = episode
        self.last_output = ""
        self._lock = asyncio.Lock()
        agents = _agents()
        for spec in episode.tools:
            fn = spec["function"]
            self.append(agents.FunctionTool(
                name=fn["name"],
                description=fn.get("description", ""),
                params_json_schema=json.loads(json.dumps(fn.get("parameters") or {"type": "object", "properties": {}})),
                on_invoke_tool=self._invoker(fn["name"]),
                strict_json_schema=False,
            ))

    def _invoker(self, name: str) -> Any:
        async def invoke(ctx: Any, arguments: str) -> str:
            call_id = getattr(ctx, "tool_call_id", None)
            async with self._lock:  # parallel calls of one response: the env takes one action at a time
                out = await asyncio.to_thread(self.episode.call, name, arguments or "{}", call_id=call_id)
            self.last_output = out
            return out

        return invoke

    @property
    def input(self) -> list[dict[str, str]]:
        return [{"role": m["role"], "content": str(m.get("content") or "")} for m in self.episode.messages]

    @property
    def reward(self) -> float:
        return self.episode.reward

    @property
    def success(self) -> bool:
        return self.episode.success

    @property
    def done(self) -> bool:
        return self.episode.done

    def stop_when_done(self, context: Any, results: Sequence[Any]) -> Any:
        """A ``tool_use_behavior``: end the run once the episode has ended, else let the model go on."""
        agents = _agents()
        if self.episode.done:
            return agents.ToolsToFinalOutputResult(is_final_output=True, final_output=self.last_output)
        return agents.ToolsToFinalOutputResult(is_final_output=False)


def env_tools(
    env: Any,
    *,
    task_id: str | None = None,
    split: str | None = None,
    index: int | None = None,
    seed: int | None = None,
) -> EnvTools:
    """Reset ``env`` (a task by id, or by split and index) and return its tools bound to that episode.

    Args:
        env: Any AgentGym env, ``agentgym/Remote-v0`` included.
        task_id, split, index, seed: Which task, as ``env.reset`` options.
    """
    episode = ToolEpisode(env)
    episode.reset(task_id=task_id, split=split, index=index, seed=seed)
    return EnvTools(episode)


def opening_messages(tools: EnvTools) -> list[Message]:
    return list(tools.episode.messages)

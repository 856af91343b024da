"""Wrappers for cross-cutting behaviour; each overrides one hook (STYLE.md, principle 6).

Turn limits are gymnasium's own ``TimeLimit`` (applied by ``gymnasium.make`` from
``max_episode_steps``); reward shaping can use gymnasium's ``TransformReward``. The wrappers here
cover what is specific to chat envs.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium

from agentgym.parsers import ParsedAction
from agentgym.types import Message

__all__ = ["HistoryWrapper", "SystemPromptWrapper"]


class HistoryWrapper(gymnasium.Wrapper[list[Message], Any, list[Message], Any]):
    """Observations become the whole conversation so far (opening messages, the agent's own turns,
    and every env message), for agent loops that do not keep history themselves.

    The agent's turn is recorded as the parsed assistant message (content plus structured tool calls).
    """

    def __init__(self, env: gymnasium.Env[list[Message], Any]) -> None:
        super().__init__(env)
        self.history: list[Message] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.history = copy.deepcopy(obs)
        return list(self.history), info

    def step(self, action: Any) -> tuple[list[Message], Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if isinstance(action, dict):
            turn: Message = ParsedAction(action.get("content") or "", list(info.get("tool_calls") or [])).message
        else:
            turn = ParsedAction(str(action), list(info.get("tool_calls") or [])).message
        self.history.append(turn)
        self.history.extend(copy.deepcopy(obs))
        return list(self.history), reward, terminated, truncated, info


class SystemPromptWrapper(gymnasium.Wrapper[list[Message], Any, list[Message], Any]):
    """Replace (or insert) the system prompt of the opening messages, e.g. for prompt ablations in eval."""

    def __init__(self, env: gymnasium.Env[list[Message], Any], prompt: str) -> None:
        super().__init__(env)
        self.prompt = prompt

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        rest = [m for m in obs if m["role"] != "system"]
        return [{"role": "system", "content": self.prompt}, *rest], info

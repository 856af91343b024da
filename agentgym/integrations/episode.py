"""One env episode driven one tool call at a time: what every framework adapter shares.

Frameworks such as TRL, the OpenAI Agents SDK and verifiers own the agent loop and call tools one
by one; AgentGym envs take whole assistant turns. :class:`ToolEpisode` maps each tool call onto
one ``env.step`` with an assistant message that carries that structured call, so the env's own
parser, validation, error observations, limits and reward apply unchanged, through the public API
only (a local env and ``agentgym/Remote-v0`` behave the same).

    ep = ToolEpisode(agentgym.make("agentgym/Demo-v0"))
    ep.reset(task_id="guess-7", seed=0)        # the opening messages; ep.tools: the env's exact schemas
    ep.call("guess", {"n": 31})                 # "lower": the tool message's text
    ep.reward, ep.success, ep.done

After the episode ended (the env terminated or hit its turn limit) a call does not step the env:
it returns :data:`EPISODE_OVER` and is counted in ``calls_after_end``.
"""

from __future__ import annotations

import json
from typing import Any

from agentgym.errors import ConfigurationError
from agentgym.types import Message, ToolSpec

__all__ = ["EPISODE_OVER", "EpisodeOver", "ToolEpisode", "tool_names"]

EPISODE_OVER = "Error: the episode is over; no more tool calls are taken."


class EpisodeOver(Exception):
    """Raised by adapters that must stop a framework's loop when the episode has ended."""


def tool_names(tools: list[ToolSpec]) -> list[str]:
    return [t["function"]["name"] for t in tools]


class ToolEpisode:
    """An env episode stepped one tool call at a time.

    Args:
        env: Any AgentGym env (``agentgym.make(...)``, wrappers included, or ``agentgym/Remote-v0``).

    Attributes:
        messages: The opening messages of the current episode.
        tools: The env's tool specs as it reported them in ``reset``'s ``info["tools"]``.
        reward: The sum of the step rewards so far (the episode's return, as ``agentgym eval`` counts it).
        success: ``info["success"]`` of the last step (``False`` until the env says otherwise).
        terminated, truncated: As the env reported them; ``done`` is either.
        steps: Env steps taken (one per tool call before the end).
        calls_after_end: Tool calls made after the episode ended (not sent to the env).
        transcript: The opening messages, then for each call the assistant message and the env's messages.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.messages: list[Message] = []
        self.tools: list[ToolSpec] = []
        self.info: dict[str, Any] = {}
        self.transcript: list[Message] = []
        self._clear()

    def _clear(self) -> None:
        self.reward = 0.0
        self.success = False
        self.terminated = False
        self.truncated = False
        self.steps = 0
        self.calls_after_end = 0
        self._started = False

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def reset(
        self,
        *,
        task_id: str | None = None,
        split: str | None = None,
        index: int | None = None,
        seed: int | None = None,
    ) -> list[Message]:
        """Start an episode on a task (by id, or by split and index); returns the opening messages."""
        options: dict[str, Any] = {}
        if task_id is not None:
            options["task_id"] = task_id
        if split is not None:
            options["split"] = split
        if index is not None:
            options["index"] = int(index)
        messages, info = self.env.reset(seed=seed, options=options or None)
        self._clear()
        self._started = True
        self.messages = [dict(m) for m in messages]  # type: ignore[misc]
        self.tools = list(info.get("tools") or [])
        self.info = dict(info)
        self.transcript = [dict(m) for m in messages]  # type: ignore[misc]
        return list(self.messages)

    def call(self, name: str, arguments: dict[str, Any] | str | None = None, *, call_id: str | None = None) -> str:
        """Run one tool call as one env step; return the text the agent reads (the env's new messages)."""
        if not self._started:
            raise ConfigurationError("ToolEpisode.call() before reset(): start an episode first")
        if self.done:
            self.calls_after_end += 1
            return EPISODE_OVER
        if isinstance(arguments, str):  # OpenAI wire format: a JSON string; the env's parser reads it
            args: Any = arguments
        else:
            args = dict(arguments or {})
        cid = call_id or f"call_{self.steps}"
        action: dict[str, Any] = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}],
        }
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        self.reward += float(reward)
        self.terminated = bool(terminated)
        self.truncated = bool(truncated)
        self.info = dict(info)
        if "success" in info:
            self.success = bool(info["success"])
        shown = dict(action)
        shown["tool_calls"] = [
            {"id": cid, "type": "function",
             "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
        ]  # type: ignore[typeddict-item]
        self.transcript.append(shown)  # type: ignore[arg-type]
        self.transcript += [dict(m) for m in obs]  # type: ignore[misc]
        return render_observation(obs)


def render_observation(messages: list[Message]) -> str:
    """The text of the env's new messages, as one tool result (joined by blank lines when several)."""
    parts = [m.get("content") or "" for m in messages]
    return "\n\n".join(p if isinstance(p, str) else json.dumps(p) for p in parts)

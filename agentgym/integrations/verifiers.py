"""AgentGym envs as a verifiers environment (``verifiers`` 0.4, ``vf-eval``).

Importing this module imports verifiers; ``import agentgym`` never does. The installable package
``integrations/verifiers-agentgym`` (module ``agentgym_verifiers``) re-exports these classes, which is
what verifiers' plugin loader looks for::

    pip install "agentgym[verifiers]" integrations/verifiers-agentgym
    vf-eval agentgym-verifiers --env.taskset.env-id agentgym/SQL-v0 --env.taskset.split test \\
        --select.limit 2 --model MODEL --client.base-url http://127.0.0.1:8000/v1 --env.agent.runtime.type subprocess

* :class:`AgentGymTaskset` yields one task per env task (lazily: a task's prompt is the env's own
  opening messages, reset with the configured seed).
* :class:`AgentGymHarness` plays a task with native OpenAI tool calls: the model is sent the env's
  messages and the env's exact tool schemas through verifiers' interception endpoint (so verifiers
  records every model call on the trace), each returned tool call is one ``env.step`` (the env's
  validation, error observations and turn limit apply), and the loop ends when the episode ends, the
  model answers without a tool call, or ``max_turns`` is reached. It runs in-process, as the
  ``Harness.launch`` contract allows; nothing is installed or downloaded at run time.
* The trace carries the env's return as the reward ``agentgym`` and the metrics ``agentgym_success``,
  ``agentgym_steps``, ``agentgym_terminated`` and ``agentgym_truncated``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.runtimes import ProgramResult

import agentgym
from agentgym.integrations.episode import ToolEpisode

__all__ = [
    "AgentGymData",
    "AgentGymHarness",
    "AgentGymHarnessConfig",
    "AgentGymTask",
    "AgentGymTaskset",
    "AgentGymTasksetConfig",
]


class AgentGymData(vf.TaskData):
    env_id: str
    task_id: str
    seed: int
    env_kwargs: dict[str, Any] = Field(default_factory=dict)


class AgentGymTasksetConfig(vf.TasksetConfig):
    env_id: str = "agentgym/Demo-v0"
    """A registered AgentGym env id (``agentgym/Remote-v0`` with ``env_kwargs`` url/env_id too)."""
    split: str = "test"
    """The split whose tasks are yielded."""
    seed: int = 0
    """The seed every episode is reset with (the same seed gives the same text)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for ``agentgym.make``."""


class AgentGymTask(vf.Task[AgentGymData]):
    pass


class AgentGymTaskset(vf.Taskset[AgentGymTask, AgentGymTasksetConfig]):
    def load(self) -> Iterator[AgentGymTask]:
        c = self.config
        env: Any = agentgym.make(c.env_id, **c.env_kwargs)
        try:
            ids = [t.task_id for t in env.unwrapped.tasks(c.split)]
            episode = ToolEpisode(env)
            for tid in ids:
                messages = episode.reset(task_id=tid, seed=c.seed)
                yield AgentGymTask(
                    AgentGymData(
                        id=tid, name=f"{c.env_id}:{tid}", prompt=[dict(m) for m in messages],  # type: ignore[misc]
                        env_id=c.env_id, task_id=tid, seed=c.seed, env_kwargs=dict(c.env_kwargs),
                    ),
                    c.task,
                )
        finally:
            env.close()


class AgentGymHarnessConfig(vf.HarnessConfig):
    max_turns: int = 32
    """Model calls per episode at most (the env's own turn limit also applies)."""
    request_timeout_s: float = 120.0
    """Total time one model call may take."""


class AgentGymHarness(vf.Harness[AgentGymHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any, tool_interception_url: str | None = None) -> ProgramResult:
        import asyncio

        from openai import AsyncOpenAI

        task = trace.task.data
        env = agentgym.make(task.env_id, **task.env_kwargs)
        episode = ToolEpisode(env)
        try:
            opening = await asyncio.to_thread(episode.reset, task_id=task.task_id, seed=task.seed)
            messages: list[dict[str, Any]] = [dict(m) for m in opening]
            async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0,
                                   timeout=self.config.request_timeout_s) as client:
                for _ in range(self.config.max_turns):
                    reply = await client.chat.completions.create(
                        model=ctx.model, messages=messages, tools=episode.tools or None)  # type: ignore[arg-type]
                    msg = reply.choices[0].message
                    calls: list[Any] = [t for t in (msg.tool_calls or []) if t.type == "function"]
                    assistant: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
                    if calls:
                        assistant["tool_calls"] = [
                            {"id": c.id, "type": "function",
                             "function": {"name": c.function.name, "arguments": c.function.arguments}}
                            for c in calls
                        ]
                    messages.append(assistant)
                    if not calls:
                        break
                    for c in calls:
                        out = await asyncio.to_thread(episode.call, c.function.name, c.function.arguments,
                                                      call_id=c.id)
                        messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
                    if episode.done:
                        break
        finally:
            await asyncio.to_thread(env.close)
            trace.record_reward("agentgym", episode.reward)
            trace.record_metrics({
                "agentgym_success": float(episode.success),
                "agentgym_steps": float(episode.steps),
                "agentgym_terminated": float(episode.terminated),
                "agentgym_truncated": float(episode.truncated),
            })
            trace.info["agentgym"] = {"task_id": task.task_id, "env_id": task.env_id,
                                      "transcript": json.loads(json.dumps(episode.transcript, default=str))}
        return ProgramResult(exit_code=0, stdout="", stderr="")

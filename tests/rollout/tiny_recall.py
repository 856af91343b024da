"""A tiny task that can only be solved with the whole conversation in view, for model-path tests.

``agentgym/TinyRecall-v0``: the user names a key (``key[q]``); the agent must first call
``wait[]`` (the tool answers ``ok``), then ``answer[q]``. On the answering turn the newest
observation says nothing about the key: a model that is sent only the new observation (the old
token-mode defect) answers at chance; one that sees the whole conversation copies the key.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentgym.core import AgentEnv
from agentgym.registration import register_env
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec

ENV_ID = "agentgym/TinyRecall-v0"
KEYS = list("abcdefghijklmnopqrstuvwx")  # one byte token each: copying one token is the induction task


class TinyRecallEnv(AgentEnv):
    """Wait once, then answer with the key the user gave at the start."""

    family = "test"
    default_parser = "react"

    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        return [TaskSpec(f"{split}-{k}", split, "recall", {"key": k}) for k in KEYS]

    def reset_task(self, task: TaskSpec) -> list[Message]:
        return [{"role": "user", "content": f"key[{task.data['key']}]"}]

    @tool
    def wait(self) -> str:
        """Wait a moment.

        Returns:
            "ok".
        """
        return "ok"

    @tool
    def answer(self, value: str) -> str:
        """Answer with the key (ends the episode).

        Args:
            value: The key.

        Returns:
            "correct" or "wrong".
        """
        assert self.task is not None
        ok = value.strip() == self.task.data["key"]
        self.finish(float(ok), ok)
        return "correct" if ok else "wrong"

    def expert_action(self) -> str:
        assert self.task is not None
        return "wait[]" if self._turn == 0 else f"answer[{self.task.data['key']}]"


register_env(ENV_ID, "tiny_recall:TinyRecallEnv", family="test", max_episode_steps=4,
             description="Tiny recall task (tests): wait[], then answer[the first message's key].")

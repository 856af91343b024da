"""Repeat a phrase back with the ``echo`` tool."""

from agentgym import AgentEnv, TaskSpec, tool

PHRASES = ["hello world", "agents need tools", "the quick brown fox", "seeded and reproducible"]


class EchoEnv(AgentEnv):
    """Repeat the given phrase with the echo tool."""

    family = "example"
    max_episode_steps = 5

    def __init__(self, loud: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.loud = loud

    def tasks(self, split="train"):
        return [TaskSpec(f"{split}-{i}", split, data={"phrase": p}) for i, p in enumerate(PHRASES)]

    def reset_task(self, task):
        how = "in capital letters" if self.loud else "exactly"
        return [{"role": "user", "content": f"Call echo with the phrase {task.data['phrase']!r} {how}."}]

    def _target(self):
        p = self.task.data["phrase"]
        return p.upper() if self.loud else p

    @tool
    def echo(self, text: str) -> str:
        """Say something back.

        Args:
            text: The text to echo.
        """
        ok = text == self._target()
        self.finish(float(ok), ok)
        return "well done" if ok else f"expected {self._target()!r}"

    def expert_action(self):
        return '<tool_call>{"name": "echo", "arguments": {"text": "%s"}}</tool_call>' % self._target()

"""A tiny tool-calling env for tests and tutorials: guess a secret number with feedback."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agentgym.core import AgentEnv, StepResult
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec

__all__ = ["GuessNumberEnv", "expert_bounds", "expert_guess", "expert_reply"]

_GUESS = re.compile(r'"n":\s*(-?\d+)')


def _guess_of(message: Message | dict[str, Any]) -> int | None:
    """The number an assistant message guessed: a structured tool call, or ``"n": N`` in its text."""
    for call in message.get("tool_calls") or []:
        function: Any = call.get("function") or {}
        args = call.get("arguments", function.get("arguments"))
        if isinstance(args, str):
            found = _GUESS.search(args)
            return int(found.group(1)) if found else None
        if isinstance(args, dict) and isinstance(args.get("n"), int):
            return int(args["n"])
    found = _GUESS.search(message.get("content") or "")
    return int(found.group(1)) if found else None


def expert_bounds(messages: Sequence[Message | dict[str, Any]], high: int = 63) -> tuple[int, int]:
    """The ``(lo, hi)`` the secret is known to lie in, read from the conversation alone.

    Each ``higher``/``lower`` answer narrows ``[lo, hi]`` around the guess before it (an assistant
    turn's structured tool call, or ``"n": N`` in its text).
    """
    lo, hi, last = 0, high, None
    for m in messages:
        if m["role"] == "assistant":
            last = _guess_of(m)
        elif m["role"] == "tool" and last is not None:
            if m["content"] == "higher":
                lo = max(lo, last + 1)
            elif m["content"] == "lower":
                hi = min(hi, last - 1)
    return lo, hi


def expert_guess(messages: Sequence[Message | dict[str, Any]], high: int = 63) -> int:
    """The binary-search expert's next guess, read from the conversation alone: the middle of
    :func:`expert_bounds`.

    This is the env's expert for a player that sees only the messages (a scripted policy, a
    benchmark, a scripted model server), where :meth:`GuessNumberEnv.expert_action` reads the env's
    own state.
    """
    lo, hi = expert_bounds(messages, high)
    return (lo + hi) // 2


def expert_reply(messages: Sequence[Message | dict[str, Any]], high: int = 63) -> str:
    """:func:`expert_guess` as the assistant's hermes tool call (``<tool_call>{...}</tool_call>``)."""
    call = {"name": "guess", "arguments": {"n": expert_guess(messages, high)}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


class GuessNumberEnv(AgentEnv):
    """Guess a secret integer in [0, high]; each guess is answered "higher", "lower" or "correct".

    Reward 1 if found, 0 if the agent gives up (``give_up``). Train and test use disjoint secrets.
    """

    family = "demo"

    def __init__(self, high: int = 63, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.high = int(high)
        self._lo = 0
        self._hi = self.high

    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        parity = 0 if split == "train" else 1
        return [TaskSpec(f"guess-{n}", split, "guess", {"secret": n}) for n in range(self.high + 1) if n % 2 == parity]

    def system_prompt(self) -> str:
        return (
            f"You are playing a guessing game. A secret integer lies between 0 and {self.high}. "
            "Call the guess tool with an integer; you will be told whether the secret is higher or lower. "
            + self.parser.format_instructions(self.tools)
        )

    def reset_task(self, task: TaskSpec) -> list[Message]:
        self._lo, self._hi = 0, self.high
        return [
            {"role": "system", "content": self.system_prompt()},
            {"role": "user", "content": "Find the secret number."},
        ]

    @tool
    def guess(self, n: int) -> str:
        """Guess the secret number.

        Args:
            n: Your guess, an integer between 0 and the upper bound.

        Returns:
            "correct", "higher" (the secret is larger) or "lower".
        """
        secret = int(self.task.data["secret"]) if self.task else 0
        if n == secret:
            self.finish(1.0, True)
            return "correct"
        if n < secret:
            self._lo = max(self._lo, n + 1)
            return "higher"
        self._hi = min(self._hi, n - 1)
        return "lower"

    @tool
    def give_up(self) -> str:
        """Stop playing and reveal the secret (reward 0)."""
        self.finish(0.0, False)
        return f"The secret was {self.task.data['secret'] if self.task else '?'}."

    def on_command(self, command: str) -> StepResult:
        # react parser with a bare number: treat as a guess, so the demo also works in text mode
        if command.strip().lstrip("-").isdigit():
            return self.run_tool_calls([{"id": "call_0", "name": "guess", "arguments": {"n": int(command)}}])
        return super().on_command(command)

    def expert_action(self) -> str:
        mid = (self._lo + self._hi) // 2
        call = {"name": "guess", "arguments": {"n": mid}}
        if self.parser.name == "react":
            return f"Action: guess[{mid}]"
        if self.parser.name == "json":
            return json.dumps(call)
        return f"<tool_call>{json.dumps(call)}</tool_call>"

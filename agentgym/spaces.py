"""Gymnasium spaces for LLM text.

``gymnasium.spaces.Text`` defaults to an alphanumeric charset, so real LLM output fails its
``contains``. These spaces accept any unicode text and still sample reproducibly from their own RNG.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.spaces import Space

from agentgym.types import Message, is_message, is_message_list

__all__ = ["ActionSpace", "ChatSpace", "TextSpace"]

# A sampling alphabet with ASCII, punctuation, whitespace and a few non-ASCII code points, so that
# sampled actions exercise the parsers with realistic junk (JSON braces, angle brackets, unicode).
_SAMPLE_CHARS = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    " \n\t.,:;!?'\"()[]{}<>/\\_-+=*&^%$#@~`|é漢字🙂"
)


def _sample_text(rng: np.random.Generator, max_length: int) -> str:
    n = int(rng.integers(0, max_length + 1))
    idx = rng.integers(0, len(_SAMPLE_CHARS), size=n)
    return "".join(_SAMPLE_CHARS[i] for i in idx)


class TextSpace(Space[str]):
    """Any Python ``str`` up to ``max_length`` characters (``None``: unbounded)."""

    def __init__(self, max_length: int | None = None, seed: int | np.random.Generator | None = None):
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return _sample_text(self.np_random, min(self.max_length or 64, 64))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and (self.max_length is None or len(x) <= self.max_length)

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextSpace) and other.max_length == self.max_length


class ActionSpace(TextSpace):
    """An agent action: raw assistant text, or an assistant :class:`Message` with ``tool_calls``."""

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return super().contains(x)
        return is_message(x) and x["role"] == "assistant"

    def __repr__(self) -> str:
        return "ActionSpace(str | assistant Message)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActionSpace)


class ChatSpace(Space[list[Message]]):
    """A list of chat :class:`Message` dicts (what ``reset``/``step`` return)."""

    def __init__(self, max_messages: int | None = None, seed: int | np.random.Generator | None = None):
        self.max_messages = max_messages
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        n = int(self.np_random.integers(1, 4))
        roles = ("system", "user", "tool")
        out: list[Message] = []
        for _ in range(n):
            role = roles[int(self.np_random.integers(0, len(roles)))]
            msg: Message = {"role": role, "content": _sample_text(self.np_random, 32)}  # type: ignore[typeddict-item]
            if role == "tool":
                msg["tool_call_id"] = f"call_{int(self.np_random.integers(0, 10**6))}"
                msg["name"] = "tool"
            out.append(msg)
        return out

    def contains(self, x: Any) -> bool:
        if not is_message_list(x):
            return False
        return self.max_messages is None or len(x) <= self.max_messages

    def __repr__(self) -> str:
        return "ChatSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChatSpace)

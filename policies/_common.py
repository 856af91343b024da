"""Helpers shared by the tokenizer-owning policies (HF and vLLM): prompts, context, stop strings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentgym.errors import ConfigurationError, ContextLengthExceeded
from agentgym.policy import GenRequest

__all__ = ["PreparedPrompt", "Truncation", "cut_at_stop", "prepare_prompts"]

Truncation = Literal["error", "left"]


@dataclass
class PreparedPrompt:
    """A request's prompt ids after rendering and context checks.

    Attributes:
        ids: Prompt token ids that go to the model.
        max_tokens: Completion budget, clipped so prompt + completion fits the context.
        truncated: How many prompt tokens were dropped from the left (``truncation="left"``).
    """

    ids: list[int]
    max_tokens: int
    truncated: int = 0


def render_ids(tokenizer: Any, req: GenRequest) -> list[int]:
    """The request's prompt ids: exact ``prompt_token_ids``, or messages + tools through the template."""
    if req.prompt_token_ids is not None:
        return [int(t) for t in req.prompt_token_ids]
    if not req.messages:
        raise ConfigurationError("a GenRequest needs messages or prompt_token_ids")
    text = tokenizer.apply_chat_template(
        list(req.messages), tools=req.tools or None, tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(str(text), add_special_tokens=False)["input_ids"])


def prepare_prompts(
    tokenizer: Any, requests: Sequence[GenRequest], context_length: int, truncation: Truncation
) -> list[PreparedPrompt]:
    """Render every request and fit it into ``context_length`` tokens.

    A prompt that leaves no room for a single new token raises
    :class:`~agentgym.errors.ContextLengthExceeded` (``truncation="error"``) or loses its oldest
    tokens (``"left"``); ``max_tokens`` is clipped to the room that is left.
    """
    out: list[PreparedPrompt] = []
    for i, req in enumerate(requests):
        if req.n < 1:
            raise ConfigurationError(f"request {i}: n must be >= 1, got {req.n}")
        if req.sampling.max_tokens < 0:
            raise ConfigurationError(f"request {i}: max_tokens must be >= 0, got {req.sampling.max_tokens}")
        ids = render_ids(tokenizer, req)
        if not ids:
            raise ConfigurationError(f"request {i}: the prompt is empty")
        dropped = 0
        if len(ids) >= context_length:
            if truncation == "error":
                raise ContextLengthExceeded(
                    f"request {i}: the prompt has {len(ids)} tokens but the context holds {context_length}. "
                    "Shorten the history (e.g. a history wrapper), or build the policy with truncation='left'."
                )
            keep = max(1, context_length - max(1, min(req.sampling.max_tokens, context_length // 2)))
            dropped = len(ids) - keep
            ids = ids[-keep:]
        room = context_length - len(ids)
        out.append(PreparedPrompt(ids=ids, max_tokens=min(req.sampling.max_tokens, room), truncated=dropped))
    return out


def cut_at_stop(text: str, stop: Sequence[str] | None) -> tuple[str, bool]:
    """Cut ``text`` at the earliest stop string. Returns (text, whether a stop string was found)."""
    if not stop:
        return text, False
    hits = [text.find(s) for s in stop if s and s in text]
    if not hits:
        return text, False
    return text[: min(hits)], True

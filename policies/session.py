"""Token-in/token-out chat sessions over an HF tokenizer's own chat template.

A :class:`TokenizerChatSession` keeps the exact token ids of one conversation. The sampled ids of
each completion are appended verbatim; new observation messages are tokenized as a *delta*: the
chat-template text that follows the already-rendered prefix. Nothing is ever re-tokenized.

How the delta is found, and what is checked each turn:

1. The session tracks ``text``: the exact string its ids stand for (the first rendered prompt, then
   each completion decoded with its special tokens, then each delta).
2. On :meth:`append_messages`, the history (including the assistant messages rebuilt from the
   completions) is rendered without a generation prompt. That string must start with ``text``:
   the template renders earlier turns exactly as the model saw them. What follows is the *glue*
   the template adds after an assistant turn that the model did not sample itself (``"\\n"`` after
   ``<|im_end|>`` in ChatML; ``<|im_end|>\\n`` when the completion was cut by ``max_tokens``).
3. The history plus the new messages is rendered *with* the generation prompt. It must start with
   the history rendering (the prefix property). The delta is glue + the rest, tokenized alone.

When a check fails the template cannot be continued token-exactly (templates that drop earlier
reasoning, move tools into the last user turn, or trim assistant text do this). The session then
reports it, as configured by ``on_mismatch``:

* ``"raise"`` (default): raise :class:`~agentgym.errors.TokenizationError`. The rollout engine
  starts a new sample from the full conversation.
* ``"rerender"``: re-render the whole conversation, replace the ids, set ``last_reset`` and return
  the *full* new prompt; ``mismatches`` records why. The earlier ids are no longer a prefix.

Tokenizing the delta alone equals tokenizing it in context when the delta begins at a special
token boundary (true for ChatML, Llama 3 and Qwen templates: the glue follows ``<|im_end|>`` or
``<|eot_id|>``). :meth:`verify` checks the whole sequence against a full re-render (for tests).
"""

from __future__ import annotations

from typing import Any, Literal

from agentgym.errors import ConfigurationError, TokenizationError
from agentgym.types import Message, ToolSpec

__all__ = ["TokenizerChatSession"]

OnMismatch = Literal["raise", "rerender"]


class TokenizerChatSession:
    """Exact token ids of one conversation, extended turn by turn (implements ``ChatSession``).

    Args:
        tokenizer: An HF tokenizer with a chat template.
        on_mismatch: ``"raise"`` or ``"rerender"`` (see the module docstring).
        template_kwargs: Extra variables for ``apply_chat_template`` (e.g. ``enable_thinking``).

    Attributes:
        messages: The conversation so far (assistant turns rebuilt from the completions).
        tools: Tool specs passed to the template on every render.
        mismatches: One line per detected template drift, in order.
        retokenization_drift: Places where re-tokenizing the text would give other ids than the
            kept ones (a completion that joins its prompt non-canonically, e.g. a generation
            prompt ending in whitespace that the tokenizer would merge with the next word, or
            non-canonical sampled ids). The kept ids are what the model saw, so training stays
            exact; only a full re-render would differ. Checked locally at each join.
        last_reset: True if the last :meth:`append_messages` re-rendered the whole conversation.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        on_mismatch: OnMismatch = "raise",
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if on_mismatch not in ("raise", "rerender"):
            raise ConfigurationError(f"on_mismatch must be 'raise' or 'rerender', got {on_mismatch!r}")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigurationError(
                "this tokenizer has no chat template; set tokenizer.chat_template or use a chat model"
            )
        self.tokenizer = tokenizer
        self.on_mismatch: OnMismatch = on_mismatch
        self.template_kwargs = dict(template_kwargs or {})
        self.messages: list[Message] = []
        self.tools: list[ToolSpec] | None = None
        self.mismatches: list[str] = []
        self.retokenization_drift: list[str] = []
        self.last_reset = False
        self._ids: list[int] = []
        self._text = ""
        self._awaiting_completion = False
        self._special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])

    # ---------------------------------------------------------------- protocol
    @property
    def token_ids(self) -> list[int]:
        """All ids so far (a copy)."""
        return list(self._ids)

    @property
    def text(self) -> str:
        """The exact string the ids stand for."""
        return self._text

    def start(self, messages: list[Message], tools: list[ToolSpec] | None = None) -> list[int]:
        """Render the first prompt (with the generation prompt) and return its ids."""
        if not messages:
            raise ConfigurationError("a chat session needs at least one message to start")
        self.messages = [dict(m) for m in messages]  # type: ignore[misc]
        self.tools = list(tools) if tools else None
        self.mismatches = []
        self.retokenization_drift = []
        self.last_reset = False
        self._text = self._render(self.messages, generation_prompt=True)
        self._ids = self._encode(self._text)
        self._awaiting_completion = True
        return list(self._ids)

    def append_completion(self, token_ids: list[int]) -> None:
        """Append the sampled ids verbatim and record the assistant message they decode to."""
        if not self._awaiting_completion:
            raise ConfigurationError("append_completion() must follow start() or append_messages()")
        ids = [int(t) for t in token_ids]
        self._check_join(self._ids, ids, "prompt|completion")
        self._ids += ids
        self._text += self.tokenizer.decode(ids, skip_special_tokens=False)
        body = list(ids)
        while body and body[-1] in self._special_ids:  # eos / end-of-turn tokens close the turn
            body.pop()
        content = self.tokenizer.decode(body, skip_special_tokens=False)
        if body and self._encode(content) != body:
            self.retokenization_drift.append(
                f"turn {self._num_assistant_turns() + 1} (completion): sampled ids are not the canonical "
                "tokenization of their text"
            )
        self.messages.append({"role": "assistant", "content": content})
        self._awaiting_completion = False

    def append_messages(self, messages: list[Message]) -> list[int]:
        """Append observation messages; return only the new ids (ending in the generation prompt)."""
        if self._awaiting_completion:
            raise ConfigurationError("append_messages() must follow append_completion()")
        if not messages:
            raise ConfigurationError("append_messages() needs at least one message")
        new = [dict(m) for m in messages]
        history = self._render(self.messages, generation_prompt=False)
        full = self._render(self.messages + new, generation_prompt=True)  # type: ignore[operator]
        self.last_reset = False
        problem = None
        if not history.startswith(self._text):
            problem = (
                "the template renders earlier turns differently from what the model saw "
                f"(first difference at char {_first_diff(history, self._text)} of {len(self._text)})"
            )
        elif not full.startswith(history):
            problem = (
                "the template breaks the prefix property: adding messages changes earlier text "
                f"(first difference at char {_first_diff(full, history)})"
            )
        self.messages += new  # type: ignore[arg-type]
        self._awaiting_completion = True
        if problem is not None:
            self.mismatches.append(f"turn {self._num_assistant_turns()}: {problem}")
            if self.on_mismatch == "raise":
                raise TokenizationError(
                    f"token-exact continuation impossible: {problem}. Use a template whose rendering of a "
                    "conversation is a prefix of its continuation, or on_mismatch='rerender' to start a new sample."
                )
            self.last_reset = True
            self._text = full
            self._ids = self._encode(full)
            return list(self._ids)
        delta_text = full[len(self._text) :]
        delta = self._encode(delta_text)
        self._check_join(self._ids, delta, "completion|observation")
        self._ids += delta
        self._text = full
        return delta

    # ------------------------------------------------------------------ checks
    def verify(self) -> bool:
        """True if the ids equal a full re-render of the conversation (expensive; for tests)."""
        return self._encode(self._text) == self._ids

    def render_all(self) -> list[int]:
        """Ids of rendering the whole conversation at once (what re-tokenizing would give)."""
        return self._encode(self._render(self.messages, generation_prompt=self._awaiting_completion))

    # ---------------------------------------------------------------- internals
    def _num_assistant_turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")

    def _check_join(self, left: list[int], right: list[int], where: str, window: int = 6) -> None:
        """Record if tokenizing the text across a join would give other ids than tokenizing each side."""
        if not left or not right:
            return
        lt = self.tokenizer.decode(left[-window:], skip_special_tokens=False)
        rt = self.tokenizer.decode(right[:window], skip_special_tokens=False)
        # Both windows share their outer edges with the joint text, so only the join can differ.
        if self._encode(lt + rt) != self._encode(lt) + self._encode(rt):
            self._drift(where, lt + rt)

    def _drift(self, where: str, text: str) -> None:
        self.retokenization_drift.append(
            f"turn {self._num_assistant_turns()} ({where}): {text!r} re-tokenizes across the join"
        )

    def _render(self, messages: list[Any], *, generation_prompt: bool) -> str:
        out = self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **self.template_kwargs,
        )
        return str(out)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def _first_diff(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n

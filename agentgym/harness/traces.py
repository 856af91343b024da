"""Token-exact traces of one rollout: consecutive requests joined into training segments.

An external agent sends whole conversations, request after request. A :class:`RolloutTrace` keeps,
per *chain* (one token context of the model), the exact ids the model saw and generated, and decides
for each new request whether it continues a chain:

* **Chat requests** (``/v1/chat/completions``) continue chain ``c`` when the request's messages are
  ``c``'s last request messages, then the assistant message the endpoint returned for it, then new
  non-assistant messages (tool results, user turns), with the same tools. The new messages are then
  tokenized as a template *delta* into ``c``'s :class:`~agentgym.policy.ChatSession`, and the
  model sees ``c``'s previous prompt + the ids it generated + the delta, token for token.

  The re-sent assistant message is **not** re-rendered: agents re-send a tool call in OpenAI's shape
  (``arguments`` as a JSON string, content dropped or ``null``), and a template renders that
  differently from what the model generated (SmolLM2's template puts its own spacing around
  ``<tool_call>``). Where the re-sent message is the one the endpoint produced (same content, same
  tool names and arguments), its recorded completion ids are reused. ``rerender_drift`` counts the
  turns where rendering the request afresh would *not* have reproduced those ids: the drift this
  avoids.
* **Text requests** (``/v1/completions``) continue the chain whose prompt + completion ids are a
  prefix of the new prompt ids.

Anything else starts a new chain: a new training :class:`~agentgym.types.Segment`, exactly as
:meth:`~agentgym.types.Trajectory.segments` treats a restarted session. Why is counted:
``context_rewritten`` (the agent summarised, truncated or reordered earlier messages),
``assistant_rewritten`` (it re-sent an assistant message other than the one produced),
``template_mismatch`` (the chat template cannot continue the session token-exactly),
``tools_changed``, ``concurrent`` (the chain was still generating). A turn never joins a chain
that another turn of the same rollout is generating on.

:meth:`RolloutTrace.turns` lists turns chain by chain (each chain's first turn ``new_session``), so
the trajectory's segments are exactly the chains even when an agent interleaves conversations.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentgym.errors import TokenizationError
from agentgym.policy import ChatSession, Generation
from agentgym.types import Message, ToolCall, ToolSpec, Turn

__all__ = ["Pending", "PolicyBinding", "RolloutTrace"]

MISMATCH_REASONS = ("context_rewritten", "assistant_rewritten", "template_mismatch", "tools_changed", "concurrent")


def _canon_calls(calls: list[ToolCall] | None) -> list[tuple[str, str]]:
    return [(c["name"], json.dumps(c["arguments"], sort_keys=True)) for c in calls or []]


def _same_message(a: Message, b: Message) -> bool:
    """Equal as far as the model can see: role, content, tool names and arguments, tool_call_id."""
    return (a["role"] == b["role"] and (a.get("content") or "") == (b.get("content") or "")
            and _canon_calls(a.get("tool_calls")) == _canon_calls(b.get("tool_calls"))
            and a.get("tool_call_id") == b.get("tool_call_id"))


def _same_reply(sent: Message, produced: Message) -> bool:
    """The re-sent assistant message is the one the endpoint produced (tool call ids are the agent's)."""
    return (sent["role"] == "assistant" and (sent.get("content") or "").strip() == (produced.get("content") or "").strip()
            and _canon_calls(sent.get("tool_calls")) == _canon_calls(produced.get("tool_calls")))


@dataclass
class _Chain:
    """One token context of the model within a rollout."""

    index: int
    kind: str  # "chat", "text", or "message" (a policy without token sessions)
    policy_id: str
    session: ChatSession | None = None
    tools: list[ToolSpec] | None = None
    messages: list[Message] = field(default_factory=list)  # chat: the last request's messages
    reply: Message | None = None  # chat: the assistant message returned for the last request
    ids: list[int] = field(default_factory=list)  # prompt + completion ids so far
    busy: bool = False
    dead: bool = False
    turns: list[int] = field(default_factory=list)


@dataclass
class Pending:
    """A request admitted to the trace and waiting for its generation.

    Attributes:
        prompt_ids: The whole token context to generate from (``None``: a message-mode policy
            renders the messages itself).
        delta: The ids this turn adds to its chain (the whole prompt on a new chain).
        new_segment: The turn starts a new chain.
        reason: Why a new chain was started (``None`` for the rollout's first chain or a continuation).
    """

    chain: _Chain
    prompt_ids: list[int] | None
    delta: list[int]
    new_segment: bool
    reason: str | None = None
    messages: list[Message] = field(default_factory=list)


@dataclass(frozen=True)
class PolicyBinding:
    """How a trace talks about one policy.

    Attributes:
        policy_id: Tagged on the policy's turns (chains never mix policies).
        new_session: ``() -> ChatSession`` (``None``: the policy keeps no token sessions; chat requests
            are then sent as messages and joined by the prompt ids the backend reports).
        render: ``(messages, tools) -> ids`` of rendering a whole conversation afresh with the
            generation prompt (for the ``rerender_drift`` count; ``None``: not counted).
    """

    policy_id: str
    new_session: Callable[[], ChatSession] | None = None
    render: Callable[[list[Message], list[ToolSpec] | None], list[int]] | None = None


class RolloutTrace:
    """The turns of one rollout, with the chain bookkeeping above (single-threaded: one event loop).

    A rollout may call several policies (a planner and an executor model): each chain belongs to one.

    Args:
        rollout_id: The rollout's id.
    """

    def __init__(self, rollout_id: str) -> None:
        self.rollout_id = rollout_id
        self._chains: list[_Chain] = []
        self._count = 0
        self._turns: list[Turn] = []
        self._turn_chain: list[int] = []
        self.requests = 0
        self.failed_requests = 0
        self.reused_completions = 0
        self.rerender_drift = 0
        self.mismatches: Counter[str] = Counter()
        self.last_messages: list[Message] = []

    def _next_index(self) -> int:
        self._count += 1
        return self._count - 1

    # ------------------------------------------------------------------------------------- chat
    def begin_chat(self, policy: PolicyBinding, messages: list[Message], tools: list[ToolSpec] | None) -> Pending:
        """Admit a chat request for ``policy``: continue a chain or start one (see the module docstring).

        Raises:
            TokenizationError: even a fresh session cannot render these messages.
        """
        self.requests += 1
        if policy.new_session is None:
            return self._begin_message_mode(policy, messages, tools)
        best: _Chain | None = None
        reason = "context_rewritten"
        for c in reversed(self._chains):
            if c.kind != "chat" or c.policy_id != policy.policy_id or c.dead or (c.reply is None and not c.busy):
                continue
            verdict = self._extends(c, messages, tools)
            if verdict is None:
                best = c
                break
            if _RANK[verdict] > _RANK[reason]:
                reason = verdict
        if best is not None:
            assert best.session is not None and best.reply is not None
            new = messages[len(best.messages) + 1:]
            try:
                delta = list(best.session.append_messages(new))
            except TokenizationError:
                best.dead = True
                reason = "template_mismatch"
            else:
                if getattr(best.session, "last_reset", False):  # a session that re-rendered by itself
                    best.dead = True
                    reason = "template_mismatch"
                else:
                    self.reused_completions += 1
                    prompt = list(best.session.token_ids)
                    if policy.render is not None and policy.render(messages, tools) != prompt:
                        self.rerender_drift += 1
                    prev = self._turns[best.turns[-1]]
                    prev.observation = list(new)
                    best.messages = list(messages)
                    best.reply = None
                    best.busy = True
                    return Pending(best, prompt, delta, False, messages=list(messages))
        session = policy.new_session()
        ids = list(session.start(list(messages), tools))
        chain = _Chain(self._next_index(), "chat", policy.policy_id, session=session, tools=tools,
                       messages=list(messages), busy=True)
        first = not any(c.policy_id == policy.policy_id and c.turns for c in self._chains)
        self._chains.append(chain)
        if not first:
            self.mismatches[reason] += 1
        return Pending(chain, ids, ids, True, None if first else reason, messages=list(messages))

    def _extends(self, c: _Chain, messages: list[Message], tools: list[ToolSpec] | None) -> str | None:
        """``None`` if ``messages`` continue chain ``c``, else why not (a mismatch reason)."""
        n = len(c.messages)
        if len(messages) < n + 2 or not all(_same_message(a, b) for a, b in zip(messages[:n], c.messages, strict=False)):
            return "context_rewritten"
        if c.busy:
            return "concurrent"
        assert c.reply is not None
        if not _same_reply(messages[n], c.reply):
            return "assistant_rewritten"
        if any(m["role"] == "assistant" for m in messages[n + 1:]):
            return "assistant_rewritten"
        if (tools or None) != (c.tools or None):
            return "tools_changed"
        return None

    def _begin_message_mode(self, policy: PolicyBinding, messages: list[Message],
                            tools: list[ToolSpec] | None) -> Pending:
        chain = _Chain(self._next_index(), "message", policy.policy_id, tools=tools, messages=list(messages), busy=True)
        self._chains.append(chain)
        return Pending(chain, None, [], True, None, messages=list(messages))

    # ------------------------------------------------------------------------------------- text
    def begin_text(self, policy: PolicyBinding, prompt_ids: list[int]) -> Pending:
        """Admit a completion request for ``policy`` whose prompt is ``prompt_ids``."""
        self.requests += 1
        reason = "context_rewritten"
        for c in reversed(self._chains):
            if c.kind != "text" or c.policy_id != policy.policy_id or c.dead or not c.ids:
                continue
            if prompt_ids[:len(c.ids)] == c.ids and len(prompt_ids) > len(c.ids):
                if c.busy:
                    reason = "concurrent"
                    continue
                c.busy = True
                return Pending(c, list(prompt_ids), list(prompt_ids[len(c.ids):]), False)
        chain = _Chain(self._next_index(), "text", policy.policy_id, busy=True)
        first = not any(c.policy_id == policy.policy_id and c.turns for c in self._chains)
        self._chains.append(chain)
        if not first:
            self.mismatches[reason] += 1
        return Pending(chain, list(prompt_ids), list(prompt_ids), True, None if first else reason)

    # ------------------------------------------------------------------------------------- results
    def end(self, p: Pending, gen: Generation, reply: Message | None, tool_calls: list[ToolCall]) -> Turn:
        """Record the generation answering ``p`` as a turn; ``reply`` is the assistant message returned
        (chat requests), compared with the next request's re-sent one."""
        c = p.chain
        prompt = p.prompt_ids
        delta = p.delta
        new_session = p.new_segment
        if c.kind == "message":  # the backend rendered the messages: join by the ids it reports
            prompt = list(gen.prompt_token_ids or [])
            prev = self._find_message_chain(prompt, c)
            if prev is not None:
                c.dead = True
                c = prev
                delta, new_session = prompt[len(prev.ids):], False
            else:
                delta = prompt
                if any(o.policy_id == c.policy_id and o.turns for o in self._chains):
                    self.mismatches["context_rewritten"] += 1
        elif gen.prompt_token_ids is not None and prompt is not None and list(gen.prompt_token_ids) != prompt:
            # the backend changed the prompt (left truncation): a context of its own, never continued
            prompt = list(gen.prompt_token_ids)
            delta, new_session = prompt, True
            if not p.new_segment:
                c.busy = False
                c.dead = True
                c = _Chain(self._next_index(), c.kind, c.policy_id)
                self._chains.append(c)
                self.mismatches["context_rewritten"] += 1
            c.dead = True
        ids = [int(t) for t in gen.token_ids]
        turn = Turn(policy_id=c.policy_id, prompt_token_ids=list(delta), completion_token_ids=ids,
                    completion_logprobs=list(gen.logprobs), weight_version=gen.weight_version, text=gen.text,
                    tool_calls=list(tool_calls), finish_reason=gen.finish_reason, new_session=new_session)
        self._turns.append(turn)
        self._turn_chain.append(c.index)
        c.turns.append(len(self._turns) - 1)
        c.busy = False
        c.ids = list(prompt or []) + ids
        if c.kind == "chat" and not c.dead:
            assert c.session is not None
            c.session.append_completion(ids)
            c.reply = reply
        if p.messages:
            self.last_messages = list(p.messages) + ([reply] if reply is not None else [])
        return turn

    def fail(self, p: Pending) -> None:
        """The generation for ``p`` failed: its chain can never be continued token-exactly."""
        self.failed_requests += 1
        p.chain.busy = False
        p.chain.dead = True

    def _find_message_chain(self, prompt: list[int], exclude: _Chain) -> _Chain | None:
        if not prompt:
            return None
        for c in reversed(self._chains):
            if c is exclude or c.kind != "message" or c.policy_id != exclude.policy_id or c.dead or c.busy or not c.ids:
                continue
            if prompt[:len(c.ids)] == c.ids and len(prompt) > len(c.ids):
                return c
        return None

    # ------------------------------------------------------------------------------------- views
    @property
    def num_turns(self) -> int:
        return len(self._turns)

    def turns(self) -> list[Turn]:
        """The turns, chain by chain (in order of each chain's first turn), each chain's first turn
        marked ``new_session``: one training segment per chain."""
        order = sorted(range(len(self._turns)), key=lambda i: (self._turn_chain[i], i))
        out: list[Turn] = []
        last_chain = None
        for i in order:
            t = self._turns[i]
            ch = self._turn_chain[i]
            if ch != last_chain and not t.new_session:
                t = dataclasses.replace(t, new_session=True)
            out.append(t)
            last_chain = ch
        return out

    @property
    def segments(self) -> int:
        return len({self._turn_chain[i] for i in range(len(self._turns))})

    def metrics(self) -> dict[str, Any]:
        """Counts for the run's metrics: requests, turns, segments and every prompt mismatch by reason."""
        out: dict[str, Any] = {
            "requests": self.requests,
            "failed_requests": self.failed_requests,
            "turns": len(self._turns),
            "segments": self.segments,
            "prompt_mismatches": sum(self.mismatches.values()),
            "reused_completions": self.reused_completions,
            "rerender_drift": self.rerender_drift,
            "generated_tokens": sum(len(t.completion_token_ids) for t in self._turns),
            "prompt_tokens": sum(len(t.prompt_token_ids) for t in self._turns),
        }
        for r in MISMATCH_REASONS:
            out[f"mismatch_{r}"] = self.mismatches.get(r, 0)
        return out


_RANK = {"context_rewritten": 0, "concurrent": 1, "tools_changed": 2, "assistant_rewritten": 3, "template_mismatch": 4}

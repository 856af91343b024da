"""A scripted policy over a real tokenizer and chat template, for tests of our own bookkeeping.

:class:`ScriptedTokenPolicy` keeps real token sessions (:class:`TokenizerChatSession` over the tiny
model's tokenizer) and answers with ``reply(prompt_text)``, tokenized; it records every prompt it was
sent and the ids it generated, so a test can check the endpoint's records against them.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any

from agentgym.policies.session import TokenizerChatSession

from agentgym.policy import Capabilities, Generation, GenRequest, PolicyLifecycle, describe_policy


def lookup_reply(prompt: str) -> str:
    """Plays TinyLookup from the context: ``lookup[]``, then ``answer[VALUE]`` from the last tool result."""
    found = re.findall(r"value\[(\w+)\]", prompt.rsplit("<|im_start|>user", 1)[-1])
    return f"answer[{found[-1]}]" if found else "lookup[]"


class ScriptedTokenPolicy(PolicyLifecycle):
    capabilities = Capabilities(sessions=True)

    def __init__(self, tokenizer: Any, reply: Callable[[str], str] = lookup_reply, *, policy_id: str = "policy",
                 version: int = 7, latency: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.policy_id = policy_id
        self.weight_version = version
        self.latency = latency
        self.calls: list[tuple[list[int], list[int]]] = []  # (prompt ids, generated ids)
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def new_session(self) -> TokenizerChatSession:
        return TokenizerChatSession(self.tokenizer)

    def describe(self) -> dict[str, Any]:
        return describe_policy(self, backend="scripted")

    async def aclose(self) -> None:
        pass

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        if self.latency:
            await asyncio.sleep(self.latency)
        out = []
        for r in requests:
            if r.prompt_token_ids is not None:
                ids = list(r.prompt_token_ids)
            else:
                text = self.tokenizer.apply_chat_template(r.messages, tools=r.tools, tokenize=False,
                                                          add_generation_prompt=True)
                ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            text = self.reply(self.tokenizer.decode(ids, skip_special_tokens=False))
            gen_ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])[: r.sampling.max_tokens - 1]
            gen_ids.append(self.eos)
            self.calls.append((ids, gen_ids))
            out.append(Generation(text=self.tokenizer.decode(gen_ids, skip_special_tokens=True), token_ids=gen_ids,
                                  logprobs=[-0.25] * len(gen_ids), weight_version=self.weight_version,
                                  prompt_token_ids=ids))
        return out

"""A one-call tool task and a tiny model that plays it, for the TRL tests (nothing downloaded).

**Task** (``agentgym/TinyCoin-v0``): the secret side of a coin is ``heads`` or ``tails``; one call
``pick(side)`` ends the episode with reward 1 if it names the secret. ``flip()`` only tells a side
at random (a tool that does not end the episode).

**Model**: a 2-layer Llama over SmolLM2's tokenizer and AgentGym's SmolLM2 chat template, fitted in
a few seconds to answer every prompt with ``pick`` of heads or tails, so that sampling gives both
rewards and a GRPO step has a signal.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.core import AgentEnv
from agentgym.registration import register_env
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec

ENV_ID = "agentgym/TinyCoin-v0"
SIDES = ("heads", "tails")


class TinyCoinEnv(AgentEnv):
    """Pick the secret side of a coin."""

    family = "demo"

    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        return [TaskSpec(f"{split}-{i}", split, "coin", {"side": SIDES[i % 2]}) for i in range(8)]

    def _reset_task(self, task: TaskSpec) -> list[Message]:
        return [{"role": "system", "content": "Pick a side. " + self.parser.format_instructions(self.tools)},
                {"role": "user", "content": f"Coin {task.task_id}."}]

    @tool
    def pick(self, side: str) -> str:
        """Name the secret side (ends the episode).

        Args:
            side: "heads" or "tails".

        Returns:
            "right" or "wrong".
        """
        assert self.task is not None
        ok = side == self.task.data["side"]
        self.finish(float(ok), ok)
        return "right" if ok else "wrong"

    @tool
    def flip(self) -> str:
        """Flip a coin of your own.

        Returns:
            A side at random.
        """
        return SIDES[int(self.np_random.integers(2))]


register_env(ENV_ID, "tiny_coin:TinyCoinEnv", family="test", max_episode_steps=4,
             description="Tiny coin task (tests): pick(side).")


def completion(side: str) -> str:
    return "<tool_call>" + json.dumps({"name": "pick", "arguments": {"side": side}}) + "</tool_call>"


def build_tiny_player(out: str | Path, *, steps: int = 300, seed: int = 0) -> Path:
    """A tiny Llama (SmolLM2's tokenizer and template) fitted to answer with ``pick`` of either side."""
    import torch
    from agentgym.policies.models import load_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    import agentgym

    out = Path(out)
    tok = load_tokenizer("smollm2-135m-instruct")
    env = agentgym.make(ENV_ID)
    prompts = []
    for t in env.unwrapped.tasks("train"):
        messages, info = env.reset(seed=0, options={"task_id": t.task_id})
        text = tok.apply_chat_template(messages, tools=info["tools"], tokenize=False, add_generation_prompt=True)
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    env.close()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    rng = random.Random(seed)
    for _ in range(steps):
        batch: list[Any] = []
        for p in rng.sample(prompts, 4):
            c = tok(completion(rng.choice(SIDES)) + tok.eos_token, add_special_tokens=False)["input_ids"]
            batch.append((p, c))
        width = max(len(p) + len(c) for p, c in batch)
        tail = max(len(c) for _, c in batch) + 1
        ids = torch.full((len(batch), width), tok.pad_token_id)
        labels = torch.full((len(batch), tail - 1), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (p, c) in enumerate(batch):  # left padding: every completion ends at the right edge
            seq = p + c
            ids[i, width - len(seq):] = torch.tensor(seq)
            mask[i, width - len(seq):] = 1
            labels[i, tail - 1 - len(c):] = torch.tensor(c)
        # only the last `tail` positions predict completion tokens: skip the rest of the vocabulary matmul
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=tail).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out

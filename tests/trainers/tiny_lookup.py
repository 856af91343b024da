"""A tiny multi-turn task and a tiny model built from a config, for the CI learning tests.

**Task** (``agentgym/TinyLookup-v0``): the user names a key; the agent must call the ``lookup`` tool
(``lookup[]``: the true value comes back as a tool message, ``value[VALUE]``) and then
``answer[VALUE]``. A second tool, ``rumor[]``, returns a random value. Every training key is paired
with every value, so nothing about the value can be learned from the key, and the test split uses
keys never seen in training: the only way to succeed is to call the right tool and copy what it
returned. A wrong answer ends the episode with reward 0; chance success is 1/len(VALUES).

**Model**: a 2-layer Llama with a byte-level BPE tokenizer trained (with the ``tokenizers``
library, in milliseconds) on the task's own text, and a prefix-stable ChatML template; nothing is
downloaded.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.core import AgentEnv
from agentgym.registration import register_env
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec

ENV_ID = "agentgym/TinyLookup-v0"
KEYS = ["owl", "elk", "yak", "emu", "cod", "gnu"]
VALUES = ["red", "tan", "blue", "gold", "pink"]
SYSTEM = "Find the value of the key with the lookup tool, then answer it."
TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


TEST_KEYS = KEYS[-2:]  # held out: never seen in training


class TinyLookupEnv(AgentEnv):
    """Look a key up with a tool, then answer with what the tool returned."""

    family = "demo"
    default_parser = "react"

    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        keys = TEST_KEYS if split == "test" else [k for k in KEYS if k not in TEST_KEYS]
        return [TaskSpec(f"{k}-{v}", split, "lookup", {"key": k, "value": v}) for k in keys for v in VALUES]

    def _reset_task(self, task: TaskSpec) -> list[Message]:
        return [{"role": "user", "content": f"key[{task.data['key']}]"}]

    @tool
    def lookup(self) -> str:
        """Look up the value of the key in the task.

        Returns:
            "value[VALUE]".
        """
        assert self.task is not None
        return f"value[{self.task.data['value']}]"

    @tool
    def rumor(self) -> str:
        """Hear a rumor about the value (often wrong).

        Returns:
            "value[VALUE]" with a value drawn at random.
        """
        return f"value[{VALUES[int(self.np_random.integers(len(VALUES)))]}]"

    @tool
    def answer(self, value: str) -> str:
        """Answer with the value (ends the episode).

        Args:
            value: The value.

        Returns:
            "correct" or "wrong".
        """
        assert self.task is not None
        ok = value.strip() == self.task.data["value"]
        self.finish(float(ok), ok)
        return "correct" if ok else "wrong"

    def expert_action(self) -> str:
        assert self.task is not None
        if self._turn == 0:
            return "lookup[]"
        return f"answer[{self.task.data['value']}]"


register_env(ENV_ID, "tiny_lookup:TinyLookupEnv", family="test", max_episode_steps=4,
             description="Tiny lookup task (tests): call lookup[], then answer[value].")


def gullible_demonstrator(messages: list[Message], rng: random.Random) -> str:
    """A scripted demonstrator that reads tool results well but mostly asks the wrong tool: it calls
    ``rumor`` (a random value) with probability 0.7 and ``lookup`` (the true value) otherwise, then
    answers with whatever the tool returned. Imitating it teaches the format and how to use a
    tool's observation; *which* tool to call (credit assigned from the final reward back to the
    first move) is left for RL."""
    last = messages[-1]
    if last["role"] == "tool" and last["content"].startswith("value["):
        return f"answer[{last['content'][len('value['):-1]}]"
    return "rumor[]" if rng.random() < 0.7 else "lookup[]"


def corpus() -> list[str]:
    out = [SYSTEM, "unknown key", "correct", "wrong"]
    for k in KEYS:
        for v in VALUES:
            out += [f"key[{k}]", "lookup[]", "rumor[]", f"answer[{v}]", f"value[{v}]"]
    return out * 4


def build_tiny_model(out: str | Path, *, hidden: int = 64, layers: int = 2, heads: int = 4, init: float = 0.02,
                     seed: int = 0) -> Path:
    """Write a tiny Llama + trained byte-level BPE tokenizer + chat template to ``out`` (a model folder)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    roles = [f"<|im_start|>{r}\n" for r in ("system", "user", "assistant", "tool")]
    tok.train_from_iterator(corpus() + roles * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    fast.chat_template = TEMPLATE
    fast.padding_side = "left"
    fast.save_pretrained(str(out))
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=1024, tie_word_embeddings=True, initializer_range=init,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = fast.eos_token_id
    model.generation_config.pad_token_id = fast.pad_token_id
    model.save_pretrained(str(out))
    return out


def protocol_demos(out: Path, seed: int = 0) -> Path:
    """Transcripts of the protocol-only demonstrator, collected through the rollout engine.

    The same file for the same ``seed``, whatever ran before in the process and however the host is loaded:
    the demonstrator draws from its own generator, and episodes run one at a time, so its draws meet the
    episodes in one order. (A module-level generator shared by every caller made the fixture's model depend on
    which tests had collected demos before it, and CI's trainer tests on that model failed.)"""
    import asyncio
    import functools

    from agentgym.policies.scripted import ScriptedPolicy

    from agentgym.rollout import GroupRequest, RolloutEngine, RolloutLimits, RolloutRuntime
    from agentgym.rollout.collect import CollectWorkflow
    from agentgym.rollout.jsonl import write_jsonl

    async def run() -> list[Any]:
        rt = RolloutRuntime(1)
        try:
            env = TinyLookupEnv()
            demonstrator = functools.partial(gullible_demonstrator, rng=random.Random(seed))
            wf = CollectWorkflow(ScriptedPolicy(demonstrator), 4, limits=RolloutLimits(max_turns=3))
            reqs = [GroupRequest(ENV_ID, t.task_id, seed=0) for t in env.tasks("train")]
            return await RolloutEngine(rt).run(wf, reqs)
        finally:
            rt.close()

    groups = asyncio.run(run())
    write_jsonl(out, [t for g in groups for t in g])
    return out


def build_tiny_sft_model(model: str, root: Path) -> str:
    """The trainer tests' starting point: ``model`` after a short SFT on the gullible demonstrator's
    transcripts (it answers with what a tool returned, but mostly asks the wrong tool: near-chance success)."""
    from agentgym.recipes import run_training
    from agentgym.trainers.config import validate_config

    demos = protocol_demos(root / "demos.jsonl")
    cfg = validate_config({
        "run": {"algorithm": "sft", "out_dir": str(root / "run"), "steps": 100, "seed": 0, "threads": 2},
        "model": {"path": model},
        "data": {"paths": [str(demos)], "batch_size": 16},
        "optim": {"lr": 1e-2},
        "rollout": {"env": "agentgym/TinyLookup-v0"},
        "eval": {"before": False, "after": False},
        "log": {"progress": False, "plot": False},
    })
    run_training(cfg)
    return str(root / "run" / "final")

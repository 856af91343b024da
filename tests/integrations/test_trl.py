"""AgentGym envs in TRL's real ``GRPOTrainer(environment_factory=...)`` (``trl`` 1.16)."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # tiny_coin registers its env by the entry point "tiny_coin:..."
    sys.path.insert(0, str(HERE))

import tiny_coin  # noqa: E402
from agentgym.policies.models import load_tokenizer  # noqa: E402
from agentgym.policies.session import TokenizerChatSession  # noqa: E402

import agentgym  # noqa: E402
from agentgym.integrations.trl import AgentGymSpec, add_response_template  # noqa: E402
from agentgym.serve.server import EnvServer  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]


def _config(out: Path, **kw: Any) -> Any:
    from trl import GRPOConfig

    base = dict(output_dir=str(out), per_device_train_batch_size=4, num_generations=4, max_completion_length=48,
                max_steps=2, use_cpu=True, report_to="none", logging_steps=1, max_tool_calling_iterations=3,
                learning_rate=1e-3, save_strategy="no", temperature=1.0, seed=0, dataloader_num_workers=0)
    base.update(kw)
    return GRPOConfig(**base)


def _trainer(spec: AgentGymSpec, model: str, out: Path, **kw: Any) -> Any:
    from trl import GRPOTrainer

    return GRPOTrainer(model=model, processing_class=spec.tokenizer(model), args=_config(out, **kw),
                       train_dataset=spec.train_dataset, environment_factory=spec.environment_factory,
                       reward_funcs=spec.reward_funcs)


def test_the_template_fix() -> None:
    """TRL rejects the prepared SmolLM2 template; the spec's tokenizer parses tool calls with it."""
    from trl.chat_template_utils import add_response_schema, parse_response

    tok = load_tokenizer("smollm2-135m-instruct")
    with pytest.raises(ValueError, match="Unrecognized chat template"):
        add_response_schema(tok)
    tok = add_response_template(load_tokenizer("smollm2-135m-instruct"))
    text = '<tool_call>{"name": "guess", "arguments": {"n": 31}}</tool_call><|im_end|>'
    parsed = parse_response(tok, tok(text, add_special_tokens=False)["input_ids"], prefix=[])
    assert parsed["tool_calls"] == [{"type": "function", "function": {"name": "guess", "arguments": {"n": 31}}}]
    plain = parse_response(tok, tok("I think 31.<|im_end|>", add_special_tokens=False)["input_ids"], prefix=[])
    assert plain["content"] == "I think 31." and not plain.get("tool_calls")


def test_trl_renders_the_prompt_agentgym_eval_renders(tiny_player: str, tmp_path: Path) -> None:
    """Token ids of the first prompt, and of the whole sequence after a tool call, as TRL builds them."""
    spec = AgentGymSpec("agentgym/Demo-v0", num_tasks=2)
    trainer = _trainer(spec, tiny_player, tmp_path / "out")
    tok = trainer.processing_class
    row = spec.train_dataset[1]
    trainer._batch_environments = [None]
    trl_ids = trainer._tokenize_prompts([row["prompt"]])[0][0]

    # agentgym eval: the env's reset messages and info["tools"] through the HF policy's token session
    env = agentgym.make("agentgym/Demo-v0")
    messages, info = env.reset(seed=0, options={"task_id": row["task_id"]})
    session = TokenizerChatSession(tok)
    assert trl_ids == session.start(messages, info["tools"])

    # one tool call later: TRL concatenates prompt + sampled ids + its tool suffix; agentgym appends the delta
    completion = tok('<tool_call>{"name": "guess", "arguments": {"n": 31}}</tool_call><|im_end|>',
                     add_special_tokens=False)["input_ids"]
    session.append_completion(completion)
    obs, *_ = env.step('<tool_call>{"name": "guess", "arguments": {"n": 31}}</tool_call>')
    agentgym_ids = session.token_ids + session.append_messages(obs)
    envs = spec.environment_factory()
    envs.reset(**row)
    result = envs.tool_0_guess(n=31)
    assert result == obs[0]["content"]
    trl_next = trl_ids + completion + trainer._get_tool_suffix_ids([{"role": "tool", "name": "guess", "content": result}])
    assert trl_next == agentgym_ids
    env.close()


def test_a_hand_written_wrapper_renders_another_prompt(tiny_player: str) -> None:
    """The defect the spec fixes: TRL rebuilds schemas from signatures (sorted, Returns moved out)."""
    tok = add_response_template(load_tokenizer(tiny_player))
    env = agentgym.make("agentgym/Demo-v0")
    messages, info = env.reset(seed=0, options={"task_id": "guess-1"})

    class Naive:
        def guess(self, n: int) -> str:
            """Guess the secret number.

            Args:
                n: Your guess, an integer between 0 and the upper bound.

            Returns:
                "correct", "higher" (the secret is larger) or "lower".
            """
            return ""

        def give_up(self) -> str:
            """Stop playing and reveal the secret (reward 0)."""
            return ""

    naive = Naive()
    methods = [getattr(naive, n) for n, _ in inspect.getmembers(Naive, predicate=inspect.isfunction)]
    ids = tok.apply_chat_template([messages], tools=methods, add_generation_prompt=True, tokenize=True,
                                  return_dict=True)["input_ids"][0]
    assert ids != TokenizerChatSession(tok).start(messages, info["tools"])
    env.close()


def test_two_grpo_steps_through_trl(tiny_player: str, tmp_path: Path) -> None:
    import torch

    spec = AgentGymSpec(tiny_coin.ENV_ID, num_tasks=8)
    assert [t["function"]["name"] for t in spec.tools] == ["pick", "flip"]
    seen: list[list[float]] = []

    def recorded(environments: Any, **kw: Any) -> list[float]:
        rewards = spec.reward_funcs[0](environments, **kw)
        seen.append(rewards)
        return rewards

    from trl import GRPOTrainer

    trainer = GRPOTrainer(model=tiny_player, processing_class=spec.tokenizer(tiny_player),
                          args=_config(tmp_path / "out"), train_dataset=spec.train_dataset,
                          environment_factory=spec.environment_factory, reward_funcs=[recorded])
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logs) == 2 and len(seen) == 2
    # the reward TRL trained on is the env's episode return, rollout by rollout
    for log, rewards in zip(logs, seen, strict=True):
        assert log["reward"] == pytest.approx(sum(rewards) / len(rewards))
        assert set(rewards) <= {0.0, 1.0}
    assert any(h.get("tools/call_frequency", 0) > 0 for h in logs)  # the tool calls reached the env
    flat = [r for rs in seen for r in rs]
    assert 0.0 in flat and 1.0 in flat  # both outcomes, so the steps had a signal
    changed = [k for k, v in trainer.model.named_parameters() if not torch.equal(v, before[k])]
    assert changed


def test_the_spec_over_remote_env(tiny_player: str, tmp_path: Path) -> None:
    """The same spec over ``agentgym/Remote-v0``: same rows, same tools, same prompt ids, same rewards."""
    local = AgentGymSpec("agentgym/Demo-v0", num_tasks=3)
    with EnvServer(["agentgym/Demo-v0"]) as srv:
        remote = AgentGymSpec("agentgym/Remote-v0", num_tasks=3,
                              env_kwargs={"url": srv.url, "env_id": "agentgym/Demo-v0"})
        assert remote.train_dataset.to_list() == local.train_dataset.to_list()
        assert remote.tools == local.tools
        env = remote.environment_factory()
        row = remote.train_dataset[0]
        env.reset(**row)
        secret = int(row["task_id"].split("-")[1])
        assert env.tool_0_guess(n=secret) == "correct"
        assert env.episode.reward == 1.0 and env.episode.success
        assert env.tool_0_guess(n=secret).startswith("Error: the episode is over")
        env._close()
        trainer = _trainer(remote, tiny_player, tmp_path / "out")
        trainer._batch_environments = [None]
        tok = trainer.processing_class
        ids = trainer._tokenize_prompts([row["prompt"]])[0][0]
        assert ids == TokenizerChatSession(tok).start(row["prompt"], local.tools)


def test_envs_without_tools_are_refused() -> None:
    from agentgym.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="no tools"):
        _ = AgentGymSpec("agentgym/ALFWorld-v0", num_tasks=1).train_dataset

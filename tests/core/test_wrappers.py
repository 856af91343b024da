from __future__ import annotations

import gymnasium

from agentgym.wrappers import HistoryWrapper, SystemPromptWrapper


def test_history_wrapper_accumulates_turns() -> None:
    env = HistoryWrapper(gymnasium.make("agentgym/Demo-v0"))
    obs, _ = env.reset(options={"task_id": "guess-4"})
    assert len(obs) == 2
    call = '<tool_call>{"name": "guess", "arguments": {"n": 1}}</tool_call>'
    obs, *_ = env.step(call)
    assert [m["role"] for m in obs] == ["system", "user", "assistant", "tool"]
    assert obs[2]["content"] == call and obs[2]["tool_calls"][0]["arguments"] == {"n": 1}
    obs, *_ = env.step("no call")
    assert [m["role"] for m in obs][-2:] == ["assistant", "user"] and "tool_calls" not in obs[-2]
    obs, _ = env.reset(seed=0)
    assert len(obs) == 2


def test_system_prompt_wrapper() -> None:
    env = SystemPromptWrapper(gymnasium.make("agentgym/Demo-v0"), "Be brief.")
    obs, _ = env.reset(seed=0)
    assert obs[0] == {"role": "system", "content": "Be brief."} and obs[1]["role"] == "user" and len(obs) == 2

"""Demo-v0's expert read from the conversation alone (``expert_guess`` / ``expert_reply``), the one copy
that scripted players in tests and benchmarks use."""

from __future__ import annotations

import json

import pytest
from agentgym.envs.demo import GuessNumberEnv, expert_guess, expert_reply

from agentgym.types import Message


@pytest.mark.parametrize("structured", [False, True])
def test_the_conversation_expert_solves_every_task_like_the_env_expert(structured: bool) -> None:
    env = GuessNumberEnv()
    for task in [*env.tasks("train"), *env.tasks("test")]:
        messages: list[Message] = list(env.reset(options={"task_id": task.task_id})[0])
        for _turn in range(7):  # binary search over 64 numbers
            text = expert_reply(messages)
            assert text == env.expert_action()  # the same move as the expert that reads the env's state
            action: Message = {"role": "assistant", "content": text}
            if structured:  # an OpenAI-style message with tool_calls instead of hermes text
                call = json.loads(text[len("<tool_call>"):-len("</tool_call>")])
                action = {"role": "assistant", "content": "", "tool_calls": [{"id": "c", **call}]}
            obs, reward, terminated, truncated, _ = env.step(action)
            messages += [action, *obs]
            if terminated:
                break
        assert terminated and reward == 1.0, task.task_id


def test_feedback_narrows_the_range() -> None:
    said: list[Message] = [{"role": "user", "content": "go"}]
    assert expert_guess(said) == 31
    said += [{"role": "assistant", "content": '<tool_call>{"name": "guess", "arguments": {"n": 31}}</tool_call>'},
             {"role": "tool", "content": "higher"}]
    assert expert_guess(said) == 47
    said += [{"role": "assistant", "content": "no guess here"}, {"role": "tool", "content": "lower"}]
    assert expert_guess(said) == 47  # feedback to a turn without a guess changes nothing
    assert expert_guess([], high=7) == 3

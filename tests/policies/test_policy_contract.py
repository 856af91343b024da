"""One contract suite, run against all four policies.

``scripted`` runs in the fast tier; ``hf`` (real SmolLM2 under transformers), ``vllm``
(in-process engine) and ``openai`` (a real `vllm serve` on 127.0.0.1) are slow.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentgym.errors import ContextLengthExceeded
from agentgym.policy import Generation, GenRequest, Policy, SamplingParams, TokenPolicy
from agentgym.types import Message

SERVED_NAME = "smollm2"  # --served-model-name in conftest.vllm_server


def _echo(messages: list[Message]) -> str:
    """The scripted twin: answers with the last user message, so order can be checked."""
    last = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    return f"You said: {last}. Done, bye."


@pytest.fixture(
    params=[
        "scripted",
        pytest.param("hf", marks=pytest.mark.slow),
        pytest.param("vllm", marks=[pytest.mark.slow, pytest.mark.vllm]),
        pytest.param("openai", marks=[pytest.mark.slow, pytest.mark.vllm]),
    ]
)
async def policy(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    kind = request.param
    if kind == "scripted":
        from agentgym.policies.scripted import ScriptedPolicy

        yield ScriptedPolicy(_echo)
    elif kind == "hf":
        yield request.getfixturevalue("hf_policy")
    elif kind == "vllm":
        yield request.getfixturevalue("vllm_policy")
    else:
        from agentgym.policies.openai import OpenAIPolicy

        client = OpenAIPolicy(request.getfixturevalue("vllm_server"), SERVED_NAME, timeout_s=120, max_retries=1,
                              tokenizer=request.getfixturevalue("smollm2_path"))
        yield client
        await client.aclose()  # its connections to the server (unclosed sockets are errors under filterwarnings)


def _is_model(policy: Any) -> bool:
    return type(policy).__name__ in ("HFPolicy", "VLLMPolicy", "OpenAIPolicy")


def _user(text: str) -> list[Message]:
    return [{"role": "user", "content": text}]


def _check(g: Generation, max_tokens: int) -> None:
    assert isinstance(g, Generation)
    assert isinstance(g.text, str)
    assert g.finish_reason in ("stop", "length")
    assert isinstance(g.weight_version, int)
    assert len(g.token_ids) <= max_tokens
    assert all(isinstance(t, int) for t in g.token_ids)
    if g.logprobs:
        assert len(g.logprobs) == len(g.token_ids)
        assert all(lp <= 1e-4 and math.isfinite(lp) for lp in g.logprobs)


async def test_is_a_policy(policy: Any) -> None:
    assert isinstance(policy, Policy)
    assert isinstance(policy.policy_id, str) and policy.policy_id
    assert await policy.generate([]) == []


async def test_request_major_order_and_count(policy: Any) -> None:
    reqs = [
        GenRequest(messages=_user("Name a color."), sampling=SamplingParams(max_tokens=8, temperature=1.0), n=2),
        GenRequest(messages=_user("Name an animal."), sampling=SamplingParams(max_tokens=8, temperature=1.0), n=3),
    ]
    gens = await policy.generate(reqs)
    assert len(gens) == 5
    for g in gens:
        _check(g, 8)
    if _is_model(policy):
        assert all(g.token_ids for g in gens)
        assert all(len(g.logprobs) == len(g.token_ids) for g in gens)
        assert gens[0].prompt_token_ids == gens[1].prompt_token_ids
        assert gens[2].prompt_token_ids == gens[3].prompt_token_ids == gens[4].prompt_token_ids
        assert gens[0].prompt_token_ids != gens[2].prompt_token_ids
    else:
        assert [g.text for g in gens] == ["You said: Name a color.. Done, bye."] * 2 + ["You said: Name an animal.. Done, bye."] * 3


async def test_max_tokens_and_length_finish(policy: Any) -> None:
    req = GenRequest(messages=_user("Write a long story about a dragon."), sampling=SamplingParams(max_tokens=5, temperature=0.0))
    (g,) = await policy.generate([req])
    _check(g, 5)
    if _is_model(policy):
        assert len(g.token_ids) == 5 and g.finish_reason == "length"


async def test_stop_string_is_cut_from_text(policy: Any) -> None:
    req = GenRequest(
        messages=_user("Count from 1 to 10 separated by commas."),
        sampling=SamplingParams(max_tokens=40, temperature=0.0, stop=[","]),
    )
    (g,) = await policy.generate([req])
    _check(g, 40)
    assert "," not in g.text
    if _is_model(policy) and g.finish_reason == "stop" and g.token_ids:
        # the ids keep what was sampled (the stop string included) for token-exact sessions
        assert g.token_ids[-1] != 2 or g.text == ""


async def test_greedy_is_deterministic(policy: Any) -> None:
    req = GenRequest(messages=_user("What is the capital of France?"), sampling=SamplingParams(max_tokens=12, temperature=0.0))
    a, b = await policy.generate([req, req])
    assert a.text == b.text and a.token_ids == b.token_ids


async def test_zero_max_tokens_is_an_empty_generation(policy: Any) -> None:
    (g,) = await policy.generate([GenRequest(messages=_user("hi"), sampling=SamplingParams(max_tokens=0))])
    assert g.text == "" and g.token_ids == [] and g.finish_reason == "length"


async def test_over_long_prompt(policy: Any) -> None:
    if not _is_model(policy):
        pytest.skip("a scripted policy has no context window")
    long = "word " * 5000  # > 2048 tokens in every fixture
    with pytest.raises(ContextLengthExceeded):
        await policy.generate([GenRequest(messages=_user(long), sampling=SamplingParams(max_tokens=4))])


async def test_token_in_token_out_session(policy: Any) -> None:
    if not isinstance(policy, TokenPolicy):
        pytest.skip("only policies with a tokenizer keep token-exact sessions")
    session = policy.new_session()
    ids = session.start(_user("Say one word."), None)
    (g1,) = await policy.generate([GenRequest(prompt_token_ids=ids, sampling=SamplingParams(max_tokens=8, temperature=0.0))])
    assert g1.prompt_token_ids == ids
    session.append_completion(g1.token_ids)
    delta = session.append_messages(_user("Another one."))
    full = session.token_ids
    assert full == ids + g1.token_ids + delta
    (g2,) = await policy.generate([GenRequest(prompt_token_ids=full, sampling=SamplingParams(max_tokens=8, temperature=0.0))])
    _check(g2, 8)
    assert g2.prompt_token_ids == full

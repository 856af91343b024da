"""Token-exact traces: which requests of a rollout join one training segment, and what each segment holds.

The policy is scripted but the tokenizer, chat template and token sessions are real (the tiny model's),
so every id below is what a real model would have been sent. The invariant checked throughout: each
segment's ids are exactly the last prompt its chain sent to the policy followed by the ids the policy
generated for it, with loss mask 1 on generated ids only.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from harness_fakes import ScriptedTokenPolicy

from agentgym.harness.endpoint import PolicyEndpoint
from agentgym.harness.openai_api import EndpointError, chat_response
from agentgym.policy import Capabilities

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look the key up.",
                                           "parameters": {"type": "object", "properties": {}}}},
         {"type": "function", "function": {"name": "answer", "description": "Answer.",
                                           "parameters": {"type": "object", "properties": {"value": {"type": "string"}},
                                                          "required": ["value"]}}}]
OPENING = [{"role": "system", "content": "Find the value of the key with the lookup tool, then answer it."},
           {"role": "user", "content": "key[owl]"}]


@pytest.fixture
def policy(tiny_tokenizer: Any) -> ScriptedTokenPolicy:
    return ScriptedTokenPolicy(tiny_tokenizer)


def endpoint(policy: Any, **kw: Any) -> PolicyEndpoint:
    return PolicyEndpoint(policy, parser="react", max_tokens=16, **kw)


async def ask(ep: PolicyEndpoint, rid: str | None, messages: list[dict[str, Any]], tools: Any = TOOLS) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "anything", "messages": messages}
    if tools is not None:
        body["tools"] = tools
    _, reply = await ep.chat(copy.deepcopy(body), rollout_id=rid)
    return chat_response(reply, logprobs=True)


def assistant(resp: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as an OpenAI client re-sends it (``content`` null, arguments a string)."""
    return {k: v for k, v in resp["choices"][0]["message"].items() if v is not None}


def tool_result(resp: dict[str, Any], content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": resp["choices"][0]["message"]["tool_calls"][0]["id"], "content": content}


def check_segments_exact(traj: Any, policy: ScriptedTokenPolicy, calls_per_segment: list[list[int]]) -> None:
    """Each segment = the last prompt its chain sent + the ids generated for it; mask 1 on generated ids."""
    segs = traj.segments()
    assert len(segs) == len(calls_per_segment)
    for seg, calls in zip(segs, calls_per_segment, strict=True):
        last_prompt, last_gen = policy.calls[calls[-1]]
        assert seg.token_ids == last_prompt + last_gen
        generated = [i for i, m in enumerate(seg.loss_mask) if m]
        want: list[int] = []
        for c in calls:
            prompt, gen = policy.calls[c]
            want += list(range(len(prompt), len(prompt) + len(gen)))
        assert generated == want
        assert [seg.token_ids[i] for i in generated] == [t for c in calls for t in policy.calls[c][1]]
        assert {seg.versions[i] for i in generated} == {7}


async def test_consecutive_turns_join_one_segment(policy: ScriptedTokenPolicy) -> None:
    ep = endpoint(policy)
    ep.open_rollout("r")
    msgs = list(OPENING)
    r1 = await ask(ep, "r", msgs)
    assert r1["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": "{}"}
    assert r1["choices"][0]["finish_reason"] == "tool_calls"
    assert r1["prompt_token_ids"] == policy.calls[0][0] and r1["choices"][0]["token_ids"] == policy.calls[0][1]
    msgs += [assistant(r1), tool_result(r1, "value[red]")]
    r2 = await ask(ep, "r", msgs)
    assert r2["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "answer", "arguments": '{"value": "red"}'}
    # the second prompt extends the first prompt + completion token for token
    assert policy.calls[1][0][: len(policy.calls[0][0]) + len(policy.calls[0][1])] == policy.calls[0][0] + policy.calls[0][1]
    assert r2["agentgym"]["segment"] == 0 and not r2["agentgym"]["new_segment"]
    traj = ep.close_rollout("r").trajectory(task_id="owl-red")
    check_segments_exact(traj, policy, [[0, 1]])
    m = traj.metrics
    assert (m["requests"], m["segments"], m["prompt_mismatches"], m["reused_completions"]) == (2, 1, 0, 1)
    # the tiny template renders an assistant turn from its content only: re-rendering the re-sent tool
    # call (content null) would not have reproduced what the model generated
    assert m["rerender_drift"] == 1
    assert traj.turns[0].observation == [{"role": "tool", "tool_call_id": msgs[3]["tool_call_id"], "content": "value[red]"}]


async def test_context_rewrite_starts_a_new_segment(policy: ScriptedTokenPolicy) -> None:
    ep = endpoint(policy)
    ep.open_rollout("r")
    r1 = await ask(ep, "r", list(OPENING))
    summary = [OPENING[0], {"role": "user", "content": "key[owl] (the lookup said value[red])"}]
    r2 = await ask(ep, "r", summary)
    assert r2["agentgym"]["new_segment"] and r2["agentgym"]["mismatch"] == "context_rewritten"
    traj = ep.close_rollout("r").trajectory()
    check_segments_exact(traj, policy, [[0], [1]])
    assert traj.metrics["prompt_mismatches"] == traj.metrics["mismatch_context_rewritten"] == 1
    assert [t.new_session for t in traj.turns] == [True, True]
    assert r1["agentgym"]["segment"] == 0 and r2["agentgym"]["segment"] == 1


async def test_a_rewritten_assistant_message_starts_a_new_segment(policy: ScriptedTokenPolicy) -> None:
    ep = endpoint(policy)
    ep.open_rollout("r")
    r1 = await ask(ep, "r", list(OPENING))
    edited = {**assistant(r1), "tool_calls": [{**assistant(r1)["tool_calls"][0],
                                               "function": {"name": "answer", "arguments": '{"value": "tan"}'}}]}
    r2 = await ask(ep, "r", [*OPENING, edited, tool_result(r1, "wrong")])
    assert r2["agentgym"]["mismatch"] == "assistant_rewritten"
    traj = ep.close_rollout("r").trajectory()
    check_segments_exact(traj, policy, [[0], [1]])
    assert traj.metrics["mismatch_assistant_rewritten"] == 1


async def test_changed_tools_start_a_new_segment(policy: ScriptedTokenPolicy) -> None:
    ep = endpoint(policy)
    ep.open_rollout("r")
    r1 = await ask(ep, "r", list(OPENING))
    await ask(ep, "r", [*OPENING, assistant(r1), tool_result(r1, "value[red]")], tools=TOOLS[:1])
    traj = ep.close_rollout("r").trajectory()
    assert traj.metrics["mismatch_tools_changed"] == 1 and traj.metrics["segments"] == 2


async def test_interleaved_conversations_keep_one_segment_each(policy: ScriptedTokenPolicy) -> None:
    """A planner and a worker conversation of one agent, interleaved: each is its own exact segment."""
    ep = endpoint(policy)
    ep.open_rollout("r")
    a = list(OPENING)
    b = [OPENING[0], {"role": "user", "content": "key[elk]"}]
    ra1 = await ask(ep, "r", a)                                       # call 0
    rb1 = await ask(ep, "r", b)                                       # call 1
    a += [assistant(ra1), tool_result(ra1, "value[red]")]
    await ask(ep, "r", a)                                             # call 2 continues a
    b += [assistant(rb1), tool_result(rb1, "value[tan]")]
    await ask(ep, "r", b)                                             # call 3 continues b
    traj = ep.close_rollout("r").trajectory()
    check_segments_exact(traj, policy, [[0, 2], [1, 3]])
    assert traj.metrics["reused_completions"] == 2
    assert traj.metrics["prompt_mismatches"] == 1  # b's first request did not continue a


async def test_completions_join_by_token_prefix(policy: ScriptedTokenPolicy, tiny_tokenizer: Any) -> None:
    ep = endpoint(policy)
    ep.open_rollout("r")
    text = tiny_tokenizer.apply_chat_template(OPENING, add_generation_prompt=True, tokenize=False)
    ids = list(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])
    _, r1 = await ep.complete({"model": "m", "prompt": ids, "max_tokens": 16}, rollout_id="r")
    more = ids + r1.token_ids + list(tiny_tokenizer("\n<|im_start|>tool\nvalue[red]<|im_end|>\n<|im_start|>assistant\n",
                                                    add_special_tokens=False)["input_ids"])
    _, r2 = await ep.complete({"model": "m", "prompt": more}, rollout_id="r")
    _, r3 = await ep.complete({"model": "m", "prompt": ids[:5]}, rollout_id="r")
    assert (r2.agentgym["new_segment"], r3.agentgym["new_segment"]) == (False, True)
    traj = ep.close_rollout("r").trajectory()
    check_segments_exact(traj, policy, [[0, 1], [2]])


async def test_a_policy_without_sessions_is_joined_by_the_ids_it_reports(tiny_tokenizer: Any) -> None:
    class MessagePolicy(ScriptedTokenPolicy):
        capabilities = Capabilities()  # renders messages itself; reports the prompt ids it used

    policy = MessagePolicy(tiny_tokenizer)
    ep = endpoint(policy)
    ep.open_rollout("r")
    r1 = await ask(ep, "r", list(OPENING))
    await ask(ep, "r", [*OPENING, assistant(r1), tool_result(r1, "value[red]")])
    traj = ep.close_rollout("r").trajectory()
    # re-rendered by the backend: the null-content tool call no longer matches what was generated
    assert traj.metrics["segments"] == 2
    assert traj.segments()[1].token_ids == policy.calls[1][0] + policy.calls[1][1]


async def test_a_failed_generation_is_no_turn_and_is_never_continued(policy: ScriptedTokenPolicy) -> None:
    ep = endpoint(policy)
    ep.open_rollout("r")
    good = policy.generate

    async def broken(requests: Any) -> Any:
        from agentgym.errors import PolicyError

        raise PolicyError("engine died")

    policy.generate = broken  # type: ignore[method-assign]
    with pytest.raises(EndpointError) as e:
        await ask(ep, "r", list(OPENING))
    assert e.value.status == 502
    policy.generate = good  # type: ignore[method-assign]
    await ask(ep, "r", list(OPENING))
    traj = ep.close_rollout("r").trajectory()
    assert traj.metrics["failed_requests"] == 1 and traj.metrics["turns"] == 1
    check_segments_exact(traj, policy, [[0]])


async def test_unrecorded_requests_leave_no_trace(policy: ScriptedTokenPolicy) -> None:
    ep = endpoint(policy)
    resp = await ask(ep, None, list(OPENING))
    assert resp["prompt_token_ids"] == policy.calls[0][0]
    assert "rollout_id" not in resp["agentgym"] and not ep.rollouts


async def test_mismatches_are_summed_into_the_runs_metrics(policy: ScriptedTokenPolicy) -> None:
    """Every trajectory's trace counts reach the training step's metrics (``rollout/trace/...``)."""
    from agentgym.trainers.batching import samples_from_groups

    from agentgym.types import TrajectoryGroup

    ep = endpoint(policy)
    trajs = []
    for rid, reward in (("a", 1.0), ("b", 0.0)):
        ep.open_rollout(rid)
        r1 = await ask(ep, rid, list(OPENING))
        await ask(ep, rid, [OPENING[0], {"role": "user", "content": "key[owl], again"}])  # a rewrite
        await ask(ep, rid, [OPENING[0], {"role": "user", "content": "key[owl], again"}, assistant(r1)])  # a foreign reply
        ep.rollouts[rid].rewards.clear()
        traj = ep.close_rollout(rid).trajectory(task_id="owl-red")
        traj.reward = reward
        trajs.append(traj)
    _, stats = samples_from_groups([TrajectoryGroup("g", "owl-red", "e", trajs)], "policy")
    trace = stats.to_metrics()["trace"]
    assert trace["prompt_mismatches"] == sum(t.metrics["prompt_mismatches"] for t in trajs) == 4
    assert trace["rerender_drift"] == 0 and trace["reused_completions"] == 0

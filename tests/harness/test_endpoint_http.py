"""The policy endpoint over real HTTP on loopback: OpenAI's clients, streaming, the rollout id in the path
or a header, Agent Lightning's routes, and clear 4xx answers to hostile or malformed requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from harness_fakes import ScriptedTokenPolicy

from agentgym.errors import ConfigurationError
from agentgym.harness.endpoint import PolicyEndpoint
from agentgym.harness.server import EndpointServer

TOKEN = "s3cret-token"
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look the key up.",
                                           "parameters": {"type": "object", "properties": {}}}},
         {"type": "function", "function": {"name": "answer", "description": "Answer.",
                                           "parameters": {"type": "object", "properties": {"value": {"type": "string"}}}}}]
MSGS = [{"role": "user", "content": "key[owl]"}]


@pytest.fixture
async def served(tiny_tokenizer: Any) -> AsyncIterator[tuple[EndpointServer, ScriptedTokenPolicy]]:
    policy = ScriptedTokenPolicy(tiny_tokenizer)
    ep = PolicyEndpoint(policy, parser="react", max_tokens=16, auto_rollouts=True, max_requests_per_rollout=3)
    async with EndpointServer(ep, token=TOKEN, max_request_bytes=64 * 1024) as srv:
        yield srv, policy


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


async def test_openai_client_chat_with_tools_and_streaming(served: Any) -> None:
    srv, policy = served
    async with openai.AsyncOpenAI(base_url=srv.base_url("r1"), api_key=TOKEN, max_retries=0) as client:
        r = await client.chat.completions.create(model="gpt-4o", messages=MSGS, tools=TOOLS, logprobs=True)
        call = r.choices[0].message.tool_calls[0]
        assert (call.function.name, call.function.arguments) == ("lookup", "{}")
        extra = r.model_extra or {}
        assert extra["prompt_token_ids"] == policy.calls[0][0]
        assert r.choices[0].model_extra["token_ids"] == policy.calls[0][1]
        assert [c.logprob for c in r.choices[0].logprobs.content] == [-0.25] * len(policy.calls[0][1])
        msgs = [*MSGS, r.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "value[red]"}]
        stream = await client.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [c async for c in stream]
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert calls[0].function.name == "answer" and json.loads(calls[0].function.arguments) == {"value": "red"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(policy.calls[1][1])
    assert srv.endpoint.rollouts["r1"].trace.metrics()["segments"] == 1


async def test_rollout_id_in_a_header_and_completions(served: Any, tiny_tokenizer: Any) -> None:
    srv, policy = served
    async with httpx.AsyncClient(headers={**auth(), "X-Rollout-Id": "hdr"}, timeout=60) as c:
        r = await c.post(srv.url + "/v1/completions", json={"model": "m", "prompt": "key[owl]", "max_tokens": 4,
                                                            "logprobs": 1})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "text_completion"
        assert body["choices"][0]["prompt_token_ids"] == policy.calls[0][0]
        assert body["choices"][0]["logprobs"]["token_logprobs"] == [-0.25] * len(policy.calls[0][1])
        models = (await c.get(srv.url + "/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["policy"] and models["data"][0]["weight_version"] == 7
    assert srv.endpoint.rollouts["hdr"].trace.requests == 1


async def test_rewards_and_finish(served: Any) -> None:
    srv, _ = served
    async with openai.AsyncOpenAI(base_url=srv.base_url("r2"), api_key=TOKEN, max_retries=0) as client:
        await client.chat.completions.create(model="m", messages=MSGS)
    async with httpx.AsyncClient(headers=auth(), timeout=60) as c:
        assert (await c.post(srv.url + "/rollout/r2/reward", json={"value": 0.5})).status_code == 200
        bad = await c.post(srv.url + "/rollout/r2/reward", json={"value": "lots"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "value"
        status = (await c.get(srv.url + "/rollout/r2")).json()
        assert status["rewards"] == [{"value": 0.5, "success": None, "source": "call"}]
        traj = (await c.post(srv.url + "/rollout/r2/finish", json={"task_id": "owl-red"})).json()
        assert (traj["task_id"], traj["reward"], traj["success"], len(traj["turns"])) == ("owl-red", 0.5, True, 1)
        assert (await c.get(srv.url + "/rollout/r2")).status_code == 404


async def test_agent_lightning_routes(served: Any) -> None:
    """Agent Lightning 1.0.2's agent-facing URLs: the proxy path and the events route."""
    srv, policy = served
    base = f"{srv.url}/proxy/rollout/ro-1/attempt/0/mode/train/openai/v1"
    async with openai.AsyncOpenAI(base_url=base, api_key=TOKEN, max_retries=0) as client:
        r = await client.chat.completions.create(model="Qwen/Qwen2.5-1.5B-Instruct", messages=MSGS)
    assert (r.model_extra or {})["prompt_token_ids"] == policy.calls[0][0]
    async with httpx.AsyncClient(headers=auth(), timeout=60) as c:
        ev = await c.post(f"{srv.url}/api/rollouts/ro-1/attempt/0/events",
                          json={"event_type": "reward", "data": {"value": 1.0, "source": "agent"}})
        assert ev.status_code == 200, ev.text
        other = await c.post(f"{srv.url}/api/rollouts/ro-1/attempt/0/events", json={"event_type": "note", "data": {"k": 1}})
        assert other.status_code == 200
        bad_mode = await c.post(f"{srv.url}/proxy/rollout/ro-1/attempt/0/mode/debug/openai/v1/chat/completions",
                                json={"model": "m", "messages": MSGS})
        assert bad_mode.status_code == 404
    ro = srv.endpoint.rollouts["ro-1"]
    assert ro.reward is not None and ro.reward.value == 1.0 and ro.reward.source == "agent"
    assert ro.info["attempt_id"] == "0" and ro.mode == "train" and ro.events[0]["event_type"] == "note"


@pytest.mark.parametrize(("path", "body", "status", "needle"), [
    ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/chat/completions", b"[1, 2]", 400, "JSON object"),
    ("/v1/chat/completions", json.dumps({"model": "m", "messages": []}).encode(), 400, "messages"),
    ("/v1/chat/completions", json.dumps({"model": "m", "messages": MSGS, "n": 2}).encode(), 400, "n must be 1"),
    ("/v1/chat/completions", json.dumps({"model": "m", "messages": MSGS, "temperature": 9}).encode(), 400, "temperature"),
    ("/v1/chat/completions", json.dumps({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}).encode(),
     400, "role"),
    ("/v1/chat/completions", json.dumps({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}).encode(),
     400, "image_url"),
    ("/v1/chat/completions", json.dumps({"model": "m", "messages": [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                               "function": {"name": "f", "arguments": "{oops"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "x"}]}).encode(), 400, "not valid JSON"),
    ("/v1/chat/completions", json.dumps({"model": "m", "messages": [{"role": "tool", "content": "x"}]}).encode(),
     400, "tool_call_id"),
    ("/v1/chat/completions", json.dumps({"model": "m", "messages": MSGS, "stop": ["a"] * 20}).encode(), 400, "stop"),
    ("/v1/completions", json.dumps({"model": "m", "prompt": [10**9]}).encode(), 400, "token ids"),
    ("/v1/completions", json.dumps({"model": "m", "prompt": ["a", "b"]}).encode(), 400, "one prompt"),
    ("/v1/completions", json.dumps({"model": "m", "prompt": "x", "echo": True}).encode(), 400, "echo"),
    ("/rollout/nope/reward", json.dumps({"value": 1}).encode(), 200, ""),  # auto_rollouts: created
    ("/rollout/bad%20id/v1/chat/completions", json.dumps({"model": "m", "messages": MSGS}).encode(), 400, "rollout id"),
    ("/v1/chat/completions", b"x" * (65 * 1024), 413, "over"),
])
async def test_malformed_and_hostile_requests_get_clear_4xx(served: Any, path: str, body: bytes, status: int,
                                                             needle: str) -> None:
    srv, policy = served
    async with httpx.AsyncClient(headers={**auth(), "content-type": "application/json"}, timeout=60) as c:
        r = await c.post(srv.url + path, content=body)
    assert r.status_code == status, r.text
    assert needle in r.text
    if status >= 400:
        assert not policy.calls  # nothing reached the model


async def test_auth_origin_and_limits(served: Any) -> None:
    srv, _ = served
    body = {"model": "m", "messages": MSGS}
    async with httpx.AsyncClient(timeout=60) as c:
        assert (await c.get(srv.url + "/health")).status_code == 200
        assert (await c.post(srv.url + "/v1/chat/completions", json=body)).status_code == 401
        wrong = await c.post(srv.url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        page = await c.post(srv.url + "/v1/chat/completions", json=body,
                            headers={**auth(), "Origin": "https://evil.example"})
        assert page.status_code == 403
        codes = [(await c.post(srv.url + "/rollout/lim/v1/chat/completions", json=body, headers=auth())).status_code
                 for _ in range(4)]
        assert codes == [200, 200, 200, 429]  # max_requests_per_rollout=3


async def test_several_policies_are_picked_by_model(tiny_tokenizer: Any) -> None:
    a, b = ScriptedTokenPolicy(tiny_tokenizer, policy_id="a"), ScriptedTokenPolicy(tiny_tokenizer, policy_id="b")
    ep = PolicyEndpoint([a, b], auto_rollouts=True)
    async with EndpointServer(ep, token=TOKEN) as srv, \
            httpx.AsyncClient(headers={**auth(), "X-Rollout-Id": "two"}, timeout=60) as c:
        assert (await c.post(srv.url + "/v1/chat/completions", json={"model": "b", "messages": MSGS})).status_code == 200
        assert (await c.post(srv.url + "/v1/chat/completions", json={"model": "a", "messages": MSGS})).status_code == 200
        r = await c.post(srv.url + "/v1/chat/completions", json={"model": "c", "messages": MSGS})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert (len(a.calls), len(b.calls)) == (1, 1)
    traj = ep.close_rollout("two").trajectory()
    assert [t.policy_id for t in traj.turns] == ["b", "a"] and len(traj.segments()) == 2


async def test_rollouts_of_a_closed_endpoint_are_not_created(tiny_tokenizer: Any) -> None:
    ep = PolicyEndpoint(ScriptedTokenPolicy(tiny_tokenizer))  # auto_rollouts off: a harness opens its own
    async with EndpointServer(ep, token=TOKEN) as srv, openai.AsyncOpenAI(
            base_url=srv.base_url("guessed"), api_key=TOKEN, max_retries=0) as client:
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="m", messages=MSGS)
    assert not ep.rollouts


async def test_a_public_address_needs_a_token(tiny_tokenizer: Any) -> None:
    ep = PolicyEndpoint(ScriptedTokenPolicy(tiny_tokenizer))
    with pytest.raises(ConfigurationError, match="without a token"):
        EndpointServer(ep, host="0.0.0.0")


async def test_idle_rollouts_expire(tiny_tokenizer: Any) -> None:
    closed: list[str] = []
    ep = PolicyEndpoint(ScriptedTokenPolicy(tiny_tokenizer), rollout_idle_s=5.0, on_close=lambda r: closed.append(r.rollout_id))
    r = ep.open_rollout("old")
    await asyncio.sleep(0)
    assert ep.expire_idle(now=r.last_used + 10.0)[0].rollout_id == "old"
    assert closed == ["old"] and not ep.rollouts

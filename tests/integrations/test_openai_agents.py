"""The OpenAI Agents SDK (real ``openai-agents``) runs an AgentGym episode through ``env_tools``.

The model is served over HTTP on 127.0.0.1 by a scripted OpenAI-compatible chat-completions server
(the test is about our glue, not a model): it plays Demo-v0 by binary search over the tool results
it is sent and, like a small model, keeps calling ``guess`` after the game is won.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request

agents = pytest.importorskip("agents")

from agentgym.envs.demo import expert_guess  # noqa: E402

import agentgym  # noqa: E402
from agentgym.integrations.episode import EPISODE_OVER  # noqa: E402
from agentgym.integrations.openai_agents import env_tools  # noqa: E402

pytestmark = pytest.mark.slow  # an HTTP model server on 127.0.0.1


def _binary_search_reply(body: dict[str, Any]) -> dict[str, Any]:
    calls = sum(1 for m in body["messages"] if m["role"] == "assistant" and m.get("tool_calls"))
    n = expert_guess(body["messages"])  # Demo-v0's own expert, read from the conversation
    tools = [t["function"]["name"] for t in body.get("tools") or []]
    assert tools == ["guess", "give_up"], tools  # the env's tools, in the env's order
    call = {"id": f"call_{calls}", "type": "function",
            "function": {"name": "guess", "arguments": json.dumps({"n": n})}}
    return {"id": f"chatcmpl-{calls}", "object": "chat.completion", "created": 0, "model": "scripted",
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


@pytest.fixture(scope="module")
def model_server() -> Iterator[dict[str, Any]]:
    app = FastAPI()
    seen: dict[str, Any] = {"requests": 0, "tools": None}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        seen["requests"] += 1
        seen["tools"] = body.get("tools")
        return _binary_search_reply(body)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(600):
            if server.started:
                break
            threading.Event().wait(0.05)
        assert server.started
        seen["url"] = f"http://127.0.0.1:{port}/v1"
        yield seen
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def _run(model_server: dict[str, Any], tools: Any, max_turns: int, **kw: Any) -> Any:
    """Run an agent whose model is the scripted server, through the SDK's chat-completions client."""
    from openai import AsyncOpenAI

    async def main() -> Any:
        async with AsyncOpenAI(base_url=model_server["url"], api_key="unused", max_retries=0, timeout=60) as client:
            model = agents.OpenAIChatCompletionsModel(model="scripted", openai_client=client)
            agent = agents.Agent(name="player", model=model, tools=tools, **kw)
            return await agents.Runner.run(agent, tools.input, max_turns=max_turns)

    return asyncio.run(main())


def test_an_agents_sdk_agent_plays_an_episode_and_the_reward_is_read_back(model_server: dict[str, Any]) -> None:
    agents.set_tracing_disabled(True)
    env = agentgym.make("agentgym/Demo-v0")
    tools = env_tools(env, task_id="guess-10", seed=0)
    assert [t.name for t in tools] == ["guess", "give_up"]
    expected = env.unwrapped.tools.specs()[0]["function"]
    assert tools[0].params_json_schema == expected["parameters"] and tools[0].description == expected["description"]
    before = model_server["requests"]
    result = _run(model_server, tools, 12, tool_use_behavior=tools.stop_when_done)
    # binary search over 0..63 finds 10 in 5 guesses: 31, 15, 7, 11, 9 -> lower, lower, higher, lower, higher, then 10
    assert tools.success and tools.reward == 1.0 and tools.done
    assert result.final_output == "correct"
    assert tools.episode.steps == model_server["requests"] - before == 6
    assert tools.episode.calls_after_end == 0
    assert model_server["tools"][0]["function"]["parameters"] == expected["parameters"]
    env.close()


def test_without_the_behaviour_the_agent_runs_past_the_end(model_server: dict[str, Any]) -> None:
    """The defect a new user hit: the SDK's default loop keeps going after the episode ended."""
    agents.set_tracing_disabled(True)
    env = agentgym.make("agentgym/Demo-v0")
    tools = env_tools(env, task_id="guess-10", seed=0)
    with pytest.raises(agents.exceptions.MaxTurnsExceeded):
        _run(model_server, tools, 9)
    # the episode still ended once and the env was never stepped after its end
    assert tools.success and tools.reward == 1.0 and tools.episode.steps == 6
    assert tools.episode.calls_after_end >= 1 and tools.last_output == EPISODE_OVER
    env.close()


def test_bad_arguments_come_back_as_the_envs_error_observation(model_server: dict[str, Any]) -> None:
    env = agentgym.make("agentgym/Demo-v0")
    tools = env_tools(env, task_id="guess-10", seed=0)
    ctx = agents.tool_context.ToolContext(context=None, tool_name="guess", tool_call_id="c1", tool_arguments="{")
    out = asyncio.run(tools[0].on_invoke_tool(ctx, '{"n": "many"}'))
    assert out.startswith("Error: invalid arguments for guess") and not tools.done
    out = asyncio.run(tools[0].on_invoke_tool(ctx, "{not json"))
    assert "not valid JSON" in out and tools.episode.steps == 2
    env.close()

"""MCP as standard MCP clients see it (issue 26, part 3): the real ``mcp`` SDK client and the OpenAI
Agents SDK's ``MCPServerStreamableHttp`` connect to ``agentgym serve``'s ``/mcp``, see the task prompt,
call the env's tools and end their session; the streamable-HTTP lifecycle checked on the wire."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentgym.serve.server import EnvServer

DEMO = "agentgym/Demo-v0"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}


@pytest.fixture(scope="module")
def server() -> Iterator[EnvServer]:
    with EnvServer([DEMO, "agentgym/ServeTest-v0"], token="tok") as srv:
        yield srv


def demo_prompt() -> str:
    import agentgym

    env = agentgym.make(DEMO)
    obs, _ = env.reset(options={"task_id": "guess-31"})
    env.close()
    return "\n\n".join(m["content"] for m in obs)


@pytest.mark.skipif(importlib.util.find_spec("agents") is None, reason="needs openai-agents (the dev extra)")
async def test_openai_agents_sdk_mcp_client(server: EnvServer) -> None:
    from agents.mcp import MCPServerStreamableHttp

    params: Any = {"url": server.url + "/mcp?task_id=guess-31", "headers": {"Authorization": "Bearer tok"}}
    async with MCPServerStreamableHttp(params=params, name="agentgym-demo") as mcp:
        assert mcp.server_initialize_result is not None
        assert mcp.server_initialize_result.instructions == demo_prompt()  # the task prompt, before any call
        tools = await mcp.list_tools()
        assert [t.name for t in tools] == ["guess", "give_up"] and tools[0].input_schema["required"] == ["n"]
        prompt = await mcp.get_prompt("task")
        assert prompt.messages[0].role == "user" and prompt.messages[0].content.text == demo_prompt()  # type: ignore[union-attr]
        r = await mcp.call_tool("guess", {"n": 40})
        assert r.content[0].text == "lower" and not r.is_error  # type: ignore[union-attr]
        r = await mcp.call_tool("guess", {"n": 31})
        assert r.content[0].text == "correct"  # type: ignore[union-attr]
        assert r.meta is not None and r.meta["agentgym"]["terminated"] and r.meta["agentgym"]["reward"] == 1.0
        assert len(server.service.sessions) == 1
    assert server.service.sessions == {}  # the client's DELETE ended the session


async def test_mcp_sdk_client(server: EnvServer) -> None:
    pytest.importorskip("mcp", reason="needs the mcp SDK (a dependency of openai-agents, the dev extra)")
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": "Bearer tok"})
    async with http, Client(streamable_http_client(server.url + "/envs/Demo-v0/mcp?split=test&index=0",
                                                   http_client=http)) as c:
        assert c.session.protocol_version == "2025-11-25"  # server/discover refused: the handshake era
        assert c.session.initialize_result is not None and "guessing game" in (c.session.initialize_result.instructions or "")
        assert [t.name for t in (await c.list_tools()).tools] == ["guess", "give_up"]
        res = await c.read_resource("agentgym://task")
        assert "guessing game" in res.contents[0].text  # type: ignore[union-attr]
        r = await c.call_tool("guess", {"n": "not a number"})  # a bad call is the tool's error, not the protocol's
        assert r.is_error and "invalid arguments" in r.content[0].text  # type: ignore[union-attr]
        assert r.meta and r.meta["agentgym"]["info"]["metrics"]["tool_bad_arguments"] == 1
        r = await c.call_tool("give_up", {})
        assert r.meta and r.meta["agentgym"]["done"] is True
        assert r.meta["agentgym"]["info"]["task_id"] == "guess-1"  # the test split's first task (odd secrets)
    assert server.service.sessions == {}


def test_streamable_http_lifecycle_on_the_wire(server: EnvServer) -> None:
    url = server.url + "/mcp"
    auth = {"authorization": "Bearer tok", "accept": "application/json, text/event-stream"}
    with httpx.Client(headers=auth, timeout=30) as c:
        r = c.post(url, params={"task_id": "guess-3"}, json=INIT)
        assert r.status_code == 200 and r.json()["result"]["protocolVersion"] == "2025-06-18"
        assert r.json()["result"]["capabilities"]["tools"] == {"listChanged": False}
        sid = r.headers["mcp-session-id"]
        h = {"mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
        assert c.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h).status_code == 202
        assert c.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers=h).json()["result"] == {}
        call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "guess", "arguments": {"n": 3}}}
        res = c.post(url, json=call, headers=h).json()["result"]
        assert res["content"][0]["text"] == "correct" and res["isError"] is False and res["_meta"]["agentgym"]["done"]
        again = c.post(url, json=call, headers=h).json()  # the episode is over: a protocol error
        assert again["error"]["data"]["type"] == "ResetNeeded"
        assert c.post(url, json=[{"jsonrpc": "2.0", "id": 4, "method": "ping"},
                                 {"jsonrpc": "2.0", "method": "notifications/cancelled"}], headers=h).json() == [
            {"jsonrpc": "2.0", "id": 4, "result": {}}]  # a batch (2025-03-26)
        bad = c.post(url, json={"jsonrpc": "2.0", "id": 5, "method": "ping"},
                     headers={**h, "mcp-protocol-version": "1999-01-01"})
        assert bad.status_code == 400
        assert c.post(url, json={"jsonrpc": "2.0", "id": 6, "method": "server/discover"}).json()["error"]["code"] == -32601
        assert c.get(url).status_code == 405  # no server-initiated stream
        assert c.delete(url, headers=h).status_code == 204
        gone = c.post(url, json={"jsonrpc": "2.0", "id": 7, "method": "ping"}, headers=h)
        assert gone.status_code == 404  # the client must initialize again
        r = c.post(url, params={"task_id": "guess-999"}, json=INIT)  # a task the env does not have
        assert r.json()["error"]["data"]["type"] == "TaskNotFound" and "mcp-session-id" not in r.headers
        assert c.post(url, params={"seed": "-1"}, json=INIT).json()["error"]["data"]["type"] == "BadRequest"
    assert server.service.sessions == {}


def test_openenv_methods_on_mcp_still_work_without_initialize(server: EnvServer) -> None:
    """OpenEnv's MCPToolClient (production mode) sends no initialize: its session methods still work."""
    url = server.url + "/mcp"
    with httpx.Client(headers={"authorization": "Bearer tok"}, timeout=30) as c:
        def rpc(method: str, **params: Any) -> Any:
            return c.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()

        sid = rpc("openenv/session/create")["result"]["session_id"]
        text = rpc("resources/read", uri="agentgym://task", session_id=sid, reset={"task_id": "guess-31"})
        assert "guessing game" in text["result"]["contents"][0]["text"]  # the first use started the episode
        res = rpc("tools/call", name="guess", arguments={"n": 31}, session_id=sid)["result"]
        assert res["data"] == "correct" and res["is_error"] is False  # OpenEnv's fields beside MCP's
        assert rpc("openenv/session/close", session_id=sid)["result"]["closed"] is True

"""``agentgym serve`` and ``RemoteEnv`` on 127.0.0.1 (servers in a background thread): the env contract
over the wire, the OpenEnv shapes, limits, auth and structured errors."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import gymnasium
import httpx
import pytest

import agentgym
from agentgym.errors import ConfigurationError, EnvServerAtCapacity, EnvServerError, ResetNeeded, TaskNotFound
from agentgym.rollout.runtime import EnvTimeout
from agentgym.serve.client import RemoteEnv
from agentgym.serve.protocol import AgentAction, AgentObservation, is_loopback
from agentgym.serve.server import EnvServer, ServeConfig

DEMO = "agentgym/Demo-v0"


def wait_until(cond: Any, what: str, bound_s: float = 60.0) -> None:
    """Wait for ``cond()`` to hold (the event itself), failing after a generous bound."""
    deadline = time.monotonic() + bound_s
    while not cond():
        assert time.monotonic() < deadline, f"not within {bound_s:g} s: {what}"
        time.sleep(0.02)


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    """One keep-alive client per test (stands in for the httpx module), closed afterwards."""
    with httpx.Client(timeout=30) as c:
        yield c


def play_expert(env: Any, seed: int, task_id: str | None = None) -> list[Any]:
    """The whole expert episode as (messages, reward, terminated, truncated, info-without-timing)."""
    out: list[Any] = []
    obs, info = env.reset(seed=seed, options={"task_id": task_id} if task_id else None)
    out.append((obs, info))
    expert = env.get_wrapper_attr("expert_action")
    for _ in range(50):
        step = env.step(expert())
        out.append(step)
        if step[2] or step[3]:
            break
    return out


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_remote_episode_equals_local(demo_server: EnvServer, transport: str) -> None:
    local = agentgym.make(DEMO)
    remote = gymnasium.make("agentgym/Remote-v0", url=demo_server.url, transport=transport)
    for seed, task in ((0, None), (5, "guess-40")):
        a, b = play_expert(local, seed, task), play_expert(remote, seed, task)
        assert a == b  # messages, rewards, flags and info (tools, parser, task_id, metrics) identical
        assert b[-1][2] and b[-1][4]["success"] is True
    assert remote.get_wrapper_attr("splits") == ("train", "test")
    assert [t.task_id for t in remote.get_wrapper_attr("tasks")("test")] == [t.task_id for t in local.unwrapped.tasks("test")]
    remote.close()
    local.close()


def test_checker_passes_over_http(demo_server: EnvServer) -> None:
    env = gymnasium.make("agentgym/Remote-v0", url=demo_server.url)
    report = agentgym.check_env(env)
    assert not report.skipped and len(report.passed) == 6
    env.close()


def test_env_errors_map_to_agentgym_errors(demo_server: EnvServer) -> None:
    env = RemoteEnv(demo_server.url)
    with pytest.raises(ResetNeeded):
        env.step("hi")  # before reset: refused locally
    with pytest.raises(TaskNotFound, match="no task 'guess-999'"):
        env.reset(options={"task_id": "guess-999"})
    with pytest.raises(TaskNotFound, match="no split"):
        env.tasks("nope")
    env.reset(seed=0, options={"task_id": "guess-3"})
    obs, r, term, trunc, info = env.step({"role": "assistant", "content": "",
                                          "tool_calls": [{"id": "c1", "name": "give_up", "arguments": {}}]})
    assert term and not trunc and info["success"] is False and obs[0]["tool_call_id"] == "c1"
    with pytest.raises(ResetNeeded):
        env.step("again")
    # the server also refuses a step after the end, whatever the client thinks
    r2 = httpx.post(demo_server.url + "/step", json={"session_id": env.session_id, "action": {"message": "x"}})
    assert r2.status_code == 409 and r2.json()["detail"]["type"] == "ResetNeeded"
    env.close()
    with pytest.raises(ConfigurationError, match="does not serve"):
        RemoteEnv(demo_server.url, env_id="agentgym/SQL-v0")


def test_bad_agent_output_stays_an_observation(demo_server: EnvServer) -> None:
    env = RemoteEnv(demo_server.url)
    env.reset(seed=1)
    for bad in ["", "<tool_call>{not json</tool_call>", 12345, {"role": "assistant", "content": None},
                '<tool_call>{"name": "guess", "arguments": {"n": "many"}}</tool_call>', "x" * 300_000]:
        obs, reward, term, trunc, info = env.step(bad)
        assert obs and obs[-1]["content"] and not term and not trunc
    assert "too long" in info["parse_error"] and info["metrics"]["oversized_actions"] == 1
    # after all that the episode still works
    obs, reward, term, _, info = env.step('<tool_call>{"name": "give_up", "arguments": {}}</tool_call>')
    assert term
    env.close()


def test_openenv_shapes_and_mcp(demo_server: EnvServer, client: httpx.Client) -> None:
    url = demo_server.url
    httpx = client
    schema = httpx.get(url + "/schema").json()
    assert set(schema) == {"action", "observation", "state"}
    assert schema["action"] == AgentAction.model_json_schema()
    assert httpx.get(url + "/metadata").json()["name"] == DEMO
    assert httpx.get(url + "/health").json() == {"status": "healthy"}
    assert httpx.get(url + "/envs/ServeTest-v0/metadata").json()["name"] == "agentgym/ServeTest-v0"
    # OpenEnv's stateless reset: no session needed
    r = httpx.post(url + "/reset", json={"seed": 3}).json()
    assert set(r) == {"observation", "reward", "done"} and not r["done"]
    AgentObservation.model_validate(r["observation"])
    # MCP JSON-RPC over HTTP, with OpenEnv's session methods
    rpc = lambda method, **params: httpx.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 7, "method": method,  # noqa: E731
                                                                 "params": params}).json()
    tools = rpc("tools/list")["result"]["tools"]
    assert [t["name"] for t in tools] == ["guess", "give_up"] and tools[0]["inputSchema"]["required"] == ["n"]
    sid = rpc("openenv/session/create")["result"]["session_id"]
    res = rpc("tools/call", name="guess", arguments={"n": 31}, session_id=sid, reset={"task_id": "guess-31"})["result"]
    assert res["content"][0]["text"] == "correct" and not res["is_error"]
    assert res["_meta"]["agentgym"]["terminated"] and res["_meta"]["agentgym"]["reward"] == 1.0
    err = rpc("tools/call", name="guess", arguments={"n": 1}, session_id=sid)
    assert err["error"]["data"]["type"] == "ResetNeeded"
    assert rpc("openenv/session/close", session_id=sid)["result"]["closed"] is True
    assert rpc("tools/call", name="guess", arguments={"n": 1}, session_id=sid)["error"]["data"]["type"] == "SessionNotFound"
    assert rpc("no/such")["error"]["code"] == -32601
    assert httpx.post(url + "/mcp", content=b"{nope").json()["error"]["code"] == -32700
    # call_tool and list_tools as OpenEnv step actions
    sid = httpx.post(url + "/agentgym/sessions", json={}).json()["session_id"]
    httpx.post(url + "/reset", json={"session_id": sid, "task_id": "guess-31"})
    lt = httpx.post(url + "/step", json={"session_id": sid, "action": {"type": "list_tools"}}).json()
    assert [t["name"] for t in lt["observation"]["tools"]] == ["guess", "give_up"]
    st = httpx.post(url + "/step", json={"session_id": sid, "action": {"type": "call_tool", "tool_name": "nope",
                                                                       "arguments": {}}}).json()
    assert st["observation"]["error"]["error_type"] == "tool_not_found" and st["observation"]["result"]["is_error"]
    state = httpx.get(url + "/state", params={"session_id": sid}).json()
    assert state["step_count"] == 1 and state["status"] == "running" and state["task_id"] == "guess-31"
    httpx.delete(url + f"/agentgym/sessions/{sid}")


def test_bad_requests_get_structured_errors_without_tracebacks(demo_server: EnvServer, client: httpx.Client) -> None:
    url = demo_server.url
    httpx = client
    cases = [
        (httpx.post(url + "/step", content=b"{not json", headers={"content-type": "application/json"}), 400, "BadRequest"),
        (httpx.post(url + "/step", json=[1, 2]), 400, "BadRequest"),
        (httpx.post(url + "/step", json={"action": "hi"}), 400, "BadRequest"),  # a stateless step needs an object
        (httpx.post(url + "/step", json={"session_id": "forged", "action": {"message": "hi"}}), 404, "SessionNotFound"),
        (httpx.post(url + "/reset", json={"seed": -1}), 400, "BadRequest"),
        (httpx.post(url + "/agentgym/sessions", json={"env_kwargs": {"path": "/etc"}}), 400, "ConfigurationError"),
        (httpx.post(url + "/step", content=b"x" * (5 * 2**20)), 413, "PayloadTooLarge"),
    ]
    for r, status, kind in cases:
        assert r.status_code == status, (r.status_code, r.text[:200])
        assert r.json()["detail"]["type"] == kind
        assert "Traceback" not in r.text
    # an env that raises: a 500 with a reference, never the exception text or a traceback
    env = RemoteEnv(url, env_id="ServeTest-v0")
    env.reset(seed=0)
    with pytest.raises(EnvServerError, match="RuntimeError") as e:
        env.step("crash")
    assert "secret" not in str(e.value) and "ref " in str(e.value) and e.value.status == 500
    env.close()


def test_step_retry_with_same_request_id_is_applied_once(demo_server: EnvServer, client: httpx.Client) -> None:
    url = demo_server.url
    httpx = client
    sid = httpx.post(url + "/agentgym/sessions", json={}).json()["session_id"]
    httpx.post(url + "/reset", json={"session_id": sid, "task_id": "guess-31"})
    body = {"session_id": sid, "request_id": "r-1", "action": {"message": '<tool_call>{"name": "guess", "arguments": {"n": 10}}</tool_call>'}}
    a, b = httpx.post(url + "/step", json=body), httpx.post(url + "/step", json=body)
    assert a.content == b.content and a.json()["observation"]["messages"][0]["content"] == "higher"
    assert httpx.get(url + "/state", params={"session_id": sid}).json()["step_count"] == 1
    httpx.delete(url + f"/agentgym/sessions/{sid}")


def test_session_creation_with_the_same_request_id_gets_the_same_session(demo_server: EnvServer,
                                                                         client: httpx.Client) -> None:
    url = demo_server.url + "/agentgym/sessions"
    before = len(demo_server.service.sessions)
    a, b = client.post(url, json={"request_id": "c-1"}), client.post(url, json={"request_id": "c-1"})
    c = client.post(url, json={"request_id": "c-2"})
    assert a.json()["session_id"] == b.json()["session_id"] != c.json()["session_id"]
    assert len(demo_server.service.sessions) == before + 2  # a retry opens no second session
    for sid in {a.json()["session_id"], c.json()["session_id"]}:
        client.delete(demo_server.url + f"/agentgym/sessions/{sid}")
    assert client.post(url, json={"request_id": 7}).status_code == 400
    assert client.post(url, json={"request_id": "x" * 129}).status_code == 400


async def test_a_retried_creation_that_arrives_while_the_first_builds_gets_its_session() -> None:
    from agentgym.serve.service import Service

    service = Service(ServeConfig([DEMO], max_sessions=2))
    try:
        a, b = await asyncio.gather(service.create(DEMO, request_id="r"), service.create(DEMO, request_id="r"))
        assert a is b and list(service.sessions) == [a.id]
        await service.close(a)  # a closed session is not handed out again: the retry gets a new one
        c = await service.create(DEMO, request_id="r")
        assert c is not a and list(service.sessions) == [c.id]
    finally:
        await service.shutdown()


def test_session_creation_is_retried_when_its_answer_is_lost(demo_server: EnvServer) -> None:
    """The keep-alive race, made deterministic: the server applies POST /agentgym/sessions and the
    connection dies before the answer arrives. RemoteEnv failed ("not retried"); now it retries with
    the same request_id and the server answers with the session it created: one session, not two."""
    from serve_helpers import DropFirstAnswer

    before = set(demo_server.service.sessions)
    with DropFirstAnswer(("127.0.0.1", demo_server.port), b"POST /agentgym/sessions") as proxy:
        env = RemoteEnv(proxy.url, retries=1)
        try:
            assert proxy.dropped.is_set()
            assert set(demo_server.service.sessions) - before == {env.session_id}
            env.reset(seed=0, options={"task_id": "guess-31"})
            assert env.step('<tool_call>{"name": "guess", "arguments": {"n": 31}}</tool_call>')[1] == 1.0
        finally:
            env.close()
    assert set(demo_server.service.sessions) == before


def test_a_dropped_remote_env_is_freed_at_once(demo_server: EnvServer) -> None:
    """Each call's deadline waits in the watchdog's heap until it passes (360 s), even when cancelled;
    it held the env alive that long, so an env dropped unclosed leaked its socket minutes later, in
    whichever test ran then (an unraisable ResourceWarning). Now a cancelled deadline holds nothing."""
    import gc
    import weakref

    env = RemoteEnv(demo_server.url)
    env.reset(seed=0)
    env.close()
    ref = weakref.ref(env)
    del env
    gc.collect()
    assert ref() is None


def test_token_auth() -> None:
    with EnvServer(DEMO, token="s3cret") as srv:
        assert httpx.get(srv.url + "/health").status_code == 200  # liveness needs no token
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Bearer s3cre"},
                        {"authorization": "Token s3cret"}):
            r = httpx.get(srv.url + "/schema", headers=headers)
            assert r.status_code == 401 and r.json()["detail"]["type"] == "Unauthorized"
        assert httpx.get(srv.url + "/schema", headers={"authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(srv.url + "/schema", auth=("anyone", "s3cret")).status_code == 200  # Basic (OpenEnv clients)
        with pytest.raises(ConfigurationError, match="token"):
            RemoteEnv(srv.url, token="nope")
        with pytest.raises(ConfigurationError, match="token"):
            RemoteEnv(srv.url, token="nope", transport="ws")
        env = RemoteEnv(srv.url, token="s3cret", transport="ws")
        env.reset(seed=0)
        env.close()


def test_refuses_public_bind_without_token() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    with pytest.raises(ConfigurationError, match="without a token"):
        ServeConfig([DEMO], host="0.0.0.0").validate()
    ServeConfig([DEMO], host="0.0.0.0", token="t").validate()


@pytest.mark.slow
def test_capacity_and_idle_expiry() -> None:
    with EnvServer(DEMO, max_sessions=2, idle_timeout_s=0.4) as srv:
        a, b = RemoteEnv(srv.url), RemoteEnv(srv.url)
        with pytest.raises(EnvServerAtCapacity, match="capacity") as e:
            RemoteEnv(srv.url, retries=0, capacity_wait_s=0)
        assert e.value.retryable
        a.reset(seed=0)
        wait_until(lambda: srv.service.sessions == {}, "both sessions expire when idle")
        with pytest.raises(EnvServerError, match="expired"):
            a.step("<tool_call>{\"name\": \"give_up\", \"arguments\": {}}</tool_call>")
        obs, info = b.reset(seed=0)  # reset is idempotent: a new session is opened transparently
        assert info["task_id"] and len(srv.service.sessions) == 1
        a.close()
        b.close()
        assert srv.service.sessions == {}


def test_server_step_timeout_discards_the_session() -> None:
    with EnvServer("agentgym/ServeTest-v0", step_timeout_s=0.3) as srv:
        env = RemoteEnv(srv.url)
        env.reset(seed=0)
        t = time.monotonic()
        with pytest.raises(EnvTimeout, match=r"did not return within 0\.3"):
            env.step("sleep 2")
        assert time.monotonic() - t < 1.5
        assert srv.service.sessions == {}
        env2 = RemoteEnv(srv.url)  # the server is fine
        env2.reset(seed=0)
        assert env2.step(env2.expert_action())[2]
        env.close()
        env2.close()


def test_websocket_protocol_errors_keep_the_connection(demo_server: EnvServer) -> None:
    from websockets.sync.client import connect

    with connect(demo_server.url.replace("http", "ws") + "/ws", proxy=None) as ws:
        def call(raw: str) -> dict[str, Any]:
            ws.send(raw)
            return json.loads(ws.recv(timeout=10))  # type: ignore[no-any-return]

        assert call("{oops")["data"]["code"] == "INVALID_JSON"
        assert call("[1]")["data"]["code"] == "VALIDATION_ERROR"
        assert call('{"type": "dance"}')["data"]["code"] == "UNKNOWN_TYPE"
        assert call('{"type": "step", "data": {"message": "x"}}')["data"]["error_type"] == "ResetNeeded"
        r = call('{"type": "reset", "data": {"seed": 0, "task_id": "guess-31"}}')
        assert r["type"] == "observation" and r["data"]["observation"]["info"]["task_id"] == "guess-31"
        r = call('{"type": "step", "data": {"type": "call_tool", "tool_name": "guess", "arguments": {"n": 31}}}')
        assert r["data"]["done"] and r["data"]["observation"]["result"]["data"] == "correct"
        assert call('{"type": "state"}')["data"]["step_count"] == 1
        mcp = call('{"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}}')
        assert [t["name"] for t in mcp["data"]["result"]["tools"]] == ["guess", "give_up"]
        n = len(demo_server.service.sessions)
        ws.send('{"type": "close"}')
    wait_until(lambda: len(demo_server.service.sessions) < n, "the connection's session is closed")
    assert len(demo_server.service.sessions) == n - 1  # that one, and only that one


def test_client_that_vanishes_mid_request(demo_server: EnvServer, client: httpx.Client) -> None:
    url = demo_server.url
    httpx = client
    sid = httpx.post(url + "/agentgym/sessions", json={}).json()["session_id"]
    httpx.post(url + "/reset", json={"session_id": sid, "task_id": "guess-31"})
    body = json.dumps({"session_id": sid, "request_id": "gone-1",
                       "action": {"message": '<tool_call>{"name": "guess", "arguments": {"n": 5}}</tool_call>'}}).encode()
    head = (f"POST /step HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((demo_server.host, demo_server.port)) as s:  # half a request, then gone
        s.sendall(head + body[:10])
    with socket.create_connection((demo_server.host, demo_server.port)) as s:  # a whole request, no reading
        s.sendall(head + body)
    state = lambda: httpx.get(url + "/state", params={"session_id": sid}).json()  # noqa: E731
    wait_until(lambda: state()["step_count"] == 1, "the step sent whole is applied")
    # the server still serves, and a retry of that step is answered without applying it again
    r = httpx.post(url + "/step", content=body, headers={"content-type": "application/json"}).json()
    assert r["observation"]["messages"][0]["content"] == "higher"
    assert state()["step_count"] == 1
    httpx.delete(url + f"/agentgym/sessions/{sid}")


def test_per_env_kwargs_and_a_clear_error_for_a_kwarg_an_env_does_not_take() -> None:
    from agentgym.cli.serve import parse_env_kwargs
    from agentgym.serve.service import Service

    assert parse_env_kwargs(["action_mode=tool", "ALFWorld-v0:max_steps=3", "agentgym/SQL-v0:url=http://h:1/x",
                             f"seed={'9' * 5000}"]) == {
        "*": {"action_mode": "tool", "seed": "9" * 5000}, "ALFWorld-v0": {"max_steps": 3},
        "agentgym/SQL-v0": {"url": "http://h:1/x"}}
    with pytest.raises(ConfigurationError, match=r"SQL-v0 does not take the env kwarg action_mode.*--kw SQL-v0:key="):
        Service(ServeConfig(["agentgym/SQL-v0", "agentgym/ALFWorld-v0"], env_kwargs={"*": {"action_mode": "tool"}}))
    with pytest.raises(ConfigurationError, match="not served here"):
        Service(ServeConfig([DEMO], env_kwargs={"SQL-v0": {"x": 1}}))
    with EnvServer(["agentgym/SQL-v0", "agentgym/ALFWorld-v0"],
                   env_kwargs={"ALFWorld-v0": {"action_mode": "tool"}}) as srv:
        spec = httpx.get(srv.url + "/envs/ALFWorld-v0/agentgym/spec").json()["env"]
        assert [t["function"]["name"] for t in spec["tools"]] == ["take_action"] and spec["parser"] == "hermes"
        assert httpx.get(srv.url + "/agentgym/spec").json()["env"]["env_id"] == "agentgym/SQL-v0"


def test_stateless_step_is_a_one_step_episode(demo_server: EnvServer, client: httpx.Client) -> None:
    """OpenEnv's POST /step without a session: a fresh env, reset with the body's task, stepped, closed."""
    n = len(demo_server.service.sessions)
    r = client.post(demo_server.url + "/step", json={"task_id": "guess-31", "action": {
        "type": "call_tool", "tool_name": "guess", "arguments": {"n": 31}}})
    assert r.status_code == 200 and r.json()["done"] and r.json()["reward"] == 1.0
    assert r.json()["observation"]["info"]["task_id"] == "guess-31"
    r = client.post(demo_server.url + "/step", json={"seed": 0, "action": {"message": "no tool call"}})
    assert r.status_code == 200 and not r.json()["done"] and r.json()["observation"]["info"]["parse_error"]
    assert len(demo_server.service.sessions) == n  # nothing left open
    o = client.post(demo_server.url + "/reset", json={"task_id": "guess-31"}).json()["observation"]
    assert o["metadata"] == {"prompt": "\n\n".join(m["content"] for m in o["messages"]), "task_id": "guess-31"}


def test_remote_env_waits_for_a_server_at_capacity() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with EnvServer(DEMO, max_sessions=1) as srv:
        first = RemoteEnv(srv.url)
        pool = ThreadPoolExecutor(2)
        waiting = pool.submit(RemoteEnv, srv.url, capacity_wait_s=120)
        with pytest.raises(EnvServerAtCapacity, match=r"waited 0\.5 s"):
            pool.submit(RemoteEnv, srv.url, capacity_wait_s=0.5, transport="ws").result(timeout=60)
        assert not waiting.done()
        first.close()  # a slot frees: the waiting env gets it
        second = waiting.result(timeout=120)
        second.reset(seed=0)
        second.close()
        pool.shutdown()

"""OpenAIPolicy against a programmable HTTP server on 127.0.0.1: parsing, retries, errors, limits.

The server is real (http.server in a thread); only its responses are scripted. The test against a
real `vllm serve` is in test_policy_contract.py / test_vllm_policies.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from agentgym.policies.openai import OpenAIPolicy

from agentgym.errors import ContextLengthExceeded, PolicyClientError, PolicyServerError, PolicyTimeout
from agentgym.parsers import get_parser
from agentgym.policy import GenRequest, SamplingParams


def chat_ok(n: int = 1, content: str = "hello", tool_calls: list[Any] | None = None) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content, "tool_calls": tool_calls or []},
        "finish_reason": "tool_calls" if tool_calls else "stop",
        "logprobs": {"content": [{"token": "hel", "logprob": -0.5}, {"token": "lo", "logprob": -0.25}]},
        "token_ids": [100, 200],
    }
    return {"choices": [dict(choice, index=i) for i in range(n)], "prompt_token_ids": [1, 2, 3]}


class FakeServer:
    """Pops one scripted action per request: (status, body) or ("sleep", s) or ("close",)."""

    def __init__(self) -> None:
        self.actions: list[Any] = []
        self.requests: list[tuple[str, str, Any]] = []
        self.default: Any = (200, chat_ok())
        self.active = 0
        self.max_active = 0
        self.delay = 0.0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with outer._lock:
                    outer.requests.append((method, self.path, body))
                    action = outer.actions.pop(0) if outer.actions else outer.default
                    outer.active += 1
                    outer.max_active = max(outer.max_active, outer.active)
                try:
                    if outer.delay:
                        time.sleep(outer.delay)
                    if action[0] == "sleep":
                        time.sleep(action[1])
                        return
                    if action[0] == "close":
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    status, payload = action
                    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass
                finally:
                    with outer._lock:
                        outer.active -= 1

            def do_POST(self) -> None:
                self._handle("POST")

            def do_GET(self) -> None:
                self._handle("GET")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer()
    yield s
    s.close()


def _policy(server: FakeServer, **kw: Any) -> OpenAIPolicy:
    kw.setdefault("max_retries", 2)
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("timeout_s", 5.0)
    return OpenAIPolicy(server.url, "m", **kw)


TOOLS: Any = [{"type": "function", "function": {"name": "search", "description": "d", "parameters": {"type": "object", "properties": {}}}}]


def _req(**kw: Any) -> GenRequest:
    return GenRequest(messages=[{"role": "user", "content": "hi"}], **kw)


async def test_chat_request_and_parsing(server: FakeServer) -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"query": "x"}'}}]
    server.default = (200, chat_ok(content="", tool_calls=calls))
    pol = _policy(server, api_key="k")
    (g,) = await pol.generate([_req(tools=TOOLS, sampling=SamplingParams(max_tokens=7, top_k=5, stop=["\n"], seed=1))])
    method, path, body = server.requests[0]
    assert (method, path) == ("POST", "/v1/chat/completions")
    assert body["tools"] == TOOLS and body["model"] == "m" and body["max_tokens"] == 7 and body["top_k"] == 5
    assert body["stop"] == ["\n"] and body["seed"] == 1 and body["logprobs"] is True and body["return_token_ids"] is True
    assert g.tool_calls == [{"id": "c1", "name": "search", "arguments": {"query": "x"}}]
    assert g.token_ids == [100, 200] and g.logprobs == [-0.5, -0.25] and g.prompt_token_ids == [1, 2, 3]
    assert g.finish_reason == "stop"
    assert g.as_action()["tool_calls"][0]["name"] == "search"  # type: ignore[index]
    await pol.aclose()


async def test_bad_tool_arguments_become_an_observation(server: FakeServer) -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{not json"}}]
    server.default = (200, chat_ok(content="", tool_calls=calls))
    (g,) = await _policy(server).generate([_req()])
    parsed = get_parser("json").parse(g.as_action(), None)
    assert parsed.error and "not valid JSON" in parsed.error


async def test_token_ids_prompt_uses_completions(server: FakeServer) -> None:
    server.default = (200, {"choices": [{"index": 0, "text": "ab", "finish_reason": "length",
                                         "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-1.0, -2.0]}}]})
    (g,) = await _policy(server, vllm_extras=False).generate([GenRequest(prompt_token_ids=[1, 2, 3])])
    _, path, body = server.requests[0]
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3] and "return_token_ids" not in body
    assert g.token_ids == [5, 6] and g.logprobs == [-1.0, -2.0] and g.finish_reason == "length"


async def test_model_is_discovered(server: FakeServer) -> None:
    server.actions = [(200, {"data": [{"id": "served"}]})]
    pol = OpenAIPolicy(server.url, None, backoff_s=0.01)
    await pol.generate([_req()])
    assert server.requests[0][:2] == ("GET", "/v1/models")
    assert server.requests[1][2]["model"] == "served" and pol.model == "served"


async def test_5xx_is_retried_then_succeeds(server: FakeServer) -> None:
    server.actions = [(500, {"error": "boom"}), (503, b"unavailable")]
    (g,) = await _policy(server).generate([_req()])
    assert g.text == "hello" and len(server.requests) == 3


async def test_5xx_gives_up_after_bounded_retries(server: FakeServer) -> None:
    server.default = (500, {"error": {"message": "engine dead"}})
    t0 = time.monotonic()
    with pytest.raises(PolicyServerError, match="after 3 tries"):
        await _policy(server).generate([_req()])
    assert len(server.requests) == 3 and time.monotonic() - t0 < 5


async def test_malformed_json_is_a_clear_error(server: FakeServer) -> None:
    server.default = (200, b"{'choices': oops")
    with pytest.raises(PolicyServerError, match="malformed JSON"):
        await _policy(server, max_retries=1).generate([_req()])
    assert len(server.requests) == 2


async def test_response_without_choices_is_a_clear_error(server: FakeServer) -> None:
    server.default = (200, {"object": "chat.completion"})
    with pytest.raises(PolicyServerError, match="without valid choices"):
        await _policy(server).generate([_req()])


async def test_wrong_number_of_choices(server: FakeServer) -> None:
    server.default = (200, chat_ok(n=1))
    with pytest.raises(PolicyServerError, match="1 choices for n=2"):
        await _policy(server).generate([_req(n=2)])


async def test_4xx_is_not_retried(server: FakeServer) -> None:
    server.default = (401, {"error": {"message": "invalid api key"}})
    with pytest.raises(PolicyClientError, match=r"invalid api key.*api key"):
        await _policy(server).generate([_req()])
    assert len(server.requests) == 1


async def test_context_length_400(server: FakeServer) -> None:
    msg = "This model's maximum context length is 2048 tokens. However, you requested 9000 tokens."
    server.default = (400, {"error": {"message": msg, "type": "BadRequestError"}})
    with pytest.raises(ContextLengthExceeded, match="2048"):
        await _policy(server).generate([_req()])
    assert len(server.requests) == 1


async def test_hanging_server_times_out(server: FakeServer) -> None:
    server.default = ("sleep", 3.0)
    t0 = time.monotonic()
    with pytest.raises(PolicyTimeout):
        await _policy(server, timeout_s=0.3, max_retries=1).generate([_req()])
    assert time.monotonic() - t0 < 2.5


async def test_dropped_connection_is_retried(server: FakeServer) -> None:
    server.actions = [("close",)]
    (g,) = await _policy(server).generate([_req()])
    assert g.text == "hello"


async def test_dead_server() -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pol = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "m", max_retries=2, backoff_s=0.01, connect_timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(PolicyServerError, match="cannot reach"):
        await pol.generate([_req()])
    assert time.monotonic() - t0 < 5


async def test_concurrency_limit(server: FakeServer) -> None:
    server.delay = 0.1
    gens = await _policy(server, max_concurrency=2).generate([_req() for _ in range(6)])
    assert len(gens) == 6 and server.max_active <= 2


async def test_zero_max_tokens_needs_no_call(server: FakeServer) -> None:
    (g,) = await _policy(server).generate([_req(sampling=SamplingParams(max_tokens=0))])
    assert g.text == "" and g.finish_reason == "length" and server.requests == []


def test_token_sessions_only_with_a_tokenizer() -> None:
    from agentgym.policies.session import TokenizerChatSession

    from agentgym.errors import ConfigurationError
    from agentgym.policy import capabilities_of

    plain = OpenAIPolicy("http://127.0.0.1:1/v1", "m")
    assert not capabilities_of(plain).sessions
    with pytest.raises(ConfigurationError, match="tokenizer"):
        plain.new_session()
    with_tok = OpenAIPolicy("http://127.0.0.1:1/v1", "m", tokenizer="smollm2-135m-instruct")
    assert capabilities_of(with_tok).sessions
    assert isinstance(with_tok.new_session(), TokenizerChatSession)
    with pytest.raises(ConfigurationError, match="http"):
        OpenAIPolicy("127.0.0.1:8000/v1", "m")

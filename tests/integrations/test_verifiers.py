"""AgentGym envs in verifiers 0.4 (real ``verifiers`` and ``openenv``, in the side venv ``.venv-verifiers``).

verifiers pins ``mcp==2.0.0`` and ``openai<3``, which the main venv's extras contradict, so these tests
run in their own venv (``make test-verifiers``, part of ``make test``) and skip in the main one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verifiers", reason="verifiers runs in its own venv: make test-verifiers")

import uvicorn
from agentgym.envs.demo import expert_guess
from fastapi import FastAPI, Request

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # HTTP servers on 127.0.0.1, vf-eval subprocesses


def _reply(body: dict[str, Any]) -> dict[str, Any]:
    """A scripted model: Demo-v0 by binary search; SQL-v0: one query, then a submitted answer."""
    tools = [t["function"]["name"] for t in body.get("tools") or []]
    msgs = body["messages"]
    n_calls = sum(1 for m in msgs if m["role"] == "assistant" and m.get("tool_calls"))
    if "guess" in tools:
        name, args = "guess", {"n": expert_guess(msgs)}  # Demo-v0's own expert, read from the conversation
    elif n_calls == 0:
        name, args = "execute_sql", {"query": "SELECT name FROM sqlite_master WHERE type = 'table'"}
    else:
        name, args = "submit", {"answer": "42"}
    call = {"id": f"call_{n_calls}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    return {"id": f"c{n_calls}", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


@pytest.fixture(scope="module")
def model_server() -> Iterator[dict[str, Any]]:
    app = FastAPI()
    seen: dict[str, Any] = {"requests": []}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        seen["requests"].append(body)
        return _reply(body)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(1200):
            if server.started:
                break
            threading.Event().wait(0.05)
        assert server.started
        seen["url"] = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        yield seen
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def _vf_eval(tmp_path: Path, model_server: dict[str, Any], *args: str) -> list[dict[str, Any]]:
    vf_eval = Path(sys.executable).parent / "vf-eval"
    cmd = [str(vf_eval), "agentgym-verifiers", *args, "--model", "scripted", "--client.base-url", model_server["url"],
           "--client.api-key-var", "AGENTGYM_TEST_KEY", "--env.agent.runtime.type", "subprocess", "--no-push", "-o", str(tmp_path), "--run.dir", "run"]
    env = {**os.environ, "AGENTGYM_TEST_KEY": "unused"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    traces = tmp_path / "run" / "traces.jsonl"
    rows = [json.loads(line) for line in traces.read_text().splitlines() if line.strip()]
    assert all(r["ok"] and not r["errors"] for r in rows), rows
    return [t for r in rows for t in r["traces"]]  # one episode per row, one agent trace per episode


def test_vf_eval_plays_demo_tasks_with_native_tool_calls(tmp_path: Path, model_server: dict[str, Any]) -> None:
    before = len(model_server["requests"])
    traces = _vf_eval(tmp_path, model_server, "--env.taskset.env-id", "agentgym/Demo-v0",
                      "--env.taskset.split", "test", "--select.limit", "2")
    assert len(traces) == 2
    for t in traces:
        assert t["rewards"]["agentgym"]["score"] == 1.0
        assert t["metrics"]["agentgym_success"] == 1.0 and t["metrics"]["agentgym_terminated"] == 1.0
    sent = model_server["requests"][before:]
    # the env's exact tools, natively (no hermes text in the prompt's place)
    import agentgym

    specs = agentgym.make("agentgym/Demo-v0").unwrapped.tools.specs()
    assert all(r["tools"] == specs for r in sent)


def test_vf_eval_runs_sql_tasks_and_records_the_envs_reward(tmp_path: Path, model_server: dict[str, Any]) -> None:
    traces = _vf_eval(tmp_path, model_server, "--env.taskset.env-id", "agentgym/SQL-v0",
                      "--env.taskset.split", "test", "--select.limit", "2")
    assert len(traces) == 2
    for t in traces:
        # wrong answers: the env's reward 0, no success, and the episode ran until the env ended it
        assert t["rewards"]["agentgym"]["score"] == 0.0
        assert t["metrics"]["agentgym_success"] == 0.0 and t["metrics"]["agentgym_steps"] >= 2.0
        assert t["metrics"]["agentgym_terminated"] + t["metrics"]["agentgym_truncated"] >= 1.0


def test_verifiers_openenv_action_parsing_accepts_hermes_text() -> None:
    """verifiers' OpenEnv taskset maps a text reply onto the action schema's one required field."""
    import httpx
    from verifiers.v1.tasksets.openenv.taskset import parse_action

    from agentgym.serve.server import EnvServer

    with EnvServer(["agentgym/Demo-v0"]) as srv:
        schema = httpx.get(srv.url + "/schema").json()["action"]
        text = '<tool_call>{"name": "guess", "arguments": {"n": 31}}</tool_call>'
        action = parse_action(text, schema)
        assert action == {"message": text}
        as_json = parse_action('{"type": "call_tool", "tool_name": "guess", "arguments": {"n": 31}}', schema)
        assert as_json["type"] == "call_tool"
        # both forms step a real episode through OpenEnv's own client (the renamed `openenv` package)
        from openenv import GenericEnvClient

        with GenericEnvClient(base_url=srv.url).sync() as c:
            c.reset(seed=0)
            r = c.step(action)
            assert r.observation["messages"][0]["role"] == "tool"
            r = c.step(as_json)
            assert r.observation.get("error") is None

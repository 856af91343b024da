"""Agents written the way their users write them: the ``openai`` client and plain HTTP, no AgentGym code.

Each takes the task dict a harness hands over (``base_url``, ``api_key``, ``model``, ``messages``,
``tools`` as OpenAI function specs, ``env_url``) and runs a tool-calling loop: ask the model, send its
tool calls to the env's URL, append the tool results, until the env says the episode is done. Nothing
here imports ``agentgym``.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
import time
from typing import Any

# Imported here, not in the agents: a sync agent runs in threads, several at once, and threads that import a
# package for the first time together can get it partially initialized (AttributeError on httpx.URL).
import httpx
import openai

MAX_TURNS = 6


# One TLS context for the process, as an agent serving many episodes keeps one: an ``openai`` or ``httpx`` client
# built without it loads the CA bundle (~30-40 ms of CPU, even for plain ``http://``), which was most of the harness
# learning test's CPU with two new clients an episode.
TLS = ssl.create_default_context()


def _env_client(task: dict[str, Any]) -> Any:
    return httpx.Client(headers={"Authorization": f"Bearer {task['api_key']}"}, timeout=300, verify=TLS)


def _model_client(task: dict[str, Any]) -> Any:
    return openai.OpenAI(base_url=task["base_url"], api_key=task["api_key"], max_retries=0, timeout=300,
                         http_client=openai.DefaultHttpxClient(verify=TLS))


def tool_agent(task: dict[str, Any]) -> None:
    """The plain ``openai`` agent: OpenAI tool calls, tool results as ``tool`` messages."""
    client = _model_client(task)
    env = _env_client(task)
    messages: list[dict[str, Any]] = list(task["messages"])
    try:
        for _ in range(MAX_TURNS):
            r = client.chat.completions.create(model=task["model"], messages=messages, tools=task["tools"])
            msg = r.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if msg.tool_calls:
                action = {"tool_calls": [tc.model_dump() for tc in msg.tool_calls]}
            else:  # no call: the env hears the text (and says what it expected)
                action = {"content": msg.content or ""}
            out = env.post(task["env_url"] + "/step", json=action)
            out.raise_for_status()
            result = out.json()
            messages += result["messages"]
            if result["done"]:
                return
    finally:
        client.close()
        env.close()


def summarising_agent(task: dict[str, Any]) -> None:
    """Like :func:`tool_agent`, but before its last question it rewrites its context: it drops the
    history and restates what it learned in one user message (a context-managing harness)."""
    client = _model_client(task)
    env = _env_client(task)
    messages: list[dict[str, Any]] = list(task["messages"])
    try:
        for turn in range(MAX_TURNS):
            r = client.chat.completions.create(model=task["model"], messages=messages, tools=task["tools"])
            msg = r.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            action = ({"tool_calls": [tc.model_dump() for tc in msg.tool_calls]} if msg.tool_calls
                      else {"content": msg.content or ""})
            result = env.post(task["env_url"] + "/step", json=action).json()
            messages += result["messages"]
            if result["done"]:
                return
            if turn == 0:  # summarise: a new, shorter context
                seen = " ".join(m["content"] for m in messages if m["role"] == "tool")
                messages = [*task["messages"][:-1], {"role": "user", "content": f"{task['prompt']} (so far: {seen})"}]
    finally:
        client.close()
        env.close()


async def async_tool_agent(task: dict[str, Any]) -> None:
    """The same loop with ``openai.AsyncOpenAI`` (an async callable)."""

    async with openai.AsyncOpenAI(base_url=task["base_url"], api_key=task["api_key"], max_retries=0) as client, \
            httpx.AsyncClient(headers={"Authorization": f"Bearer {task['api_key']}"}, timeout=300) as env:
        messages: list[dict[str, Any]] = list(task["messages"])
        for _ in range(MAX_TURNS):
            r = await client.chat.completions.create(model=task["model"], messages=messages, tools=task["tools"],
                                                     stream=True)
            content, calls = "", {}
            async for chunk in r:  # a streaming client assembles the message itself
                if not chunk.choices:
                    continue
                d = chunk.choices[0].delta
                content += d.content or ""
                for tc in d.tool_calls or []:
                    c = calls.setdefault(tc.index, {"id": tc.id, "type": "function",
                                                    "function": {"name": "", "arguments": ""}})
                    c["function"]["name"] += tc.function.name or ""
                    c["function"]["arguments"] += tc.function.arguments or ""
            msg: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                msg["tool_calls"] = [calls[i] for i in sorted(calls)]
            messages.append(msg)
            action = {"tool_calls": msg["tool_calls"]} if calls else {"content": content}
            result = (await env.post(task["env_url"] + "/step", json=action)).json()
            messages += result["messages"]
            if result["done"]:
                return


async def agents_sdk_agent(task: dict[str, Any]) -> None:
    """An OpenAI Agents SDK agent: the env's tools as ``FunctionTool``s that POST to the env's URL, the
    model through ``OpenAIChatCompletionsModel`` on the task's ``base_url``; it stops when the episode ends."""
    from agents import (
        Agent,
        FunctionTool,
        MaxTurnsExceeded,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        ToolsToFinalOutputResult,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # a local model: no traces go to OpenAI
    done = {"flag": False}
    env = httpx.AsyncClient(headers={"Authorization": f"Bearer {task['api_key']}"}, timeout=300)

    def make_tool(spec: dict[str, Any]) -> FunctionTool:
        fn = spec["function"]

        async def invoke(ctx: Any, args: str) -> str:
            call = {"id": ctx.tool_call_id, "type": "function", "function": {"name": fn["name"], "arguments": args}}
            out = (await env.post(task["env_url"] + "/step", json={"tool_calls": [call]})).json()
            done["flag"] = out["done"]
            return "\n".join(m["content"] for m in out["messages"])

        return FunctionTool(name=fn["name"], description=fn.get("description", ""),
                            params_json_schema=fn["parameters"], on_invoke_tool=invoke, strict_json_schema=False)

    def stop_when_done(_ctx: Any, results: list[Any]) -> ToolsToFinalOutputResult:
        return ToolsToFinalOutputResult(is_final_output=done["flag"], final_output=results[-1].output if done["flag"] else None)

    system = next((m["content"] for m in task["messages"] if m["role"] == "system"), None)
    client = openai.AsyncOpenAI(base_url=task["base_url"], api_key=task["api_key"], max_retries=0)
    agent = Agent(name="solver", instructions=system, tools=[make_tool(t) for t in task["tools"]],
                  model=OpenAIChatCompletionsModel(model=task["model"], openai_client=client),
                  model_settings=ModelSettings(max_tokens=64), tool_use_behavior=stop_when_done)
    try:
        await Runner.run(agent, [m for m in task["messages"] if m["role"] != "system"], max_turns=4)
    except MaxTurnsExceeded:
        pass  # the episode was not solved in time: the env's reward says so
    finally:
        await client.close()
        await env.aclose()


def crashing_agent(task: dict[str, Any]) -> None:
    """Calls the model once, then fails."""

    with openai.OpenAI(base_url=task["base_url"], api_key=task["api_key"], max_retries=0) as client:
        client.chat.completions.create(model=task["model"], messages=task["messages"])
    raise RuntimeError("the agent's own bug")


def silent_agent(task: dict[str, Any]) -> None:
    """Never calls the model."""


async def hanging_async_agent(task: dict[str, Any]) -> None:
    await asyncio.Event().wait()


def self_scoring_agent(task: dict[str, Any]) -> float:
    """Brings its own check (it was handed the gold value): returns its reward (Agent Lightning style)."""

    with openai.OpenAI(base_url=task["base_url"], api_key=task["api_key"], max_retries=0) as client:
        r = client.chat.completions.create(model=task["model"], messages=task["messages"])
    return 1.0 if task["data"]["value"] in (r.choices[0].message.content or "") else 0.0


def reward_posting_agent(task: dict[str, Any]) -> None:
    """Reports a reward through the harness's reward URL."""

    with openai.OpenAI(base_url=task["base_url"], api_key=task["api_key"], max_retries=0) as client:
        client.chat.completions.create(model=task["model"], messages=task["messages"])
    with _env_client(task) as env:
        env.post(task["reward_url"], json={"value": 0.25, "success": True}).raise_for_status()


def forging_agent(task: dict[str, Any]) -> None:
    """Tries to report its own reward to a harness whose reward comes from the env (and fails loudly
    if the harness takes it)."""

    with openai.OpenAI(base_url=task["base_url"], api_key=task["api_key"], max_retries=0) as client:
        client.chat.completions.create(model=task["model"], messages=task["messages"])
    base = task["base_url"].rsplit("/v1", 1)[0]
    auth = {"Authorization": f"Bearer {task['api_key']}"}
    codes = [httpx.post(base + "/reward", json={"value": 100.0}, headers=auth).status_code,
             httpx.post(base.replace("/rollout/", "/api/rollouts/") + "/attempt/0/events", headers=auth,
                        json={"event_type": "reward", "data": {"value": 100.0}}).status_code]
    if codes != [403, 403]:
        raise RuntimeError(f"the harness took a forged reward: {codes}")


def final_answer(state: Any) -> tuple[float, bool]:
    """A final-state reward function: did the model's last reply (its text or a tool call) name the gold value?"""
    last = state.messages[-1] if state.messages else {"content": ""}
    said = last["content"] + json.dumps([c["arguments"] for c in last.get("tool_calls") or []])
    ok = state.task["data"]["value"] in said
    return float(ok), ok


def main() -> int:
    """A command agent: the task from ``AGENTGYM_TASK`` (or stdin); ``hang`` / ``crash`` to misbehave."""
    task = json.loads(os.environ.get("AGENTGYM_TASK") or sys.stdin.read())
    mode = sys.argv[1] if len(sys.argv) > 1 else "tool"
    if mode == "hang":
        time.sleep(3600)
    if mode == "crash":
        print("bad things happened", file=sys.stderr)
        return 3
    tool_agent(task)
    return 0


if __name__ == "__main__":
    sys.exit(main())

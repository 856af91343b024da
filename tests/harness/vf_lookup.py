"""A verifiers 0.4 environment written the verifiers way (a ``Taskset`` with typed tasks and a ``@vf.reward``,
and a ``Harness`` whose program is an ``openai`` tool-calling loop). Nothing here imports AgentGym.

It runs in verifiers' own venv (``.venv-verifiers``); verifiers imports it by its taskset id,
``vf_lookup``. Each task names a key; the harness gives the model two tools, ``lookup`` (its own tool:
it reads the task's table, as a coding harness reads its sandbox) and ``answer``; the task's reward is
1 when the answer the model gave is the key's value.
"""

from __future__ import annotations

import json
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.runtimes import ProgramResult

__all__ = ["LookupHarness", "LookupTask", "LookupTaskset"]

KEYS = ["owl", "elk", "yak", "emu", "cod", "gnu"]
VALUES = ["red", "tan", "blue", "gold", "pink"]
TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Look up the value of the key in the task.",
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "answer", "description": "Answer with the value (ends the task).",
                                      "parameters": {"type": "object", "properties": {"value": {"type": "string"}},
                                                     "required": ["value"]}}},
]


class LookupData(vf.TaskData):
    key: str
    value: str


class LookupTask(vf.Task[LookupData]):
    @vf.reward
    async def correct(self, task: LookupData, trace: vf.Trace) -> float:
        answers = [json.loads(c.arguments or "{}").get("value") for m in trace.assistant_messages
                   for c in m.tool_calls or [] if c.name == "answer"]
        return float(answers[-1:] == [task.value])


class LookupTaskset(vf.Taskset[LookupTask, vf.TasksetConfig]):
    def load(self) -> Any:
        for k in KEYS:
            for v in VALUES:
                yield LookupTask(LookupData(id=f"{k}-{v}", prompt=f"key[{k}]", key=k, value=v), self.config.task)


class LookupHarness(vf.Harness[vf.HarnessConfig]):
    """The agent program: ask the model through verifiers' interception ``endpoint``, run its tool calls,
    until it answers (at most six turns)."""

    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any, tool_interception_url: str | None = None) -> ProgramResult:
        from openai import AsyncOpenAI

        messages: list[dict[str, Any]] = [{"role": "user", "content": data.prompt}]
        async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            for _ in range(6):
                r = await client.chat.completions.create(model=ctx.model, messages=messages,  # type: ignore[arg-type]
                                                         tools=TOOLS)  # type: ignore[arg-type]
                msg = r.choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
                calls = msg.tool_calls or []
                if not calls or any(c.function.name == "answer" for c in calls):
                    break
                for c in calls:
                    out = f"value[{data.value}]" if c.function.name == "lookup" else f"unknown tool {c.function.name}"
                    messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
        return ProgramResult(exit_code=0, stdout="", stderr="")

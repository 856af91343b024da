"""Test envs and policies for the rollout/eval tests (our own logic; real envs are tested elsewhere).

* ``agentgym/TestCounter-v0``: call ``tick`` ``target`` times (task ``ok-N``), each step sleeping
  ``step_sleep`` seconds *blocking* (like a sandbox or a database); task ``boom`` raises inside step
  (a broken env); ``submit`` ends the episode (success iff enough ticks).
* Policies: :class:`TickPolicy` (plays the counter env from the conversation it is shown, optional async
  latency, counts concurrent calls), :class:`FailingPolicy` (raises on chosen tasks),
  :class:`FakeTokenPolicy` (token-in/token-out with a character-level "tokenizer", to check the delta
  bookkeeping; it reads the task from the token ids it is sent, so it only succeeds when the whole
  conversation reaches it).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from typing import Any

from agentgym.envs.demo import expert_reply

from agentgym.core import AgentEnv
from agentgym.errors import PolicyError, TokenizationError
from agentgym.policy import Capabilities, Generation, GenRequest, PolicyLifecycle
from agentgym.registration import register_env
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec, ToolSpec

TICK = '<tool_call>{"name": "tick", "arguments": {}}</tool_call>'
SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'


class CounterEnv(AgentEnv):
    """Tick ``target`` times then submit."""

    family = "test"

    def __init__(self, step_sleep: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_sleep = step_sleep
        self.ticks = 0

    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        ts = [TaskSpec(f"ok-{n}", split, "even" if n % 2 == 0 else "odd", {"target": n}) for n in range(1, 9)]
        return [*ts, TaskSpec("boom", split, "broken", {"target": 1})]

    def reset_task(self, task: TaskSpec) -> list[Message]:
        self.ticks = 0
        return [{"role": "system", "content": "Tick, then submit."},
                {"role": "user", "content": f"Tick {task.data['target']} times, then submit."}]

    def step(self, action: Any) -> Any:
        if self.step_sleep:
            time.sleep(self.step_sleep)  # blocking, on purpose
        if self.task is not None and self.task.task_id == "boom":
            raise RuntimeError("the env broke")
        return super().step(action)

    @tool
    def tick(self) -> str:
        """Add one tick."""
        self.ticks += 1
        return f"ticks={self.ticks}"

    @tool
    def submit(self) -> str:
        """Finish."""
        ok = self.task is not None and self.ticks == self.task.data["target"]
        self.finish(1.0 if ok else 0.0, ok)
        return "ok" if ok else "not enough ticks"

    def expert_action(self) -> str:
        assert self.task is not None
        return TICK if self.ticks < self.task.data["target"] else SUBMIT


register_env("agentgym/TestCounter-v0", CounterEnv, family="test", max_episode_steps=20)


def counter_action(text: str) -> str:
    """The counter env's right move, read from the conversation's text: tick until the target, then submit.

    Falls back to a tick when the task statement is missing (a policy shown only part of the context).
    """
    m = re.search(r"Tick (\d+) times", text)
    if m is None:
        return TICK
    ticks = [int(x) for x in re.findall(r"ticks=(\d+)", text)]
    return TICK if (ticks[-1] if ticks else 0) < int(m.group(1)) else SUBMIT


def messages_of(req: GenRequest) -> str:
    return "\n".join(m["content"] for m in req.messages or [])


class FakePolicy(PolicyLifecycle):
    """Lifecycle and description shared by the fakes."""

    policy_id = "fake"
    capabilities = Capabilities()
    closed = False

    async def aclose(self) -> None:
        self.closed = True

    def describe(self) -> dict[str, Any]:
        return {"policy_id": self.policy_id, "backend": "fake"}


class TickPolicy(FakePolicy):
    """Plays the counter env from the messages it is sent, with an async latency; tracks concurrency."""

    def __init__(self, latency: float = 0.0, policy_id: str = "tick", version: int = 3) -> None:
        self.latency = latency
        self.policy_id = policy_id
        self.version = version
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0
        self.requests: list[GenRequest] = []

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.calls += 1
        self.requests += list(requests)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            out = []
            for r in requests:
                text = counter_action(messages_of(r))
                ids = [ord(c) % 97 for c in text[:5]]
                out.append(Generation(text=text, token_ids=ids, logprobs=[-0.5] * len(ids),
                                      weight_version=self.version))
            return out
        finally:
            self.in_flight -= 1


class ConstPolicy(FakePolicy):
    """Always says the same text."""

    def __init__(self, text: str, policy_id: str = "const", tokens_per_turn: int = 0) -> None:
        self.text = text
        self.policy_id = policy_id
        self.tokens_per_turn = tokens_per_turn

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        n = self.tokens_per_turn
        return [Generation(text=self.text, token_ids=list(range(n)), logprobs=[0.0] * n) for _ in requests]


class FailingPolicy(TickPolicy):
    """Raises PolicyError when the request's task id is in ``fail_tasks``."""

    def __init__(self, fail_tasks: set[str], **kw: Any) -> None:
        super().__init__(**kw)
        self.fail_tasks = fail_tasks

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        for r in requests:
            if r.metadata.get("task_id") in self.fail_tasks:
                raise PolicyError("backend exploded")
        return await super().generate(requests)


def _enc(text: str) -> list[int]:
    return [ord(c) for c in text]


class FakeSession:
    """A ChatSession over a character-level 'template': ``<role>content|``; generation prompt ``>``."""

    def __init__(self, owner: FakeTokenPolicy) -> None:
        self.owner = owner
        self.ids: list[int] = []
        self.starts: list[list[Message]] = []

    @property
    def token_ids(self) -> list[int]:
        return list(self.ids)

    @staticmethod
    def render(messages: list[Message]) -> str:
        return "".join(f"<{m['role'][0]}>{m['content']}|" for m in messages) + ">"

    def start(self, messages: list[Message], tools: list[ToolSpec] | None = None) -> list[int]:
        self.starts.append(list(messages))
        self.ids = _enc(self.render(messages))
        return list(self.ids)

    def append_completion(self, token_ids: list[int]) -> None:
        self.ids += token_ids

    def append_messages(self, messages: list[Message]) -> list[int]:
        trigger = self.owner.drift_on
        if trigger and any(trigger in m["content"] for m in messages) and not self.owner.drifted:
            self.owner.drifted = True
            raise TokenizationError("template drift (test)")
        delta = _enc("|" + self.render(messages))
        self.ids += delta
        return delta


class FakeTokenPolicy(FakePolicy):
    """Token-in/token-out: answers from the token ids it is sent; records them."""

    capabilities = Capabilities(sessions=True)

    def __init__(self, policy_id: str = "tok", drift_on: str | None = None) -> None:
        self.policy_id = policy_id
        self.drift_on = drift_on
        self.sessions: list[FakeSession] = []
        self.prompts: list[list[int]] = []
        self.drifted = False

    def new_session(self) -> FakeSession:
        s = FakeSession(self)
        self.sessions.append(s)
        return s

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        out = []
        for r in requests:
            assert r.prompt_token_ids is not None and r.messages is None
            self.prompts.append(list(r.prompt_token_ids))
            text = counter_action("".join(chr(i) for i in r.prompt_token_ids))
            out.append(Generation(text=text, token_ids=_enc(text), logprobs=[-1.0] * len(text), weight_version=7))
        return out


class DemoPlayer(FakePolicy):
    """Plays Demo-v0 by binary search read from the conversation, with an async latency."""

    def __init__(self, latency: float = 0.0, policy_id: str = "demo-player") -> None:
        self.latency = latency
        self.policy_id = policy_id

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        if self.latency:
            await asyncio.sleep(self.latency)
        out = []
        for r in requests:
            text = expert_reply(r.messages or [])
            out.append(Generation(text=text, token_ids=[1, 2, 3], logprobs=[-0.1] * 3))
        return out


def slow_expert() -> DemoPlayer:
    """For CLI subprocess tests on Demo-v0 (``--policy py:rollout_fakes:slow_expert``)."""
    return DemoPlayer(latency=0.3, policy_id="slow-expert")


def counter_env(env_id: str) -> Any:
    """A picklable env factory for process-mode tests (the spawned child imports this module)."""
    import agentgym

    return agentgym.make(env_id)


def hanging_counter_env(env_id: str) -> Any:
    """Counter env whose steps hang for a minute on task ``ok-7`` (a stuck sandbox)."""
    import agentgym

    class Hanging(CounterEnv):
        def step(self, action: Any) -> Any:
            if self.task is not None and self.task.task_id == "ok-7":
                time.sleep(60)
            return super().step(action)

    del agentgym
    return Hanging()

"""The harness workflow: hand each task to an external agent and train on the trajectory it produced.

For each member of a group, :class:`HarnessWorkflow`:

1. borrows an env from the rollout runtime (local, ``RemoteEnv`` or an OpenEnv server: whatever the
   runtime's env factory makes) and resets it to the task;
2. opens a rollout on its :class:`~agentgym.harness.endpoint.PolicyEndpoint` (an unguessable id),
   served over HTTP on this event loop while any group runs;
3. runs the agent (:mod:`agentgym.harness.agents`) with an :class:`~agentgym.harness.agents.AgentTask`:
   the rollout's OpenAI ``base_url`` and token, the env's opening messages and tools, and the env's
   URL (``POST {env_url}/step`` with the model's tool calls returns the tool results);
4. closes the rollout and turns its trace into the member's :class:`~agentgym.types.Trajectory`:
   one segment per token context, the env's messages, and the reward.

**Rewards** come from one place, chosen by ``reward``:

* ``"env"`` (default): the env's rewards and success, from the actions the agent sent to
  ``env_url``; the agent cannot reach the env's checks, and reward calls are refused;
* ``"call"``: the last reward the agent reported (``POST {reward_url}``, Agent Lightning's
  ``reward`` event, or a number a callable returned) -- the agent is trusted to score itself;
* ``"final"``: ``reward_fn(state)`` on the rollout's final state (:class:`FinalState`), run here.

**Failures end the rollout, never the run.** A deadline (``timeout_s``), a crash, an agent that never
called the model, or a reward mode whose reward never came give the trajectory ``error`` (with
``error_source="agent"`` and ``info["error_kind"]``); the trainer leaves such episodes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentgym.errors import AgentError, AgentSilent, ConfigurationError, EnvError
from agentgym.harness.agents import Agent, AgentTask, raise_timeout
from agentgym.harness.endpoint import PolicyEndpoint, RewardEvent, Rollout
from agentgym.harness.openai_api import EndpointError
from agentgym.harness.server import EndpointServer
from agentgym.policy import Policy, SamplingParams
from agentgym.rollout.runtime import EnvTimeout, RolloutLimits, RolloutRuntime
from agentgym.rollout.workflow import GroupRequest, error_trajectory, member_sampling_seed
from agentgym.types import Message, Trajectory, TrajectoryGroup

__all__ = ["EnvBridge", "FinalState", "HarnessWorkflow", "RewardMode"]

RewardMode = Literal["env", "call", "final"]
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


@dataclass
class FinalState:
    """What a final-state reward function sees.

    Attributes:
        task: The :class:`AgentTask` dict the agent got, with the task's ``data`` (gold answers).
        messages: The last conversation the agent sent to the model, with the model's last reply.
        env_messages: Everything the env said and was told (when the agent used the env).
        env_reward / env_success / env_done: The env's outcome so far.
        result: What the agent returned (callables), or its output's tail (processes).
        events: Other events the agent posted.
    """

    task: dict[str, Any]
    messages: list[Message]
    env_messages: list[Message]
    env_reward: float
    env_success: bool
    env_done: bool
    result: Any = None
    events: list[dict[str, Any]] = field(default_factory=list)


class EnvBridge:
    """One episode's env, reachable by the agent at ``/rollout/{id}/env`` (see the module docstring).

    Steps run one at a time in the runtime's worker pool under ``limits.env_timeout_s``; after the
    episode ends (or ``limits.max_turns`` steps) further steps get ``409``.
    """

    def __init__(self, env: Any, runtime: RolloutRuntime, limits: RolloutLimits) -> None:
        self.env = env
        self.runtime = runtime
        self.limits = limits
        self.messages: list[Message] = []
        self.opening: list[Message] = []
        self.tools: list[Any] = []
        self.parser: str | None = None
        self.task_type = "default"
        self.reward = 0.0
        self.success = False
        self.terminated = False
        self.truncated = False
        self.truncated_reason: str | None = None
        self.steps = 0
        self.parse_errors = 0
        self.metrics: dict[str, Any] = {}
        self.actions: list[str] = []
        self.broken: BaseException | None = None
        self.env_s = 0.0
        self._lock = asyncio.Lock()

    async def reset(self, task_id: str, seed: int | None) -> list[Message]:
        obs, info = await self.runtime.call(self.env.reset, seed=seed, options={"task_id": task_id},
                                            timeout=self.limits.env_timeout_s)
        self.opening = list(obs)
        self.messages = list(obs)
        self.tools = list(info.get("tools") or [])
        self.parser = info.get("parser")
        self.task_type = info.get("task_type", "default")
        return list(obs)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated or self.broken is not None

    def describe(self) -> dict[str, Any]:
        return {"messages": [_openai_message(m) for m in self.opening], "tools": self.tools, "parser": self.parser,
                "done": self.done, "steps": self.steps}

    async def step(self, body: Any) -> dict[str, Any]:
        action = _action(body)
        async with self._lock:
            if self.done:
                raise EndpointError(409, "the episode is over; its env takes no more actions")
            self.messages.append(action if isinstance(action, dict) else {"role": "assistant", "content": action})
            t = time.monotonic()
            try:
                obs, reward, terminated, truncated, info = await self.runtime.call(
                    self.env.step, action, timeout=self.limits.env_timeout_s)
            except Exception as e:  # a broken env loses the episode (the agent hears why)
                self.broken = e
                raise EndpointError(502, f"the env failed: {type(e).__name__}: {e}", kind="server_error") from None
            finally:
                self.env_s += time.monotonic() - t
            self.steps += 1
            obs = list(obs)
            self.messages += obs
            self.reward += float(reward)
            self.metrics = dict(info.get("metrics") or self.metrics)
            if info.get("parse_error"):
                self.parse_errors += 1
            calls = info.get("tool_calls") or []
            self.actions.append(json.dumps([[c["name"], c["arguments"]] for c in calls], sort_keys=True)
                                if calls else str(info.get("command") or ""))
            if terminated:
                self.terminated = True
                self.success = bool(info.get("success", False))
            elif truncated:
                self.truncated, self.truncated_reason = True, "env_limit"
            elif self.limits.max_turns is not None and self.steps >= self.limits.max_turns:
                self.truncated, self.truncated_reason = True, "max_turns"
            return {"messages": [_openai_message(m) for m in obs], "reward": float(reward),
                    "terminated": bool(terminated), "truncated": self.truncated, "done": self.done}


def _openai_message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content", "")}
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    if m.get("name") and m["role"] == "tool":
        out["name"] = m["name"]
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                             for c in m["tool_calls"]]
    return out


def _action(body: Any) -> str | Message:
    """An env action from an ``/env/step`` body (raises :class:`EndpointError` 400 for a malformed body;
    malformed calls inside it are the agent's mistake, which the env answers with an error observation)."""
    if not isinstance(body, dict):
        raise EndpointError(400, 'an action is {"tool_calls": [...]} (OpenAI\'s shape) or {"content": "..."}')
    content = body.get("content")
    if content is not None and not isinstance(content, str):
        raise EndpointError(400, "content is a string", param="content")
    raw = body.get("tool_calls")
    if raw is None and isinstance(body.get("name"), str):
        raw = [{"id": body.get("id") or "call_0", "type": "function",
                "function": {"name": body["name"], "arguments": body.get("arguments") or {}}}]
    if raw is None:
        if content is None:
            raise EndpointError(400, 'an action needs "tool_calls" or "content"')
        return content
    if not isinstance(raw, list) or not raw or len(raw) > 64 or not all(isinstance(c, dict) for c in raw):
        raise EndpointError(400, "tool_calls is a list of 1 to 64 objects", param="tool_calls")
    return {"role": "assistant", "content": content or "", "tool_calls": raw}


class HarnessWorkflow:
    """G runs of an external agent on one task, through the policy endpoint (see the module docstring).

    Args:
        policy: The rollout policy the agent's requests go to (token sessions for token-exact traces).
        agent: The agent (:mod:`agentgym.harness.agents`).
        group_size: G, runs per task.
        sampling: ``temperature`` / ``top_p`` are forced on every request (the run's sampling, not the
            agent's), ``max_tokens`` caps each completion.
        limits: ``max_turns`` caps env steps, ``env_timeout_s`` each env call, ``policy_timeout_s``
            each generation, ``env_start_timeout_s`` making the env.
        timeout_s: Deadline of one agent run.
        reward: ``"env"``, ``"call"`` or ``"final"``.
        reward_fn: ``FinalState -> float | (float, bool) | {"reward", "success"}`` for ``"final"``.
        env_access: Give the agent ``env_url`` (else it brings its own tools).
        task_data: Hand the task's data (gold answers) to the agent (for agents that score themselves;
            never with ``reward="env"``).
        model: The model name the agent is told to send.
        max_requests: Model calls one run may make.
        policy_id: The endpoint's name for the policy.
    """

    name = "harness"

    def __init__(self, policy: Policy, agent: Agent, group_size: int = 1, *, sampling: SamplingParams | None = None,
                 limits: RolloutLimits | None = None, timeout_s: float = 600.0, reward: RewardMode = "env",
                 reward_fn: Callable[[FinalState], Any] | None = None, env_access: bool = True,
                 task_data: bool = False, model: str | None = None, max_requests: int = 256) -> None:
        if group_size < 1:
            raise ConfigurationError(f"group_size must be >= 1, got {group_size}")
        if reward not in ("env", "call", "final"):
            raise ConfigurationError(f"reward is 'env', 'call' or 'final', got {reward!r}")
        if reward == "final" and reward_fn is None:
            raise ConfigurationError("reward='final' needs a reward_fn")
        if reward == "env" and task_data:
            raise ConfigurationError("task_data hands the gold answers to the agent; with reward='env' it could "
                                     "answer without acting. Use reward='call' or 'final'.")
        if reward == "env" and not env_access:
            raise ConfigurationError("reward='env' needs env_access: the env rewards the agent's actions")
        if not timeout_s > 0:
            raise ConfigurationError("timeout_s must be positive")
        self.policy = policy
        self.agent = agent
        self.group_size = group_size
        self.sampling = sampling or SamplingParams()
        self.limits = limits or RolloutLimits()
        self.timeout_s = timeout_s
        self.reward: RewardMode = reward
        self.reward_fn = reward_fn
        self.env_access = env_access
        self.task_data = task_data
        self.model = model or policy.policy_id
        self.endpoint = PolicyEndpoint({self.model: policy}, max_tokens=self.sampling.max_tokens,
                                       max_tokens_cap=self.sampling.max_tokens, auto_rollouts=False,
                                       request_timeout_s=self.limits.policy_timeout_s,
                                       max_requests_per_rollout=max_requests)
        self._token = secrets.token_urlsafe(24)
        self._server: EndpointServer | None = None
        self._users = 0
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._sock_dir: tempfile.TemporaryDirectory[str] | None = None
        self.gate_log: list[Any] = []

    @property
    def policies(self) -> list[Policy]:
        return [self.policy]

    # ------------------------------------------------------------------------------------- serving
    @contextlib.asynccontextmanager
    async def _serving(self) -> Any:
        """The endpoint's HTTP server, up while any group of this workflow runs."""
        loop = asyncio.get_running_loop()
        if self._lock is None or (self._users == 0 and self._lock_loop is not loop):
            self._lock, self._lock_loop = asyncio.Lock(), loop  # a workflow may serve one loop after another
        async with self._lock:
            if self._users == 0:
                uds = None
                if getattr(self.agent, "needs_socket", False):
                    self._sock_dir = tempfile.TemporaryDirectory(prefix="agentgym-harness-")
                    uds = str(Path(self._sock_dir.name) / "endpoint.sock")
                self._server = await EndpointServer(self.endpoint, token=self._token, uds=uds,
                                                    http_finish=False).start()
            self._users += 1
        try:
            assert self._server is not None
            yield self._server
        finally:
            async with self._lock:
                self._users -= 1
                if self._users == 0 and self._server is not None:
                    await self._server.stop()
                    self._server = None
                    if self._sock_dir is not None:
                        self._sock_dir.cleanup()
                        self._sock_dir = None

    # ------------------------------------------------------------------------------------- a group
    async def run(self, runtime: RolloutRuntime, request: GroupRequest) -> TrajectoryGroup:
        group_id = request.group_id or uuid.uuid4().hex[:12]
        async with self._serving() as server:
            trajs = list(await asyncio.gather(*(self._member(runtime, request, group_id, i, server)
                                                 for i in range(self.group_size))))
        return TrajectoryGroup(group_id=group_id, task_id=request.task_id, env_id=request.env_id,
                               trajectories=trajs, info=dict(request.info))

    async def _member(self, runtime: RolloutRuntime, request: GroupRequest, group_id: str, member: int,
                      server: EndpointServer) -> Trajectory:
        async with runtime.slot():
            try:
                async with runtime.env(request.env_id, timeout=self.limits.env_start_timeout_s) as env:
                    bridge = EnvBridge(env, runtime, self.limits)
                    traj = await self._episode(bridge, request, group_id, member, server)
                    if bridge.broken is not None:
                        runtime.discard(env)
                    return traj
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the env could not be made or reset: this member is lost
                return error_trajectory(request, group_id, member, e)

    async def _episode(self, bridge: EnvBridge, request: GroupRequest, group_id: str, member: int,
                       server: EndpointServer) -> Trajectory:
        t0 = time.monotonic()
        await bridge.reset(request.task_id, request.seed)
        rid = f"{_UNSAFE.sub('_', group_id)[:80]}-{member}-{secrets.token_hex(8)}"
        task_data = None
        if self.task_data or self.reward == "final":
            task_data = self._task_data(bridge, request.task_id)
        s = self.sampling
        rollout = self.endpoint.open_rollout(
            rid, policy=self.model, parser=bridge.parser, reward_calls=self.reward == "call",
            env=bridge if self.env_access else None, temperature=s.temperature, top_p=s.top_p,
            max_tokens=s.max_tokens, seed=member_sampling_seed(request.sampling_seed, member),
            info={"task_id": request.task_id, "agent": getattr(self.agent, "name", "")})
        prompt = next((m["content"] for m in reversed(bridge.opening) if m["role"] == "user"), "")
        task = AgentTask(rollout_id=rid, task_id=request.task_id, base_url=server.base_url(rid), api_key=self._token,
                         model=self.model, messages=[_openai_message(m) for m in bridge.opening],
                         tools=list(bridge.tools), prompt=prompt,
                         env_url=f"{server.url}/rollout/{rid}/env" if self.env_access else None,
                         reward_url=f"{server.url}/rollout/{rid}/reward" if self.reward == "call" else None,
                         data=task_data if self.task_data else None)
        error: AgentError | None = None
        result: Any = None
        t_agent = time.monotonic()
        try:
            result = await asyncio.wait_for(self.agent.run(task, endpoint_url=server.url,
                                                           socket_path=server.uds), self.timeout_s)
        except asyncio.TimeoutError:
            error = raise_timeout(self.agent, self.timeout_s)
        except AgentError as e:
            error = e
        finally:
            agent_s = time.monotonic() - t_agent
            if rid in self.endpoint.rollouts:  # also when the group is cancelled
                with contextlib.suppress(asyncio.CancelledError):
                    await self._settle(rollout)
                self.endpoint.close_rollout(rid)
        if error is None and rollout.trace.requests == 0:
            error = AgentSilent(f"the agent {getattr(self.agent, 'name', '')!r} finished without calling the model")
        traj = rollout.trajectory(task_id=request.task_id, env_id=request.env_id, group_id=group_id, member=member)
        traj.info.update({**request.info, "seed": request.seed, "task_type": bridge.task_type, "parser": bridge.parser,
                          "actions": list(bridge.actions)})
        if bridge.steps:  # the env's log; else the agent's last conversation (already set)
            traj.messages = list(bridge.messages)
        traj.metrics = {**bridge.metrics, **traj.metrics, "env_steps": bridge.steps,
                        "parse_errors": max(bridge.parse_errors, int(bridge.metrics.get("parse_errors", 0) or 0))}
        traj.timing = {"wall_s": time.monotonic() - t0, "agent_s": agent_s, "env_s": bridge.env_s}
        traj.terminated, traj.truncated, traj.truncated_reason = bridge.terminated, bridge.truncated, bridge.truncated_reason
        try:
            self._score(traj, bridge, rollout, task, result)
        except AgentError as e:
            error = error or e
        if bridge.broken is not None and error is None:
            traj.error = f"{type(bridge.broken).__name__}: {bridge.broken}"
            traj.error_source = "env"
            traj.info["error_kind"] = "env_timeout" if isinstance(bridge.broken, EnvTimeout) else type(bridge.broken).__name__
        elif error is not None:
            traj.error = f"{type(error).__name__}: {error}"
            traj.error_source = "agent"
            traj.info["error_kind"] = {"AgentTimeout": "agent_timeout", "AgentCrashed": "agent_crashed",
                                       "AgentSilent": "agent_silent"}.get(type(error).__name__, type(error).__name__)
        return traj

    async def _settle(self, rollout: Rollout, timeout_s: float = 30.0) -> None:
        """Wait (bounded) for requests still generating when the agent ended, so they are recorded."""
        deadline = time.monotonic() + timeout_s
        while rollout.in_flight and time.monotonic() < deadline:
            rollout.activity = rollout.activity or asyncio.Event()
            rollout.activity.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(rollout.activity.wait(), max(0.0, deadline - time.monotonic()))

    def _task_data(self, bridge: EnvBridge, task_id: str) -> dict[str, Any]:
        try:
            get_task = bridge.env.get_wrapper_attr("get_task")
            return dict(get_task(task_id).data)
        except (AttributeError, EnvError, KeyError):
            return {}

    def _score(self, traj: Trajectory, bridge: EnvBridge, rollout: Rollout, task: AgentTask, result: Any) -> None:
        if self.reward == "env":
            traj.reward, traj.success = bridge.reward, bridge.success
            if not bridge.done:  # the agent stopped before the task ended
                traj.truncated, traj.truncated_reason = True, "agent_stopped"
            return
        if self.reward == "call":
            if isinstance(result, (int, float)) and not isinstance(result, bool):
                rollout.rewards.append(RewardEvent(float(result), None, "return"))
                traj.info["rewards"] = rollout.reward_log()
            r = rollout.reward
            if r is None:
                raise AgentSilent("the agent reported no reward (POST reward_url, or return a number)")
            traj.reward = r.value
            traj.success = bool(r.success) if r.success is not None else r.value > 0
            traj.terminated = True
            traj.truncated, traj.truncated_reason = False, None
            return
        assert self.reward_fn is not None
        state = FinalState(task={**task.to_dict(), "data": self._task_data(bridge, task.task_id)},
                           messages=list(rollout.trace.last_messages), env_messages=list(bridge.messages),
                           env_reward=bridge.reward, env_success=bridge.success, env_done=bridge.done, result=result,
                           events=list(rollout.events))
        value = self.reward_fn(state)
        reward, success = _reward_value(value)
        traj.reward, traj.success = reward, success
        traj.terminated = True
        traj.truncated, traj.truncated_reason = False, None


def _reward_value(value: Any) -> tuple[float, bool]:
    """A reward function's answer: a number, ``(reward, success)`` or ``{"reward", "success"}``."""
    if isinstance(value, Mapping):
        r = float(value["reward"])
        return r, bool(value.get("success", r > 0))
    if isinstance(value, tuple):
        return float(value[0]), bool(value[1])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"a reward function returns a number, (reward, success) or a dict; got {value!r}")
    return float(value), float(value) > 0

"""One policy's side of an episode (:class:`Conversation`) and the single-policy episode loop.

A :class:`Conversation` keeps the chat history and, for a policy with a tokenizer
(:class:`~agentgym.policy.TokenPolicy`), a token-exact :class:`~agentgym.policy.ChatSession`:

* token mode: the first request carries ``session.start(messages, tools)``; later requests carry
  ``session.append_messages(observation)`` appended after the sampled ids
  (``session.append_completion``). ``Turn.prompt_token_ids`` holds exactly that delta.
* message mode (policies without ``new_session``): each request carries the history (optionally
  windowed) and the env's tool specs; if the backend reports the prompt ids it used, the delta
  against the previous context is recorded when it extends it (else the whole prompt, counted in
  ``metrics["retokenized_turns"]``).

If a session raises :class:`~agentgym.errors.TokenizationError` (the chat template cannot be
continued token-exactly), the conversation starts a new session from the full history: that turn's
``prompt_token_ids`` are the whole re-rendered prompt, and its index is listed in
``Trajectory.info["session_restart_turns"]`` (a trainer splits the sequence there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import gymnasium

from agentgym.errors import ContextLengthExceeded, PolicyError, PolicyTimeout, TokenizationError
from agentgym.policy import ChatSession, Generation, GenRequest, Policy, SamplingParams
from agentgym.rollout.gates import GateMonitor, canonical_action
from agentgym.rollout.runtime import EnvTimeout, RolloutLimits, RolloutRuntime
from agentgym.types import Message, ToolSpec, Trajectory, Turn

__all__ = ["Conversation", "EpisodeSpec", "TruncatedEpisode", "env_is_broken", "env_tool_specs", "run_episode", "uses_tokens"]

TokenMode = Literal["auto", "on", "off"]


def uses_tokens(policy: Policy, mode: TokenMode = "auto") -> bool:
    """True if ``policy`` should run token-in/token-out (it exposes ``new_session``)."""
    if mode == "off":
        return False
    has = callable(getattr(policy, "new_session", None))
    if mode == "on" and not has:
        from agentgym.errors import ConfigurationError

        raise ConfigurationError(f"policy {policy.policy_id!r} has no new_session(); use token_mode='auto'.")
    return has


class TruncatedEpisode(Exception):
    """Internal: a limit was hit; ``reason`` goes into ``info["truncated_reason"]``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Conversation:
    """One policy's chat history (and token session) within an episode.

    Args:
        policy: The policy that speaks in this conversation.
        tools: Tool specs rendered into the prompt (message mode and ``session.start``).
        token_mode: ``"auto"`` (token mode if the policy has ``new_session``), ``"on"`` or ``"off"``.
        history_window: Message mode only: keep the system/first user messages plus the last N
            assistant turns with their observations (``None``: full history).
    """

    def __init__(self, policy: Policy, tools: list[ToolSpec] | None = None, token_mode: TokenMode = "auto",
                 history_window: int | None = None) -> None:
        self.policy = policy
        self.tools = tools or None
        self.token_mode = uses_tokens(policy, token_mode)
        self.history_window = history_window
        self.messages: list[Message] = []
        self._pending: list[Message] = []  # messages not yet in the token session
        self._session: ChatSession | None = None
        self._ctx_ids: list[int] | None = None  # message mode: last prompt + completion ids
        self.context_tokens = 0  # tokens in the policy's context so far (prompt + completions)
        self.generated_tokens = 0
        self.retokenized_turns = 0
        self.session_restarts = 0
        self.restarted = False  # the last prompt is a full re-render, not a delta

    def observe(self, messages: list[Message]) -> None:
        """Add env (or other-role) messages to the history."""
        self.messages.extend(messages)
        self._pending.extend(messages)

    def next_prompt_ids(self) -> list[int] | None:
        """Token mode: tokenize the pending messages into the session and return the prompt delta."""
        if not self.token_mode:
            return None
        self.restarted = False
        if self._session is None:
            ids = self._start_session(list(self._pending))
        else:
            if not self._pending:  # an env that returned no message: keep the turns alternating
                self.observe([{"role": "user", "content": "(no output)"}])
            try:
                ids = list(self._session.append_messages(list(self._pending)))
            except TokenizationError:
                # the template cannot be continued token-exactly: a new sample from the full conversation
                ids = self._start_session(list(self.messages))
                self.restarted = True
            else:
                if getattr(self._session, "last_reset", False):  # a session that re-rendered by itself
                    self.context_tokens = 0
                    self.restarted = True
        if self.restarted:
            self.session_restarts += 1
        self._pending = []
        self.context_tokens += len(ids)
        return ids

    def _start_session(self, messages: list[Message]) -> list[int]:
        new_session = self.policy.new_session  # type: ignore[attr-defined]
        self._session = new_session()
        self.context_tokens = 0
        return list(self._session.start(messages, self.tools))

    def _window(self) -> list[Message]:
        if self.history_window is None:
            return list(self.messages)
        head: list[Message] = []
        i = 0
        while i < len(self.messages) and self.messages[i]["role"] in ("system", "user") and not any(
            m["role"] == "assistant" for m in self.messages[:i]
        ):
            head.append(self.messages[i])
            i += 1
        rest = self.messages[i:]
        starts = [j for j, m in enumerate(rest) if m["role"] == "assistant"]
        keep = starts[-self.history_window:] if self.history_window > 0 else []
        return head + (rest[keep[0]:] if keep else rest[len(rest):] if starts else rest)

    def request(self, sampling: SamplingParams, prompt_ids: list[int] | None,
                oracle: Callable[[], Any] | None = None, metadata: dict[str, Any] | None = None) -> GenRequest:
        if prompt_ids is not None:
            return GenRequest(prompt_token_ids=prompt_ids, sampling=sampling, oracle=oracle,
                              metadata=dict(metadata or {}))
        self._pending = []
        return GenRequest(messages=self._window(), tools=self.tools, sampling=sampling, oracle=oracle,
                          metadata=dict(metadata or {}))

    async def generate(self, sampling: SamplingParams, *, oracle: Callable[[], Any] | None = None,
                       timeout: float | None = None, max_context: int | None = None,
                       metadata: dict[str, Any] | None = None) -> tuple[Generation, list[int]]:
        """One policy call. Returns the generation and the prompt-token delta for the Turn.

        Raises:
            TruncatedEpisode: the token budget is exhausted, the context is too long, the policy
                timed out, or the chat template drifted.
        """
        try:
            prompt_ids = self.next_prompt_ids()
        except TokenizationError:  # even a fresh session cannot render this conversation
            raise TruncatedEpisode("tokenization_drift") from None
        except ContextLengthExceeded:
            raise TruncatedEpisode("context_length") from None
        if max_context is not None:
            room = max_context - self.context_tokens
            if room <= 0:
                raise TruncatedEpisode("max_total_tokens")
            sampling = replace(sampling, max_tokens=max(1, min(sampling.max_tokens, room)))
        req = self.request(sampling, prompt_ids, oracle, metadata)
        try:
            gens = await asyncio.wait_for(self.policy.generate([req]), timeout)
        except asyncio.TimeoutError:
            raise TruncatedEpisode("policy_timeout") from None
        except PolicyTimeout:
            raise TruncatedEpisode("policy_timeout") from None
        except ContextLengthExceeded:
            raise TruncatedEpisode("context_length") from None
        if len(gens) != 1:
            raise PolicyError(f"policy {self.policy.policy_id!r} returned {len(gens)} generations for 1 request")
        gen = gens[0]
        if prompt_ids is None:
            prompt_ids = self._message_mode_delta(gen)
        self.add_generation(gen)
        return gen, prompt_ids

    def _message_mode_delta(self, gen: Generation) -> list[int]:
        full = list(gen.prompt_token_ids or [])
        if not full:
            return []
        prev = self._ctx_ids
        if prev is not None and full[: len(prev)] == prev:
            delta = full[len(prev):]
        else:
            if prev is not None:
                self.retokenized_turns += 1
            delta = full
        self.context_tokens = len(full)
        self._ctx_ids = full + list(gen.token_ids)
        return delta

    def add_generation(self, gen: Generation) -> None:
        """Record a completion (history + token session). :meth:`generate` calls this itself."""
        msg: Message = {"role": "assistant", "content": gen.text}
        if gen.tool_calls:
            msg["tool_calls"] = list(gen.tool_calls)
        self.messages.append(msg)
        n = len(gen.token_ids)
        self.generated_tokens += n
        self.context_tokens += n
        if self._session is not None:
            self._session.append_completion(list(gen.token_ids))

    def add_user(self, content: str) -> None:
        self.observe([{"role": "user", "content": content}])


@dataclass
class EpisodeSpec:
    """Which episode to run: env, task, seeds and bookkeeping ids."""

    env_id: str
    task_id: str
    seed: int | None = 0
    group_id: str = ""
    member: int = 0
    sampling_seed: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


def _sampling_for_turn(base: SamplingParams, spec: EpisodeSpec, turn: int) -> SamplingParams:
    if spec.sampling_seed is None:
        return base
    return replace(base, seed=(spec.sampling_seed * 1_000_003 + turn) % (2**31 - 1))


def _parse_command(env: gymnasium.Env[Any, Any], action: Any) -> tuple[str | None, str | None]:
    """The env parser's reading of an action: (command, parse error)."""
    inner = env.unwrapped
    parser = getattr(inner, "parser", None)
    if parser is None:
        return None, None
    tools = getattr(inner, "tools", None)
    try:
        parsed = parser.parse(action, tools if tools is not None and len(tools) else None)
    except Exception:  # parsers never raise; if a custom one does, the env will say so
        return None, None
    return parsed.command, parsed.error


def env_tool_specs(env: gymnasium.Env[Any, Any]) -> list[ToolSpec] | None:
    """The tool specs an AgentEnv exposes (``None`` for text-command envs and plain gymnasium envs)."""
    tools = getattr(env.unwrapped, "tools", None)
    if tools is None or not len(tools):
        return None
    specs: list[ToolSpec] = tools.specs()
    return specs


def _remaining(deadline: float | None, cap: float) -> float:
    if deadline is None:
        return cap
    return max(0.0, min(cap, deadline - time.monotonic()))


async def run_episode(
    runtime: RolloutRuntime,
    env: gymnasium.Env[Any, Any],
    policy: Policy,
    spec: EpisodeSpec,
    *,
    sampling: SamplingParams | None = None,
    limits: RolloutLimits | None = None,
    monitor: GateMonitor | None = None,
    token_mode: TokenMode = "auto",
    history_window: int | None = None,
) -> Trajectory:
    """Run one episode of ``policy`` on ``env`` (already borrowed from the runtime).

    Never raises for a failing policy or env: the trajectory comes back with ``error`` set. Limits
    give ``truncated`` with ``info["truncated_reason"]``; a gate stop gives ``early_stopped``.
    The caller must hold one of the runtime's slots (``runtime.slot()``); it is released while the
    member waits at a gate's hold point.
    """
    sampling = sampling or SamplingParams()
    limits = limits or RolloutLimits()
    t0 = time.monotonic()
    deadline = t0 + limits.max_wall_s if limits.max_wall_s else None
    traj = Trajectory(task_id=spec.task_id, env_id=spec.env_id, group_id=spec.group_id,
                      info={**spec.info, "member": spec.member, "seed": spec.seed, "policy_id": policy.policy_id})
    timing = {"reset_s": 0.0, "policy_s": 0.0, "env_s": 0.0, "hold_s": 0.0}
    actions: list[str] = []
    parse_errors = 0
    env_metrics: dict[str, Any] = {}
    conv: Conversation | None = None
    success = False
    stage = "env"
    try:
        t = time.monotonic()
        obs, info = await runtime.call(env.reset, seed=spec.seed, options={"task_id": spec.task_id},
                                       timeout=limits.env_timeout_s)
        timing["reset_s"] = time.monotonic() - t
        traj.info["task_type"] = info.get("task_type", "default")
        inner = env.unwrapped
        tools = env_tool_specs(env)
        traj.info["parser"] = getattr(getattr(inner, "parser", None), "name", None)
        oracle = getattr(inner, "expert_action", None)
        conv = Conversation(policy, tools, token_mode, history_window)
        conv.observe(list(obs))
        traj.messages = list(obs)
        while True:
            if monitor is not None and monitor.stopped:
                traj.early_stopped = True
                break
            if limits.max_turns is not None and len(traj.turns) >= limits.max_turns:
                raise TruncatedEpisode("max_turns")
            if deadline is not None and time.monotonic() >= deadline:
                raise TruncatedEpisode("max_wall_s")
            stage = "policy"
            t = time.monotonic()
            cap = limits.policy_timeout_s
            timeout = _remaining(deadline, cap)
            try:
                gen, prompt_ids = await conv.generate(
                    _sampling_for_turn(sampling, spec, len(traj.turns)), oracle=oracle, timeout=timeout,
                    max_context=limits.max_total_tokens,
                    metadata={"task_id": spec.task_id, "group_id": spec.group_id, "member": spec.member})
            except TruncatedEpisode as e:
                if e.reason == "policy_timeout" and deadline is not None and timeout < cap:
                    raise TruncatedEpisode("max_wall_s") from None
                raise
            finally:
                timing["policy_s"] += time.monotonic() - t
            turn = Turn(policy_id=policy.policy_id, prompt_token_ids=prompt_ids,
                        completion_token_ids=list(gen.token_ids), completion_logprobs=list(gen.logprobs),
                        weight_version=gen.weight_version, text=gen.text, finish_reason=gen.finish_reason)
            if conv.restarted:  # this turn's prompt ids are a full re-render, not a delta
                traj.info.setdefault("session_restart_turns", []).append(len(traj.turns))
            traj.turns.append(turn)
            traj.messages.append(conv.messages[-1])
            action = gen.as_action()
            stage = "env"
            t = time.monotonic()
            obs, reward, terminated, truncated, info = await runtime.call(
                env.step, action, timeout=limits.env_timeout_s)
            timing["env_s"] += time.monotonic() - t
            obs = list(obs)
            turn.observation = obs
            turn.tool_calls = list(info.get("tool_calls") or [])
            turn.reward = float(reward)
            traj.reward += float(reward)
            traj.messages.extend(obs)
            if info.get("parse_error"):
                parse_errors += 1
            env_metrics = dict(info.get("metrics") or env_metrics)
            command, _ = _parse_command(env, action) if not turn.tool_calls else (None, None)
            actions.append(canonical_action(turn.tool_calls, command, gen.text))
            if monitor is not None:
                monitor.record_step(spec.member, actions[-1], float(reward), conv.generated_tokens)
            if terminated:
                traj.terminated = True
                success = bool(info.get("success", False))
                break
            if truncated:
                traj.truncated = True
                at_limit = limits.max_turns is not None and len(traj.turns) >= limits.max_turns
                traj.info["truncated_reason"] = "max_turns" if at_limit else "env_limit"
                break
            stage = "rollout"
            conv.observe(obs)
            if monitor is not None:
                monitor.after_step()
                if monitor.must_hold(len(actions)):
                    t = time.monotonic()
                    # siblings are each bounded by their own per-call timeouts
                    bound = len(actions) * (limits.policy_timeout_s + limits.env_timeout_s)
                    runtime.release_slot()
                    try:
                        await monitor.hold(len(actions), timeout=_remaining(deadline, bound))
                    except asyncio.TimeoutError:
                        raise TruncatedEpisode("max_wall_s") from None
                    finally:
                        await runtime.acquire_slot()
                        timing["hold_s"] += time.monotonic() - t
    except TruncatedEpisode as e:
        traj.truncated = True
        traj.info["truncated_reason"] = e.reason
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a broken policy or env loses only this episode
        traj.error = f"{type(e).__name__}: {e}"
        traj.info["error_kind"] = "env_timeout" if isinstance(e, EnvTimeout) else type(e).__name__
        traj.info["error_source"] = stage
    finally:
        traj.success = success
        traj.info["actions"] = actions
        traj.metrics = {
            **env_metrics,
            "turns": len(traj.turns),
            "generated_tokens": traj.num_generated_tokens,
            "prompt_tokens": sum(len(t.prompt_token_ids) for t in traj.turns),
            "parse_errors": max(parse_errors, int(env_metrics.get("parse_errors", 0) or 0)),
            "retokenized_turns": conv.retokenized_turns if conv is not None else 0,
            "session_restarts": conv.session_restarts if conv is not None else 0,
        }
        timing["wall_s"] = time.monotonic() - t0
        traj.timing = timing
    if monitor is not None:
        monitor.group.rewards[spec.member] = traj.reward
        monitor.group.tokens[spec.member] = traj.num_generated_tokens
        monitor.member_done(spec.member, success)
    return traj


def env_is_broken(traj: Trajectory) -> bool:
    """True if the episode's env should not be reused (it raised or timed out)."""
    return traj.error is not None and traj.info.get("error_source") == "env"

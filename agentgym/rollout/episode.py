"""The one episode stepper: propose, act, observe. Every workflow composes it.

An :class:`Episode` owns the bookkeeping of one running episode (the trajectory, limits, deadline,
timings, the gate monitor); a workflow drives it with three moves:

* :meth:`Episode.propose`: one policy call in a :class:`Conversation` (a :class:`Turn`);
* :meth:`Episode.act`: send a turn's action to the env (a :class:`StepOutcome`);
* :meth:`Conversation.observe`: show messages to a policy (the env's, or another role's).

:func:`run_episode` is the single-policy loop; a multi-policy workflow
(:class:`~agentgym.rollout.multi_policy.SolverVerifierWorkflow`) is a different routing of turns to
conversations over the same three moves, not a second loop. :meth:`Episode.run` wraps a workflow's
body: it turns limits into ``truncated`` (with ``truncated_reason``), failures into ``error`` (with
``error_source``), and fills in metrics and timing, so every workflow reports them the same way.

The loop learns everything from the env's public API: ``reset`` returns ``info["tools"]`` (the tool
specs to render) and ``info["parser"]``; ``step`` returns ``info["tool_calls"]`` and
``info["command"]``. It never reaches into ``env.unwrapped``, so an env behind HTTP behaves like a
local one. The env's expert is an env-side policy (``capabilities.env_side``): it acts through
the env (``policy.act(env)``) and model policies never see it.

**Token in, token out.** For a policy that declares ``sessions``, a :class:`Conversation` keeps a
:class:`~agentgym.policy.ChatSession`. Each turn the new observation messages are tokenized into the
session (only the delta) and the request carries the session's *whole* token sequence, so the
model always sees the full conversation with the exact ids it sampled. ``Turn.prompt_token_ids``
records the delta. If the template cannot be continued token-exactly
(:class:`~agentgym.errors.TokenizationError`), the conversation starts a new session from the full
history and that turn is marked ``new_session`` (a new training segment).

**Abort and resume.** A generation that comes back with ``finish_reason="abort"`` (a weight update
interrupted it) is resumed: the partial completion is appended to the prompt and generation
continues, on the new weights, up to the turn's remaining token budget. The turn keeps one weight
version per token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import gymnasium

from agentgym.errors import (
    ConfigurationError,
    ContextLengthExceeded,
    PolicyError,
    PolicyTimeout,
    TokenizationError,
)
from agentgym.policy import ChatSession, Generation, GenRequest, Policy, SamplingParams, capabilities_of
from agentgym.rollout.gates import GateMonitor, canonical_action, canonical_calls
from agentgym.rollout.runtime import EnvTimeout, RolloutLimits, RolloutRuntime
from agentgym.types import Message, ToolSpec, Trajectory, Turn

__all__ = [
    "Conversation",
    "Episode",
    "EpisodeSpec",
    "StepOutcome",
    "TruncatedEpisode",
    "action_of",
    "run_episode",
    "run_episode_body",
    "turn_seed",
    "uses_tokens",
]

TokenMode = Literal["auto", "on", "off"]
MAX_RESUMES = 16  # per turn


def uses_tokens(policy: Policy, mode: TokenMode = "auto") -> bool:
    """True if ``policy`` runs token-in/token-out: it declares ``sessions`` and ``mode`` is not ``"off"``."""
    if mode == "off":
        return False
    has = capabilities_of(policy).sessions
    if mode == "on" and not has:
        raise ConfigurationError(f"policy {policy.policy_id!r} does not declare sessions; use token_mode='auto'.")
    return has


class TruncatedEpisode(Exception):
    """A limit was hit; ``reason`` becomes ``Trajectory.truncated_reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def turn_seed(sampling_seed: int | None, call_index: int) -> int | None:
    """The sampling seed of the ``call_index``-th policy call of an episode (``None``: unseeded)."""
    if sampling_seed is None:
        return None
    return (sampling_seed * 1_000_003 + call_index) % (2**31 - 1)


class Conversation:
    """One policy's chat history (and token session) within an episode.

    Args:
        policy: The policy that speaks in this conversation.
        tools: Tool specs rendered into the prompt (message mode and ``session.start``).
        token_mode: ``"auto"`` (token mode if the policy declares sessions), ``"on"`` or ``"off"``.
        history_window: Message mode only: keep the system/first user messages plus the last N
            assistant turns with their observations (``None``: full history).
        env: The env, for env-side policies (the expert), which act through it.
        runtime: Runs an env-side policy's blocking ``act`` in the worker pool.
    """

    def __init__(self, policy: Policy, tools: list[ToolSpec] | None = None, token_mode: TokenMode = "auto",
                 history_window: int | None = None, *, env: Any = None, runtime: RolloutRuntime | None = None) -> None:
        caps = capabilities_of(policy)
        self.policy = policy
        self.env_side = caps.env_side
        if self.env_side and (env is None or runtime is None):
            raise ConfigurationError(f"policy {policy.policy_id!r} acts through the env; run it in an Episode")
        self.env = env
        self.runtime = runtime
        self.tools = tools or None
        self.token_mode = (not self.env_side) and uses_tokens(policy, token_mode)
        self.history_window = history_window
        self.messages: list[Message] = []
        self._pending: list[Message] = []  # messages not yet in the token session
        self._session: ChatSession | None = None
        self._ctx_ids: list[int] | None = None  # message mode: last prompt + completion ids
        self.context_tokens = 0  # tokens in the policy's context so far (prompt + completions)
        self.generated_tokens = 0
        self.retokenized_turns = 0
        self.session_restarts = 0
        self.resumes = 0
        self._prepared: tuple[list[int], bool] | None = None

    def observe(self, messages: list[Message]) -> None:
        """Add env (or other-role) messages to the history."""
        self.messages.extend(messages)
        self._pending.extend(messages)

    def add_user(self, content: str) -> None:
        self.observe([{"role": "user", "content": content}])

    # ------------------------------------------------------------------ prompts
    def _next_prompt(self) -> tuple[list[int], bool]:
        """Token mode: tokenize the pending messages into the session; (delta ids, new session)."""
        if self._session is None:
            return self._start_session(list(self._pending)), True
        if not self._pending:  # an env that returned no message: keep the turns alternating
            self.observe([{"role": "user", "content": "(no output)"}])
        try:
            delta = list(self._session.append_messages(list(self._pending)))
        except TokenizationError:
            # the template cannot be continued token-exactly: a new sample from the full conversation
            self.session_restarts += 1
            return self._start_session(list(self.messages)), True
        if getattr(self._session, "last_reset", False):  # a session that re-rendered by itself
            self.session_restarts += 1
            return list(self._session.token_ids), True
        return delta, False

    def _start_session(self, messages: list[Message]) -> list[int]:
        self._session = self.policy.new_session()  # type: ignore[attr-defined]
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

    # ------------------------------------------------------------------ generation
    async def generate(self, sampling: SamplingParams, *, timeout: float | None = None,
                       max_context: int | None = None,
                       metadata: dict[str, Any] | None = None) -> tuple[Generation, list[int], bool]:
        """One policy call. Returns ``(generation, prompt delta for the Turn, new_session)``.

        Raises:
            TruncatedEpisode: the token budget is exhausted, the context is too long, the policy
                timed out, or the chat template drifted.
        """
        if self.env_side:
            return await self._act(timeout), [], False
        req = self.prepare(sampling, max_context=max_context, metadata=metadata)
        gen = await self._call(req, timeout)
        delta, new_session = self.complete(gen)
        return gen, delta, new_session

    def prepare(self, sampling: SamplingParams, *, max_context: int | None = None,
                metadata: dict[str, Any] | None = None) -> GenRequest:
        """The next request (token mode: the pending messages are tokenized into the session first).

        :meth:`generate` is ``prepare`` + the policy call + :meth:`complete`; a loop that batches
        many conversations' requests into one call uses the two halves directly.

        Raises:
            TruncatedEpisode: see :meth:`generate`.
        """
        self._prepared = None
        if self.token_mode:
            try:
                self._prepared = self._next_prompt()
            except TokenizationError:  # even a fresh session cannot render this conversation
                raise TruncatedEpisode("tokenization_drift") from None
            except ContextLengthExceeded:
                raise TruncatedEpisode("context_length") from None
            self._pending = []
            self.context_tokens = len(self._session.token_ids) if self._session is not None else 0
        if max_context is not None:
            room = max_context - self.context_tokens
            if room <= 0:
                raise TruncatedEpisode("max_total_tokens")
            sampling = replace(sampling, max_tokens=max(1, min(sampling.max_tokens, room)))
        if self.token_mode:
            assert self._session is not None
            return GenRequest(prompt_token_ids=self._session.token_ids, sampling=sampling, metadata=dict(metadata or {}))
        self._pending = []
        return GenRequest(messages=self._window(), tools=self.tools, sampling=sampling, metadata=dict(metadata or {}))

    def complete(self, gen: Generation) -> tuple[list[int], bool]:
        """Record the generation answering the last :meth:`prepare`; returns (prompt delta, new session)."""
        if self.token_mode:
            assert self._prepared is not None, "complete() must follow prepare()"
            delta, new_session = self._prepared
        else:
            delta, new_session = self._message_mode_delta(gen)
        self._prepared = None
        self._add_generation(gen)
        return delta, new_session

    async def _call(self, req: GenRequest, timeout: float | None) -> Generation:
        """Generate, resuming an aborted generation until the turn is complete (see the module docstring)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        gen = await self._one(req, deadline)
        resumes = 0
        while gen.finish_reason == "abort":
            resumes += 1
            self.resumes += 1
            if resumes > MAX_RESUMES:
                raise PolicyError(f"policy {self.policy.policy_id!r} aborted the same turn {resumes} times")
            if not self.token_mode:  # a chat API cannot continue a partial completion exactly: sample again
                gen = await self._one(req, deadline)
                continue
            left = req.sampling.max_tokens - len(gen.token_ids)
            if left <= 0:
                gen = replace(gen, finish_reason="length")
                break
            assert req.prompt_token_ids is not None
            more = await self._one(replace(req, prompt_token_ids=list(req.prompt_token_ids) + list(gen.token_ids),
                                           sampling=replace(req.sampling, max_tokens=left)), deadline)
            gen = _join(gen, more)
        return gen

    async def _one(self, req: GenRequest, deadline: float | None) -> Generation:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            gens = await asyncio.wait_for(self.policy.generate([req]), timeout)
        except (asyncio.TimeoutError, PolicyTimeout):
            raise TruncatedEpisode("policy_timeout") from None
        except ContextLengthExceeded:
            raise TruncatedEpisode("context_length") from None
        if len(gens) != 1:
            raise PolicyError(f"policy {self.policy.policy_id!r} returned {len(gens)} generations for 1 request")
        return gens[0]

    async def _act(self, timeout: float | None) -> Generation:
        assert self.runtime is not None
        action = await self.runtime.call(self.policy.act, self.env, timeout=timeout, owner=self.env)  # type: ignore[attr-defined]
        if action is None:
            raise PolicyError(f"{self.policy.policy_id!r}: this env has no expert (expert_action() returned None)")
        if isinstance(action, str):
            gen = Generation(text=action)
        elif isinstance(action, dict) and action.get("role") == "assistant":
            gen = Generation(text=action.get("content") or "", tool_calls=action.get("tool_calls") or None)
        else:
            raise PolicyError(f"{self.policy.policy_id!r} returned {type(action).__name__}; expected str or assistant message")
        self._add_generation(gen)
        return gen

    def _message_mode_delta(self, gen: Generation) -> tuple[list[int], bool]:
        full = list(gen.prompt_token_ids or [])
        first = not any(m["role"] == "assistant" for m in self.messages)
        if not full:  # the backend reports no prompt ids: one context per conversation, as far as we know
            return [], first
        prev = self._ctx_ids
        if prev is not None and full[: len(prev)] == prev:
            delta, new = full[len(prev):], False
        else:
            if prev is not None:
                self.retokenized_turns += 1
            delta, new = full, True
        self.context_tokens = len(full)
        self._ctx_ids = full + list(gen.token_ids)
        return delta, new

    def _add_generation(self, gen: Generation) -> None:
        msg: Message = {"role": "assistant", "content": gen.text}
        if gen.tool_calls:
            msg["tool_calls"] = list(gen.tool_calls)
        self.messages.append(msg)
        n = len(gen.token_ids)
        self.generated_tokens += n
        self.context_tokens += n
        if self._session is not None:
            self._session.append_completion(list(gen.token_ids))


def _join(a: Generation, b: Generation) -> Generation:
    """A partial generation ``a`` continued by ``b`` (per-token versions kept)."""
    va = a.weight_version if isinstance(a.weight_version, list) else [a.weight_version] * len(a.token_ids)
    vb = b.weight_version if isinstance(b.weight_version, list) else [b.weight_version] * len(b.token_ids)
    versions = va + vb
    wv: int | list[int] = versions[0] if versions and len(set(versions)) == 1 else versions
    if not versions:
        wv = b.weight_version
    lp = a.logprobs + b.logprobs if (a.logprobs or not a.token_ids) and (b.logprobs or not b.token_ids) else []
    return Generation(text=a.text + b.text, token_ids=a.token_ids + b.token_ids, logprobs=lp,
                      finish_reason=b.finish_reason, weight_version=wv, prompt_token_ids=a.prompt_token_ids,
                      tool_calls=b.tool_calls or a.tool_calls)


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


@dataclass
class StepOutcome:
    """What one env step returned (observation messages are already on the turn)."""

    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class Episode:
    """State and bookkeeping of one running episode (see the module docstring).

    The caller must hold one of the runtime's slots (``runtime.slot()``); it is released while the
    member waits at a gate's hold point.

    Args:
        runtime: Worker pool for blocking env calls.
        env: The env (borrowed from the runtime).
        spec: Task, seeds, group and member.
        limits: Turn/token/wall-time limits.
        monitor: The group's gate monitor, if gates watch it.
    """

    def __init__(self, runtime: RolloutRuntime, env: gymnasium.Env[Any, Any], spec: EpisodeSpec,
                 limits: RolloutLimits | None = None, monitor: GateMonitor | None = None) -> None:
        self.runtime = runtime
        self.env = env
        self.spec = spec
        self.limits = limits or RolloutLimits()
        self.monitor = monitor
        self.t0 = time.monotonic()
        self.deadline = self.t0 + self.limits.max_wall_s if self.limits.max_wall_s else None
        self.traj = Trajectory(task_id=spec.task_id, env_id=spec.env_id, group_id=spec.group_id,
                               member=spec.member, info={**spec.info, "seed": spec.seed})
        self.timing = {"reset_s": 0.0, "policy_s": 0.0, "env_s": 0.0, "hold_s": 0.0}
        self.tools: list[ToolSpec] | None = None
        self.parser: str | None = None
        self.actions: list[str] = []  # canonical action of each env step (gates, logs)
        self.parse_errors = 0
        self.env_metrics: dict[str, Any] = {}
        self.conversations: list[Conversation] = []
        self.calls = 0  # policy calls so far (sampling seeds)
        self.stage = "env"

    # ------------------------------------------------------------------ the three moves
    async def reset(self) -> list[Message]:
        """Reset the env to the spec's task; returns the opening messages (also in ``traj.messages``)."""
        t = time.monotonic()
        self.stage = "env"
        obs, info = await self.runtime.call(self.env.reset, seed=self.spec.seed, options={"task_id": self.spec.task_id},
                                            timeout=self.limits.env_timeout_s)
        self.timing["reset_s"] += time.monotonic() - t
        self.traj.info["task_type"] = info.get("task_type", "default")
        self.tools = list(info.get("tools") or []) or None
        self.parser = info.get("parser")
        self.traj.info["parser"] = self.parser
        obs = list(obs)
        self.traj.messages = list(obs)
        return obs

    def conversation(self, policy: Policy, *, tools: list[ToolSpec] | Literal["env"] | None = "env",
                     token_mode: TokenMode = "auto", history_window: int | None = None) -> Conversation:
        """A conversation for ``policy`` in this episode (``tools="env"``: the env's tools)."""
        conv = Conversation(policy, self.tools if tools == "env" else tools, token_mode, history_window,
                            env=self.env, runtime=self.runtime)
        self.conversations.append(conv)
        return conv

    async def propose(self, conv: Conversation, sampling: SamplingParams) -> Turn:
        """One policy call in ``conv``; the turn is appended to the trajectory."""
        self._check_deadline()
        self.stage = "policy"
        cap = self.limits.policy_timeout_s
        timeout = self._remaining(cap)
        seed = turn_seed(self.spec.sampling_seed, self.calls)
        self.calls += 1
        s = sampling if seed is None else replace(sampling, seed=seed)
        t = time.monotonic()
        try:
            gen, delta, new_session = await conv.generate(
                s, timeout=timeout, max_context=self.limits.max_total_tokens,
                metadata={"task_id": self.spec.task_id, "group_id": self.spec.group_id, "member": self.spec.member})
        except TruncatedEpisode as e:
            if e.reason == "policy_timeout" and self.deadline is not None and timeout < cap:
                raise TruncatedEpisode("max_wall_s") from None
            raise
        finally:
            policy_s = time.monotonic() - t
            self.timing["policy_s"] += policy_s
        turn = Turn(policy_id=conv.policy.policy_id, prompt_token_ids=delta, completion_token_ids=list(gen.token_ids),
                    completion_logprobs=list(gen.logprobs), weight_version=gen.weight_version, text=gen.text,
                    finish_reason=gen.finish_reason, new_session=new_session, timing={"policy_s": policy_s})
        self.traj.turns.append(turn)
        return turn

    async def act(self, turn: Turn, action: str | Message | None = None) -> StepOutcome:
        """Send ``turn``'s action (or ``action``) to the env; record the outcome on the turn.

        Ends the episode (``terminated``/``truncated``) when the env says so.
        """
        if action is None:
            action = turn.text
        self.traj.messages.append(action if isinstance(action, dict) else {"role": "assistant", "content": action})
        self.stage = "env"
        t = time.monotonic()
        obs, reward, terminated, truncated, info = await self.runtime.call(self.env.step, action,
                                                                           timeout=self.limits.env_timeout_s)
        env_s = time.monotonic() - t
        self.timing["env_s"] += env_s
        turn.timing["env_s"] = env_s
        obs = list(obs)
        turn.observation = obs
        turn.tool_calls = list(info.get("tool_calls") or [])
        turn.reward = float(reward)
        tr = self.traj
        tr.reward += float(reward)
        tr.messages.extend(obs)
        if info.get("parse_error"):
            self.parse_errors += 1
            turn.parse_error = str(info["parse_error"])
        self.env_metrics = dict(info.get("metrics") or self.env_metrics)
        self.actions.append(canonical_action(turn.tool_calls, info.get("command"), turn.text))
        if self.monitor is not None:
            self.monitor.record_step(self.spec.member, self.actions[-1], float(reward), self.generated_tokens,
                                     canonical_calls(turn.tool_calls))
        if terminated:
            tr.terminated = True
            tr.success = bool(info.get("success", False))
        elif truncated:
            tr.truncated = True
            at_limit = self.limits.max_turns is not None and len(self.actions) >= self.limits.max_turns
            tr.truncated_reason = "max_turns" if at_limit else "env_limit"
        self.stage = "rollout"
        return StepOutcome(obs, float(reward), bool(terminated), bool(truncated), info)

    def next_turn(self) -> bool:
        """Before each proposal: False if a gate stopped the group (the member ends ``early_stopped``).

        Raises:
            TruncatedEpisode: ``max_turns`` env steps were taken, or the wall-clock deadline passed.
        """
        if self.monitor is not None and self.monitor.stopped:
            self.traj.early_stopped = True
            return False
        if self.limits.max_turns is not None and len(self.actions) >= self.limits.max_turns:
            raise TruncatedEpisode("max_turns")
        self._check_deadline()
        return True

    async def checkpoint(self) -> bool:
        """Between env steps: run the gates (waiting at a hold point). False if a gate stopped the group."""
        m = self.monitor
        if m is None:
            return True
        m.after_step()
        n = len(self.actions)
        if m.must_hold(n):
            t = time.monotonic()
            # siblings are each bounded by their own per-call timeouts
            bound = n * (self.limits.policy_timeout_s + self.limits.env_timeout_s)
            self.runtime.release_slot()
            try:
                await m.hold(n, timeout=self._remaining(bound))
            except asyncio.TimeoutError:
                raise TruncatedEpisode("max_wall_s") from None
            finally:
                await self.runtime.acquire_slot()
                self.timing["hold_s"] += time.monotonic() - t
        if m.stopped:
            self.traj.early_stopped = True
            return False
        return True

    # ------------------------------------------------------------------ running a body
    async def run(self, body: Callable[[Episode], Awaitable[None]]) -> Trajectory:
        """Run a workflow's episode body; never raises for a failing policy or env.

        Limits give ``truncated`` with ``truncated_reason``; failures give ``error`` and
        ``error_source``; a gate stop gives ``early_stopped``. Metrics and timing are filled in.
        """
        tr = self.traj
        try:
            await body(self)
        except TruncatedEpisode as e:
            tr.truncated = True
            tr.truncated_reason = e.reason
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a broken policy or env loses only this episode
            tr.error = f"{type(e).__name__}: {e}"
            tr.error_source = self.stage
            tr.info["error_kind"] = "env_timeout" if isinstance(e, EnvTimeout) else type(e).__name__
        finally:
            tr.info["actions"] = list(self.actions)
            tr.metrics = {
                **self.env_metrics,
                **tr.metrics,  # what the workflow's body recorded
                "turns": len(tr.turns),
                "env_steps": len(self.actions),
                "generated_tokens": tr.num_generated_tokens,
                "prompt_tokens": sum(len(t.prompt_token_ids) for t in tr.turns),
                "parse_errors": max(self.parse_errors, int(self.env_metrics.get("parse_errors", 0) or 0)),
                "retokenized_turns": sum(c.retokenized_turns for c in self.conversations),
                "session_restarts": sum(c.session_restarts for c in self.conversations),
                "resumed_generations": sum(c.resumes for c in self.conversations),
            }
            self.timing["wall_s"] = time.monotonic() - self.t0
            tr.timing = dict(self.timing)
        if self.monitor is not None:
            self.monitor.group.rewards[self.spec.member] = tr.reward
            self.monitor.group.tokens[self.spec.member] = tr.num_generated_tokens
            self.monitor.member_done(self.spec.member, tr.success)
        return tr

    # ------------------------------------------------------------------ helpers
    @property
    def generated_tokens(self) -> int:
        return sum(c.generated_tokens for c in self.conversations)

    @property
    def env_broken(self) -> bool:
        """True if the env should not be reused (it raised or timed out)."""
        return self.traj.error is not None and self.traj.error_source == "env"

    def _check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise TruncatedEpisode("max_wall_s")

    def _remaining(self, cap: float) -> float:
        if self.deadline is None:
            return cap
        return max(0.0, min(cap, self.deadline - time.monotonic()))


def action_of(conv: Conversation) -> str | Message:
    """The env action for ``conv``'s last completion: its text, or the assistant message when the
    backend returned structured tool calls."""
    last = conv.messages[-1]
    return last if last.get("tool_calls") else last["content"]


async def run_episode_body(ep: Episode, policy: Policy, sampling: SamplingParams, token_mode: TokenMode = "auto",
                           history_window: int | None = None) -> None:
    """The single-policy episode: reset, then propose, act, observe until the episode ends."""
    ep.traj.info["policy_id"] = policy.policy_id
    obs = await ep.reset()
    conv = ep.conversation(policy, token_mode=token_mode, history_window=history_window)
    conv.observe(obs)
    while ep.next_turn():
        turn = await ep.propose(conv, sampling)
        out = await ep.act(turn, action_of(conv))
        if out.done:
            return
        conv.observe(out.observation)
        if not await ep.checkpoint():
            return


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
    """Run one episode of ``policy`` on ``env`` (already borrowed from the runtime; hold a slot).

    Never raises for a failing policy or env (see :meth:`Episode.run`).
    """
    ep = Episode(runtime, env, spec, limits, monitor)
    s = sampling or SamplingParams()
    return await ep.run(lambda e: run_episode_body(e, policy, s, token_mode, history_window))

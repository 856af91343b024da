"""The policy endpoint: OpenAI-compatible generation over rollout policies, with token-exact rollout traces.

:class:`PolicyEndpoint` is the in-process API; :mod:`agentgym.harness.server` puts HTTP in front of
it (``agentgym serve-policy``, and the endpoint a harness workflow hands its agents)::

    endpoint = PolicyEndpoint({"smollm2": hf_policy}, parser="hermes")
    rollout = endpoint.open_rollout("r1")                       # or auto-created by the first request
    req, reply = await endpoint.chat(body, rollout_id="r1")      # an OpenAI chat request body
    endpoint.post_reward("r1", 1.0)                              # POST /rollout/r1/reward
    traj = endpoint.close_rollout("r1").trajectory(task_id="t")  # the turns, segments and reward

Every request of a rollout goes through its :class:`~agentgym.harness.traces.RolloutTrace`, which
joins requests into token-exact segments. Prompts are rendered with the serving policy's own chat
template (a token session: only new messages are tokenized); the completion is parsed into OpenAI
``tool_calls`` with the rollout's parser family (``hermes``, ``json`` or ``react``, the env's, where
the workflow knows it). The response carries the prompt and completion ids, logprobs and weight
versions.

Bounds: ``n`` is 1; ``max_tokens`` is capped (``max_tokens_cap``); a generation has a deadline
(``request_timeout_s``, then ``504``); rollouts open at once (``max_rollouts``), requests per rollout
(``max_requests_per_rollout``) and events per rollout are capped (``429``); idle rollouts expire
(``rollout_idle_s``). Request bodies are size-limited by the server's guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from agentgym.errors import (
    ConfigurationError,
    ContextLengthExceeded,
    PolicyError,
    PolicyTimeout,
    TokenizationError,
)
from agentgym.harness.openai_api import (
    ChatRequest,
    CompletionRequest,
    EndpointError,
    Reply,
    parse_chat_request,
    parse_completion_request,
    to_messages,
    to_tool_specs,
)
from agentgym.harness.traces import Pending, PolicyBinding, RolloutTrace
from agentgym.parsers import get_parser
from agentgym.policy import Generation, GenRequest, Policy, SamplingParams, capabilities_of
from agentgym.rollout.episode import _join as join_generations
from agentgym.rollout.episode import turn_seed
from agentgym.types import Message, ToolCall, ToolSpec, Trajectory

__all__ = ["EnvAccess", "PolicyEndpoint", "RewardEvent", "Rollout", "RolloutMode"]

RolloutMode = Literal["train", "val"]
MAX_RESUMES = 16
MAX_EVENTS = 1024
_ROLLOUT_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")


class EnvAccess(Protocol):
    """An env an agent reaches through the endpoint (``/rollout/{id}/env``); see :mod:`agentgym.harness.workflow`."""

    def describe(self) -> dict[str, Any]: ...

    async def step(self, body: Any) -> dict[str, Any]: ...


@dataclass
class RewardEvent:
    """A reward reported for a rollout (``POST .../reward``, Agent Lightning's reward event, or the
    value an agent callable returned)."""

    value: float
    success: bool | None = None
    source: str = "call"
    at: float = field(default_factory=time.time)


@dataclass
class Rollout:
    """One agent run: its trace, rewards, events and (for a harness workflow) its env.

    Attributes:
        rollout_id: The id in the URL path or header.
        policy: The policy pinned to the rollout (``None``: each request's ``model`` picks one).
        parser: The parser family that turns completions into tool calls (``None``: the endpoint's).
        reward_calls: Whether reward calls are accepted (a harness whose reward comes from the env
            refuses them, so an agent cannot forge its reward).
        mode: ``train`` or ``val`` (Agent Lightning's URL mode; recorded in ``info``).
        env: The env the agent acts on through the endpoint, if any.
        info: Free-form bookkeeping (task id, attempt id...).
        temperature / top_p: Forced on every request of the rollout (a training run samples at its
            own temperature, whatever the agent asks; Agent Lightning's proxy does the same).
        max_tokens: A cap on every request's completion tokens.
        seed: Base sampling seed: request ``k`` without a seed of its own gets a derived one.
    """

    rollout_id: str
    policy: str | None = None
    parser: str | None = None
    reward_calls: bool = True
    mode: RolloutMode = "train"
    env: EnvAccess | None = None
    info: dict[str, Any] = field(default_factory=dict)
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    trace: RolloutTrace = field(init=False)
    rewards: list[RewardEvent] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    in_flight: int = 0
    closed: bool = False
    activity: asyncio.Event | None = None

    def __post_init__(self) -> None:
        self.trace = RolloutTrace(self.rollout_id)

    def touch(self) -> None:
        self.last_used = time.monotonic()
        if self.activity is not None:
            self.activity.set()

    @property
    def reward(self) -> RewardEvent | None:
        """The last reported reward (Agent Lightning's rule: the final reward event counts)."""
        return self.rewards[-1] if self.rewards else None

    def reward_log(self) -> list[dict[str, Any]]:
        return [{"value": e.value, "success": e.success, "source": e.source} for e in self.rewards]

    def trajectory(self, *, task_id: str | None = None, env_id: str = "", group_id: str = "",
                   member: int = 0) -> Trajectory:
        """The rollout as a training :class:`~agentgym.types.Trajectory`: one segment per chain, the
        last reported reward (a harness workflow sets the env's reward itself)."""
        tr = self.trace
        r = self.reward
        traj = Trajectory(task_id=task_id or str(self.info.get("task_id") or self.rollout_id), env_id=env_id,
                          group_id=group_id, member=member, turns=tr.turns(), messages=list(tr.last_messages))
        if r is not None:
            traj.reward = r.value
            traj.success = bool(r.success) if r.success is not None else r.value > 0
        traj.metrics = tr.metrics()
        traj.info = {**self.info, "rollout_id": self.rollout_id, "mode": self.mode, "rewards": self.reward_log()}
        if self.events:
            traj.info["events"] = list(self.events)
        return traj


class PolicyEndpoint:
    """Rollout policies behind OpenAI's chat and completions APIs (see the module docstring).

    Args:
        policies: One policy, several (named by ``policy_id``), or ``{model name: policy}``. With one,
            any ``model`` in a request is served by it, so an agent with a hard-coded model name only
            changes its ``base_url``; with several, ``model`` must name one (else ``404``).
        parser: The default parser family for tool calls (``None``: ``hermes`` when a request has tools).
        max_tokens: Completion tokens when a request names none.
        max_tokens_cap: The most completion tokens a request may get (larger asks are capped).
        request_timeout_s: Deadline of one generation (``504`` past it).
        auto_rollouts: Create a rollout on the first request naming an unknown id (Agent Lightning's
            proxy and ``serve-policy``); otherwise unknown ids get ``404`` (a harness workflow opens
            its rollouts itself, with unguessable ids).
        max_rollouts: Rollouts open at once.
        max_requests_per_rollout: Model calls per rollout.
        rollout_idle_s: A rollout unused for this long expires (:meth:`expire_idle`).
        on_close: Called with every rollout that is closed or expires (``serve-policy --out``).
        temperature: Sampling temperature when a request names none (OpenAI's default is 1).
        count_rerender_drift: Count the turns where re-rendering a request afresh would differ from
            the ids kept (one extra render per request).
    """

    def __init__(self, policies: Policy | Sequence[Policy] | Mapping[str, Policy], *, parser: str | None = None,
                 max_tokens: int = 512, max_tokens_cap: int = 4096, request_timeout_s: float = 600.0,
                 auto_rollouts: bool = False, max_rollouts: int = 4096, max_requests_per_rollout: int = 1024,
                 rollout_idle_s: float = 3600.0, on_close: Callable[[Rollout], Any] | None = None,
                 temperature: float = 1.0, count_rerender_drift: bool = True) -> None:
        if isinstance(policies, Mapping):
            named = dict(policies)
        elif isinstance(policies, Sequence):
            named = {p.policy_id: p for p in policies}
        else:
            named = {policies.policy_id: policies}
        if not named:
            raise ConfigurationError("PolicyEndpoint needs at least one policy")
        if parser is not None:
            get_parser(parser)
        for name, value in (("max_tokens", max_tokens), ("max_tokens_cap", max_tokens_cap),
                            ("max_rollouts", max_rollouts), ("max_requests_per_rollout", max_requests_per_rollout)):
            if value < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {value}")
        if not request_timeout_s > 0 or not rollout_idle_s > 0:
            raise ConfigurationError("request_timeout_s and rollout_idle_s must be positive")
        self.policies = named
        self.parser = parser
        self.max_tokens = min(max_tokens, max_tokens_cap)
        self.max_tokens_cap = max_tokens_cap
        self.request_timeout_s = request_timeout_s
        self.auto_rollouts = auto_rollouts
        self.max_rollouts = max_rollouts
        self.max_requests_per_rollout = max_requests_per_rollout
        self.rollout_idle_s = rollout_idle_s
        self.on_close = on_close
        self.temperature = temperature
        self.count_rerender_drift = count_rerender_drift
        self.rollouts: dict[str, Rollout] = {}
        self.requests = 0
        self._last_sweep = time.monotonic()
        self._bindings: dict[str, PolicyBinding] = {}

    # ------------------------------------------------------------------------------------- rollouts
    def open_rollout(self, rollout_id: str | None = None, *, policy: str | None = None, parser: str | None = None,
                     reward_calls: bool = True, mode: RolloutMode = "train", env: EnvAccess | None = None,
                     info: dict[str, Any] | None = None, temperature: float | None = None,
                     top_p: float | None = None, max_tokens: int | None = None, seed: int | None = None) -> Rollout:
        """Open a rollout (a new unguessable id if none is given).

        Raises:
            EndpointError: the id is malformed or taken (``409``), too many rollouts are open (``429``).
        """
        rid = rollout_id or uuid.uuid4().hex
        if not _ROLLOUT_ID.fullmatch(rid):
            raise EndpointError(400, "a rollout id is 1-200 characters of letters, digits and _.:-", param="rollout_id")
        if rid in self.rollouts:
            raise EndpointError(409, f"rollout {rid!r} is already open")
        if len(self.rollouts) >= self.max_rollouts:
            self.expire_idle()
            if len(self.rollouts) >= self.max_rollouts:
                raise EndpointError(429, f"{self.max_rollouts} rollouts are open; finish some first",
                                    kind="rate_limit_error")
        if policy is not None and policy not in self.policies:
            raise ConfigurationError(f"no policy {policy!r}; serving {sorted(self.policies)}")
        if parser is not None:
            get_parser(parser)
        r = Rollout(rid, policy=policy, parser=parser, reward_calls=reward_calls, mode=mode, env=env,
                    info=dict(info or {}), temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed)
        self.rollouts[rid] = r
        return r

    def rollout(self, rollout_id: str, *, create: bool | None = None) -> Rollout:
        """The open rollout ``rollout_id`` (created if ``auto_rollouts``; else ``404``)."""
        r = self.rollouts.get(rollout_id)
        if r is not None:
            return r
        if create if create is not None else self.auto_rollouts:
            return self.open_rollout(rollout_id)
        raise EndpointError(404, f"no open rollout {rollout_id!r}", code="rollout_not_found")

    def close_rollout(self, rollout_id: str) -> Rollout:
        """Close a rollout and hand it back (its trajectory is final); later requests for it get ``404``."""
        r = self.rollouts.pop(rollout_id, None)
        if r is None:
            raise EndpointError(404, f"no open rollout {rollout_id!r}", code="rollout_not_found")
        r.closed = True
        if self.on_close is not None:
            self.on_close(r)
        return r

    def expire_idle(self, now: float | None = None) -> list[Rollout]:
        """Close rollouts idle for ``rollout_idle_s`` (none in flight); returns them."""
        now = time.monotonic() if now is None else now
        out = [r for r in self.rollouts.values() if not r.in_flight and now - r.last_used > self.rollout_idle_s]
        return [self.close_rollout(r.rollout_id) for r in out]

    def close_all(self) -> list[Rollout]:
        """Close every open rollout (at shutdown)."""
        return [self.close_rollout(rid) for rid in list(self.rollouts)]

    def _maybe_expire(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep > min(60.0, self.rollout_idle_s / 4):
            self._last_sweep = now
            self.expire_idle(now)

    def post_reward(self, rollout_id: str, value: Any, *, success: Any = None, source: str = "call") -> RewardEvent:
        """Record a reward for a rollout (``POST /rollout/{id}/reward``).

        Raises:
            EndpointError: unknown rollout (``404``), a rollout whose reward comes from its env or a
                final-state function (``403``), a value that is not a finite number (``400``).
        """
        r = self.rollout(rollout_id, create=self.auto_rollouts)
        if not r.reward_calls:
            raise EndpointError(403, "this rollout's reward comes from its env (or a function of its final state); "
                                     "reward calls are refused", kind="permission_error")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
            raise EndpointError(400, "a reward is a finite number", param="value")
        if success is not None and not isinstance(success, bool):
            raise EndpointError(400, "success is true or false", param="success")
        self._count_event(r)
        ev = RewardEvent(float(value), success, source)
        r.rewards.append(ev)
        r.touch()
        return ev

    def post_event(self, rollout_id: str, event_type: str, data: dict[str, Any]) -> None:
        """Record an event (Agent Lightning's ``POST .../events``): ``reward`` events set the reward,
        others are kept in the trajectory's ``info["events"]``."""
        if event_type == "reward":
            self.post_reward(rollout_id, data.get("value"), success=data.get("success"),
                             source=str(data.get("source") or "event"))
            return
        r = self.rollout(rollout_id, create=self.auto_rollouts)
        self._count_event(r)
        r.events.append({"event_type": event_type, "data": data, "at": time.time()})
        r.touch()

    def _count_event(self, r: Rollout) -> None:
        if len(r.rewards) + len(r.events) >= MAX_EVENTS:
            raise EndpointError(429, f"at most {MAX_EVENTS} events per rollout", kind="rate_limit_error")

    # ------------------------------------------------------------------------------------- models
    def models(self) -> dict[str, Any]:
        """``GET /v1/models``."""
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "agentgym",
                                            "weight_version": int(getattr(p, "weight_version", 0))}
                                           for name, p in self.policies.items()]}

    def _policy(self, model: str, rollout: Rollout | None) -> tuple[str, Policy]:
        if rollout is not None and rollout.policy is not None:
            return rollout.policy, self.policies[rollout.policy]
        if len(self.policies) == 1:
            return next(iter(self.policies.items()))
        if model in self.policies:
            return model, self.policies[model]
        raise EndpointError(404, f"the model {model!r} is not served; models: {', '.join(sorted(self.policies))}",
                            param="model", code="model_not_found")

    def _binding(self, name: str, policy: Policy) -> PolicyBinding:
        b = self._bindings.get(name)
        if b is None:
            sessions = capabilities_of(policy).sessions
            tok = getattr(policy, "tokenizer", None)
            render = None
            if sessions and tok is not None and self.count_rerender_drift:
                def render(messages: list[Message], tools: list[ToolSpec] | None, _tok: Any = tok) -> list[int]:
                    text = _tok.apply_chat_template(list(messages), tools=tools, tokenize=False,
                                                    add_generation_prompt=True)
                    return list(_tok(str(text), add_special_tokens=False)["input_ids"])
            b = PolicyBinding(policy.policy_id, policy.new_session if sessions else None,  # type: ignore[attr-defined]
                              render)
            self._bindings[name] = b
        return b

    # ------------------------------------------------------------------------------------- requests
    def _admit(self, rollout_id: str | None) -> Rollout | None:
        self._maybe_expire()
        if rollout_id is None:
            return None
        r = self.rollout(rollout_id)
        if r.trace.requests >= self.max_requests_per_rollout:
            raise EndpointError(429, f"rollout {rollout_id!r} made {self.max_requests_per_rollout} model calls, "
                                     "the most one rollout may", kind="rate_limit_error")
        return r

    def _sampling(self, req: ChatRequest | CompletionRequest, r: Rollout | None) -> SamplingParams:
        budget = min(req.token_budget() or self.max_tokens, self.max_tokens_cap)
        temperature = self.temperature if req.temperature is None else req.temperature
        top_p = 1.0 if req.top_p is None else req.top_p
        seed = req.seed
        if r is not None:
            temperature = temperature if r.temperature is None else r.temperature
            top_p = top_p if r.top_p is None else r.top_p
            budget = budget if r.max_tokens is None else min(budget, r.max_tokens)
            if seed is None and r.seed is not None:
                seed = turn_seed(r.seed, r.trace.requests)
        return SamplingParams(temperature=temperature, top_p=top_p, max_tokens=budget, stop=req.stop_list(),
                              seed=seed, logprobs=True)

    async def chat(self, body: Any, *, rollout_id: str | None = None) -> tuple[ChatRequest, Reply]:
        """Answer one ``/v1/chat/completions`` body (recorded in ``rollout_id``'s trace if given).

        Raises:
            EndpointError: a bad request (``400``), unknown model or rollout (``404``), a limit
                (``429``), a prompt longer than the context (``400``), a generation past its
                deadline (``504``) or a failed policy (``502``).
        """
        req = parse_chat_request(body)
        rollout = self._admit(rollout_id)
        name, policy = self._policy(req.model, rollout)
        messages, tools = to_messages(req), to_tool_specs(req)
        binding = self._binding(name, policy)
        sampling = self._sampling(req, rollout)

        async def run(pending: Pending | None) -> Generation:
            if pending is not None and pending.prompt_ids is not None:
                greq = GenRequest(prompt_token_ids=pending.prompt_ids, sampling=sampling)
            elif binding.new_session is not None:  # not recorded, token-exact anyway
                session = binding.new_session()
                greq = GenRequest(prompt_token_ids=list(session.start(list(messages), tools)), sampling=sampling)
            else:
                greq = GenRequest(messages=messages, tools=tools, sampling=sampling)
            return await self._generate(policy, greq)

        def begin(r: Rollout) -> Pending:
            return r.trace.begin_chat(binding, messages, tools)

        gen, pending = await self._run(rollout, begin, run)
        calls, content = self._tool_calls(req, gen, tools, rollout)
        reply_msg: Message = {"role": "assistant", "content": content or ""}
        if calls:
            reply_msg["tool_calls"] = calls
        ext = self._record(rollout, pending, gen, reply_msg, calls)
        finish = "tool_calls" if calls and gen.finish_reason == "stop" else gen.finish_reason
        prompt = pending.prompt_ids if pending is not None and pending.prompt_ids is not None else (
            list(gen.prompt_token_ids or []))
        return req, self._reply(name, policy, gen, content, calls, prompt, finish, ext)

    async def complete(self, body: Any, *, rollout_id: str | None = None) -> tuple[CompletionRequest, Reply]:
        """Answer one ``/v1/completions`` body (raises :class:`EndpointError` as :meth:`chat`)."""
        req = parse_completion_request(body)
        rollout = self._admit(rollout_id)
        name, policy = self._policy(req.model, rollout)
        tok = getattr(policy, "tokenizer", None)
        if isinstance(req.prompt, str):
            if tok is None:
                raise EndpointError(400, f"the model {name!r} has no tokenizer here: send the prompt as token ids",
                                    param="prompt")
            ids = list(tok(req.prompt)["input_ids"])
        else:
            ids = [int(t) for t in req.prompt]  # type: ignore[union-attr, arg-type]
        if not ids:
            raise EndpointError(400, "the prompt is empty", param="prompt")
        vocab = len(tok) if tok is not None else None
        if vocab is not None and any(t < 0 or t >= vocab for t in ids):
            raise EndpointError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
        binding = self._binding(name, policy)
        sampling = self._sampling(req, rollout)

        async def run(pending: Pending | None) -> Generation:
            return await self._generate(policy, GenRequest(prompt_token_ids=ids, sampling=sampling))

        def begin(r: Rollout) -> Pending:
            return r.trace.begin_text(binding, ids)

        gen, pending = await self._run(rollout, begin, run)
        ext = self._record(rollout, pending, gen, None, [])
        return req, self._reply(name, policy, gen, gen.text, [], ids, gen.finish_reason, ext)

    async def _run(self, rollout: Rollout | None, begin: Callable[[Rollout], Pending],
                   run: Callable[[Pending | None], Awaitable[Generation]]) -> tuple[Generation, Pending | None]:
        self.requests += 1
        pending = None
        if rollout is not None:
            try:
                pending = begin(rollout)
            except TokenizationError as e:
                raise EndpointError(400, f"the chat template cannot render these messages: {e}") from None
            rollout.in_flight += 1
            rollout.touch()
        try:
            gen = await run(pending)
        except BaseException:
            if pending is not None and rollout is not None:
                rollout.trace.fail(pending)
            raise
        finally:
            if rollout is not None:
                rollout.in_flight -= 1
                rollout.touch()
        return gen, pending

    async def _generate(self, policy: Policy, req: GenRequest) -> Generation:
        """One generation under the deadline, resuming one a weight update aborted (per-token versions)."""
        deadline = time.monotonic() + self.request_timeout_s

        async def one(r: GenRequest) -> Generation:
            left = max(0.0, deadline - time.monotonic())
            try:
                gens = await asyncio.wait_for(policy.generate([r]), left)
            except (asyncio.TimeoutError, PolicyTimeout):
                raise EndpointError(504, f"the generation did not finish within {self.request_timeout_s:g} s",
                                    kind="timeout_error") from None
            except ContextLengthExceeded as e:
                raise EndpointError(400, str(e), param="messages", code="context_length_exceeded") from None
            except (PolicyError, ConfigurationError) as e:
                raise EndpointError(502, f"the policy failed: {type(e).__name__}: {e}", kind="server_error") from None
            if len(gens) != 1:
                raise EndpointError(502, f"the policy returned {len(gens)} generations for one request",
                                    kind="server_error")
            return gens[0]

        gen = await one(req)
        resumes = 0
        while gen.finish_reason == "abort" and req.prompt_token_ids is not None:
            resumes += 1
            left = req.sampling.max_tokens - len(gen.token_ids)
            if resumes > MAX_RESUMES or left <= 0:
                gen = replace(gen, finish_reason="length")
                break
            more = await one(replace(req, prompt_token_ids=list(req.prompt_token_ids) + list(gen.token_ids),
                                     sampling=replace(req.sampling, max_tokens=left)))
            gen = join_generations(gen, more)
        return gen

    def _tool_calls(self, req: ChatRequest, gen: Generation, tools: list[ToolSpec] | None,
                    rollout: Rollout | None) -> tuple[list[ToolCall], str | None]:
        """Parse the completion into OpenAI tool calls; returns ``(calls, content)``."""
        if gen.tool_calls:  # a backend that parsed them itself
            calls = [{**c, "id": _call_id()} for c in gen.tool_calls]
            return calls, gen.text or None  # type: ignore[return-value]
        if not req.parses_tools():
            return [], gen.text
        name = (rollout.parser if rollout is not None else None) or self.parser or "hermes"
        parser = get_parser(name)
        parsed = parser.parse(gen.text, _toolset(tools or []))
        if not parsed.ok or not parsed.tool_calls:
            return [], gen.text
        calls = [{"id": _call_id(), "name": c["name"], "arguments": c["arguments"]} for c in parsed.tool_calls]
        return calls, _content_without_calls(parser.name, gen.text)  # type: ignore[return-value]

    def _record(self, rollout: Rollout | None, pending: Pending | None, gen: Generation, reply: Message | None,
                calls: list[ToolCall]) -> dict[str, Any]:
        wv = gen.weight_version
        versions = wv if isinstance(wv, list) else [int(wv)] if gen.token_ids else []
        ext: dict[str, Any] = {"weight_version": min(versions) if versions else int(wv) if not isinstance(wv, list) else 0,
                               "weight_versions": sorted(set(versions))}
        if rollout is None or pending is None:
            return ext
        rollout.trace.end(pending, gen, reply, calls)
        ext.update({"rollout_id": rollout.rollout_id, "turn": rollout.trace.num_turns - 1,
                    "segment": pending.chain.index, "new_segment": pending.new_segment})
        if pending.reason:
            ext["mismatch"] = pending.reason
        return ext

    def _reply(self, name: str, policy: Policy, gen: Generation, content: str | None, calls: list[ToolCall],
               prompt: list[int], finish: str, ext: dict[str, Any]) -> Reply:
        tok = getattr(policy, "tokenizer", None)
        ids = list(gen.token_ids)
        tokens = [tok.decode([t], skip_special_tokens=False) for t in ids] if tok is not None and gen.logprobs else []
        lps = list(gen.logprobs) if len(gen.logprobs) == len(ids) else []
        return Reply(model=name, text=gen.text, content=content if (content or not calls) else None,
                     tool_calls=calls, prompt_ids=list(prompt), token_ids=ids, logprobs=lps,
                     tokens=tokens if lps else [], finish_reason=finish, agentgym=ext)


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


_HERMES_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)
_REACT_ACTION = re.compile(r"^\s*Action\s*\d*\s*:.*\Z", re.IGNORECASE | re.MULTILINE | re.DOTALL)


def _content_without_calls(parser: str, text: str) -> str | None:
    """The assistant text outside the tool-call markup (``None`` if nothing is left)."""
    if parser == "hermes":
        rest = _HERMES_BLOCK.sub("", text)
    elif parser == "react":
        m = _REACT_ACTION.search(text)
        rest = text[:m.start()] if m else ""
    else:
        rest = ""
    return rest.strip() or None


def _toolset(specs: list[ToolSpec]) -> Any:
    """A ToolSet of the request's tools (names, schemas, first parameters), for the parsers; never called."""
    import pydantic

    from agentgym.tools import Tool, ToolSet

    def _never(**_kw: Any) -> str:
        raise ConfigurationError("a client's tool runs on the client")

    out = ToolSet()
    for s in specs:
        f = s["function"]
        params = dict(f.get("parameters") or {})
        with contextlib.suppress(ConfigurationError):  # a duplicate name: the first one wins
            out.add(Tool(f["name"], f.get("description", ""), _never, pydantic.BaseModel, params,
                         param_names=list((params.get("properties") or {}).keys())))
    return out

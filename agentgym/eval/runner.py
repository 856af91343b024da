"""Standardized evaluation: a recorded protocol, resumable per-episode JSONL and a summary.

:func:`run_eval` (or :func:`arun_eval` inside a running loop) evaluates one policy over one or
more envs. For every env it takes ``tasks`` tasks of ``split`` (spread evenly over the split's
stable task order), and runs ``samples`` episodes of each task for every seed in ``seeds``. An
episode's env seed is the eval seed; its sampling seed is derived from (seed, task index, sample).

Output directory:

* ``episodes.jsonl``: one full trajectory per finished episode, appended as it finishes. On a rerun
  with the same protocol, finished episodes are skipped (episodes that ended with an error are run
  again unless ``retry_errors=False``); the last record of an episode wins.
* ``summary.json``: per env and overall: success rate and mean reward with 95% CIs (a bootstrap over
  tasks, each task's seeds and samples kept together; Wilson where every task scores the same; see
  :func:`~agentgym.eval.stats.success_interval`),
  unbiased pass@k, turns, tokens, parse errors, truncation reasons, timings, success by task type
  and by number of turns, the tasks each env loaded, skipped (with reasons) and evaluated, and
  the full protocol (env and policy versions, template, parser,
  history mode, limits, sampling, seeds). Rewritten at the end and when interrupted
  (``"complete": false``).
* ``run.json``: the protocol fingerprint used to refuse resuming with different settings.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

import agentgym
from agentgym.config import ConfigModel
from agentgym.errors import ConfigurationError
from agentgym.eval.stats import mean_ci, pass_at_k, success_interval
from agentgym.policy import Policy, SamplingParams, capabilities_of
from agentgym.rollout.batching import micro_batch
from agentgym.rollout.engine import RolloutEngine
from agentgym.rollout.episode import TokenMode, uses_tokens
from agentgym.rollout.jsonl import append_jsonl, iter_jsonl
from agentgym.rollout.runtime import RolloutLimits, RolloutRuntime
from agentgym.rollout.workflow import GroupRequest, MultiTurnWorkflow
from agentgym.types import TaskSpec, Trajectory, TrajectoryGroup

__all__ = ["EPISODES_FILE", "SUMMARY_FILE", "EvalConfig", "arun_eval", "episode_key", "load_episodes",
           "run_eval", "select_tasks", "summarize"]

EPISODES_FILE = "episodes.jsonl"
SUMMARY_FILE = "summary.json"
RUN_FILE = "run.json"
ProgressFn = Callable[[int, int, Trajectory | None], None]  # (episodes done, episodes planned, the one that finished)


class EvalConfig(ConfigModel):
    """The evaluation protocol (everything that changes the numbers is recorded).

    A typed pydantic model (:class:`~agentgym.config.ConfigModel`): a bad value raises
    :class:`~agentgym.errors.ConfigurationError` naming every bad field, at construction or
    assignment. ``envs`` may be given positionally: ``EvalConfig(["agentgym/Demo-v0"], tasks=8)``.

    Attributes:
        envs: Env ids (at least one).
        split: Task split (``"test"``...). An env without a ``test`` split uses its held-out split
            (``valid_unseen`` for ALFWorld; see :func:`resolve_split`); the split used is recorded.
        split_overrides: ``{env_id: split}`` for envs that should use another split.
        tasks: Tasks per env (``None``: the whole split). Chosen evenly spread over the split.
        samples: Episodes per task and seed (K of pass@k).
        seeds: Env/sampling seeds (the CIs resample tasks, keeping each task's seeds together).
        max_turns: Policy turns per episode (``None``: the env's registered limit).
        max_total_tokens / max_wall_s: Further per-episode limits (truncate).
        max_tokens / temperature / top_p: Sampling per turn.
        concurrency: Episodes in flight.
        parser: Override the env's action parser (``hermes``/``json``/``react``).
        history_window: Keep only the last N turns in the prompt (message mode); ``None``: full.
        token_mode: ``"auto"`` (token-exact sessions when the policy supports them), ``"on"``, ``"off"``.
        env_kwargs: Extra constructor kwargs for every env.
        retry_errors: On resume, rerun episodes that ended with an error.
        policy_spec: The spec string the policy came from (recorded only).
        policy_timeout_s: One policy request, retries included; past it the episode is truncated.
        env_timeout_s: One env reset/step; past it the episode is an env error.
        env_workers: ``"thread"`` or ``"process"`` (each env in its own process; a step that
            overruns ``env_timeout_s`` is killed with it).
        sampling_seeds: Give every turn a sampling seed derived from (seed, task, sample, turn), so a
            rerun reproduces the run where the backend honours seeds (HFPolicy draws each seeded row
            from its own generator inside the running batch; vLLM honours per-request seeds).
        batch_requests: Coalesce concurrent turns into batched policy calls
            (:func:`~agentgym.rollout.batching.micro_batch`).
    """

    envs: list[str]
    split: str = "test"
    tasks: int | None = Field(default=None, ge=1)
    samples: int = Field(default=1, ge=1)
    seeds: list[int] = Field(default_factory=lambda: [0])
    max_turns: int | None = Field(default=None, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)
    max_wall_s: float | None = Field(default=None, gt=0)
    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    concurrency: int = Field(default=16, ge=1)
    parser: str | None = None
    history_window: int | None = Field(default=None, ge=0)
    token_mode: TokenMode = "auto"
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    retry_errors: bool = True
    policy_spec: str | None = None
    policy_timeout_s: float = Field(default=600.0, gt=0)
    env_timeout_s: float = Field(default=300.0, gt=0)
    env_workers: Literal["thread", "process"] = "thread"
    sampling_seeds: bool = True
    batch_requests: bool = True
    split_overrides: dict[str, str] = Field(default_factory=dict)

    def __init__(self, envs: Sequence[str] | None = None, /, **data: Any) -> None:
        if envs is not None:
            if "envs" in data:
                raise ConfigurationError("EvalConfig: envs given twice (positionally and by keyword).")
            data["envs"] = envs
        super().__init__(**data)

    @field_validator("envs")
    @classmethod
    def _some_envs(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("give at least one env id (e.g. agentgym/Demo-v0)")
        return v

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("give at least one seed (e.g. [0, 1, 2])")
        if len(set(v)) != len(v):
            raise ValueError(f"seeds must be distinct, got {v}")
        return v

    @field_validator("parser")
    @classmethod
    def _known_parser(cls, v: str | None) -> str | None:
        from agentgym.parsers import list_parsers

        if v is not None and v not in list_parsers():
            raise ValueError(f"unknown parser {v!r}; choose one of {', '.join(list_parsers())}")
        return v

    def limits(self) -> RolloutLimits:
        return RolloutLimits(self.max_turns, self.max_total_tokens, self.max_wall_s, self.env_timeout_s,
                             self.policy_timeout_s)

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens)

    def fingerprint(self) -> dict[str, Any]:
        """Settings that must match to resume into the same directory."""
        d = self.model_dump()
        for k in ("envs", "tasks", "seeds", "concurrency", "retry_errors", "policy_timeout_s", "env_timeout_s", "env_workers",
                  "batch_requests"):
            d.pop(k)  # more envs/tasks/seeds may be added on resume; these do not change results
        return d


TEST_SPLIT_FALLBACKS = ("valid_unseen", "validation", "valid", "dev", "eval")


def resolve_split(env_id: str, splits: Sequence[str] | None, config: EvalConfig) -> str:
    """The split to use for ``env_id``: a per-env override, the requested split, or for ``"test"``
    on an env without one, its held-out split (first of :data:`TEST_SPLIT_FALLBACKS`).
    """
    wanted = config.split_overrides.get(env_id, config.split)
    if splits is None or wanted in splits:
        return wanted
    if wanted == "test" and env_id not in config.split_overrides:
        for alt in TEST_SPLIT_FALLBACKS:
            if alt in splits:
                return alt
    raise ConfigurationError(
        f"{env_id} has no split {wanted!r}; its splits are: {', '.join(splits)}. "
        f"Pick one for this env with --split {config.split},{env_id}={splits[-1]}.")


def episode_key(env_id: str, task_id: str, seed: int | None, sample: int) -> str:
    return f"{env_id}|{task_id}|seed={seed}|sample={sample}"


def select_tasks(pool: Sequence[TaskSpec], n: int | None) -> list[TaskSpec]:
    """``n`` tasks spread evenly over ``pool`` (stable order); all of them if ``n`` is None or larger."""
    if n is None or n >= len(pool):
        return list(pool)
    return [pool[(i * len(pool)) // n] for i in range(n)]


def load_episodes(out: str | Path) -> dict[str, Trajectory]:
    """The last record of every episode in ``out/episodes.jsonl`` (by eval key)."""
    path = Path(out) / EPISODES_FILE
    latest: dict[str, Trajectory] = {}
    if path.exists():
        for t in iter_jsonl(path):
            key = t.info.get("eval_key")
            if isinstance(key, str):
                latest[key] = t
    return latest


def _describe_policy(policy: Policy, spec: str | None) -> dict[str, Any]:
    try:
        d = dict(policy.describe())
    except Exception as e:  # describing must never break an eval
        d = {"policy_id": policy.policy_id, "describe_error": f"{type(e).__name__}: {e}"}
    d = {k: v for k, v in d.items() if _jsonable(v)}
    d["spec"] = spec
    d.setdefault("token_in_token_out", uses_tokens(policy))
    return d


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def _load_report(env: Any, split: str, evaluated: int) -> dict[str, Any] | None:
    """The env's own account of loaded and skipped tasks (``AgentEnv.load_report``, read through
    wrappers like ``tasks``), plus how many of them this run evaluates."""
    try:
        fn = env.get_wrapper_attr("load_report")
    except AttributeError:
        return None
    report = dict(fn(split))
    report["evaluated"] = evaluated
    return report


def _env_protocol(env_id: str, env: Any, split: str, chosen: list[TaskSpec], pool_size: int,
                  reset_info: dict[str, Any]) -> dict[str, Any]:
    from agentgym.registration import env_entry

    e = env_entry(env_id)
    inner = env.unwrapped
    tools = [t.get("function", {}).get("name") for t in reset_info.get("tools") or [] if isinstance(t, dict)]
    return {
        "id": env_id,
        "version": env_id.rsplit("-v", 1)[-1] if "-v" in env_id else None,
        "entry_point": e.entry_point,
        "class": f"{type(inner).__module__}.{type(inner).__qualname__}",
        "family": e.family,
        "plugin": e.plugin or None,
        "max_episode_steps": getattr(getattr(env, "spec", None), "max_episode_steps", None),
        "parser": reset_info.get("parser"),
        "tools": tools,
        "split": split,
        "split_size": pool_size,
        "task_ids": [t.task_id for t in chosen],
    }


def _make_env(env_id: str, config: EvalConfig) -> Any:
    from agentgym.registration import make

    kw = dict(config.env_kwargs)
    if config.parser is not None:
        kw["parser"] = config.parser
    if config.max_turns is not None:
        kw["max_episode_steps"] = config.max_turns
    return make(env_id, **kw)


async def _plan_env(runtime: RolloutRuntime, env_id: str, config: EvalConfig) -> tuple[dict[str, Any], list[TaskSpec]]:
    """Open ``env_id`` once: resolve its split, choose its tasks, and record its protocol entry."""
    async with runtime.env(env_id, timeout=config.env_timeout_s) as env:
        try:  # the env's public API, through wrappers (an env served over HTTP answers the same)
            splits = env.get_wrapper_attr("splits")
            tasks_fn = env.get_wrapper_attr("tasks")
        except AttributeError:
            raise ConfigurationError(f"{env_id} is not an AgentEnv (it has no tasks()); it cannot be evaluated.") from None
        split = resolve_split(env_id, splits, config)
        pool = list(await runtime.call(tasks_fn, split, timeout=config.env_timeout_s))
        if not pool:
            raise ConfigurationError(f"{env_id} split {split!r} has no tasks.")
        chosen = select_tasks(pool, config.tasks)
        _, info = await runtime.call(env.reset, seed=0, options={"task_id": chosen[0].task_id},
                                     timeout=config.env_timeout_s)
        proto = _env_protocol(env_id, env, split, chosen, len(pool), dict(info))
        proto["tasks"] = await runtime.call(_load_report, env, split, len(chosen), timeout=config.env_timeout_s)
    return proto, chosen


def _requests(plan: list[tuple[str, int, TaskSpec]], envs_proto: dict[str, Any], config: EvalConfig,
              finished: set[str]) -> list[GroupRequest]:
    """One single-episode group per (seed, task, sample) not already ``finished``."""
    out: list[GroupRequest] = []
    for seed in config.seeds:
        for env_id, ti, task in plan:
            for s in range(config.samples):
                key = episode_key(env_id, task.task_id, seed, s)
                if key in finished:
                    continue
                out.append(GroupRequest(
                    env_id, task.task_id, seed=seed, group_id=key,
                    sampling_seed=(seed * 100_003 + ti * 101 + s) % (2**31 - 1) if config.sampling_seeds else None,
                    info={"eval_key": key, "sample": s, "task_index": ti, "split": envs_proto[env_id]["split"]}))
    return out


def _write_summary(out: Path, config: EvalConfig, protocol: dict[str, Any], plan: list[tuple[str, int, TaskSpec]],
                   *, complete: bool, wall_s: float) -> dict[str, Any]:
    summary = summarize(load_episodes(out).values(), config, protocol, plan_keys=_plan_keys(plan, config))
    summary["complete"] = complete
    summary["run_wall_s"] = wall_s
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))
    return summary


async def arun_eval(policy: Policy, config: EvalConfig, out: str | Path, *,
                    progress: ProgressFn | None = None) -> dict[str, Any]:
    """:func:`run_eval` inside a running event loop."""
    from agentgym.registration import env_entry

    config = EvalConfig.from_dict(config.model_dump())  # a validated copy: later edits by the caller do not leak in
    out = Path(out)
    env_ids = [env_entry(e).id for e in config.envs]  # UnknownEnvError with a did-you-mean
    if len(set(env_ids)) != len(env_ids):
        raise ConfigurationError(f"an env is listed twice: {config.envs}.")
    out.mkdir(parents=True, exist_ok=True)
    _check_resume(out, config)
    t_start = time.monotonic()
    runtime = RolloutRuntime(max_concurrency=config.concurrency, env_factory=functools.partial(_make_env, config=config),
                             env_workers=config.env_workers)  # type: ignore[arg-type]
    try:
        envs_proto: dict[str, Any] = {}
        plan: list[tuple[str, int, TaskSpec]] = []
        for env_id in env_ids:
            envs_proto[env_id], chosen = await _plan_env(runtime, env_id, config)
            plan += [(env_id, i, t) for i, t in enumerate(chosen)]
        protocol = _protocol(policy, config, envs_proto)
        (out / RUN_FILE).write_text(json.dumps({"fingerprint": config.fingerprint(), "protocol": protocol},
                                               indent=2, default=str))
        finished = {k for k, t in load_episodes(out).items() if t.error is None or not config.retry_errors}
        requests = _requests(plan, envs_proto, config, finished)
        total = len(plan) * len(config.seeds) * config.samples
        n_done = total - len(requests)
        if progress is not None:
            progress(n_done, total, None)
        batch = config.batch_requests and not capabilities_of(policy).env_side
        runner_policy = micro_batch(policy, max_batch=config.concurrency, runtime=runtime) if batch else policy
        wf = MultiTurnWorkflow(runner_policy, 1, sampling=config.sampling(), limits=config.limits(),
                               token_mode=config.token_mode, history_window=config.history_window)

        def on_group(req: GroupRequest, group: TrajectoryGroup) -> None:  # each episode is kept as it finishes
            nonlocal n_done
            for t in group.trajectories:
                t.info.update(req.info)
            append_jsonl(out / EPISODES_FILE, group.trajectories)
            n_done += len(group.trajectories)
            if progress is not None:
                for t in group.trajectories:
                    progress(n_done, total, t)

        complete = False
        try:
            await RolloutEngine(runtime).run(wf, requests, on_group=on_group)
            complete = True
        finally:  # also when interrupted: the summary of what finished, marked incomplete
            summary = _write_summary(out, config, protocol, plan, complete=complete, wall_s=time.monotonic() - t_start)
        return summary
    finally:
        runtime.close(wait=False)


def run_eval(policy: Policy, config: EvalConfig, out: str | Path, *,
             progress: ProgressFn | None = None) -> dict[str, Any]:
    """Evaluate ``policy`` under the protocol ``config``, writing into ``out``: what ``agentgym eval`` runs.

    Example::

        from agentgym.eval import EvalConfig, run_eval
        from agentgym.policies import from_spec

        policy = from_spec("hf:smollm2-135m-instruct")     # or "vllm:...", "openai:URL#model", "expert"
        config = EvalConfig(["agentgym/Demo-v0"], split="test", tasks=8, samples=2, seeds=[0, 1], max_turns=8)
        summary = run_eval(policy, config, "runs/demo-smollm2")
        print(summary["envs"]["agentgym/Demo-v0"]["success"])   # {"mean", "ci95", "per_seed", ...}

    Rerunning into the same ``out`` with the same protocol resumes: finished episodes are kept and
    only the rest run (more seeds or tasks may be added). The caller owns ``policy`` (close it with
    ``await policy.aclose()``, or use it as an async context manager). Inside a running event loop,
    ``await`` :func:`arun_eval` instead.

    Args:
        policy: Any :class:`~agentgym.policy.Policy` (build one from a spec string with
            :func:`agentgym.policies.from_spec`).
        config: The protocol: envs, split, tasks, samples, seeds, limits, sampling.
        out: Output directory: ``episodes.jsonl`` (one trajectory per episode, appended as each
            finishes), ``summary.json`` (the returned dict) and ``run.json`` (the protocol).
        progress: Called as ``progress(done, total, trajectory)`` after each episode (``trajectory``
            is ``None`` for the initial call).

    Returns:
        The summary: ``envs`` (per env: ``success`` and ``reward`` with 95% CIs over seeds,
        ``pass_at_k``, ``turns``, ``tokens``, ``parse_errors``, ``truncated_reasons``, ``errors``,
        ``timings``, ``by_task_type``, ``tasks`` loaded/skipped/evaluated), ``overall``, ``protocol``,
        ``expected_episodes``, ``finished_episodes``, ``complete`` and ``run_wall_s``.

    Raises:
        ConfigurationError: an unknown env id (:class:`~agentgym.errors.UnknownEnvError`), a split an
            env lacks, or ``out`` holding a run with another protocol.
    """
    return asyncio.run(arun_eval(policy, config, out, progress=progress))


def _plan_keys(plan: list[tuple[str, int, TaskSpec]], config: EvalConfig) -> set[str]:
    return {episode_key(e, t.task_id, seed, s) for seed in config.seeds for e, _, t in plan
            for s in range(config.samples)}


def _check_resume(out: Path, config: EvalConfig) -> None:
    run = out / RUN_FILE
    if not run.exists():
        return
    try:
        prev = json.loads(run.read_text()).get("fingerprint", {})
    except (json.JSONDecodeError, OSError):
        return
    mine = json.loads(json.dumps(config.fingerprint(), default=str))
    diff = sorted(k for k in set(prev) | set(mine) if prev.get(k) != mine.get(k))
    if diff:
        detail = ", ".join(f"{k}: {prev.get(k)!r} -> {mine.get(k)!r}" for k in diff)
        raise ConfigurationError(
            f"{out} holds a run with a different protocol ({detail}). Resuming would mix results: "
            "use another --out directory, or delete this one to start over.")


def _protocol(policy: Policy, config: EvalConfig, envs: dict[str, Any]) -> dict[str, Any]:
    token = uses_tokens(policy, config.token_mode)
    pol = _describe_policy(policy, config.policy_spec)
    return {
        "agentgym_version": agentgym.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "command": " ".join(sys.argv) if sys.argv and "agentgym" in sys.argv[0] else None,
        "envs": envs,
        "policy": pol,
        "template": ("policy's own chat template" + (f" (sha1 {pol['chat_template_sha1']})"
                                                     if "chat_template_sha1" in pol else ""))
        if token or "chat_template_sha1" in pol else "none (policy consumes messages)",
        "parser": {e: v["parser"] for e, v in envs.items()},
        "parser_override": config.parser,
        "history": "full" if config.history_window is None or token else f"last {config.history_window} turns",
        "token_mode": "token-exact session" if token else "messages",
        "limits": config.limits().to_dict(),
        "max_turns": {e: (config.max_turns or v["max_episode_steps"]) for e, v in envs.items()},
        "sampling": asdict(config.sampling()),
        "sampling_seed": "derived from (seed, task index, sample, turn)" if config.sampling_seeds else None,
        "batch_requests": config.batch_requests,
        "seeds": list(config.seeds),
        "samples": config.samples,
        "split": config.split,
        "splits_used": {e: v["split"] for e, v in envs.items()},
        "tasks": config.tasks,
        "task_selection": "evenly spread over the split's stable order",
        "env_kwargs": config.env_kwargs,
    }


def _ks(samples: int) -> list[int]:
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= samples]
    if samples not in ks:
        ks.append(samples)
    return ks


def _block(trajs: list[Trajectory], seeds: Sequence[int], samples: int) -> dict[str, Any]:
    """Summary statistics of one env's (or all envs') episodes."""
    by_seed: dict[Any, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_seed[t.info.get("seed")].append(t)
    seed_list = [s for s in seeds if by_seed.get(s)]
    succ = [sum(t.success for t in by_seed[s]) / len(by_seed[s]) for s in seed_list]
    rew = [sum(t.reward for t in by_seed[s]) / len(by_seed[s]) for s in seed_list]
    n = len(trajs)
    by_task = [((t.env_id, t.task_id), float(t.success)) for t in trajs]
    success = {**success_interval(by_task), "n": len(seed_list), "per_seed": succ}  # n: seeds
    reward = {**success_interval([((t.env_id, t.task_id), float(t.reward)) for t in trajs], binary=False,
                                 bounds=(-math.inf, math.inf)), "n": len(seed_list), "per_seed": rew}
    passk: dict[str, Any] = {}
    for k in _ks(samples):
        vals = []
        for s in seed_list:
            per_task: dict[tuple[str, str], list[bool]] = defaultdict(list)
            for t in by_seed[s]:
                per_task[(t.env_id, t.task_id)].append(t.success)
            scores = [pass_at_k(len(v), sum(v), k) for v in per_task.values() if len(v) >= k]
            if scores:
                vals.append(sum(scores) / len(scores))
        if vals:
            passk[f"pass@{k}"] = mean_ci(vals)
    turns = [t.num_turns for t in trajs]
    gen = [int(t.metrics.get("generated_tokens", t.num_generated_tokens)) for t in trajs]
    prompt = [int(t.metrics.get("prompt_tokens", 0)) for t in trajs]
    perr = [int(t.metrics.get("parse_errors", 0) or 0) for t in trajs]
    reasons: dict[str, int] = defaultdict(int)
    for t in trajs:
        if t.truncated:
            reasons[str(t.truncated_reason or "unknown")] += 1
    by_type: dict[str, list[bool]] = defaultdict(list)
    by_turns: dict[int, list[bool]] = defaultdict(list)
    for t in trajs:
        by_type[str(t.info.get("task_type", "default"))].append(t.success)
        by_turns[t.num_turns].append(t.success)
    walls = [t.timing.get("wall_s", 0.0) for t in trajs]

    def _mean(xs: Sequence[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {
        "episodes": n,
        "errors": sum(1 for t in trajs if t.error is not None),
        "error_examples": sorted({t.error for t in trajs if t.error})[:5],
        "success": success,
        "reward": reward,
        "pass_at_k": passk,
        "terminated": sum(t.terminated for t in trajs),
        "truncated": sum(t.truncated for t in trajs),
        "truncated_reasons": dict(reasons),
        "turns": {"mean": _mean(turns), "max": max(turns) if turns else None,
                  "total": sum(turns)},
        "tokens": {"generated_mean": _mean(gen), "generated_total": sum(gen), "prompt_mean": _mean(prompt),
                   "prompt_total": sum(prompt)},
        "parse_errors": {"total": sum(perr), "per_episode": _mean(perr),
                         "per_turn": sum(perr) / sum(turns) if sum(turns) else None},
        "timings": {"episode_wall_mean_s": _mean(walls),
                    "policy_s_total": sum(t.timing.get("policy_s", 0.0) for t in trajs),
                    "env_s_total": sum(t.timing.get("env_s", 0.0) + t.timing.get("reset_s", 0.0) for t in trajs)},
        "by_task_type": {k: {"episodes": len(v), "success": sum(v) / len(v)} for k, v in sorted(by_type.items())},
        "by_turns": {str(k): {"episodes": len(v), "success": sum(v) / len(v)} for k, v in sorted(by_turns.items())},
    }


def summarize(trajectories: Any, config: EvalConfig, protocol: dict[str, Any],
              plan_keys: set[str] | None = None) -> dict[str, Any]:
    """Build ``summary.json`` from episode records (only those in the plan, if given).

    Episodes that ended with an error count as failures (reward 0) and are also counted in
    ``errors``; truncated episodes count as failures unless the env reported success.
    """
    trajs = [t for t in trajectories if plan_keys is None or t.info.get("eval_key") in plan_keys]
    envs: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        envs[t.env_id].append(t)
    per_env = {e: _block(ts, config.seeds, config.samples) for e, ts in sorted(envs.items())}
    for e, b in per_env.items():  # loaded / skipped / evaluated task counts, as the env reported them
        b["tasks"] = protocol.get("envs", {}).get(e, {}).get("tasks")
    overall = _block(trajs, config.seeds, config.samples) if trajs else {}
    means = [b["success"]["mean"] for b in per_env.values() if b["success"]["mean"] is not None]
    if overall:
        overall["success_macro"] = sum(means) / len(means) if means else None
    return {
        "expected_episodes": len(plan_keys) if plan_keys is not None else None,
        "finished_episodes": len(trajs),
        "envs": per_env,
        "overall": overall,
        "protocol": protocol,
    }

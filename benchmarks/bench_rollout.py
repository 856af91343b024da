"""Rollout throughput: this engine's concurrent workflow vs a synchronous turn-by-turn batch loop.

Both run the same episodes (the same env, tasks, policy and sampling) in the same process:

* **baseline (verl-style)**: episodes go in waves of ``B``. Each turn, the requests of every
  still-running episode of the wave are sent as one batch; then every env is stepped, one after
  the other, in the loop's thread; the next wave starts when the slowest episode of this one ends.
* **engine**: :class:`~agentgym.rollout.RolloutEngine` + :class:`~agentgym.rollout.MultiTurnWorkflow`,
  ``B`` episodes in flight, each turn its own request, coalesced into backend batches by
  :func:`~agentgym.rollout.micro_batch`; env steps in the worker pool; a finished episode's slot is
  refilled at once.

Policies:

* ``simulated``: a *scripted* policy with a simulated static-batching backend (clearly not a model):
  one call at a time; a call costs ``prefill + max_len_in_batch * (t_tok + t_row * batch)``; each
  completion's length is drawn in 16..128 tokens; actions are the Demo env's expert, except that 30% of
  turns guess at random, so episodes differ in length. Env steps sleep ``--env-ms`` (a cheap tool call).
* ``hf``: SmolLM2-135M-Instruct through ``HFPolicy`` on CPU (token-in/token-out), if installed and prepared.

Writes ``benchmarks/results/rollout.json``. ``--quick`` runs a smaller simulated setup and a tiny HF one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium

import agentgym
from agentgym.policy import Generation, GenRequest, Policy, SamplingParams
from agentgym.rollout import (
    GroupRequest,
    MultiTurnWorkflow,
    RolloutEngine,
    RolloutLimits,
    RolloutRuntime,
    micro_batch,
)
from agentgym.rollout.episode import Conversation, env_tool_specs

ENV = "agentgym/Demo-v0"
RESULTS = Path(__file__).parent / "results" / "rollout.json"


class SlowStep(gymnasium.Wrapper):  # type: ignore[type-arg]
    """Blocking sleep in every step: a cheap tool call."""

    def __init__(self, env: gymnasium.Env[Any, Any], seconds: float) -> None:
        super().__init__(env)
        self.seconds = seconds

    def step(self, action: Any) -> Any:
        if self.seconds:
            time.sleep(self.seconds)
        return self.env.step(action)


class SimulatedBatchPolicy:
    """Scripted actions behind a simulated static-batching backend (see the module docstring)."""

    policy_id = "simulated"

    def __init__(self, prefill_s: float = 0.02, t_tok: float = 0.0015, t_row: float = 0.0001,
                 explore: float = 0.3) -> None:
        self.prefill_s, self.t_tok, self.t_row, self.explore = prefill_s, t_tok, t_row, explore
        self._lock = asyncio.Lock()
        self.batches: list[int] = []

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        async with self._lock:
            outs = []
            lengths = []
            for r in requests:
                key = f"{r.metadata.get('group_id')}|{len(r.messages or [])}"
                rng = random.Random(zlib.crc32(key.encode()))
                n = rng.randint(16, 128)
                lengths.append(n)
                if rng.random() < self.explore or r.oracle is None:
                    text = f'<tool_call>{{"name": "guess", "arguments": {{"n": {rng.randint(0, 63)}}}}}</tool_call>'
                else:
                    text = str(r.oracle())
                outs.append(Generation(text=text, token_ids=[1] * n, logprobs=[-1.0] * n))
            self.batches.append(len(requests))
            await asyncio.sleep(self.prefill_s + max(lengths) * (self.t_tok + self.t_row * len(requests)))
            return outs


def make_env(env_ms: float, max_turns: int) -> gymnasium.Env[Any, Any]:
    return SlowStep(agentgym.make(ENV, max_episode_steps=max_turns), env_ms / 1000)


async def run_baseline(policy: Policy, tasks: list[str], batch: int, sampling: SamplingParams, max_turns: int,
                       env_ms: float) -> dict[str, Any]:
    """Synchronous turn-by-turn batch loop in waves of ``batch`` episodes."""
    envs = [make_env(env_ms, max_turns) for _ in range(min(batch, len(tasks)))]
    t0 = time.monotonic()
    tokens = episodes = successes = turns = 0
    for w in range(0, len(tasks), batch):
        wave = tasks[w : w + batch]
        convs: list[Conversation] = []
        metas: list[dict[str, Any]] = []
        for env, (i, task) in zip(envs, enumerate(wave, w), strict=False):
            obs, _ = env.reset(seed=0, options={"task_id": task})
            c = Conversation(policy, env_tool_specs(env))
            c.observe(list(obs))
            convs.append(c)
            metas.append({"task_id": task, "member": 0, "group_id": f"{task}#{i}"})
        active = list(range(len(wave)))
        n_turns = [0] * len(wave)
        while active:
            reqs = [convs[k].request(sampling, convs[k].next_prompt_ids(), envs[k].unwrapped.expert_action,  # type: ignore[attr-defined]
                                     metas[k]) for k in active]
            gens = await policy.generate(reqs)
            still = []
            for k, gen in zip(active, gens, strict=True):
                convs[k].add_generation(gen)
                tokens += len(gen.token_ids)
                obs, _, term, trunc, info = envs[k].step(gen.as_action())  # blocking, in the loop thread
                n_turns[k] += 1
                if term or trunc or n_turns[k] >= max_turns:
                    episodes += 1
                    successes += int(bool(info.get("success")))
                    turns += n_turns[k]
                else:
                    convs[k].observe(list(obs))
                    still.append(k)
            active = still
    wall = time.monotonic() - t0
    for env in envs:
        env.close()
    return {"wall_s": wall, "episodes": episodes, "episodes_per_s": episodes / wall, "generated_tokens": tokens,
            "tokens_per_s": tokens / wall, "success": successes / max(1, episodes), "turns": turns}


async def run_engine(policy: Policy, tasks: list[str], batch: int, sampling: SamplingParams, max_turns: int,
                     env_ms: float) -> dict[str, Any]:
    rt = RolloutRuntime(max_concurrency=batch, env_factory=lambda _eid: make_env(env_ms, max_turns))
    batcher = micro_batch(policy, max_batch=batch, runtime=rt)
    wf = MultiTurnWorkflow(batcher, 1, sampling=sampling, limits=RolloutLimits(max_turns=max_turns))
    reqs = [GroupRequest(ENV, t, seed=0, group_id=f"{t}#{i}") for i, t in enumerate(tasks)]
    t0 = time.monotonic()
    with rt:
        groups = await RolloutEngine(rt).run(wf, reqs)
    wall = time.monotonic() - t0
    trajs = [t for g in groups for t in g]
    tokens = sum(t.num_generated_tokens for t in trajs)
    return {"wall_s": wall, "episodes": len(trajs), "episodes_per_s": len(trajs) / wall, "generated_tokens": tokens,
            "tokens_per_s": tokens / wall, "success": sum(t.success for t in trajs) / max(1, len(trajs)),
            "turns": sum(t.num_turns for t in trajs), "errors": sum(t.error is not None for t in trajs),
            "mean_batch": sum(batcher.batch_sizes) / max(1, len(batcher.batch_sizes))}


def task_list(n: int) -> list[str]:
    pool = [t.task_id for t in agentgym.make(ENV).unwrapped.tasks("test")]  # type: ignore[attr-defined]
    return [pool[i % len(pool)] for i in range(n)]


async def compare(name: str, policy_factory: Any, n: int, batch: int, sampling: SamplingParams, max_turns: int,
                  env_ms: float) -> dict[str, Any]:
    tasks = task_list(n)
    pol = policy_factory()
    # simulated: request metadata keys the scripted choices, so both methods see the same episodes
    base = await run_baseline(pol, tasks, batch, sampling, max_turns, env_ms)
    eng = await run_engine(pol, tasks, batch, sampling, max_turns, env_ms)
    res = {"policy": name, "env": ENV, "episodes": n, "concurrency": batch, "max_turns": max_turns,
           "env_step_ms": env_ms, "max_tokens": sampling.max_tokens, "baseline_sync_batch": base, "engine": eng,
           "speedup_episodes_per_s": eng["episodes_per_s"] / base["episodes_per_s"],
           "speedup_tokens_per_s": eng["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None}
    print(f"\n[{name}] {n} episodes, B={batch}, max_turns={max_turns}, env step {env_ms} ms")
    for label, r in (("baseline (sync batch loop)", base), ("engine (concurrent)", eng)):
        print(f"  {label:28s} wall {r['wall_s']:7.2f} s  {r['episodes_per_s']:7.2f} ep/s  "
              f"{r['tokens_per_s']:9.1f} gen tok/s  success {r['success']:.2f}  turns {r['turns']}")
    print(f"  speedup: {res['speedup_episodes_per_s']:.2f}x episodes/s")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs (~1 min)")
    ap.add_argument("--skip-hf", action="store_true", help="skip the SmolLM2 run")
    ap.add_argument("--env-ms", type=float, default=10.0, help="simulated tool latency per env step")
    args = ap.parse_args()
    results: dict[str, Any] = {
        "benchmark": "rollout throughput: concurrent engine vs synchronous turn-by-turn batch loop",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_start": os.getloadavg(), "threads": threading.active_count()},
        "note": "Measured on a shared machine under CPU contention from other jobs; compare the two methods "
                "within one run, not across runs. 'simulated' is a scripted policy with a simulated "
                "static-batching latency model, not a model.",
        "runs": [],
    }
    sim = dict(n=64, batch=16, max_turns=12) if not args.quick else dict(n=32, batch=8, max_turns=12)
    results["runs"].append(asyncio.run(compare(
        "simulated", SimulatedBatchPolicy, sim["n"], sim["batch"], SamplingParams(max_tokens=128), sim["max_turns"],
        args.env_ms)))
    if not args.skip_hf:
        try:
            from agentgym.policies.hf import HFPolicy
            from agentgym.policies.models import is_prepared

            ok = is_prepared("smollm2-135m-instruct")
        except ImportError:
            ok = False
        if ok:
            hf = dict(n=16, batch=8, max_turns=3) if not args.quick else dict(n=8, batch=4, max_turns=2)
            results["runs"].append(asyncio.run(compare(
                "hf:smollm2-135m-instruct (CPU)", lambda: HFPolicy("smollm2-135m-instruct", policy_id="hf"),
                hf["n"], hf["batch"], SamplingParams(max_tokens=48, temperature=1.0), hf["max_turns"], args.env_ms)))
        else:
            print("SmolLM2 not prepared (agentgym models prepare smollm2-135m-instruct): HF run skipped")
    results["machine"]["loadavg_end"] = os.getloadavg()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()

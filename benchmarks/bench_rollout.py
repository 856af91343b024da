"""Rollout throughput: this engine's concurrent workflow vs a verl-style synchronous batch loop.

Both run the same episodes (the same env, tasks, policy and sampling) in the same process, one after
the other, with the same warm-up:

* **baseline (verl-style)**: episodes go in waves of ``B``. Each turn, the requests of every
  still-running episode of the wave go out as one batched call; then every env of the wave is
  stepped *concurrently* in a thread pool (as verl runs tool calls); the next wave starts when the
  slowest episode of this one ends. Token-exact sessions, like the engine.
* **engine**: :class:`~agentgym.rollout.RolloutEngine` + :class:`~agentgym.rollout.MultiTurnWorkflow`,
  ``B`` episodes in flight, each turn its own request (coalesced into batches by
  :func:`~agentgym.rollout.micro_batch` for the static-batching backend); env steps in the worker
  pool; a finished episode's slot is refilled at once.

Policies:

* ``simulated``: a *scripted* Demo-v0 player (binary search read from the conversation, plus a random
  guess on 30% of turns, keyed by episode and turn so both methods play the same episodes) behind a
  simulated static-batching backend (clearly not a model): one call at a time; a call costs
  ``prefill + max_len_in_batch * (t_tok + t_row * batch)``; completion lengths are drawn in 16..128.
  Env steps sleep ``--env-ms`` (a cheap tool call).
* ``vllm``: SmolLM2-135M-Instruct through ``VLLMPolicy`` (continuous batching, token in/token out) on
  ALFWorld-v0, if vLLM is installed: real generation, real env.

Writes ``benchmarks/results/rollout.json``. Run: ``python benchmarks/bench_rollout.py [--quick] [--skip-vllm]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gymnasium
from agentgym.envs.demo import expert_guess
from provenance import Provenance  # benchmarks/ is on sys.path when a script runs

import agentgym
from agentgym.policy import Capabilities, Generation, GenRequest, Policy, PolicyLifecycle, SamplingParams
from agentgym.rollout import (
    GroupRequest,
    MultiTurnWorkflow,
    RolloutEngine,
    RolloutLimits,
    RolloutRuntime,
    micro_batch,
)
from agentgym.rollout.episode import Conversation, TruncatedEpisode, action_of

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


class SimulatedBatchPolicy(PolicyLifecycle):
    """Scripted Demo actions behind a simulated static-batching backend (see the module docstring)."""

    policy_id = "simulated"
    capabilities = Capabilities()

    def __init__(self, prefill_s: float = 0.02, t_tok: float = 0.0015, t_row: float = 0.0001,
                 explore: float = 0.3) -> None:
        self.prefill_s, self.t_tok, self.t_row, self.explore = prefill_s, t_tok, t_row, explore
        self._lock = asyncio.Lock()
        self.batches: list[int] = []

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        async with self._lock:
            outs, lengths = [], []
            for r in requests:
                msgs = r.messages or []
                key = f"{r.metadata.get('group_id')}|{len(msgs)}"
                rng = random.Random(zlib.crc32(key.encode()))
                n = rng.randint(16, 128)
                lengths.append(n)
                guess = rng.randint(0, 63) if rng.random() < self.explore else expert_guess(msgs)
                text = f'<tool_call>{{"name": "guess", "arguments": {{"n": {guess}}}}}</tool_call>'
                outs.append(Generation(text=text, token_ids=[1] * n, logprobs=[-1.0] * n))
            self.batches.append(len(requests))
            await asyncio.sleep(self.prefill_s + max(lengths) * (self.t_tok + self.t_row * len(requests)))
            return outs

    async def aclose(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"policy_id": self.policy_id, "backend": "simulated static batching"}


def make_env(env_id: str, env_ms: float, max_turns: int) -> gymnasium.Env[Any, Any]:
    return SlowStep(agentgym.make(env_id, max_episode_steps=max_turns), env_ms / 1000)


async def run_baseline(policy: Policy, env_id: str, tasks: list[str], batch: int, sampling: SamplingParams,
                       max_turns: int, env_ms: float) -> dict[str, Any]:
    """verl-style: waves of ``batch`` episodes; one batched call per turn; env steps run concurrently."""
    pool = ThreadPoolExecutor(max_workers=batch)
    loop = asyncio.get_running_loop()
    envs = [make_env(env_id, env_ms, max_turns) for _ in range(min(batch, len(tasks)))]
    t0 = time.monotonic()
    tokens = episodes = successes = turns = 0
    for w in range(0, len(tasks), batch):
        wave = tasks[w: w + batch]
        resets = await asyncio.gather(*(loop.run_in_executor(pool, lambda e=env, t=task: e.reset(
            seed=0, options={"task_id": t})) for env, task in zip(envs, wave, strict=False)))
        convs: list[Conversation] = []
        metas: list[dict[str, Any]] = []
        for i, (obs, info) in enumerate(resets, w):
            c = Conversation(policy, list(info.get("tools") or []) or None)
            c.observe(list(obs))
            convs.append(c)
            metas.append({"task_id": tasks[i], "member": 0, "group_id": f"{tasks[i]}#{i}"})
        active = list(range(len(wave)))
        n_turns = [0] * len(wave)
        while active:
            ready, reqs = [], []
            for k in active:
                try:
                    reqs.append(convs[k].prepare(sampling, metadata=metas[k]))
                    ready.append(k)
                except TruncatedEpisode:
                    episodes += 1
                    turns += n_turns[k]
            gens = await policy.generate(reqs) if reqs else []
            for k, gen in zip(ready, gens, strict=True):
                convs[k].complete(gen)
                tokens += len(gen.token_ids)
            steps = await asyncio.gather(*(loop.run_in_executor(pool, envs[k].step, action_of(convs[k])) for k in ready))
            still = []
            for k, (obs, _, term, trunc, info) in zip(ready, steps, strict=True):
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
    pool.shutdown()
    for env in envs:
        env.close()
    return {"wall_s": wall, "episodes": episodes, "episodes_per_s": episodes / wall, "generated_tokens": tokens,
            "tokens_per_s": tokens / wall, "success": successes / max(1, episodes), "turns": turns}


async def run_engine(policy: Policy, env_id: str, tasks: list[str], batch: int, sampling: SamplingParams,
                     max_turns: int, env_ms: float, coalesce: bool) -> dict[str, Any]:
    rt = RolloutRuntime(max_concurrency=batch, env_factory=lambda eid: make_env(eid, env_ms, max_turns))
    pol = micro_batch(policy, max_batch=batch, runtime=rt) if coalesce else policy
    wf = MultiTurnWorkflow(pol, 1, sampling=sampling, limits=RolloutLimits(max_turns=max_turns))
    reqs = [GroupRequest(env_id, t, seed=0, group_id=f"{t}#{i}") for i, t in enumerate(tasks)]
    t0 = time.monotonic()
    with rt:
        groups = await RolloutEngine(rt).run(wf, reqs)
    wall = time.monotonic() - t0
    trajs = [t for g in groups for t in g]
    tokens = sum(t.num_generated_tokens for t in trajs)
    out = {"wall_s": wall, "episodes": len(trajs), "episodes_per_s": len(trajs) / wall, "generated_tokens": tokens,
           "tokens_per_s": tokens / wall, "success": sum(t.success for t in trajs) / max(1, len(trajs)),
           "turns": sum(t.num_turns for t in trajs), "errors": sum(t.error is not None for t in trajs)}
    if coalesce:
        sizes = pol.batch_sizes  # type: ignore[attr-defined]
        out["mean_batch"] = sum(sizes) / max(1, len(sizes))
    return out


def task_list(env_id: str, split: str, n: int) -> list[str]:
    pool = [t.task_id for t in agentgym.make(env_id).get_wrapper_attr("tasks")(split)]
    step = max(1, len(pool) // n)
    return [pool[(i * step) % len(pool)] for i in range(n)]


async def compare(name: str, policy: Policy, env_id: str, split: str, n: int, batch: int, sampling: SamplingParams,
                  max_turns: int, env_ms: float, coalesce: bool) -> dict[str, Any]:
    tasks = task_list(env_id, split, n)
    warm = tasks[: min(batch, 4)]
    await run_baseline(policy, env_id, warm, batch, sampling, 2, env_ms)  # equal warm-up for both
    await run_engine(policy, env_id, warm, batch, sampling, 2, env_ms, coalesce)
    base = await run_baseline(policy, env_id, tasks, batch, sampling, max_turns, env_ms)
    eng = await run_engine(policy, env_id, tasks, batch, sampling, max_turns, env_ms, coalesce)
    res = {"policy": name, "env": env_id, "episodes": n, "concurrency": batch, "max_turns": max_turns,
           "env_step_ms": env_ms, "max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
           "baseline_verl_style": base, "engine": eng,
           "speedup_episodes_per_s": eng["episodes_per_s"] / base["episodes_per_s"],
           "speedup_tokens_per_s": eng["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None}
    print(f"\n[{name}] {env_id}: {n} episodes, B={batch}, max_turns={max_turns}, env step {env_ms} ms")
    for label, r in (("baseline (verl-style)", base), ("engine (concurrent)", eng)):
        print(f"  {label:24s} wall {r['wall_s']:7.2f} s  {r['episodes_per_s']:7.3f} ep/s  "
              f"{r['tokens_per_s']:9.1f} gen tok/s  success {r['success']:.2f}  turns {r['turns']}")
    print(f"  speedup: {res['speedup_episodes_per_s']:.2f}x episodes/s, {res['speedup_tokens_per_s']:.2f}x tokens/s")
    return res


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "benchmark": "rollout throughput: concurrent engine vs verl-style synchronous batch loop (concurrent env steps)",
        "command": "python benchmarks/bench_rollout.py" + (" --quick" if args.quick else ""),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_start": os.getloadavg()},
        "note": "Both methods run in the same process on the same tasks after the same warm-up. 'simulated' is a "
                "scripted policy with a simulated static-batching latency model, not a model.",
        "runs": [],
    }
    sim = dict(n=64, batch=16, max_turns=12) if not args.quick else dict(n=32, batch=8, max_turns=12)
    results["runs"].append(await compare("simulated", SimulatedBatchPolicy(), "agentgym/Demo-v0", "test", sim["n"],
                                         sim["batch"], SamplingParams(max_tokens=128), sim["max_turns"], args.env_ms,
                                         coalesce=True))
    if not args.skip_vllm:
        try:
            from agentgym.policies.vllm import VLLMPolicy
        except ImportError:
            print("vLLM not installed: the SmolLM2 run is skipped")
        else:
            v = dict(n=32, batch=16, max_turns=8) if not args.quick else dict(n=8, batch=4, max_turns=4)
            pol = VLLMPolicy("smollm2-135m-instruct", policy_id="vllm", max_num_seqs=32, kv_cache_gib=2)
            try:
                results["runs"].append(await compare(
                    "vllm:smollm2-135m-instruct (CPU)", pol, "agentgym/ALFWorld-v0", "valid_seen", v["n"], v["batch"],
                    SamplingParams(max_tokens=48, temperature=1.0), v["max_turns"], args.env_ms, coalesce=False))
            finally:
                await pol.aclose()
    results["machine"]["loadavg_end"] = os.getloadavg()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs (~1 min)")
    ap.add_argument("--skip-vllm", action="store_true", help="skip the SmolLM2 run")
    ap.add_argument("--env-ms", type=float, default=10.0, help="simulated tool latency per env step")
    args = ap.parse_args()
    prov = Provenance.start()
    results = asyncio.run(main_async(args))
    results["provenance"] = prov.finish()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()

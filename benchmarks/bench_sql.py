"""SQL env throughput against skyrl-gym's text2sql env: the same tasks, databases, actions and iterations.

Workload: ``--tasks`` query tasks of SQL-v0's train split, spread over its four databases and nine task
types (filters, joins, group-bys, nested queries...). One episode of a task is a reset, 3 steps that run
the task's gold query and return the rows, then a scored submit of the gold query (reward 1 expected on
both sides). Each side plays every task once per round, in the same order, ``--rounds`` rounds, sides
alternating who goes first, after one warm-up round each; each round starts from a fresh env, so no gold
result is cached across rounds.

* ours: ``agentgym/SQL-v0`` (hermes tool calls, a sandboxed in-memory copy of the database per episode);
  it computes a task's gold rows once, at the task's first reset in an env (so once per episode here, since
  every task appears once per round) and compares the submitted rows with them;
* the peer: skyrl-gym's ``SQLEnv`` in its own virtualenv (``python -m venv .venv-peers-sql &&
  .venv-peers-sql/bin/pip install skyrl-gym``) on the same databases written as SQLite files in the Spider
  layout; it runs the gold query again at every scored step, and reads the file database directly.

Reported per side: episode steps/s over whole episodes (4 steps each, resets included), and the time in
query steps and in scored steps, each per round with medians; the ratio ours/peer per round, as a geometric
mean with a 95% t-interval over the rounds' logs. Writes ``benchmarks/results/sql.json``.
Usage: ``python benchmarks/bench_sql.py [--quick] [--tasks 200] [--rounds 5] [--no-peer]``.
"""

from __future__ import annotations

import argparse
import json
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
EXEC_STEPS = 3

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402

PEER_SNIPPET = r"""
import json, sys, time
from skyrl_gym.envs.sql.env import SQLEnv, Text2SQLEnvConfig
args = json.loads(sys.stdin.read())
cfg = Text2SQLEnvConfig(db_path=args["db_root"])
t_exec = t_submit = t_reset = 0.0
rewards = []
t0 = time.perf_counter()
for task in args["tasks"]:
    q = task["sql"]
    t = time.perf_counter()
    env = SQLEnv(cfg, extras={"db_id": task["db_id"], "reward_spec": {"ground_truth": q}, "data": "spider",
                              "max_turns": 10**9})
    env.init([{"role": "user", "content": task["question"]}])
    t_reset += time.perf_counter() - t
    for _ in range(args["exec_steps"]):
        t = time.perf_counter()
        r = env.step(f"<think>look</think><sql>{q}</sql>")
        t_exec += time.perf_counter() - t
    assert "observation" in r["observations"][0]["content"], r
    t = time.perf_counter()
    r = env.step(f"<think>done</think><solution>{q}</solution>")
    t_submit += time.perf_counter() - t
    rewards.append(float(r["reward"]))
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "reset_s": t_reset, "exec_s": t_exec, "submit_s": t_submit, "rewards": rewards}))
"""


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def pick_tasks(n: int) -> list[Any]:
    """``n`` query tasks spread evenly over the train split's stable order (all four databases, every type)."""
    import gymnasium

    import agentgym  # noqa: F401  (registers the envs)

    env = gymnasium.make("agentgym/SQL-v0")
    pool = [t for t in env.unwrapped.tasks("train") if t.data.get("kind") == "query"]
    env.close()
    step = max(1, len(pool) // n)
    return pool[::step][:n]


def run_ours(tasks: list[Any]) -> dict[str, Any]:
    """One round: a fresh env (no gold result cached), every task once."""
    from agentgym.envs.sql.env import SQLEnv

    env = SQLEnv()
    t_exec = t_submit = t_reset = 0.0
    rewards = []
    t0 = time.perf_counter()
    for task in tasks:
        q = task.data["sql"]
        t = time.perf_counter()
        env.reset(options={"task": task})
        t_reset += time.perf_counter() - t
        action = call("execute_sql", query=q)
        for _ in range(EXEC_STEPS):
            t = time.perf_counter()
            obs, *_ = env.step(action)
            t_exec += time.perf_counter() - t
        assert "Error" not in obs[0]["content"], obs
        t = time.perf_counter()
        _, r, term, _, _ = env.step(call("submit", query=q))
        t_submit += time.perf_counter() - t
        assert term
        rewards.append(float(r))
    wall = time.perf_counter() - t0
    env.close()
    return {"wall_s": wall, "reset_s": t_reset, "exec_s": t_exec, "submit_s": t_submit, "rewards": rewards}


def write_spider_dbs(root: Path, db_ids: set[str]) -> None:
    """Each built-in database as ``root/spider/database/<id>/<id>.sqlite`` (the layout skyrl-gym reads)."""
    from agentgym.envs.sql.tasks import builtin_db

    for db_id in sorted(db_ids):
        f = root / "spider" / "database" / db_id / f"{db_id}.sqlite"
        f.parent.mkdir(parents=True, exist_ok=True)
        mem = sqlite3.connect(":memory:")
        mem.deserialize(builtin_db(db_id).snapshot)
        disk = sqlite3.connect(f)
        mem.backup(disk)
        disk.close()
        mem.close()


def run_peer(db_root: Path, tasks: list[Any]) -> dict[str, Any]:
    payload = {"db_root": str(db_root), "exec_steps": EXEC_STEPS,
               "tasks": [{"sql": t.data["sql"], "db_id": t.data["db_id"], "question": t.data["question"]} for t in tasks]}
    proc = subprocess.run([str(PEER_PY), "-c", PEER_SNIPPET], input=json.dumps(payload), capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError("skyrl-gym run failed: " + proc.stderr.strip()[-1500:])
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def summary(runs: list[dict[str, Any]], episodes: int) -> dict[str, Any]:
    steps = episodes * (EXEC_STEPS + 1)
    per = [{"episode_steps_per_s": steps / r["wall_s"], "query_steps_per_s": episodes * EXEC_STEPS / r["exec_s"],
            "scored_steps_per_s": episodes / r["submit_s"], "resets_per_s": episodes / r["reset_s"],
            "mean_reward": statistics.fmean(r["rewards"]), "wall_s": r["wall_s"]} for r in runs]
    return {"per_round": [{k: round(v, 3) for k, v in p.items()} for p in per],
            "median": {k: round(statistics.median(p[k] for p in per), 1) for k in per[0]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="40 tasks, 2 rounds")
    ap.add_argument("--tasks", type=int, default=None, help="distinct tasks, each played once per round (default 200)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5)")
    ap.add_argument("--no-peer", action="store_true", help="skip skyrl-gym")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    n_tasks = a.tasks or (40 if a.quick else 200)
    rounds = a.rounds or (2 if a.quick else 5)
    peer_on = not a.no_peer and PEER_PY.exists()
    prov = Provenance.start(peers={"skyrl-gym": PEER_PY} if peer_on else {}, packages=["skyrl-gym"])
    from agentgym.eval.stats import ratio_ci

    tasks = pick_tasks(n_tasks)
    ours: list[dict[str, Any]] = []
    peer: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        write_spider_dbs(Path(tmp), {t.data["db_id"] for t in tasks})
        run_ours(tasks)  # warm-up: one whole round per side (builds every database once, loads every code path)
        if peer_on:
            run_peer(Path(tmp), tasks)
        for r in range(rounds):
            order = ["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]
            for side in order:
                if side == "ours":
                    ours.append(run_ours(tasks))
                elif peer_on:
                    peer.append(run_peer(Path(tmp), tasks))
            print(f"round {r}: ours {len(tasks) * 4 / ours[-1]['wall_s']:.0f} steps/s"
                  + (f", skyrl-gym {len(tasks) * 4 / peer[-1]['wall_s']:.0f} steps/s" if peer else ""), flush=True)
    result: dict[str, Any] = {
        "benchmark": "sql env steps/s, the same tasks and iterations on both sides (reward check included)",
        "workload": {"tasks": len(tasks), "episodes_per_round": len(tasks), "query_steps_per_episode": EXEC_STEPS,
                     "scored_steps_per_episode": 1, "rounds": rounds, "sqlite": sqlite3.sqlite_version,
                     "task_types": sorted({t.task_type for t in tasks}), "databases": sorted({t.data["db_id"] for t in tasks}),
                     "task_ids": [t.task_id for t in tasks]},
        "agentgym": summary(ours, len(tasks)),
        "skyrl_gym": summary(peer, len(tasks)) if peer else "not measured (no .venv-peers-sql, or --no-peer)",
        "caveats": ("agentgym computes a task's gold rows once, at the task's first reset in an env (here once per "
                    "episode: every task appears once per round, each round in a fresh env) and scores against them; "
                    "skyrl-gym runs the gold query again at every scored step. agentgym runs each episode on a "
                    "sandboxed in-memory copy of the database (a worker process, timeouts, limits); skyrl-gym "
                    "queries the SQLite file directly."),
    }
    if peer:
        ratios = {k: ratio_ci([o[k] / p[k] for o, p in zip(result["agentgym"]["per_round"], result["skyrl_gym"]["per_round"],
                                                            strict=True)])
                  for k in ("episode_steps_per_s", "query_steps_per_s", "scored_steps_per_s")}
        # geometric mean over rounds of ours/peer throughput, 95% t-interval over the rounds' logs
        result["ours_over_peer"] = {k: {"mean": round(v["mean"], 3), "ci95": [round(x, 3) for x in v["ci95"]] if v["ci95"] else None}
                                    for k, v in ratios.items()}
    result["provenance"] = prov.finish()
    for name, res in (("agentgym", result["agentgym"]), ("skyrl-gym", result["skyrl_gym"])):
        if isinstance(res, dict):
            m = res["median"]
            print(f"{name:<10} episode steps/s {m['episode_steps_per_s']:>8.0f}  query {m['query_steps_per_s']:>8.0f}  "
                  f"scored {m['scored_steps_per_s']:>8.0f}  reward {m['mean_reward']:.2f}")
    print(json.dumps(result.get("ours_over_peer")))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

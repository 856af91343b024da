"""Run a verifiers environment's episode as an AgentGym harness agent, so that its model calls train.

An AgentGym harness workflow (``[multi] workflow = "harness"``) runs this command once per task, in
verifiers' own venv::

    [multi.options]
    command = [".venv-verifiers/bin/python", "-m", "agentgym_verifiers.episode", "my-taskset"]
    reward = "call"
    env_access = false

It reads the task the workflow hands over (``AGENTGYM_TASK`` or standard input: ``task_id``,
``base_url``, ``api_key``, ``model``, ``reward_url``), loads the verifiers environment of the taskset
id (its own harness unless ``--harness`` names another), picks the taskset's task whose ``id`` is the
AgentGym task id, and runs one episode with verifiers' model client pointed at the rollout's
``base_url``: every model call the verifiers harness makes goes through verifiers' interception
server to AgentGym's policy endpoint, which records its token ids, logprobs and weight versions.
The episode's reward (the sum of its traces' weighted rewards, verifiers' ``Trace.reward``) is
posted to ``reward_url``. A failed episode exits non-zero (the rollout's error, never the run's).
Prints one JSON line: ``{"task_id", "reward", "rewards", "ok"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

import httpx
import verifiers.v1 as vf

__all__ = ["main", "run_episode"]

KEY_VAR = "AGENTGYM_ENDPOINT_KEY"


def _task() -> dict[str, Any]:
    blob = os.environ.get("AGENTGYM_TASK") or sys.stdin.read()
    task: dict[str, Any] = json.loads(blob)
    return task


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


async def run_episode(task: dict[str, Any], taskset_id: str, *, harness_id: str | None = None,
                      env_config: dict[str, Any] | None = None) -> vf.Episode:
    """One episode of the verifiers taskset's task ``task["task_id"]``, its model at ``task["base_url"]``."""
    raw: dict[str, Any] = {"taskset": {"id": taskset_id}, "agent": {"runtime": {"type": "subprocess"}}}
    if harness_id:
        raw["agent"]["harness"] = {"id": harness_id}
    env = vf.load_environment(vf.resolve_env_config(_merge(raw, env_config or {})))
    matches = list(env.taskset.include(ids=[task["task_id"]]))
    if len(matches) != 1:
        raise SystemExit(f"the verifiers taskset {taskset_id!r} has {len(matches)} tasks with id {task['task_id']!r}; "
                         "the AgentGym env's task ids must name its tasks")
    os.environ[KEY_VAR] = task["api_key"]
    ctx = vf.ModelContext(model=task["model"],
                          client=vf.EvalClientConfig(base_url=task["base_url"], api_key_var=KEY_VAR))
    async with env.serving():
        return await env.run_episode(matches[0], ctx)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentgym_verifiers.episode", description=__doc__.split("\n\n")[0])
    p.add_argument("taskset", help="the verifiers taskset id (an importable module, as vf-eval takes it)")
    p.add_argument("--harness", help="a verifiers harness id (default: the taskset's own, as vf-eval picks it)")
    p.add_argument("--env-config", default="{}", help="more verifiers env config, as JSON (merged)")
    args = p.parse_args(argv)
    task = _task()
    episode = asyncio.run(run_episode(task, args.taskset, harness_id=args.harness,
                                      env_config=json.loads(args.env_config)))
    reward = sum(t.reward for t in episode.traces)
    rewards = {k: (r.score if r is not None else None) for t in episode.traces for k, r in t.rewards.items()}
    print(json.dumps({"task_id": task["task_id"], "reward": reward, "rewards": rewards, "ok": episode.ok}))
    if not episode.ok:
        errors = [e.message for e in episode.errors] + [e.message for t in episode.traces for e in t.errors]
        print(f"the verifiers episode failed: {errors}", file=sys.stderr)
        return 1
    if task.get("reward_url"):
        r = httpx.post(task["reward_url"], json={"value": reward},
                       headers={"Authorization": f"Bearer {task['api_key']}"}, timeout=60)
        r.raise_for_status()
    return 0


if __name__ == "__main__":
    sys.exit(main())

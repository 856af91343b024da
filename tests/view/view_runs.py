"""Run folders for the viewer tests (the ``runs`` fixture in conftest.py), made with the real eval runner on Demo-v0 and scripted policies.

* ``before``: bisects but gives up once the secret is known to be above 35 (fails guess-43, guess-53);
* ``after``: bisects but gives up once the secret is known to be below 5 (fails guess-1);
  so from ``before`` to ``after`` guess-43 and guess-53 are gained and guess-1 is lost;
* ``xss``: the first turn is a malformed tool call (a parse error), the second carries ``<script>`` and
  ``<img onerror>`` in the assistant's text next to a real tool call, then it bisects;
* ``train``: a training run folder: ``config.json``, ``metrics.jsonl``, ``result.json``, eval stages
  ``before``/``step-000003``/``after`` (copies of the eval runs above) and ``groups.jsonl`` written by the
  trainer's own :class:`~agentgym.trainers.metrics.GroupLog` (one group stopped by a gate).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agentgym.envs.demo import expert_bounds, expert_reply
from agentgym.policies.scripted import ScriptedPolicy

from agentgym.eval.runner import EvalConfig, run_eval
from agentgym.types import Message, Trajectory, TrajectoryGroup, Turn

ENV = "agentgym/Demo-v0"
TASKS = 6  # guess-1, guess-11, guess-21, guess-33, guess-43, guess-53
XSS = '<script>window.__agv_pwned = 1</script><img src=x onerror="window.__agv_pwned = 2"><b>bold</b>'


def _call(n: int) -> str:
    return '<tool_call>{"name": "guess", "arguments": {"n": %d}}</tool_call>' % n


def bisect(give_up_if: Any) -> Any:
    """Demo-v0's expert (:func:`~agentgym.envs.demo.expert_reply`), giving up once ``give_up_if(lo, hi)``
    holds for the bounds the conversation has narrowed the secret to."""
    def act(messages: list[Message]) -> str:
        if give_up_if(*expert_bounds(messages)):
            return '<tool_call>{"name": "give_up", "arguments": {}}</tool_call>'
        return expert_reply(messages)
    return act


def xss_policy(messages: list[Message]) -> str:
    turns = sum(1 for m in messages if m["role"] == "assistant")
    if turns == 0:
        return '<tool_call>{"name": "guess", "arguments": {"n": </tool_call>'  # malformed: a parse error
    if turns == 1:
        return f"Thinking {XSS} now. " + _call(31)
    return bisect(lambda lo, hi: False)(messages)


def make_eval(out: Path, fn: Any, seeds: list[int] | None = None, samples: int = 1) -> Path:
    cfg = EvalConfig([ENV], split="test", tasks=TASKS, seeds=seeds or [0, 1], samples=samples, concurrency=4)
    run_eval(ScriptedPolicy(fn), cfg, out)
    return out


def _group(task: str, trajs: list[Trajectory], *, stop: bool) -> TrajectoryGroup:
    gid = f"train|{task}"
    for i, t in enumerate(trajs):
        t.group_id, t.member, t.early_stopped = gid, i, stop
    rec = {"gate": "selective_rollout", "group_id": gid, "task_id": task, "env_id": ENV, "action": "stop" if stop else "continue",
           "reason": "mean pairwise distance 0.050 < 0.12" if stop else "mean pairwise distance 0.61 >= 0.12",
           "score": 0.05 if stop else 0.61, "step": 2, "enforced": True, "elapsed_s": 0.1, "details": {},
           "tokens_at_decision": 40, "final_rewards": None, "final_success": None, "final_zero_variance": None,
           "final_tokens": None, "final_elapsed_s": None}
    return TrajectoryGroup(gid, task, ENV, trajs, early_stopped=stop, stop_reason="selective_rollout:similar" if stop else None,
                           gate_records=[rec])


def make_train(out: Path, before: Path, after: Path) -> Path:
    from agentgym.trainers.metrics import GroupLog

    from agentgym.rollout.jsonl import read_jsonl

    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"run": {"name": "viewer-test", "algorithm": "grpo", "steps": 6},
                                                 "model": {"path": "tiny"}, "rollout": {"env": ENV}}))
    recs: list[dict[str, Any]] = [{"step": 0, "eval/success": 0.5}]
    for s in range(6):
        recs.append({"step": s, "rollout/reward_mean": 0.2 + 0.1 * s, "rollout/success_rate": 0.2 + 0.1 * s,
                     "train/loss": 1.0 / (s + 1), "train/kl": 0.01 * s, "train/clip_frac": 0.02, "train/entropy": 1.5 - 0.1 * s,
                     "train/tokens_per_s": 900.0 + s, "mem/rss_gb": 3.5, "dataflow/staleness_max": s % 2,
                     "train/skipped": "no samples" if s == 9 else None})
        if s == 2:
            recs[-1]["eval/success"] = 0.6
    recs.append({"step": 6, "eval/success": 0.9})
    with open(out / "metrics.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
        f.write('{"step": 7, "train/loss": 0.')  # a torn last line (a run killed mid-write)
    (out / "result.json").write_text(json.dumps({"before": {"success": 0.5}, "after": {"success": 0.9}, "steps": 6,
                                                 "train_wall_s": 12.5}))
    for stage, src in (("before", before), ("step-000003", after), ("after", after)):
        shutil.copytree(src, out / "eval" / stage)
    owner = SimpleNamespace(step=0, version=0)
    log = GroupLog(out / "groups.jsonl", owner)
    eps = read_jsonl(after / "episodes.jsonl")
    by_task: dict[str, list[Trajectory]] = {}
    for t in eps:
        by_task.setdefault(t.task_id, []).append(t)
    for k, (task, trajs) in enumerate(sorted(by_task.items())):
        g = _group(task, trajs, stop=k == 0)
        owner.step, owner.version = k // 2, k // 2
        log(g, {"default": "early_stopped" if k == 0 else None})
    return out


def trajectory(task: str = "t1", *, seed: int = 0, sample: int = 0, success: bool = True, env: str = ENV,
               text: str = "hi", parse_error: str | None = None) -> Trajectory:
    """A small trajectory record for the unit tests."""
    turn = Turn("p", prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5], completion_logprobs=[-0.1, -0.2],
                weight_version=[2, 3], text=text,
                tool_calls=[{"id": "c0", "name": "guess", "arguments": {"n": 7}}],
                observation=[{"role": "tool", "tool_call_id": "c0", "name": "guess", "content": "higher"}],
                reward=1.0 if success else 0.0, parse_error=parse_error, timing={"policy_s": 0.5, "env_s": 0.01})
    key = f"{env}|{task}|seed={seed}|sample={sample}"
    return Trajectory(task, env, group_id=key, turns=[turn],
                      messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "go"},
                                {"role": "assistant", "content": text}, *turn.observation],
                      reward=1.0 if success else 0.0, success=success, terminated=True,
                      metrics={"parse_errors": int(parse_error is not None), "generated_tokens": 2, "prompt_tokens": 3},
                      timing={"wall_s": 0.6}, info={"eval_key": key, "seed": seed, "sample": sample, "task_type": "guess"})


def compare_links(docs: dict[str, Any]) -> set[str]:
    """The ``compare/...`` documents the pages of ``docs`` (the index and run documents) link to, as app.js builds
    the links: the index's comparisons (sidebar, overview) and, on a training run's page, its first held-out stage
    against each later one ("compare with before"). A comparison page links only to itself."""
    out = {"compare/" + ",".join(map(str, ids)) for ids in docs["index"]["comparisons"]}
    for doc in docs.values():
        held = doc.get("heldout") or []
        out |= {f"compare/{held[0]['run']},{p['run']}" for p in held[1:]}
    return out

"""ALFWorld's two experts on every split: the observation-only expert (``expert="observer"``, what
``agentgym collect --policy expert`` imitates) next to the planner that sees the whole scene.

Sections (every generated task of every split, one episode each; the experts are deterministic):

* ``experts``: success within the registered 50-step limit and within the shipped training configs'
  ``max_turns = 30``; mean steps (95% t-interval); per task type; where the observer needs more
  than 30 steps, why (task type, room, how many receptacles it looked into before it first saw a goal
  object, the step it first saw one).
* ``detours``: DAgger-style robustness: a random admissible command with probability 0.3 instead of
  the expert's; success within 100 steps, the expert's own commands that did nothing (should be 0),
  and the episodes stuck because a detour picked up a thing no receptacle takes back.
* ``tokens``: tokens per episode of the experts' transcripts, chat-templated with SmolLM2-135M's
  tokenizer (system prompt, observations, commands), ``obs_style="react"`` (default) vs
  ``"compact"``; both styles play the same commands, so the ratio is paired per episode.
* ``orders``: the observer with its search order replaced, same tasks, same run: the shipped order
  (open surfaces first), the listing's order over the receptacles that can hold the object, and the
  listing's order over every receptacle (no table).
* ``speed``: microseconds per expert call (``expert_command()``, the observer's reading of the new
  observations included), observer vs planner over the same train tasks, interleaved rounds; and, for
  scale, the env's own ``step`` in the same loops. Thread CPU time, so other jobs on a shared machine
  do not count (the clock's own cost, ~1 µs, is in every figure alike).

Usage: ``python benchmarks/bench_alfworld_experts.py [--quick]``; writes
``benchmarks/results/alfworld_experts.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "alfworld_experts.json"
MODEL = Path.home() / ".cache" / "agentgym" / "models" / "smollm2-135m-instruct"
TRAIN_TURNS = 30  # configs/train/alfworld-{sft,grpo}.toml: [rollout] max_turns
ENV_LIMIT = 50  # agentgym/ALFWorld-v0's registered max_episode_steps

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402


def wilson(k: int, n: int) -> list[float]:
    if n == 0:
        return [0.0, 0.0]
    z = 1.96
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(max(0.0, c - h), 4), round(min(1.0, c + h), 4)]


def mean_ci(xs: list[float]) -> dict[str, Any]:
    m = statistics.fmean(xs)
    h = 1.96 * statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return {"mean": round(m, 3), "ci95": [round(m - h, 3), round(m + h, 3)]}


def episode(env: Any, task: Any, limit: int = 400) -> dict[str, Any]:
    """One expert episode: messages, steps, success, and when a goal object was first seen."""
    from agentgym.envs.alfworld.observer import ObservationExpert

    obs, _ = env.reset(options={"task": task})
    msgs = list(obs)
    watcher = ObservationExpert()  # reads the same texts, to tell when a goal object was first shown
    for m in obs:
        if m["role"] == "user":
            watcher.observe(m["content"])
    first_seen = None
    looked = 0
    reward = 0.0
    steps = 0
    for steps in range(1, limit + 1):
        cmd = env.expert_command()
        msgs.append({"role": "assistant", "content": cmd})
        obs, reward, term, trunc, _ = env.step(cmd)
        msgs += obs
        before = len(watcher.contents)
        for m in obs:
            watcher.observe(m["content"])
        if first_seen is None:
            looked += len(watcher.contents) > before
            goal = watcher.goal
            shown = [o for c in watcher.contents.values() for o in c] + ([watcher.held] if watcher.held else [])
            if goal is not None and any(o.rsplit(" ", 1)[0] == goal.object.lower() for o in shown):
                first_seen = steps
        if term or trunc:
            break
    return {"messages": msgs, "steps": steps, "success": reward == 1.0, "first_seen": first_seen, "looked": looked}


def experts_section(splits: dict[str, list[Any]]) -> tuple[dict[str, Any], dict[str, dict[str, list[Any]]]]:
    from agentgym.envs.alfworld.env import ALFWorldEnv

    out: dict[str, Any] = {}
    transcripts: dict[str, dict[str, list[Any]]] = {}
    for expert in ("observer", "planner"):
        env = ALFWorldEnv(expert=expert)
        out[expert] = {}
        transcripts[expert] = {}
        for split, tasks in splits.items():
            eps = [episode(env, t) for t in tasks]
            transcripts[expert][split] = [(t, e["messages"]) for t, e in zip(tasks, eps, strict=True)]
            n = len(eps)
            ok50 = sum(e["success"] and e["steps"] <= ENV_LIMIT for e in eps)
            ok30 = sum(e["success"] and e["steps"] <= TRAIN_TURNS for e in eps)
            by_type: dict[str, Any] = {}
            for tt in sorted({t.task_type for t in tasks}):
                sel = [e for t, e in zip(tasks, eps, strict=True) if t.task_type == tt]
                by_type[tt] = {"n": len(sel),
                               "success_at_30": round(sum(e["success"] and e["steps"] <= TRAIN_TURNS for e in sel) / len(sel), 4),
                               "mean_steps": round(statistics.fmean(e["steps"] for e in sel), 2),
                               "max_steps": max(e["steps"] for e in sel)}
            row: dict[str, Any] = {
                "episodes": n,
                "success_at_50": round(ok50 / n, 4), "success_at_50_ci95": wilson(ok50, n),
                "success_at_30": round(ok30 / n, 4), "success_at_30_ci95": wilson(ok30, n),
                "success_unbounded": round(sum(e["success"] for e in eps) / n, 4),
                "steps": mean_ci([e["steps"] for e in eps]),
                "max_steps": max(e["steps"] for e in eps),
                "by_task_type": by_type,
            }
            if expert == "observer":
                over = [(t, e) for t, e in zip(tasks, eps, strict=True) if e["steps"] > TRAIN_TURNS]
                row["over_30_steps"] = {
                    "episodes": len(over),
                    "by_task_type": dict(collections.Counter(t.task_type for t, _ in over).most_common()),
                    "by_room": dict(collections.Counter(t.data["room"] for t, _ in over).most_common()),
                    "all_by_room": dict(collections.Counter(t.data["room"] for t in tasks).most_common()),
                    "first_saw_a_goal_object_at_step": mean_ci([float(e["first_seen"] or e["steps"]) for _, e in over])
                    if len(over) > 1 else None,
                    "receptacles_looked_into_before": mean_ci([float(e["looked"]) for _, e in over]) if len(over) > 1 else None,
                }
                row["first_saw_a_goal_object_at_step"] = mean_ci([float(e["first_seen"] or e["steps"]) for e in eps])
            out[expert][split] = row
            print(f"  {expert:8s} {split:12s} success@50 {row['success_at_50']:.3f} @30 {row['success_at_30']:.3f} "
                  f"steps {row['steps']['mean']:.2f} max {row['max_steps']}", flush=True)
    return out, transcripts


def detours_section(splits: dict[str, list[Any]], prob: float = 0.3) -> dict[str, Any]:
    from agentgym.envs.alfworld.env import ALFWorldEnv

    out: dict[str, Any] = {}
    env = ALFWorldEnv()
    rng = random.Random(0)
    for split, tasks in splits.items():
        n = ok = invalid = stuck = steps_total = 0
        for t in tasks:
            _, info = env.reset(options={"task": t})
            reward = 0.0
            k = 0
            while k < 100:
                k += 1
                if rng.random() < prob:
                    _, reward, term, _, info = env.step(rng.choice(info["admissible_actions"]))
                else:
                    before = info["metrics"].get("invalid_actions", 0)
                    _, reward, term, _, info = env.step(env.expert_command())
                    invalid += info["metrics"].get("invalid_actions", 0) > before
                if term:
                    break
            n += 1
            steps_total += k
            ok += reward == 1.0
            held = env._held
            if reward != 1.0 and held is not None and env.expert_command() == "look":
                stuck += 1
        out[split] = {"episodes": n, "random_prob": prob, "success_within_100": round(ok / n, 4),
                      "success_ci95": wilson(ok, n), "mean_steps": round(steps_total / n, 2),
                      "expert_commands_that_did_nothing": invalid,
                      "stuck_holding_a_thing_nothing_takes_back": stuck}
        print(f"  detours {split:12s} {out[split]}", flush=True)
    return out


def tokens_section(splits: dict[str, list[Any]], transcripts: dict[str, dict[str, list[Any]]]) -> dict[str, Any]:
    from agentgym.envs.alfworld.env import ALFWorldEnv
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODEL))

    def count(msgs: list[dict[str, Any]]) -> tuple[int, int]:
        text = tok.apply_chat_template(msgs, tokenize=False)
        obs = sum(len(tok(m["content"])["input_ids"]) for m in msgs if m["role"] in ("user", "tool"))
        return len(tok(text)["input_ids"]), obs

    out: dict[str, Any] = {"tokenizer": "SmolLM2-135M-Instruct (chat template applied to the whole transcript)"}
    compact = ALFWorldEnv(obs_style="compact")
    for expert, per_split in transcripts.items():
        out[expert] = {}
        for split, eps in per_split.items():
            react_tot, react_obs, comp_tot, comp_obs, ratios = [], [], [], [], []
            for task, msgs in eps:
                cmds = [m["content"] for m in msgs if m["role"] == "assistant"]
                obs, _ = compact.reset(options={"task": task})
                cm = list(obs)
                for c in cmds:  # the same commands, told in the compact style
                    cm.append({"role": "assistant", "content": c})
                    obs, _, term, trunc, _ = compact.step(c)
                    cm += obs
                assert term, task.task_id
                a, ao = count(msgs)
                b, bo = count(cm)
                react_tot.append(a)
                react_obs.append(ao)
                comp_tot.append(b)
                comp_obs.append(bo)
                ratios.append(b / a)
            out[expert][split] = {
                "episodes": len(eps),
                "react_tokens_per_episode": mean_ci([float(x) for x in react_tot]),
                "compact_tokens_per_episode": mean_ci([float(x) for x in comp_tot]),
                "react_observation_tokens": round(statistics.fmean(react_obs), 1),
                "compact_observation_tokens": round(statistics.fmean(comp_obs), 1),
                "compact_over_react": {"mean": round(statistics.fmean(ratios), 4),
                                       "min": round(min(ratios), 4), "max": round(max(ratios), 4)},
                "react_max_tokens": max(react_tot), "compact_max_tokens": max(comp_tot),
            }
            r = out[expert][split]
            print(f"  tokens {expert:8s} {split:12s} react {r['react_tokens_per_episode']['mean']:.0f} "
                  f"compact {r['compact_tokens_per_episode']['mean']:.0f} ratio {r['compact_over_react']['mean']:.3f}",
                  flush=True)
    out["system_prompt_tokens"] = {
        "react": len(tok(ALFWorldEnv().system_prompt())["input_ids"]),
        "compact": len(tok(compact.system_prompt())["input_ids"]),
    }
    return out


def orders_section(splits: dict[str, list[Any]]) -> dict[str, Any]:
    from agentgym.envs.alfworld import observer as O
    from agentgym.envs.alfworld.env import ALFWorldEnv

    shipped = O.search_order

    def listing_can_hold(receps: Any, otype: str, target: str | None) -> list[str]:
        names = list(receps)
        first = [n for n in names if O.can_hold(O._type(n) or "", otype)]
        first.sort(key=lambda n: (O._type(n) == target, names.index(n)))
        return first + [n for n in names if n not in first]

    def listing_all(receps: Any, otype: str, target: str | None) -> list[str]:
        return list(receps)

    out: dict[str, Any] = {}
    try:
        for name, fn in (("surfaces_first (shipped)", shipped), ("listing_order_can_hold", listing_can_hold),
                         ("listing_order_everything", listing_all)):
            O.search_order = fn  # type: ignore[assignment]
            env = ALFWorldEnv()
            out[name] = {}
            for split, tasks in splits.items():
                steps = []
                for t in tasks:
                    env.reset(options={"task": t})
                    k = 0
                    done = False
                    while not done and k < 400:
                        k += 1
                        _, _, term, trunc, _ = env.step(env.expert_command())
                        done = term or trunc
                    steps.append(k)
                n = len(steps)
                out[name][split] = {"steps": mean_ci([float(x) for x in steps]),
                                    "success_at_30": round(sum(x <= TRAIN_TURNS for x in steps) / n, 4),
                                    "success_at_50": round(sum(x <= ENV_LIMIT for x in steps) / n, 4),
                                    "max_steps": max(steps)}
                print(f"  order {name:26s} {split:12s} {out[name][split]}", flush=True)
    finally:
        O.search_order = shipped
    return out


def speed_section(tasks: list[Any], rounds: int) -> dict[str, Any]:
    from agentgym.envs.alfworld.env import ALFWorldEnv

    envs = {e: ALFWorldEnv(expert=e) for e in ("observer", "planner")}
    per: dict[str, list[float]] = {e: [] for e in envs}
    step_us: list[float] = []

    def one(expert: str) -> float:
        env = envs[expert]
        spent = stepping = 0
        calls = 0
        for t in tasks:
            env.reset(options={"task": t})
            while True:
                t0 = time.thread_time_ns()  # CPU time of this thread: the shared machine's load stays out
                cmd = env.expert_command()
                t1 = time.thread_time_ns()
                _, _, term, trunc, _ = env.step(cmd)
                stepping += time.thread_time_ns() - t1
                spent += t1 - t0
                calls += 1
                if term or trunc:
                    break
        step_us.append(stepping / 1e3 / calls)
        return spent / 1e3 / calls

    for e in envs:  # warm-up, equal for both
        one(e)
    step_us.clear()
    for r in range(rounds):
        order = ["observer", "planner"] if r % 2 == 0 else ["planner", "observer"]
        for e in order:
            per[e].append(one(e))
    out: dict[str, Any] = {"tasks": len(tasks), "rounds": rounds, "order": "interleaved, alternating first",
                           "clock": "thread CPU time (time.thread_time_ns) around each call",
                           "env_step_us_median": round(statistics.median(step_us), 2)}
    for e, xs in per.items():
        out[e] = {"us_per_call_median": round(statistics.median(xs), 2), "min": round(min(xs), 2),
                  "max": round(max(xs), 2), "rounds": [round(x, 2) for x in xs]}
    print(f"  speed {out}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the first 300 train tasks instead of all 3,553")
    ap.add_argument("--rounds", type=int, default=5, help="speed rounds per expert")
    args = ap.parse_args()
    prov = Provenance.start()
    import transformers
    from agentgym.envs.alfworld.env import ALFWorldEnv

    import agentgym

    env = ALFWorldEnv()
    splits = {s: list(env.tasks(s)) for s in env.splits}
    if args.quick:
        splits["train"] = splits["train"][:300]
    result: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "argv": sys.argv,
        "versions": {"python": platform.python_version(), "agentgym": getattr(agentgym, "__version__", "?"),
                     "transformers": transformers.__version__},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_start": os.getloadavg()},
        "limits": {"env_max_episode_steps": ENV_LIMIT, "training_max_turns": TRAIN_TURNS},
    }
    print("experts ...", flush=True)
    result["experts"], transcripts = experts_section(splits)
    print("detours ...", flush=True)
    result["detours"] = detours_section(splits)
    print("tokens ...", flush=True)
    result["tokens"] = tokens_section(splits, transcripts)
    print("orders ...", flush=True)
    result["orders"] = orders_section(splits)
    print("speed ...", flush=True)
    result["speed"] = speed_section(splits["train"][:300], args.rounds)
    result["machine"]["loadavg_end"] = os.getloadavg()
    result["provenance"] = prov.finish()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

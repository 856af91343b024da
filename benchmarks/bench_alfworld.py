"""ALFWorld benchmark: the native engine vs the real ``alfworld`` package, single process.

Figures (all with admissible commands computed every step, as ``info["admissible_actions"]``):

* ``native``: ``agentgym/ALFWorld-v0`` steps/s under a random policy that picks among the admissible
  commands (through ``AgentEnv.step``: parser, dispatch, info), steps/s of the bare engine
  (``env._execute`` + ``admissible_actions()``, i.e. without the AgentEnv wrapper), steps/s through
  ``gymnasium.make`` (TimeLimit/OrderEnforcing wrappers), the planner expert solving tasks end to end,
  resets/s over generated train tasks, and tool mode (hermes ``take_action`` calls).
* ``peer``: ``alfworld`` 0.4 (TextWorld + Fast Downward) on the *same* scenes: each native scene is
  exported as a ``.tw-pddl`` game (``write_tw_game``; ALFWorld's own game data is a separate
  download, so these stand in for it), then ``textworld.start`` + ``reset`` (resets/s) and ``step``
  with random admissible commands (steps/s), in the same run. It runs in ``.venv-peers-alfworld``
  (``python -m venv .venv-peers-alfworld && .venv-peers-alfworld/bin/pip install alfworld gymnasium``);
  without it the peer figures are quoted from the issue (18-38 steps/s, 2-4 resets/s) and marked so.
* ``native_same_scenes``: the native engine on exactly those scenes and the same kind of policy.

Usage: ``python benchmarks/bench_alfworld.py [--quick] [--no-peer]``; writes
``benchmarks/results/alfworld.json``. The machine may be shared: figures are best-of-3 rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEER_PY = ROOT / ".venv-peers-alfworld" / "bin" / "python"
OUT = ROOT / "benchmarks" / "results" / "alfworld.json"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402


def _best(fn: Any, rounds: int = 3) -> float:
    return max(fn() for _ in range(rounds))


# ------------------------------------------------------------------------------------ native
def native_figures(steps: int, resets: int) -> dict[str, Any]:
    import gymnasium
    from agentgym.envs.alfworld.env import ALFWorldEnv

    import agentgym  # noqa: F401  (registers the ids)

    env = ALFWorldEnv(expert="planner")  # the figures in alfworld.json; the observer: bench_alfworld_experts.py
    env.tasks("train")

    def random_walk(e: Any, n: int, seed: int = 0) -> float:
        rng = random.Random(seed)
        _, info = e.reset(seed=seed)
        adm = info["admissible_actions"]
        t = time.perf_counter()
        k = turns = 0
        while k < n:
            _, _, term, trunc, info = e.step(rng.choice(adm))
            k += 1
            turns += 1
            if term or trunc or turns >= 50:
                _, info = e.reset()
                turns = 0
            adm = info["admissible_actions"]
        return n / (time.perf_counter() - t)

    def bare_engine(n: int) -> float:
        rng = random.Random(1)
        env.reset(seed=1)
        adm = env.admissible_actions() or []
        t = time.perf_counter()
        for _ in range(n):
            env._execute(rng.choice(adm))
            if env._won:
                env.reset()
            adm = env.admissible_actions() or []
        return n / (time.perf_counter() - t)

    def expert(n_tasks: int) -> tuple[float, float, int]:
        tasks = env.tasks("train")[:n_tasks]
        t = time.perf_counter()
        k = solved = 0
        for task in tasks:
            env.reset(options={"task": task})
            while True:
                _, r, term, trunc, _ = env.step(env.expert_action())
                k += 1
                if term or trunc:
                    solved += int(r == 1.0)
                    break
        dt = time.perf_counter() - t
        return k / dt, n_tasks / dt, solved

    def reset_rate(n: int) -> float:
        t = time.perf_counter()
        for i in range(n):
            env.reset(options={"split": "train", "index": i})
        return n / (time.perf_counter() - t)

    tool_env = ALFWorldEnv(action_mode="tool")

    def tool_mode(n: int) -> float:
        rng = random.Random(2)
        _, info = tool_env.reset(seed=2)
        adm = info["admissible_actions"]
        t = time.perf_counter()
        turns = 0
        for _ in range(n):
            call = '<tool_call>{"name": "take_action", "arguments": {"action": "%s"}}</tool_call>' % rng.choice(adm)
            _, _, term, _, info = tool_env.step(call)
            turns += 1
            if term or turns >= 50:
                _, info = tool_env.reset()
                turns = 0
            adm = info["admissible_actions"]
        return n / (time.perf_counter() - t)

    gym_env = gymnasium.make("agentgym/ALFWorld-v0")
    n_expert = max(100, resets // 4)
    exp = max((expert(n_expert) for _ in range(3)), key=lambda x: x[0])
    return {
        "steps_per_s_random_admissible": round(_best(lambda: random_walk(env, steps))),
        "steps_per_s_bare_engine": round(_best(lambda: bare_engine(steps))),
        "steps_per_s_gymnasium_make": round(_best(lambda: random_walk(gym_env, steps))),
        "steps_per_s_tool_mode_hermes": round(_best(lambda: tool_mode(steps // 2))),
        "steps_per_s_expert_incl_resets": round(exp[0]),
        "tasks_per_s_expert": round(exp[1]),
        "expert_solved": f"{exp[2]}/{n_expert}",
        "resets_per_s": round(_best(lambda: reset_rate(resets))),
    }


def export_scenes(n: int, folder: Path) -> list[tuple[str, str]]:
    """Export n native scenes (all six task types) as .tw-pddl games; returns (scene json, game path)."""
    from agentgym.envs.alfworld.env import ALFWorldEnv
    from agentgym.envs.alfworld.tw import write_tw_game

    env = ALFWorldEnv(grammar="v0.4", obs_style="raw")
    out = []
    for i in range(n):
        env.reset(options={"split": "valid_seen", "index": i})
        spec = env.scene_spec()
        game = write_tw_game(spec, folder / f"scene{i}.tw-pddl")
        out.append((spec.model_dump_json(), str(game)))
    return out


def native_same_scenes(scenes: list[str], steps_per_scene: int) -> dict[str, Any]:
    from agentgym.envs.alfworld.env import ALFWorldEnv
    from agentgym.envs.alfworld.scene import load_scene

    env = ALFWorldEnv(grammar="v0.4", obs_style="raw")
    specs = [load_scene(s) for s in scenes]

    def run() -> tuple[float, float]:
        rng = random.Random(0)
        t = time.perf_counter()
        for spec in specs:
            env.reset(options={"scene": spec})
        reset_rate = len(specs) / (time.perf_counter() - t)
        k = 0
        t = time.perf_counter()
        for spec in specs:
            _, info = env.reset(options={"scene": spec})
            for _ in range(steps_per_scene):
                _, _, term, _, info = env.step(rng.choice(info["admissible_actions"]))
                k += 1
                if term:
                    _, info = env.reset(options={"scene": spec})
        return k / (time.perf_counter() - t), reset_rate

    best = max((run() for _ in range(3)), key=lambda x: x[0])
    return {"steps_per_s": round(best[0]), "resets_per_s": round(best[1])}


# ------------------------------------------------------------------------------------ peer
def peer_worker(games: list[str], steps_per_scene: int) -> dict[str, Any]:
    """Runs inside .venv-peers-alfworld: the real engine, raw textworld API plus our adapter."""
    import alfworld.agents.environment.alfred_tw_env as atw
    import alfworld.info
    import textworld
    from agentgym.envs.alfworld.tw import ALFWorldTWEnv

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    rng = random.Random(0)
    reset_times, step_count, step_time = [], 0, 0.0
    for g in games:
        t = time.perf_counter()
        env = textworld.start(g, request_infos=infos, wrappers=[atw.AlfredDemangler, atw.AlfredInfos])
        state = env.reset()
        reset_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(steps_per_scene):
            state, _, done = env.step(rng.choice(state["admissible_commands"]))
            step_count += 1
            if done:
                break
        step_time += time.perf_counter() - t
        t = time.perf_counter()
        state = env.reset()  # a second reset of the same, already loaded game
        reset_times.append(time.perf_counter() - t)
        env.close()
    adapter = ALFWorldTWEnv(game_files=games[:2])
    t = time.perf_counter()
    _, info = adapter.reset(options={"index": 0})
    k = 0
    for _ in range(steps_per_scene):
        _, _, term, _, info = adapter.step(rng.choice(info["admissible_actions"]))
        k += 1
        if term:
            break
    adapter_dt = time.perf_counter() - t
    adapter.close()
    first_resets = reset_times[0::2]
    return {
        "alfworld_version": alfworld.info.__version__,
        "textworld_version": textworld.__version__,
        "steps_per_s": round(step_count / step_time, 1),
        "resets_per_s_load_and_reset": round(len(first_resets) / sum(first_resets), 2),
        "resets_per_s_reset_only": round(len(reset_times[1::2]) / sum(reset_times[1::2]), 2),
        "adapter_steps_per_s_incl_one_reset": round(k / adapter_dt, 1),
        "steps_measured": step_count,
        "games": len(games),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps, fewer peer games")
    ap.add_argument("--no-peer", action="store_true", help="skip the real alfworld package")
    ap.add_argument("--peer-worker", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--steps-per-scene", type=int, default=30, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer_worker is not None:
        print(json.dumps(peer_worker(args.peer_worker, args.steps_per_scene)))
        return

    # the peer runs ~10 steps/s: 20 games x 50 steps is ~1,000 measured steps (100 s), not a handful
    steps, resets, n_games, per_scene = (20_000, 500, 3, 20) if args.quick else (100_000, 2_000, 20, 50)
    peer_on = not args.no_peer and PEER_PY.exists()
    prov = Provenance.start(peers={"alfworld": PEER_PY} if peer_on else {}, packages=["alfworld", "textworld"])
    result: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_start": os.getloadavg(),
                    "note": "native figures are the best of 3 rounds; the peer's are one pass over many games"},
        "quick": args.quick,
    }
    print("native engine (agentgym/ALFWorld-v0) ...", flush=True)
    result["native"] = native_figures(steps, resets)
    for k, v in result["native"].items():
        print(f"  {k:34s} {v}")

    peer: dict[str, Any] | None = None
    if peer_on:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                scenes = export_scenes(n_games, Path(tmp))
            except Exception as e:  # alfworld missing from this venv: export in the peer venv instead
                print(f"  (exporting scenes in the peer venv: {e})")
                scenes = []
            if scenes:
                games = [g for _, g in scenes]
            else:
                code = (
                    "import sys, json; from pathlib import Path; sys.path.insert(0, %r);"
                    "from bench_alfworld import export_scenes;"
                    "print(json.dumps(export_scenes(%d, Path(%r))))" % (str(ROOT / "benchmarks"), n_games, tmp)
                )
                out = subprocess.run([str(PEER_PY), "-c", code], capture_output=True, text=True, timeout=600)
                if out.returncode == 0:
                    scenes = [tuple(x) for x in json.loads(out.stdout.strip().splitlines()[-1])]
                    games = [g for _, g in scenes]
                else:
                    print("  peer export failed:", out.stderr[-500:])
                    games = []
            if games:
                print(f"real alfworld on {len(games)} exported scenes ({PEER_PY.parent.parent.name}) ...", flush=True)
                proc = subprocess.run(
                    [str(PEER_PY), __file__, "--steps-per-scene", str(per_scene), "--peer-worker", *games],
                    capture_output=True, text=True, timeout=1200,
                )
                if proc.returncode == 0:
                    peer = json.loads(proc.stdout.strip().splitlines()[-1])
                    peer["source"] = "measured in this run"
                else:
                    print("  peer run failed:", proc.stderr[-800:])
                result["native_same_scenes"] = native_same_scenes([s for s, _ in scenes], per_scene)
    if peer is None:
        peer = {"source": "not measured in this run (install alfworld in .venv-peers-alfworld)"}
    result["peer_alfworld"] = peer
    print("real alfworld (TextWorld + Fast Downward):")
    for k, v in peer.items():
        print(f"  {k:34s} {v}")
    if "native_same_scenes" in result:
        print("native engine on the same scenes:")
        for k, v in result["native_same_scenes"].items():
            print(f"  {k:34s} {v}")
        if isinstance(peer.get("steps_per_s"), float):
            sp = result["native_same_scenes"]["steps_per_s"] / peer["steps_per_s"]
            rs = result["native_same_scenes"]["resets_per_s"] / peer["resets_per_s_load_and_reset"]
            result["speedup"] = {"steps": round(sp), "resets": round(rs)}
            print(f"speedup: steps x{sp:,.0f}, resets x{rs:,.0f}")
    result["provenance"] = prov.finish()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "benchmarks"))
    main()

"""Plain against relabelled (DAgger-style) imitation of the env's expert, SmolLM2-135M-Instruct on CPU.

A perfect expert's transcripts contain no mistakes, so a model that imitates them never sees a
state off the expert's path. Relabelled collection puts the episode in such states and labels each
one with the expert's action for it (``agentgym collect --relabel``). Per env, in one run:

* **Search-v0** (the real run's env; it has no admissible-action list, so the mistakes come from
  the model itself, which is DAgger proper):
    - ``plain``: SFT on N expert transcripts (``configs/train/search-sft.toml``);
    - ``dagger``: the ``plain`` model acts on N train tasks at T=1.0, the expert labels every state
      it reaches, and a fresh SFT runs on the N expert transcripts plus those N relabelled ones;
    - ``plain_2n``: SFT on 2N expert transcripts, the same amount of data as ``dagger``.
* **ALFWorld-v0** (``configs/train/alfworld-sft.toml``): the expert acts, but with probability P takes
  a random admissible action instead; ``plain`` trains on the expert's own transcripts of the same
  tasks and samples, ``relabelled`` on the perturbed ones with the expert's label at every state.

Every arm starts from the base model with the same config (epochs, lr, batch size); held-out success
is measured through vLLM with each env's protocol (Search: 60 test tasks x 5 seeds at T=0.7;
ALFWorld: ``--alfworld-eval-tasks`` valid_unseen tasks x 2 seeds at T=0.7). Every held-out episode is
exported to ``benchmarks/results/episodes/imitation/<env>-<arm>.jsonl.gz``, and every interval in the JSON
(each arm's: bootstrap over tasks, Wilson where every task ties; each arm against ``plain`` and DAgger
against ``plain_2n``: paired bootstrap over tasks) is computed from those files by
``benchmarks/recompute.py``, so ``python benchmarks/recompute.py --bench imitation --check`` reproduces
them. Writes ``benchmarks/results/imitation.json``.

Run: ``python benchmarks/bench_imitation.py [--envs search,alfworld] [--search-tasks 96] [--alfworld-tasks 32]``
(about 75 minutes on 2 cores with the defaults; ``--sft-set``, ``--runs`` and ``--results`` make a tiny
end-to-end check, see ``make bench-smoke``). ``--resume`` continues an interrupted run across sittings: finished
collections and evaluated arms are reused, an interrupted arm's training continues from its newest checkpoint
(its held-out eval reruns whole).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the real run's command runner, so both benchmarks run stages the same way
import recompute
from bench_real_run import RESULTS, ROOT, sh
from provenance import Provenance

RUN = ROOT / "runs" / "imitation"
SFT_SETS: list[str] = []  # --sft-set: extra overrides for every SFT stage (a tiny check)
RESUME: list[bool] = [False]  # --resume: reuse finished collections and arms, continue interrupted ones


def collect(env: str, out: Path, *extra: str) -> dict[str, Any]:
    done = out.with_name(out.name + ".done")  # written after the file is complete
    if RESUME[0] and done.is_file() and out.is_file():
        print(f"  reusing {_rel(out)} (--resume)", flush=True)
        wall = float(done.read_text() or 0.0)
    else:
        done.unlink(missing_ok=True)
        wall = sh("collect", "--env", env, "--out", str(out), *extra)
        done.write_text(str(wall))
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    labels = [lb for r in rows for lb in (r.get("info", {}).get("labels") or [])]
    return {"file": _rel(out), "transcripts": len(rows), "wall_s": round(wall, 1),
            "success": round(sum(bool(r.get("success")) for r in rows) / max(1, len(rows)), 4),
            "random_steps": sum(1 for r in rows for a in r.get("info", {}).get("acting", []) if a == "random"),
            "labelled_states": len(labels)}


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def sft(config: str, out: Path, data: list[Path], eval_sets: list[str], arm: str, results: Path) -> dict[str, Any]:
    """One SFT arm from the base model; its held-out episodes exported as ``imitation/<arm>``."""
    paths = "[" + ",".join(json.dumps(str(p)) for p in data) + "]"
    sets = [f"run.resume={'true' if RESUME[0] else 'false'}", f"run.out_dir={out}", f"data.paths={paths}",
            "eval.before=false", "eval.after=true", *eval_sets, *SFT_SETS]
    prior = out / "result.json"
    finished = RESUME[0] and prior.is_file() and "after" in json.loads(prior.read_text() or "{}")
    if finished:  # --resume: this arm trained and was evaluated in an earlier sitting
        print(f"  reusing the finished arm {_rel(out)} (--resume)", flush=True)
        wall = float(json.loads(prior.read_text()).get("train_wall_s", 0.0))
    else:  # --resume continues an interrupted arm from its newest checkpoint (run.resume)
        wall = sh("train", "--config", config, *[a for s in sets for a in ("--set", s)])
    res = json.loads((out / "result.json").read_text())
    after = res["after"]
    recompute.export(out / "eval" / "after", "imitation", arm, "after", results=results)
    iv = recompute.arm_interval(recompute.arm_rows("imitation", arm, "after", results))
    return {"data": [_rel(p) for p in data], "stage_wall_s": round(wall, 1),
            "train_s": round(res.get("train_wall_s", 0.0) - after.get("wall_s", 0.0), 1), "steps": res.get("steps"),
            "sft_data": res.get("sft_data"), "trained_tokens": (res.get("sft_data") or {}).get("trained_tokens"),
            "success": iv["mean"], "ci95": iv["ci95"], "ci_method": iv["method"], "episodes": iv["episodes"],
            "tasks": iv["tasks"], "eval_wall_s": round(after.get("wall_s", 0.0), 1),
            "eval_dir": _rel(out / "eval" / "after"), "episodes_file": _rel(recompute.episodes_file("imitation", arm, results))}


def _pair(results: Path, a: str, b: str) -> dict[str, Any]:
    return recompute.paired(recompute.arm_rows("imitation", a, "after", results),
                            recompute.arm_rows("imitation", b, "after", results))


CI = "95% CI: bootstrap over tasks (Wilson where every task ties), from the exported episodes"


def search(n: int, run: Path, results: Path, actor: str) -> dict[str, Any]:
    env, cfg, d = "agentgym/Search-v0", "configs/train/search-sft.toml", run / "search"
    d.mkdir(parents=True, exist_ok=True)
    data = {"expert_n": collect(env, d / "expert-n.jsonl", "--policy", "expert", "--tasks", str(n)),
            "expert_2n": collect(env, d / "expert-2n.jsonl", "--policy", "expert", "--tasks", str(2 * n))}
    arms = {"plain": sft(cfg, d / "plain", [d / "expert-n.jsonl"], [], "search-plain", results)}
    model = d / "plain" / "final"
    # DAgger: the imitating model acts (its own mistakes), the env's expert labels every state it reaches
    data["dagger_n"] = collect(env, d / "dagger-n.jsonl", "--policy", f"{actor}:{model}", "--relabel", "--tasks", str(n),
                               "--temperature", "1.0", "--max-turns", "6", "--max-tokens", "64", "--concurrency", "32")
    arms["dagger"] = sft(cfg, d / "dagger", [d / "expert-n.jsonl", d / "dagger-n.jsonl"], [], "search-dagger", results)
    arms["plain_2n"] = sft(cfg, d / "plain-2n", [d / "expert-2n.jsonl"], [], "search-plain_2n", results)
    for k in ("dagger", "plain_2n"):
        arms[k]["paired_vs_plain"] = _pair(results, "search-plain", f"search-{k}")
    arms["dagger"]["paired_vs_plain_2n"] = _pair(results, "search-plain_2n", "search-dagger")
    return {"env": env, "config": cfg, "n": n, "collections": data, "arms": arms,
            "protocol": f"test split, 60 tasks x 5 seeds, T=0.7 with per-turn sampling seeds; {CI}"}


def alfworld(n: int, random_prob: float, samples: int, eval_tasks: int, run: Path, results: Path) -> dict[str, Any]:
    env, cfg, d = "agentgym/ALFWorld-v0", "configs/train/alfworld-sft.toml", run / "alfworld"
    d.mkdir(parents=True, exist_ok=True)
    common = ["--policy", "expert", "--tasks", str(n), "--samples", str(samples), "--max-turns", "30"]
    data = {"plain": collect(env, d / "plain.jsonl", *common),
            "relabelled": collect(env, d / "relabelled.jsonl", *common, "--relabel", "--random-prob", str(random_prob))}
    ev = [f"eval.tasks={eval_tasks}", "eval.seeds=[0,1]", "eval.temperature=0.7", "eval.sampling_seeds=true"]
    arms = {"plain": sft(cfg, d / "plain", [d / "plain.jsonl"], ev, "alfworld-plain", results),
            "relabelled": sft(cfg, d / "relabelled", [d / "relabelled.jsonl"], ev, "alfworld-relabelled", results)}
    arms["relabelled"]["paired_vs_plain"] = _pair(results, "alfworld-plain", "alfworld-relabelled")
    return {"env": env, "config": cfg, "tasks": n, "samples": samples, "random_prob": random_prob,
            "collections": data, "arms": arms,
            "protocol": f"valid_unseen, {eval_tasks} tasks x 2 seeds, T=0.7 with per-turn sampling seeds; {CI}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", default="search,alfworld")
    ap.add_argument("--search-tasks", type=int, default=96, help="N: expert transcripts in the plain arm")
    ap.add_argument("--alfworld-tasks", type=int, default=32)
    ap.add_argument("--alfworld-samples", type=int, default=2)
    ap.add_argument("--alfworld-eval-tasks", type=int, default=32, help="valid_unseen tasks in each held-out eval")
    ap.add_argument("--random-prob", type=float, default=0.2, help="ALFWorld: random admissible action probability")
    ap.add_argument("--dagger-actor", default="vllm", choices=["vllm", "hf"], help="backend of the acting SFT model")
    ap.add_argument("--sft-set", action="append", default=[], help="extra --set for every SFT stage (repeatable)")
    ap.add_argument("--runs", default=str(RUN), help="run folder (default runs/imitation)")
    ap.add_argument("--results", default=str(RESULTS), help="where the JSON and episodes/ go")
    ap.add_argument("--resume", action="store_true",
                    help="continue an interrupted run: reuse finished collections and evaluated arms in --runs, "
                         "resume an arm's training from its newest checkpoint")
    args = ap.parse_args()
    SFT_SETS[:] = args.sft_set
    RESUME[0] = args.resume
    run, results = Path(args.runs), Path(args.results)
    path = results / "imitation.json"
    out: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for name in [s.strip() for s in args.envs.split(",") if s.strip()]:
        print(f"== {name}", flush=True)
        prov = Provenance.start()
        if name == "search":
            out["search"] = search(args.search_tasks, run, results, args.dagger_actor)
        elif name == "alfworld":
            out["alfworld"] = alfworld(args.alfworld_tasks, args.random_prob, args.alfworld_samples,
                                       args.alfworld_eval_tasks, run, results)
        else:
            raise SystemExit(f"unknown env section {name!r} (search, alfworld)")
        out[name]["extra_sets"] = args.sft_set
        out[name]["provenance"] = prov.finish()
        out.pop("machine", None)
        out["recomputable"] = recompute.recompute("imitation", results)
        results.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1))  # after each env, so a later failure keeps what finished
        for arm, r in out[name]["arms"].items():
            print(f"  {arm:>10}: {100 * r['success']:.1f}% [{100 * r['ci95'][0]:.1f}, {100 * r['ci95'][1]:.1f}] "
                  f"({r['episodes']} episodes; SFT {r['train_s']} s, {r['trained_tokens']} tokens)", flush=True)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

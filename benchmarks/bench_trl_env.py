"""TRL's ``GRPOTrainer`` through ``agentgym.integrations.trl.AgentGymSpec`` against ``agentgym train``, on the
same env, model and steps (issue 26, part 2: "compare with ``agentgym train`` on the same env and steps").

**Setup.** The env and model of ``tests/integrations/test_trl.py``: ``agentgym/TinyCoin-v0`` (one tool call
``pick(side)`` ends the episode; ``tests/integrations/tiny_coin.py``) and the tiny player built there (a 2-layer
Llama over SmolLM2's tokenizer and AgentGym's SmolLM2 chat template, fitted to answer with ``pick`` of either
side; nothing downloaded). Both arms start from the same weights and train with one settings dict
(:data:`SETTINGS`): group size, groups per step, max tokens, turns, lr (constant, no warm-up), full fine-tuning
in float32, temperature, clip range, no KL, gradient clip, seed, one torch thread.

**Protocol.** ``--repeats`` rounds; in round ``r`` both arms run with seed ``r``, in alternating order (TRL
first in even rounds), each arm in its own subprocess (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``),
so memory, threads and caches do not leak between them. Each arm records, per step: the wall time (from the
end of the previous step; the first step is reported apart, it includes warm-up), the tokens the loss trained
on, and the mean reward. After training, the arm's final weights are evaluated by ``agentgym eval``'s code path
(``run_eval``, HF policy) on the held-out split (8 tasks x ``--eval-samples`` samples, temperature 1); the
starting model is evaluated the same way once. The headline is the per-round ratio of steady-state step time
(TRL / AgentGym), geometric mean with a 95% t-interval over rounds (``agentgym.eval.stats.ratio_ci``).

What is not equal between the arms is written into the JSON (``not_equal``): TRL owns its loop.

Run: ``python benchmarks/bench_trl_env.py --steps 10 --repeats 4`` writes the committed ``benchmarks/results/trl_env.json``;
``--quick`` is a smoke run (2 steps, 1 round) that writes nowhere unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "integrations"  # tiny_coin.py: the env (registered on import) and the tiny player
RESULTS = Path(__file__).parent / "results" / "trl_env.json"

# One settings dict; each arm's config is derived from it (``trl_args`` / ``agentgym_config``).
SETTINGS: dict[str, Any] = {
    "env": "agentgym/TinyCoin-v0",
    "group_size": 4,            # TRL num_generations
    "groups_per_step": 2,       # TRL per_device_train_batch_size = group_size * groups_per_step
    "max_tokens": 48,           # TRL max_completion_length (see NOT_EQUAL: per turn vs per rollout)
    "max_turns": 4,             # TRL: 1 generation + max_tool_calling_iterations = 3
    "lr": 1e-3,                 # constant, no warm-up, AdamW betas (0.9, 0.999), eps 1e-8, no weight decay
    "finetune": "full",
    "dtype": "float32",         # TRL: bf16=False; no gradient checkpointing in either
    "temperature": 1.0,
    "top_p": 1.0,
    "clip_low": 0.2,
    "clip_high": 0.28,          # TRL epsilon / epsilon_high
    "kl_coef": 0.0,             # TRL beta
    "grad_clip": 1.0,           # TRL max_grad_norm
    "aggregation": "token-mean",  # TRL loss_type="dapo": mean over the batch's trained tokens
    "threads": 1,
}

NOT_EQUAL = [
    "Generation: TRL samples with transformers' model.generate on the trainer's own model (one padded batch of "
    "group_size * groups_per_step prompts, then one batch per tool-calling iteration); AgentGym samples through "
    "its rollout engine with HFPolicy, a second copy of the model that receives the new weights after every step "
    "(publish), continuous-batched across concurrent episodes.",
    "Episode shape and max_tokens: AgentGym's rollout.max_tokens=48 is per assistant turn; TRL's "
    "max_completion_length=48 bounds the whole multi-turn completion (generated tokens + tool results + later "
    "turns). Here the pick call is 27 tokens and TRL's tool-result suffix 23, so TRL rolls the tool message back "
    "as overlong and ends the rollout after the call (the env executed it, so the reward counts): both arms train "
    "on the same ~27 tokens per pick episode. A completion without a tool call (or a flip) ends TRL's rollout with "
    "reward 0, while AgentGym answers with an error observation and lets the model go on (up to 4 turns), so "
    "AgentGym can train on more tokens in those episodes: compare time per step and time per trained token.",
    "Task order: same 8 train tasks and the same seed, but each trainer draws its own task order (TRL's shuffled "
    "RepeatSampler, AgentGym's task stream), so the episodes differ between arms.",
    "Advantages: both normalise by the group's std (TRL scale_rewards='group', AgentGym estimator 'grpo'); "
    "AgentGym applies truncated importance sampling between rollout and trainer logprobs (tis_cap=2; the two "
    "HF copies agree to ~1e-5, weight ~1), TRL has no behaviour-policy logprobs on this path. AgentGym's dynamic "
    "sampling (dropping zero-variance groups and refilling) is off to match TRL.",
    "Zero-variance groups: AgentGym leaves groups whose rewards are all equal out of the batch (their advantage is "
    "0) and skips the update when no group is left (0 trained tokens that step, 'updated' false); TRL keeps them "
    "in the batch, so their tokens count in DAPO's token-mean denominator and it runs forward/backward every step. "
    "So AgentGym's per-step work is smaller when groups agree, and its loss is normalised over fewer tokens.",
    "Bookkeeping each arm does and the other does not: AgentGym writes metrics.jsonl every step and publishes "
    "weights to the rollout copy (both inside its step time); its final checkpoint and TRL's save_model come after "
    "the last timed step. TRL computes no old-policy logprobs (num_iterations=1) and no reference model (beta=0).",
    "TRL 1.16 always patches the model with its fused, chunked LM-head log-prob kernel (no option turns it off); "
    "on CPU, without Triton, it runs as tiled torch ops over every position of the padded prompt + completion "
    "(labels mask the prompt), which is most of TRL's step time here (generate_score_s is TRL's generation + "
    "env + reward, the rest of the step is the loss forward/backward and the optimizer). AgentGym's trainer "
    "computes logits only for the trained positions. On a GPU with Triton the kernel is a different cost.",
    "The task is a coin flip whose side is a function of the task id's parity: made for throughput, not learning; "
    "held-out success shows what each trainer leaves after the run (same eval code for both), with few episodes.",
]


# ---------------------------------------------------------------------------------------------- configs
def trl_args(s: dict[str, Any], out: str, steps: int, seed: int) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments equivalent to ``s``."""
    assert s["finetune"] == "full" and s["dtype"] == "float32" and s["aggregation"] == "token-mean"
    return dict(
        output_dir=out, max_steps=steps, seed=seed, data_seed=seed, use_cpu=True, report_to="none",
        logging_steps=1, save_strategy="no", dataloader_num_workers=0,
        num_generations=s["group_size"], per_device_train_batch_size=s["group_size"] * s["groups_per_step"],
        gradient_accumulation_steps=1, max_completion_length=s["max_tokens"],
        max_tool_calling_iterations=s["max_turns"] - 1, temperature=s["temperature"], top_p=s["top_p"],
        learning_rate=s["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=s["grad_clip"],
        epsilon=s["clip_low"], epsilon_high=s["clip_high"], beta=s["kl_coef"], loss_type="dapo",
        scale_rewards="group", num_iterations=1, bf16=False, gradient_checkpointing=False,
        mask_truncated_completions=False,
    )


def agentgym_config(s: dict[str, Any], model: str, out: str, steps: int, seed: int) -> dict[str, Any]:
    """``agentgym train``'s config (as a dict for ``validate_config``) equivalent to ``s``."""
    return {
        "run": {"out_dir": out, "steps": steps, "seed": seed, "threads": s["threads"], "resume": False,
                "checkpoint_every": steps + 1, "keep_checkpoints": 1},
        "model": {"path": model, "dtype": s["dtype"], "finetune": s["finetune"]},
        "rollout": {"env": s["env"], "imports": ["tiny_coin"], "backend": "hf", "group_size": s["group_size"],
                    "groups_per_step": s["groups_per_step"], "max_tokens": s["max_tokens"],
                    "max_turns": s["max_turns"], "temperature": s["temperature"], "top_p": s["top_p"],
                    "concurrency": s["group_size"] * s["groups_per_step"]},
        "advantage": {"estimator": "grpo"},
        "loss": {"clip_low": s["clip_low"], "clip_high": s["clip_high"], "kl_coef": s["kl_coef"],
                 "aggregation": s["aggregation"]},
        "filter": {"dynamic_sampling": False},
        "optim": {"lr": s["lr"], "warmup_steps": 0, "schedule": "constant", "grad_clip": s["grad_clip"],
                  "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8},
        "eval": {"before": False, "after": False},
        "log": {"progress": False, "plot": False},
    }


# ---------------------------------------------------------------------------------------------- arms (children)
def _threads() -> None:
    import torch

    torch.set_num_threads(SETTINGS["threads"])


def heldout(model: str, out: str, samples: int, seed: int) -> dict[str, Any]:
    """``agentgym eval``'s code path on the held-out split (HF policy, temperature 1)."""
    from agentgym.policies import from_spec

    from agentgym.eval import EvalConfig, run_eval

    policy = from_spec("hf:" + model)
    cfg = EvalConfig([SETTINGS["env"]], split="test", samples=samples, seeds=[seed], max_turns=SETTINGS["max_turns"],
                     max_tokens=SETTINGS["max_tokens"], temperature=1.0, concurrency=8)
    t = time.perf_counter()
    summary = run_eval(policy, cfg, out)
    block = summary["envs"][SETTINGS["env"]]
    return {"success": block["success"]["mean"], "episodes": block.get("episodes", block.get("finished_episodes")),
            "n_tasks": 8, "samples": samples, "wall_s": time.perf_counter() - t}


def arm_trl(model: str, work: Path, steps: int, seed: int) -> dict[str, Any]:
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentgym.integrations.trl import AgentGymSpec

    spec = AgentGymSpec(SETTINGS["env"], num_tasks=8, seed=0)
    marks: list[float] = []
    tokens: list[int] = []
    gen_s: list[float] = []

    class Timer(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            marks.append(time.perf_counter())

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            tokens.append(0)
            gen_s.append(0.0)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            marks.append(time.perf_counter())

    class Counted(GRPOTrainer):  # type: ignore[misc]
        def _generate_and_score_completions(self, *a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            out = super()._generate_and_score_completions(*a, **kw)
            gen_s[-1] += time.perf_counter() - t
            return out

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            mask = inputs["completion_mask"]
            if "tool_mask" in inputs:
                mask = mask * inputs["tool_mask"]
            tokens[-1] += int(mask.sum().item())
            return super()._compute_loss(model, inputs)

    t_setup = time.perf_counter()
    trainer = Counted(model=model, processing_class=spec.tokenizer(model),
                      args=GRPOConfig(**trl_args(SETTINGS, str(work / "trl-out"), steps, seed)),
                      train_dataset=spec.train_dataset, environment_factory=spec.environment_factory,
                      reward_funcs=spec.reward_funcs, callbacks=[Timer()])
    assert next(trainer.model.parameters()).dtype == torch.float32
    setup_s = time.perf_counter() - t_setup
    trainer.train()
    assert trainer.state.global_step == steps
    logs = [h for h in trainer.state.log_history if "reward" in h]
    final = str(work / "trl-final")
    trainer.save_model(final)
    return {"setup_s": setup_s, "step_s": [b - a for a, b in itertools.pairwise(marks)],
            "trained_tokens": tokens, "reward": [h["reward"] for h in logs],
            "generate_score_s": gen_s,
            "tool_calls_per_rollout": [h.get("tools/call_frequency") for h in logs],
            "completion_len_mean": [h.get("completions/mean_length") for h in logs], "final": final}


def arm_agentgym(model: str, work: Path, steps: int, seed: int) -> dict[str, Any]:
    from agentgym.recipes import run_training
    from agentgym.trainers.config import validate_config

    marks: list[float] = []
    rows: list[dict[str, Any]] = []

    def on_step(flat: dict[str, Any]) -> None:
        marks.append(time.perf_counter())
        rows.append(flat)

    out = str(work / "ag-run")
    cfg = validate_config(agentgym_config(SETTINGS, model, out, steps, seed))
    t0 = time.perf_counter()
    run_training(cfg, on_step=on_step)
    first = float(rows[0]["elapsed_s"])  # the first step, from the loop's start (setup excluded)
    return {"setup_s": marks[0] - t0 - first, "step_s": [first] + [b - a for a, b in itertools.pairwise(marks)],
            # a step whose groups all have zero variance trains nothing (no train/ metrics): 0 tokens
            "trained_tokens": [int(r.get("train/trained_tokens", 0)) for r in rows],
            "updated": ["train/trained_tokens" in r for r in rows],
            "reward": [float(r["rollout/reward_mean"]) for r in rows],
            "rollout_s": [float(r.get("time/rollout_s", 0.0)) for r in rows],
            "train_s": [float(r.get("time/train_s", 0.0)) for r in rows],
            "final": str(Path(out) / "final")}


def run_arm(arm: str, model: str, steps: int, seed: int, eval_samples: int, out: Path) -> None:
    _threads()
    import tiny_coin  # noqa: F401 (registers agentgym/TinyCoin-v0; TINY is on PYTHONPATH)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"bench-trl-{arm}-") as tmp:
        work = Path(tmp)
        if arm == "eval":
            res: dict[str, Any] = {"heldout": heldout(model, str(work / "eval"), eval_samples, seed)}
        else:
            res = (arm_trl if arm == "trl" else arm_agentgym)(model, work, steps, seed)
            res["heldout_after"] = heldout(res.pop("final"), str(work / "eval"), eval_samples, seed)
    import resource

    res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    res["process_wall_s"] = time.perf_counter() - t0
    out.write_text(json.dumps(res))


# ---------------------------------------------------------------------------------------------- parent
def _child(args: list[str], log: Path) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               TRL_EXPERIMENTAL_SILENCE="1", PYTHONPATH=os.pathsep.join(
                   [str(TINY), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    res_path = log.with_suffix(".json")
    t = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, __file__, *args, "--result", str(res_path)], stdout=f,
                              stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
    if proc.returncode != 0:
        raise SystemExit(f"arm {args} failed (exit {proc.returncode}); log: {log}\n{log.read_text()[-3000:]}")
    res: dict[str, Any] = json.loads(res_path.read_text())
    res["subprocess_wall_s"] = time.perf_counter() - t
    return res


def summarize(rounds: list[dict[str, dict[str, Any]]], before: dict[str, Any]) -> dict[str, Any]:
    """Per-arm figures and the paired TRL / AgentGym ratios over rounds."""
    from agentgym.eval.stats import mean_ci, ratio_ci, wilson_interval

    def steady(r: dict[str, Any]) -> float:
        s = r["step_s"][1:] or r["step_s"]
        return sum(s) / len(s)

    def per_token(r: dict[str, Any]) -> float:  # steady-state seconds per trained token
        return sum(r["step_s"][1:]) / max(1, sum(r["trained_tokens"][1:]))

    arms: dict[str, Any] = {}
    for arm in ("trl", "agentgym"):
        rs = [rd[arm] for rd in rounds]
        succ = sum(round(r["heldout_after"]["success"] * r["heldout_after"]["samples"] * 8) for r in rs)
        n = sum(r["heldout_after"]["samples"] * 8 for r in rs)
        arms[arm] = {
            "steady_step_s": mean_ci([steady(r) for r in rs]),
            "first_step_s": mean_ci([r["step_s"][0] for r in rs]),
            "setup_s": mean_ci([r["setup_s"] for r in rs]),
            "trained_tokens_per_step": mean_ci([sum(r["trained_tokens"]) / len(r["trained_tokens"]) for r in rs]),
            "steady_s_per_1k_trained_tokens": mean_ci([1000 * per_token(r) for r in rs]),
            "reward_mean_over_steps": mean_ci([sum(r["reward"]) / len(r["reward"]) for r in rs]),
            "heldout_after": {"success": succ / n if n else None, "episodes": n,
                              "wilson95": wilson_interval(succ, n)},
            "peak_rss_gb": mean_ci([r["peak_rss_gb"] for r in rs]),
            "subprocess_wall_s": mean_ci([r["subprocess_wall_s"] for r in rs]),
        }
    ratio = {
        "steady_step_time_trl_over_agentgym": ratio_ci([steady(rd["trl"]) / steady(rd["agentgym"]) for rd in rounds]),
        "time_per_trained_token_trl_over_agentgym": ratio_ci(
            [per_token(rd["trl"]) / per_token(rd["agentgym"]) for rd in rounds]),
        "first_step_time_trl_over_agentgym": ratio_ci(
            [rd["trl"]["step_s"][0] / rd["agentgym"]["step_s"][0] for rd in rounds]),
    }
    k = before["heldout"]["samples"] * 8
    s0 = round(before["heldout"]["success"] * k)
    return {"arms": arms, "ratios": ratio,
            "heldout_before": {"success": before["heldout"]["success"], "episodes": k,
                               "wilson95": wilson_interval(s0, k)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eval-samples", type=int, default=4, help="held-out samples per task (8 tasks)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 steps, 1 round, writes only to --out")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--arm", choices=["trl", "agentgym", "eval"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.arm:
        run_arm(a.arm, a.model, a.steps, a.seed, a.eval_samples, a.result)
        return
    if a.quick:
        a.steps, a.repeats = 2, 1
    out = a.out or (None if a.quick else RESULTS)

    sys.path[:0] = [str(TINY), str(Path(__file__).parent)]
    from provenance import Provenance

    prov = Provenance.start()
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        work = Path(tmp)
        _threads()
        import tiny_coin

        t = time.perf_counter()
        model = str(tiny_coin.build_tiny_player(work / "player"))
        build_s = time.perf_counter() - t
        common = ["--model", model, "--steps", str(a.steps), "--eval-samples", str(a.eval_samples)]
        before = _child(["--arm", "eval", *common], work / "eval-before.log")
        rounds: list[dict[str, dict[str, Any]]] = []
        for r in range(a.repeats):
            order = ["trl", "agentgym"] if r % 2 == 0 else ["agentgym", "trl"]
            rd: dict[str, dict[str, Any]] = {}
            for arm in order:
                rd[arm] = _child(["--arm", arm, "--seed", str(r), *common], work / f"r{r}-{arm}.log")
                print(f"round {r} {arm}: steady {sum(rd[arm]['step_s'][1:]) / max(1, a.steps - 1):.3f} s/step, "
                      f"tokens/step {sum(rd[arm]['trained_tokens']) / a.steps:.0f}, "
                      f"reward {sum(rd[arm]['reward']) / a.steps:.2f}", flush=True)
            rd["order"] = order  # type: ignore[assignment]
            rounds.append(rd)
    result = {
        "what": "TRL 1.16 GRPOTrainer(environment_factory=AgentGymSpec) vs agentgym train (run_training), same env, "
                "tiny model, settings and steps; each arm its own subprocess, rounds interleaved",
        "command": "python benchmarks/bench_trl_env.py " + " ".join(sys.argv[1:]),
        "settings": SETTINGS, "steps": a.steps, "repeats": a.repeats, "eval_samples_per_task": a.eval_samples,
        "trl_grpo_config": {k: v for k, v in trl_args(SETTINGS, "OUT", a.steps, 0).items() if k != "output_dir"},
        "agentgym_config": agentgym_config(SETTINGS, "MODEL", "OUT", a.steps, 0),
        "model": "tests/integrations/tiny_coin.build_tiny_player (2-layer Llama, hidden 64, SmolLM2 tokenizer)",
        "build_player_s": build_s,
        "not_equal": NOT_EQUAL,
        **summarize(rounds, before),
        "rounds": rounds,
        "total_wall_s": time.perf_counter() - t_all,
    }
    result["provenance"] = prov.finish()
    r = result["ratios"]["steady_step_time_trl_over_agentgym"]
    print(json.dumps({"steady_step_s": {k: v["steady_step_s"] for k, v in result["arms"].items()},
                      "ratio_trl_over_agentgym": {"mean": r["mean"], "ci95": r["ci95"]},
                      "per_token": result["ratios"]["time_per_trained_token_trl_over_agentgym"]}, indent=1))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()

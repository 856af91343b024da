"""Trainer step time and trained tokens/s on SmolLM2-135M (CPU), ours vs TRL's GRPOTrainer, same workload.

Workload: 4 multi-turn sequences (~300-400 tokens each: a prompt of 100-200 tokens, then 2 turns of
40 generated tokens each followed by 60 tool tokens), 80 trained tokens per sequence (the loss mask is 0 on
prompt and tool tokens), advantages +-1. One optimizer step per iteration (GRPO loss, token-mean,
no KL), bf16 weights, gradient clipping at 1.0; full fine-tune and LoRA (r=16, all linear layers).
Both sides are set up the same way, set explicitly and asserted before timing: AdamW (``torch.optim.AdamW``,
lr 1e-6, betas (0.9, 0.999), eps 1e-8, weight decay 0), gradient checkpointing off, no autocast.

* **ours**: :class:`agentgym.trainers.PolicyTrainer.train_on` (micro-batches packed under a token
  budget of 4096, sorted by length).
* **TRL**: ``GRPOTrainer.compute_loss`` on the same tokens (prompt left-padded, completion
  right-padded, ``tool_mask`` = our loss mask, ``loss_type="dapo"`` = token-mean, ``beta=0``), then
  backward, clip and the trainer's own optimizer (``optim="adamw_torch"``) step. Generation is not timed on
  either side. TRL runs in its own virtualenv (``--trl-python``, default ``.venv-trl/bin/python``:
  ``python -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 trl==1.16 peft``).

Each side is a worker process holding its model; after one warm-up step each, the parent times
``--steps`` steps, alternating sides step by step (lockstep: one side computes while the other waits).
Reported: median step time per side, and TRL/ours per step pair as a geometric mean with a 95% t-interval
over the pairs. Writes ``benchmarks/results/trainer.json``.
Run: ``python benchmarks/bench_trainer.py [--steps 10] [--trl-python .venv-trl/bin/python]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "trainer.json"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402

N_SEQ, TURNS, GEN, TOOL = 4, 2, 40, 60


def make_workload(vocab: int, seed: int = 0) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    seqs, masks = [], []
    for _ in range(N_SEQ):
        prompt = 100 + int(torch.randint(0, 100, (1,), generator=g))
        ids: list[int] = torch.randint(10, vocab, (prompt,), generator=g).tolist()
        mask = [0] * prompt
        for _ in range(TURNS):
            ids += torch.randint(10, vocab, (GEN + TOOL,), generator=g).tolist()
            mask += [1] * GEN + [0] * TOOL
        seqs.append(ids)
        masks.append(mask)
    advantages = [1.0 if i % 2 == 0 else -1.0 for i in range(N_SEQ)]
    return {"token_ids": seqs, "loss_mask": masks, "advantages": advantages}


def _stats(times: list[float], trained: int, total: int) -> dict[str, Any]:
    med = statistics.median(times)
    return {"step_s_median": round(med, 3), "step_s_all": [round(t, 3) for t in times],
            "trained_tokens_per_step": trained, "tokens_per_step": total,
            "trained_tokens_per_s": round(trained / med, 1), "tokens_per_s": round(total / med, 1)}


OPTIM = {"lr": 1e-6, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}


def _check_setup(model: Any, opt: Any) -> dict[str, Any]:
    """Assert the shared setup (see the module docstring) and return it for the JSON."""
    import torch

    assert type(opt) is torch.optim.AdamW, type(opt)
    for g in opt.param_groups:
        for k, v in OPTIM.items():
            assert tuple(g[k]) == v if k == "betas" else g[k] == v, (k, g[k])
    base = getattr(model, "base_model", model)
    gc = bool(getattr(model, "is_gradient_checkpointing", False) or getattr(base, "is_gradient_checkpointing", False))
    assert not gc, "gradient checkpointing must be off on both sides"
    return {"optimizer": type(opt).__module__ + "." + type(opt).__name__,
            "param_groups": [{k: (list(g[k]) if k == "betas" else g[k]) for k in OPTIM} for g in opt.param_groups],
            "gradient_checkpointing": gc, "trainable_params": sum(p.numel() for g in opt.param_groups for p in g["params"])}


# ---------------------------------------------------------------------------------------------- ours
def setup_ours(model_path: str, work: dict[str, Any], finetune: str) -> tuple[Callable[[], None], dict[str, Any]]:
    import torch
    from agentgym.trainers.batching import TrainSample
    from agentgym.trainers.config import LossConfig, OptimConfig
    from agentgym.trainers.model import add_lora, load_causal_lm
    from agentgym.trainers.trainer import PolicyTrainer

    torch.manual_seed(0)
    model = load_causal_lm(model_path, "bfloat16", gradient_checkpointing=False)
    adapter = None
    if finetune == "lora":
        model = add_lora(model, "policy", rank=16, alpha=32, dropout=0.0, targets="all-linear")
        adapter = "policy"
    tr = PolicyTrainer("policy", model, optim=OptimConfig(lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"],
                                                           weight_decay=OPTIM["weight_decay"], token_budget=4096,
                                                           grad_clip=1.0),
                       loss=LossConfig(tis_cap=None), adapter=adapter)
    setup = _check_setup(model, tr.optimizer)
    samples = [TrainSample("policy", ids, m, a) for ids, m, a in
               zip(work["token_ids"], work["loss_mask"], work["advantages"], strict=True)]
    info: dict[str, Any] = {"setup": setup}

    def step() -> None:
        m = tr.train_on(samples)
        assert m["optimizer_steps"] == 1
        info.update(micro_batches=m["micro_batches"], padding_efficiency=round(m["padding_efficiency"], 3))

    return step, info


# ----------------------------------------------------------------------------------------------- TRL
def setup_trl(model_path: str, work: dict[str, Any], finetune: str) -> tuple[Callable[[], None], dict[str, Any]]:
    import tempfile

    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    model.config.use_cache = False  # as ours: no KV cache built during training forwards
    peft_config = None
    if finetune == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    out = tempfile.mkdtemp()
    args = GRPOConfig(output_dir=out, per_device_train_batch_size=N_SEQ, num_generations=N_SEQ, beta=0.0,
                      loss_type="dapo", learning_rate=OPTIM["lr"], max_grad_norm=1.0, use_cpu=True, bf16=False,
                      optim="adamw_torch", adam_beta1=OPTIM["betas"][0], adam_beta2=OPTIM["betas"][1],
                      adam_epsilon=OPTIM["eps"], weight_decay=OPTIM["weight_decay"], gradient_checkpointing=False,
                      report_to=[], logging_steps=1000, save_strategy="no")
    ds = Dataset.from_list([{"prompt": "hi"}] * N_SEQ)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=ds, processing_class=tok, peft_config=peft_config)
    assert trainer.args.gradient_checkpointing is False and trainer.args.optim == "adamw_torch"
    model = trainer.model
    model.train()
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which we do not run
    opt = trainer.optimizer
    setup = _check_setup(model, opt)
    # split each sequence at its first trained token: prompt (left-padded) + completion (right-padded)
    prompts, comps, cmask = [], [], []
    for ids, m in zip(work["token_ids"], work["loss_mask"], strict=True):
        k = m.index(1)
        prompts.append(ids[:k])
        comps.append(ids[k:])
        cmask.append(m[k:])
    P, C = max(map(len, prompts)), max(map(len, comps))
    pad = tok.pad_token_id
    prompt_ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    completion_ids = torch.tensor([c + [pad] * (C - len(c)) for c in comps])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (C - len(c)) for c in comps])
    tool_mask = torch.tensor([m + [0] * (C - len(m)) for m in cmask])
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
              "completion_mask": completion_mask, "tool_mask": tool_mask,
              "advantages": torch.tensor(work["advantages"]), "num_items_in_batch": tool_mask.sum().float()}
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    return step, {"setup": setup, "trl": trl.__version__,
                  "padded_tokens_per_step": int(prompt_ids.numel() + completion_ids.numel())}


def worker(side: str, model: str, work_path: str, finetune: str) -> None:
    """Lockstep worker: set up, one warm-up step, then one timed step per ``step`` line on stdin."""
    work = json.loads(Path(work_path).read_text())
    step, info = (setup_ours if side == "ours" else setup_trl)(model, work, finetune)
    step()  # warm-up
    print("READY", flush=True)
    times: list[float] = []
    for line in sys.stdin:
        if line.strip() != "step":
            break
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        print(f"TIME {times[-1]}", flush=True)
    trained = sum(sum(x[1:]) for x in work["loss_mask"])
    print("RESULT " + json.dumps({**_stats(times, trained, sum(len(x) for x in work["token_ids"])), **info}), flush=True)


class Worker:
    def __init__(self, py: str, side: str, model: str, work: Path, finetune: str, threads: int) -> None:
        cmd = [py, __file__, "--worker", side, "--model", model, "--work", str(work), "--finetune", finetune,
               "--threads", str(threads)]
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        self.side = side
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._expect("READY")

    def _expect(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        raise SystemExit(f"{self.side} worker exited (code {self.proc.wait()}) before {prefix}")

    def step(self) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return float(self._expect("TIME "))

    def finish(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("done\n")
        self.proc.stdin.flush()
        res: dict[str, Any] = json.loads(self._expect("RESULT "))
        self.proc.wait(timeout=120)
        return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--worker", choices=["ours", "trl"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--finetune", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        import torch

        torch.set_num_threads(a.threads)
        worker(a.worker, a.model, a.work, a.finetune)
        return
    if not Path(a.trl_python).exists():
        raise SystemExit(f"{a.trl_python} not found: python -m venv .venv-trl && .venv-trl/bin/pip install "
                         "torch==2.13.0 trl==1.16 peft")
    prov = Provenance.start(peers={"trl": a.trl_python}, packages=["trl", "peft", "accelerate", "datasets"])
    from agentgym.policies.models import load_tokenizer, resolve_model

    from agentgym.eval.stats import ratio_ci

    model = resolve_model("smollm2-135m-instruct")
    work = make_workload(len(load_tokenizer(model)))
    rows: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        wpath = Path(tmp) / "work.json"
        wpath.write_text(json.dumps(work))
        for finetune in ("lora", "full"):
            sides = {"ours": Worker(sys.executable, "ours", model, wpath, finetune, a.threads),
                     "trl": Worker(a.trl_python, "trl", model, wpath, finetune, a.threads)}
            pairs: list[tuple[float, float]] = []
            for i in range(a.steps):  # lockstep, alternating who goes first
                order = ["ours", "trl"] if i % 2 == 0 else ["trl", "ours"]
                t = {side: sides[side].step() for side in order}
                pairs.append((t["ours"], t["trl"]))
            for side, w in sides.items():
                rows[f"{side}-{finetune}"] = w.finish()
                print(f"{side:5s} {finetune:5s} step {rows[f'{side}-{finetune}']['step_s_median']:7.2f} s  "
                      f"trained tok/s {rows[f'{side}-{finetune}']['trained_tokens_per_s']:8.1f}", flush=True)
            r = ratio_ci([tr / ou for ou, tr in pairs])
            ratios[finetune] = {"mean": round(r["mean"], 3), "ci95": [round(x, 3) for x in r["ci95"]] if r["ci95"] else None,
                                "per_step": [round(x, 3) for x in r["per_round"]]}
    out = {"benchmark": "trainer", "model": "SmolLM2-135M-Instruct", "dtype": "bfloat16", "device": "cpu",
           "threads": a.threads, "workload": {"sequences": N_SEQ, "turns": TURNS, "generated_per_turn": GEN,
                                              "tool_tokens_per_turn": TOOL, "prompt_tokens": "100-200"},
           "optimizer": {"class": "torch.optim.AdamW", **OPTIM, "grad_clip": 1.0}, "gradient_checkpointing": False,
           "results": rows, "trl_step_time_over_ours": ratios, "timed_steps": a.steps,
           "note": ("Lockstep: the two sides alternate steps (one computes while the other waits), so load changes hit "
                    "both; trl_step_time_over_ours is the geometric mean over step pairs (>1: ours is faster), 95% "
                    "t-interval over the pairs' logs."),
           "provenance": prov.finish()}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()

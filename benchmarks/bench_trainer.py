"""Trainer step time and trained tokens/s on SmolLM2-135M (CPU), ours vs TRL's GRPOTrainer, same workload.

Workload: 4 multi-turn sequences (~300-400 tokens each: a prompt of 100-200 tokens, then 2 turns of
40 generated tokens each followed by 60 tool tokens), 80 trained tokens per sequence (the loss mask is 0 on
prompt and tool tokens), advantages +-1. One optimizer step per iteration (GRPO loss, token-mean,
no KL), bf16 weights, AdamW, gradient clipping at 1.0; full fine-tune and LoRA (r=16, all linear
layers).

* **ours**: :class:`agentgym.trainers.PolicyTrainer.train_on` (micro-batches packed under a token
  budget of 4096, sorted by length).
* **TRL**: ``GRPOTrainer.compute_loss`` on the same tokens (prompt left-padded, completion
  right-padded, ``tool_mask`` = our loss mask, ``loss_type="dapo"`` = token-mean, ``beta=0``), then
  backward, clip and the trainer's own optimizer step. Generation is not timed on either side.
  TRL runs in its own virtualenv (``--trl-python``, default ``.venv-trl/bin/python``; install
  ``trl==1.16`` there) in a subprocess, warmed up the same way.

Each side runs 1 warm-up step and ``--steps`` timed steps, alternating configurations; the median
step time is reported. Writes ``benchmarks/results/trainer.json``.
Run: ``python benchmarks/bench_trainer.py [--steps 2] [--trl-python .venv-trl/bin/python]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "trainer.json"
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


# ---------------------------------------------------------------------------------------------- ours
def run_ours(model_path: str, work: dict[str, Any], finetune: str, steps: int) -> dict[str, Any]:
    import torch
    from agentgym.trainers.batching import TrainSample
    from agentgym.trainers.config import LossConfig, OptimConfig
    from agentgym.trainers.model import add_lora, load_causal_lm
    from agentgym.trainers.trainer import PolicyTrainer

    torch.manual_seed(0)
    model = load_causal_lm(model_path, "bfloat16")
    adapter = None
    if finetune == "lora":
        model = add_lora(model, "policy", rank=16, alpha=32, dropout=0.0, targets="all-linear")
        adapter = "policy"
    tr = PolicyTrainer("policy", model, optim=OptimConfig(lr=1e-6, token_budget=4096, grad_clip=1.0),
                       loss=LossConfig(tis_cap=None), adapter=adapter)
    samples = [TrainSample("policy", ids, m, a) for ids, m, a in
               zip(work["token_ids"], work["loss_mask"], work["advantages"], strict=True)]
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        m = tr.train_on(samples)
        dt = time.perf_counter() - t0
        assert m["optimizer_steps"] == 1
        if i:
            times.append(dt)
    trained = sum(sum(x[1:]) for x in work["loss_mask"])
    return {**_stats(times, trained, sum(len(x) for x in work["token_ids"])), "micro_batches": m["micro_batches"],
            "padding_efficiency": round(m["padding_efficiency"], 3)}


# ----------------------------------------------------------------------------------------------- TRL
def run_trl(model_path: str, work: dict[str, Any], finetune: str, steps: int) -> dict[str, Any]:
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
    peft_config = None
    if finetune == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, per_device_train_batch_size=N_SEQ, num_generations=N_SEQ, beta=0.0,
                          loss_type="dapo", learning_rate=1e-6, max_grad_norm=1.0, use_cpu=True, bf16=False,
                          report_to=[], logging_steps=1000, save_strategy="no")
        ds = Dataset.from_list([{"prompt": "hi"}] * N_SEQ)
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=args, train_dataset=ds, processing_class=tok, peft_config=peft_config)
        model = trainer.model
        model.train()
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which we do not run
        opt = trainer.optimizer
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
        times = []
        for i in range(steps + 1):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = trainer.compute_loss(model, inputs)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            dt = time.perf_counter() - t0
            if i:
                times.append(dt)
    trained = sum(sum(x[1:]) for x in work["loss_mask"])
    return {**_stats(times, trained, sum(len(x) for x in work["token_ids"])), "trl": trl.__version__,
            "padded_tokens_per_step": int(prompt_ids.numel() + completion_ids.numel())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    ap.add_argument("--worker", choices=["ours", "trl"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--finetune", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        import torch

        torch.set_num_threads(a.threads)
        work = json.loads(Path(a.work).read_text())
        fn = run_ours if a.worker == "ours" else run_trl
        print("RESULT " + json.dumps(fn(a.model, work, a.finetune, a.steps)), flush=True)
        return
    from agentgym.policies.models import load_tokenizer, resolve_model

    model = resolve_model("smollm2-135m-instruct")
    work = make_workload(len(load_tokenizer(model)))
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        wpath = Path(tmp) / "work.json"
        wpath.write_text(json.dumps(work))
        for finetune in ("lora", "full"):
            for side, py in (("ours", sys.executable), ("trl", a.trl_python)):
                if side == "trl" and not Path(py).exists():
                    rows[f"{side}-{finetune}"] = {"skipped": f"{py} not found (python -m venv .venv-trl && "
                                                                 ".venv-trl/bin/pip install torch==2.13.0 trl==1.16 peft)"}
                    continue
                cmd = [py, __file__, "--worker", side, "--model", model, "--work", str(wpath), "--finetune", finetune,
                       "--steps", str(a.steps), "--threads", str(a.threads)]
                env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
                line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
                if res.returncode != 0 or line is None:
                    raise SystemExit(f"{side} {finetune} failed:\n{res.stderr[-3000:]}")
                rows[f"{side}-{finetune}"] = json.loads(line[len("RESULT "):])
                print(f"{side:5s} {finetune:5s} step {rows[f'{side}-{finetune}']['step_s_median']:7.2f} s  "
                      f"trained tok/s {rows[f'{side}-{finetune}']['trained_tokens_per_s']:8.1f}", flush=True)
    ratios = {}
    for ft in ("lora", "full"):
        o, t = rows.get(f"ours-{ft}", {}), rows.get(f"trl-{ft}", {})
        if "step_s_median" in o and "step_s_median" in t:
            ratios[ft] = round(t["step_s_median"] / o["step_s_median"], 2)
    out = {"benchmark": "trainer", "model": "SmolLM2-135M-Instruct", "dtype": "bfloat16", "device": "cpu",
           "threads": a.threads, "workload": {"sequences": N_SEQ, "turns": TURNS, "generated_per_turn": GEN,
                                              "tool_tokens_per_turn": TOOL, "prompt_tokens": "100-200"},
           "results": rows, "speedup_vs_trl": ratios, "timed_steps": a.steps,
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg": os.getloadavg()},
           "command": "python benchmarks/bench_trainer.py"}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()

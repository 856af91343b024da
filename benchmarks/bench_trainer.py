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

**Sharded** (``--procs 1,2``; this section only, merged into the same JSON as ``"sharded"``): the SFT training work
(the workload above, loss on its masked tokens, a full fine-tune with the same AdamW settings, fp32 weights by
default: ``--procs-dtype``) on one process (``trainer.strategy = "single"``) and on N FSDP2 ranks under
``torchrun --nproc_per_node N`` (gloo, each rank training on its share of the same global batch), one run per
count in interleaved rounds (1, 2, 1, 2, ...; ``--repeats`` rounds), each ``--steps`` optimizer steps
(``benchmarks/bench_trainer_worker.py``). The runs get the same cores: ``--threads`` x the largest count in all,
split evenly over the ranks (``--rank-threads K``: K threads in every process instead; on a loaded machine a
multi-threaded process loses far more to preemption than single-threaded ranks do, so run it on a quiet one: the
load averages are recorded). Reported per count: trained tokens/s in the steady state (the first step left out)
as the mean over rounds with a 95% t-interval, the speedup over one process per round (geometric mean, 95%
interval), and per rank the peak resident memory (``ru_maxrss``, the model load included; and over the training
steps alone, ``VmHWM`` reset after the load) and the parameter + gradient + optimizer bytes it holds (its shards). Run: ``python benchmarks/bench_trainer.py --procs 1,2 --steps 10 --threads 1``.
"""

from __future__ import annotations

import argparse
import contextlib
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
PROCS_WORKER = Path(__file__).resolve().parent / "bench_trainer_worker.py"

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


OPTIM: dict[str, Any] = {"lr": 1e-6, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}


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
    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
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

    def no_reward(completions: Any, **kw: Any) -> list[float | None]:
        return [0.0] * len(completions)

    trainer = GRPOTrainer(model=model, reward_funcs=no_reward,
                          args=args, train_dataset=ds, processing_class=tok, peft_config=peft_config)
    assert trainer.args.gradient_checkpointing is False and trainer.args.optim == "adamw_torch"
    model = trainer.model
    model.train()
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which we do not run
    opt = trainer.optimizer
    assert opt is not None
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


# ------------------------------------------------------------------------------------ sharded (--procs)
def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _procs_run(procs: int, model: str, wpath: Path, steps: int, threads: int, dtype: str, out: Path,
               timeout_s: float) -> list[dict[str, Any]]:
    """One run of the worker: one process (``procs == 1``) or ``procs`` FSDP2 ranks under torchrun; its ranks'
    records, rank 0 first."""
    import signal

    args = [str(PROCS_WORKER), "--model", model, "--work", str(wpath), "--steps", str(steps), "--threads",
            str(threads), "--dtype", dtype, "--out", str(out)]
    if procs == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(procs),
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), *args]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(threads)}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    try:
        log = p.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise SystemExit(f"{procs}-process run timed out after {timeout_s:.0f} s") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # anything a failed group left behind
    if p.returncode != 0:
        raise SystemExit(f"{procs}-process run failed (exit {p.returncode}):\n{log[-4000:]}")
    recs = sorted((json.loads(f.read_text()) for f in out.glob("rank*.json")), key=lambda r: r["rank"])
    if len(recs) != procs:
        raise SystemExit(f"{procs}-process run wrote {len(recs)} rank records:\n{log[-4000:]}")
    return recs


def _steady(rec: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's steady state: the steps after the first."""
    t, tok = rec["step_s"][1:], rec["trained_tokens"][1:]
    return {"trained_tokens_per_s": sum(tok) / sum(t), "step_s_median": statistics.median(t),
            "step_s_all": [round(x, 3) for x in rec["step_s"]]}


def _max_gib(values: list[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(max(known) / 2**30, 3) if known else None


def run_procs(procs: list[int], model: str, work: dict[str, Any], steps: int, repeats: int, threads: int, dtype: str,
              timeout_s: float, rank_threads: int | None = None) -> dict[str, Any]:
    """The ``--procs`` section (see the module docstring)."""
    from agentgym.eval.stats import mean_ci, ratio_ci

    if steps < 2:
        raise SystemExit("--procs needs --steps >= 2 (the first step is left out of the steady state)")
    cores = threads * max(procs)
    runs: dict[int, list[dict[str, Any]]] = {p: [] for p in procs}
    with tempfile.TemporaryDirectory() as tmp:
        wpath = Path(tmp) / "work.json"
        wpath.write_text(json.dumps(work))
        for r in range(repeats):
            for p in procs:  # interleaved: 1, 2, 1, 2, ... so that load changes hit every count
                per_rank = rank_threads or max(1, cores // p)
                recs = _procs_run(p, model, wpath, steps, per_rank, dtype, Path(tmp) / f"round{r}-procs{p}", timeout_s)
                runs[p].append({"round": r, "threads_per_rank": per_rank, **_steady(recs[0]),
                                "ranks": [{"rank": x["rank"], "peak_rss_bytes": x["peak_rss_bytes"],
                                           "train_peak_rss_bytes": x["train_peak_rss_bytes"],
                                           "held_bytes": x["held_bytes"],
                                           "sequences": x["sequences"], "threads": x["threads"]} for x in recs]})
                print(f"round {r} procs {p}: trained tok/s {runs[p][-1]['trained_tokens_per_s']:8.1f}  step "
                      f"{runs[p][-1]['step_s_median']:.2f} s  peak RSS/rank (run; training steps) "
                      + ", ".join(f"{x['peak_rss_bytes'] / 2**30:.2f}; {(x['train_peak_rss_bytes'] or 0) / 2**30:.2f}"
                                  for x in recs) + " GiB", flush=True)
    rows: dict[str, Any] = {}
    for p in procs:
        tps = mean_ci([x["trained_tokens_per_s"] for x in runs[p]])
        ranks = runs[p][-1]["ranks"]
        rows[str(p)] = {
            "trained_tokens_per_s": {"mean": round(tps["mean"], 1), "ci95": [round(v, 1) for v in tps["ci95"]]
                                     if tps["ci95"] else None, "per_round": [round(x["trained_tokens_per_s"], 1)
                                                                              for x in runs[p]]},
            "step_s_median_per_round": [round(x["step_s_median"], 3) for x in runs[p]],
            "threads_per_rank": runs[p][0]["threads_per_rank"],
            "peak_rss_gib_per_rank": {str(x["rank"]): round(max(run["ranks"][i]["peak_rss_bytes"] for run in runs[p])
                                                            / 2**30, 3) for i, x in enumerate(ranks)},
            "train_peak_rss_gib_per_rank": {str(x["rank"]): _max_gib([run["ranks"][i]["train_peak_rss_bytes"]
                                                                      for run in runs[p]]) for i, x in enumerate(ranks)},
            "held_bytes_per_rank": {str(x["rank"]): x["held_bytes"] for x in ranks},
            "held_gib_per_rank": {str(x["rank"]): round(x["held_bytes"]["total"] / 2**30, 3) for x in ranks},
            "sequences_per_rank": {str(x["rank"]): x["sequences"] for x in ranks},
            "runs": runs[p],
        }
    base = procs[0]
    speedup = {}
    for p in procs[1:]:
        rc = ratio_ci([b["trained_tokens_per_s"] / a["trained_tokens_per_s"] for a, b in zip(runs[base], runs[p],
                                                                                                strict=True)])
        speedup[f"{p}_over_{base}"] = {"mean": round(rc["mean"], 3), "ci95": [round(x, 3) for x in rc["ci95"]]
                                       if rc["ci95"] else None, "per_round": [round(x, 3) for x in rc["per_round"]]}
    return {"procs": procs, "rounds": repeats, "steps_per_run": steps, "steady_state": "steps 2..N (the first left out)",
            "cores": cores if rank_threads is None else None, "rank_threads": rank_threads, "dtype": dtype, "finetune": "full", "algorithm": "sft", "results": rows,
            "throughput_speedup": speedup,
            "note": ("One process (strategy single) vs N FSDP2 ranks under torchrun (gloo), same global batch, steps "
                     "and data, interleaved rounds; each run gets the same cores (threads x ranks). trained tokens/s "
                     "is rank 0's clock over the steady-state steps (the ranks meet at a barrier before each step); "
                     "peak_rss includes the model load (each rank loads the whole model, then shards it), "
                     "train_peak_rss the training steps alone; "
                     "held_bytes is what each rank holds: its parameter, gradient (sized as its trainable parameter "
                     "shards) and AdamW state shards.")}


def _merge_write(path: str, section: dict[str, Any]) -> None:
    """Update ``path``'s JSON with ``section``'s keys, keeping the other sections already there."""
    p = Path(path)
    old: dict[str, Any] = {}
    if p.is_file():
        try:
            old = json.loads(p.read_text())
        except ValueError:
            old = {}
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({**old, **section}, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--procs", default=None, help="sharded section only: process counts, e.g. 1,2 (one process, "
                    "then FSDP2 ranks under torchrun)")
    ap.add_argument("--repeats", type=int, default=3, help="--procs: interleaved rounds")
    ap.add_argument("--procs-dtype", default="float32", choices=["float32", "bfloat16"],
                    help="--procs: weights and optimizer dtype")
    ap.add_argument("--procs-timeout", type=float, default=3600.0, help="--procs: seconds one run may take")
    ap.add_argument("--rank-threads", type=int, default=None,
                    help="--procs: threads of every process, whatever the count (default: the same cores for every "
                         "count, --threads x the largest count split over the ranks)")
    ap.add_argument("--worker", choices=["ours", "trl"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M-Instruct, prepared)")
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--finetune", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        import torch

        torch.set_num_threads(a.threads)
        worker(a.worker, a.model, a.work, a.finetune)
        return
    if a.procs:
        procs = [int(x) for x in a.procs.split(",") if x.strip()]
        if not procs or min(procs) < 1:
            raise SystemExit(f"--procs: positive process counts, e.g. 1,2 (got {a.procs!r})")
        prov = Provenance.start()
        from agentgym.policies.models import load_tokenizer, resolve_model

        model = a.model or resolve_model("smollm2-135m-instruct")
        section = run_procs(procs, model, make_workload(len(load_tokenizer(model))), a.steps, a.repeats, a.threads,
                            a.procs_dtype, a.procs_timeout, a.rank_threads)
        section.update(model=("SmolLM2-135M-Instruct" if a.model is None else a.model), device="cpu",
                       workload={"sequences": N_SEQ, "turns": TURNS, "generated_per_turn": GEN,
                                 "tool_tokens_per_turn": TOOL, "prompt_tokens": "100-200"},
                       optimizer={"class": "torch.optim.AdamW", **OPTIM, "grad_clip": 1.0}, provenance=prov.finish())
        _merge_write(a.out, {"sharded": section})
        print(json.dumps({p: r["trained_tokens_per_s"] for p, r in section["results"].items()}))
        print(json.dumps(section["throughput_speedup"]))
        return
    if not Path(a.trl_python).exists():
        raise SystemExit(f"{a.trl_python} not found: python -m venv .venv-trl && .venv-trl/bin/pip install "
                         "torch==2.13.0 trl==1.16 peft")
    prov = Provenance.start(peers={"trl": a.trl_python}, packages=["trl", "peft", "accelerate", "datasets"])
    from agentgym.policies.models import load_tokenizer, resolve_model

    from agentgym.eval.stats import ratio_ci

    model = a.model or resolve_model("smollm2-135m-instruct")
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
    _merge_write(a.out, out)  # keeps the "sharded" section of --procs
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()

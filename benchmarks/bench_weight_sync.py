"""Weight sync: sparsity of real SmolLM2 training steps, full vs delta bytes, and publish time.

Three parts, one run, same model:

1. **Training-step sparsity.** SmolLM2-135M-Instruct trained with AdamW on a few chat examples:
   full fine-tune with bf16 parameters at lr 1e-5 and 1e-6, and LoRA (rank 8 on q/v). For each step:
   the fraction of bf16 elements unchanged, bytes of a full transfer vs the sparse delta (int32
   index + bf16 value per changed element), and the time WeightSync takes to encode it.
2. **Publish to VLLMPolicy.** A 1% sparse delta applied in place vs a full reload; the baseline is
   the previous implementation (write all tensors as safetensors to /dev/shm and have vLLM reload
   them from there, ``collective_rpc("reload_weights")``), measured in the same run, interleaved.
3. **Cross-region shim.** The same full and delta payloads over a simulated link (100/300 ms RTT,
   100 Mbit/s): transfer time computed by :class:`~agentgym.dataflow.weightsync.LinkShim`.

Usage: ``python benchmarks/bench_weight_sync.py [--steps 4] [--rounds 3] [--skip-vllm]``
Writes ``benchmarks/results/weight_sync.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "weight_sync.json"
TEXTS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Guess a number between 0 and 63.", "<tool_call>{\"name\": \"guess\", \"arguments\": {\"n\": 31}}</tool_call>"),
    ("Name three fruits.", "Apple, banana and cherry."),
    ("How many legs does a spider have?", "A spider has eight legs."),
]


def _batch(tok: Any) -> Any:
    import torch

    rows = [tok.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": a}], tokenize=True)
            for q, a in TEXTS]
    rows = [r["input_ids"] if isinstance(r, dict) else r for r in rows]
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), tok.pad_token_id or 0)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def training_sparsity(model_path: str, steps: int) -> list[dict[str, Any]]:
    import torch
    import transformers
    from agentgym.policies.weights import LoRAAdapter, apply_update

    from agentgym.dataflow.weightsync import WeightSync

    tok = transformers.AutoTokenizer.from_pretrained(model_path)
    ids, mask = _batch(tok)
    labels = ids.masked_fill(mask == 0, -100)
    out = []

    class Sink:  # a receiver that applies what it gets (the trainer's shadow target)
        def __init__(self, state: dict[str, Any]) -> None:
            self.state = {k: v.detach().to(torch.bfloat16).clone() for k, v in state.items()}
            self.weight_version = 0

        def state_dict(self) -> dict[str, Any]:
            return self.state

        def update_weights(self, update: Any, version: int) -> list[str]:
            changed = apply_update(self.state, update)
            self.weight_version = version
            return changed

    for lr in (1e-5, 1e-6):
        model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        sink = Sink({k: v for k, v in model.state_dict().items() if k != "lm_head.weight"})
        sync = WeightSync(sink)
        sync.publish(model, 1)
        for step in range(steps):
            t = time.perf_counter()
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            train_s = time.perf_counter() - t
            r = sync.publish(model, step + 2)
            out.append({"setting": f"full fine-tune bf16 AdamW lr={lr:g}", "step": step + 1, "loss": float(loss),
                        "unchanged_fraction": r.unchanged_fraction, "bytes_full": r.bytes_full, "bytes_delta": r.bytes_sent,
                        "compression": r.compression, "encode_apply_s": r.seconds, "train_step_s": train_s})
            print(out[-1], flush=True)
        del model, opt

    # LoRA rank 8 on q_proj/v_proj, frozen bf16 base, fp32 adapter
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    lora: dict[str, tuple[Any, Any]] = {}
    for name, mod in model.named_modules():
        if name.endswith(("q_proj", "v_proj")):
            a = torch.nn.Parameter(torch.randn(8, mod.in_features, generator=g) * 0.01)
            b = torch.nn.Parameter(torch.zeros(mod.out_features, 8))
            lora[name] = (a, b)
            base_fwd = mod.forward

            def fwd(x: Any, _f: Any = base_fwd, _a: Any = a, _b: Any = b) -> Any:
                return _f(x) + ((x.float() @ _a.t()) @ _b.t() * 2.0).to(x.dtype)

            mod.forward = fwd  # type: ignore[method-assign]
    opt = torch.optim.AdamW([t for ab in lora.values() for t in ab], lr=1e-4)
    sink = Sink({k: v for k, v in model.state_dict().items() if k != "lm_head.weight"})
    sync = WeightSync(sink)
    sync.publish(model, 1)
    for step in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        adapter = LoRAAdapter({k: (a.detach().clone(), b.detach().clone()) for k, (a, b) in lora.items()}, rank=8, alpha=16)
        r = sync.publish(adapter, step + 2)  # the sink cannot serve adapters: merged delta
        out.append({"setting": "LoRA r=8 q/v AdamW lr=1e-4", "step": step + 1, "loss": float(loss),
                    "unchanged_fraction": r.unchanged_fraction, "bytes_full": r.bytes_full, "bytes_delta": r.bytes_sent,
                    "bytes_adapter": adapter.num_bytes(), "compression": r.compression, "encode_apply_s": r.seconds})
        print(out[-1], flush=True)
    return out


def vllm_publish(model_path: str, rounds: int) -> dict[str, Any]:
    import torch
    from agentgym.policies.vllm import VLLMPolicy
    from agentgym.policies.weights import WeightDelta

    pol = VLLMPolicy(model_path, kv_cache_gib=1, max_model_len=1024, max_num_seqs=8)
    try:
        base = pol.state_dict()
        g = torch.Generator().manual_seed(0)
        times: dict[str, list[float]] = {"delta_1pct_inplace": [], "full_inplace": [], "full_reload_from_shm (previous)": []}
        v = pol.weight_version
        delta_elems = 0
        for _ in range(rounds):
            new = {}
            for k, t in base.items():
                i = torch.randint(0, t.numel(), (max(1, t.numel() // 100),), generator=g)
                n = t.clone()
                n.view(-1)[i] = (n.view(-1)[i].float() + 1e-3).to(t.dtype)
                new[k] = n
            d = WeightDelta.from_diff(base, new)
            delta_elems = d.num_changed()
            v += 1
            t0 = time.perf_counter()
            pol.update_weights(d, v)
            times["delta_1pct_inplace"].append(time.perf_counter() - t0)
            v += 1
            t0 = time.perf_counter()
            pol.update_weights(dict(base), v)
            times["full_inplace"].append(time.perf_counter() - t0)
            # the previous implementation: clone, save safetensors to /dev/shm, vLLM reload_weights from disk
            v += 1
            t0 = time.perf_counter()
            from safetensors.torch import save_file

            staged = {k: t.clone() for k, t in base.items()}
            folder = tempfile.mkdtemp(prefix="agentgym-weights-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
            save_file(staged, os.path.join(folder, "model.safetensors"))
            pol._run(pol.engine.collective_rpc("reload_weights", kwargs={"weights_path": folder}), timeout=600)
            pol._run(pol.engine.reset_prefix_cache(), timeout=60)
            shutil.rmtree(folder, ignore_errors=True)
            times["full_reload_from_shm (previous)"].append(time.perf_counter() - t0)
            pol.weight_version = v
        return {"rounds": rounds, "delta_elements": delta_elems,
                "median_s": {k: statistics.median(x) for k, x in times.items()}, "all_s": times}
    finally:
        pol.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-vllm", action="store_true")
    args = ap.parse_args()
    from agentgym.policies.models import resolve_model

    from agentgym.dataflow.weightsync import LinkShim

    path = resolve_model("smollm2-135m-instruct")
    steps = training_sparsity(path, args.steps)
    links = []
    for rtt in (0.1, 0.3):
        link = LinkShim(rtt_s=rtt, bandwidth_bps=100e6)
        for s in steps:
            links.append({"setting": s["setting"], "step": s["step"], "rtt_s": rtt, "bandwidth_mbit": 100,
                          "full_s": link.delay(s["bytes_full"]), "delta_s": link.delay(s["bytes_delta"])})
    result: dict[str, Any] = {
        "command": "python benchmarks/bench_weight_sync.py " + f"--steps {args.steps} --rounds {args.rounds}"
                   + (" --skip-vllm" if args.skip_vllm else ""),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "training_steps": steps,
        "cross_region": links,
    }
    if not args.skip_vllm:
        result["vllm_publish"] = vllm_publish(path, args.rounds)
        print(result["vllm_publish"]["median_s"], flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()

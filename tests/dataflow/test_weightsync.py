"""WeightSync's protocol: full on first sync, sparse bf16 deltas after, fallbacks on a version gap or
a checksum mismatch, LoRA as adapter or merged delta, the wire codec and the link shim.

The target here is a small in-process policy built on the same ``apply_update``/``check_version``
that HFPolicy uses (the protocol is our own logic); the real engines are in
``tests/policies/test_vllm_weights.py``.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from agentgym.errors import ChecksumMismatch, ConfigurationError, WeightSyncError

torch = pytest.importorskip("torch")
from agentgym.policies.weights import LoRAAdapter, apply_update, check_version  # noqa: E402

from agentgym.dataflow.weightsync import (  # noqa: E402
    LinkShim,
    WeightSync,
    _payload_crc,
    crc32_of,
    decode_payload,
    encode_payload,
    publish,
    sparse_diff,
    verify_checks,
    write_payload,
)


class TinyPolicy:
    """Holds bf16 tensors and applies updates like HFPolicy does."""

    def __init__(self, dtype: Any = None) -> None:
        g = torch.Generator().manual_seed(0)
        self.state = {"m.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16),
                      "v": torch.randn(32, 16, generator=g).to(torch.bfloat16)}
        if dtype is not None:
            self.state = {k: v.to(dtype) for k, v in self.state.items()}
        self.weight_version = 0
        self.updates: list[Any] = []

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def update_weights(self, update: Any, version: int) -> list[str]:
        check_version(self.weight_version, version)
        changed = apply_update(self.state, update)
        self.weight_version = version
        self.updates.append(update)
        return changed


def _trainer_state(seed: int, frac: float = 0.01) -> dict[str, Any]:
    """fp32 'trainer' weights: the TinyPolicy start with ~frac of the elements moved."""
    base = TinyPolicy().state
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, t in base.items():
        f = t.float().clone()
        i = torch.randperm(f.numel(), generator=g)[: max(1, int(f.numel() * frac))]
        f.view(-1)[i] += 0.5
        out[k] = f
    return out


def _served_equals(pol: TinyPolicy, state: dict[str, Any]) -> bool:
    return all(torch.equal(pol.state[k], state[k].to(torch.bfloat16)) for k in state)


def test_first_full_then_sparse_delta() -> None:
    pol = TinyPolicy()
    sync = WeightSync(pol)
    s1 = _trainer_state(1)
    r1 = sync.publish(s1, 1)
    assert (r1.kind, r1.reason) == ("full", "first") and _served_equals(pol, s1)
    s2 = {k: v.clone() for k, v in s1.items()}
    s2["m.weight"].view(-1)[[3, 77, 500]] -= 1.0
    r2 = sync.publish(s2, 2)
    assert r2.kind == "delta" and r2.changed == 3 and r2.bytes_sent == 3 * (4 + 2)
    assert r2.bytes_full == (64 * 32 + 32 * 16) * 2 and r2.unchanged_fraction > 0.99 and r2.compression > 100
    assert _served_equals(pol, s2) and pol.weight_version == 2
    assert set(pol.updates[-1]["indices"]) == {"m.weight"}  # only what changed travelled
    # an update below bf16 resolution changes nothing: an empty delta, still a new version
    s3 = {k: v + 1e-6 for k, v in s2.items()}
    r3 = sync.publish(s3, 3)
    assert r3.kind == "delta" and r3.changed < r3.elements // 100 and pol.weight_version == 3


def test_fp32_policy_takes_bf16_deltas() -> None:
    """A policy serving fp32 (HFPolicy with dtype="float32") compares the delta's base in bf16."""
    pol = TinyPolicy(torch.float32)
    sync = WeightSync(pol)
    s1 = _trainer_state(1)
    assert sync.publish(s1, 1).kind == "full"
    s2 = {k: v.clone() for k, v in s1.items()}
    s2["m.weight"].view(-1)[[3, 77]] -= 1.0
    r = sync.publish(s2, 2)
    assert (r.kind, r.changed) == ("delta", 2) and pol.state["m.weight"].dtype == torch.float32
    assert _served_equals(pol, s2)
    pol.state["m.weight"][0, 0] += 1.0  # the served weights drifted: still caught
    s2["m.weight"].view(-1)[5] += 1.0
    assert sync.publish(s2, 3).reason == "checksum_mismatch" and _served_equals(pol, s2)


def test_dense_tensor_goes_whole() -> None:
    pol = TinyPolicy()
    sync = WeightSync(pol)
    s1 = _trainer_state(1)
    sync.publish(s1, 1)
    s2 = {k: v.clone() for k, v in s1.items()}
    s2["v"] += 1.0  # every element: indices + values would be 3x the tensor
    r = sync.publish(s2, 2)
    assert set(pol.updates[-1]["full"]) == {"v"} and not pol.updates[-1]["indices"]
    assert r.bytes_sent == 32 * 16 * 2 and _served_equals(pol, s2)


def test_version_gap_falls_back_to_full() -> None:
    pol = TinyPolicy()
    sync = WeightSync(pol)
    s1 = _trainer_state(1)
    sync.publish(s1, 1)
    pol.update_weights({"v": torch.zeros(32, 16)}, 2)  # someone else updated the policy
    r = sync.publish(_trainer_state(2), 3)
    assert (r.kind, r.reason) == ("full", "version_gap") and _served_equals(pol, _trainer_state(2))
    r = sync.publish(_trainer_state(3), 5)  # the trainer skipped a version
    assert (r.kind, r.reason) == ("full", "version_gap") and pol.weight_version == 5


def test_checksum_mismatch_falls_back_to_full() -> None:
    pol = TinyPolicy()
    sync = WeightSync(pol)
    s1 = _trainer_state(1)
    sync.publish(s1, 1)
    pol.state["m.weight"][0, 0] = 123.0  # the served weights drifted, same version
    s2 = {k: v.clone() for k, v in s1.items()}
    s2["m.weight"].view(-1)[5] = -3.0
    r = sync.publish(s2, 2)
    assert (r.kind, r.reason) == ("full", "checksum_mismatch")
    assert _served_equals(pol, s2) and pol.weight_version == 2  # the refused delta wrote nothing, the full fixed it


def test_assume_served_skips_the_first_full_transfer_and_is_checked() -> None:
    pol = TinyPolicy()
    sync = WeightSync(pol)
    sync.assume_served(pol.state, 0)  # the trainer starts from the checkpoint the policy loaded
    s1 = {k: v.float().clone() for k, v in pol.state.items()}
    s1["v"].view(-1)[[4, 9]] += 1.0
    r = sync.publish(s1, 1)
    assert (r.kind, r.changed, r.bytes_sent) == ("delta", 2, 2 * (4 + 2)) and _served_equals(pol, s1)
    # a wrong assumption (the policy serves other weights) is caught by the base checksums
    pol2 = TinyPolicy()
    sync2 = WeightSync(pol2)
    sync2.assume_served(_trainer_state(7), 0)
    r = sync2.publish(s1, 1)
    assert (r.kind, r.reason) == ("full", "checksum_mismatch") and _served_equals(pol2, s1)
    # ... and a wrong version by the version check
    sync3 = WeightSync(TinyPolicy())
    sync3.assume_served(TinyPolicy().state, None)
    assert sync3.publish(s1, 1).reason == "version_gap"
    with pytest.raises(ConfigurationError, match="verify"):
        WeightSync(TinyPolicy(), verify=False).assume_served(pol.state, 0)
    with pytest.raises(ConfigurationError, match="every weight"):
        WeightSync(TinyPolicy()).assume_served({"v": pol.state["v"]}, 0)


def test_damaged_payload_is_refused_before_writing() -> None:
    state = TinyPolicy().state
    new = state["m.weight"].clone()
    new.view(-1)[[1, 2]] = 9.0
    i, v = sparse_diff(state["m.weight"], new)
    checks = {"base": {"m.weight": crc32_of(state["m.weight"])}, "payload": {"m.weight": 0}}
    checks["payload"]["m.weight"] = _payload_crc(i, v)
    verify_checks(state, {"m.weight": i}, {"m.weight": v}, checks)  # intact
    bad = v.clone()
    bad[0] = 1.0
    with pytest.raises(ChecksumMismatch, match="damaged"):
        verify_checks(state, {"m.weight": i}, {"m.weight": bad}, checks)
    before = state["m.weight"].clone()
    with pytest.raises(ChecksumMismatch):
        apply_update(state, {"indices": {"m.weight": i}, "values": {"m.weight": bad}, "checks": checks})
    assert torch.equal(state["m.weight"], before)


def test_codec_round_trip_bytes_and_base64() -> None:
    full = {"a": torch.randn(3, 4).to(torch.bfloat16)}
    idx = {"b": torch.tensor([0, 5], dtype=torch.int32)}
    val = {"b": torch.tensor([1.5, -2.0]).to(torch.bfloat16)}
    blob = encode_payload(full, idx, val, {"base": {"b": 7}})
    for form in (blob, "b64:" + base64.b64encode(blob).decode()):
        f, i, v, c = decode_payload(form)
        assert torch.equal(f["a"], full["a"]) and torch.equal(i["b"], idx["b"]) and torch.equal(v["b"], val["b"])
        assert c == {"base": {"b": 7}}
    with pytest.raises(WeightSyncError):
        decode_payload("http://nope")


def test_codec_file_form_and_damaged_payloads(tmp_path: Any) -> None:
    full = {"a": torch.randn(3, 4).to(torch.bfloat16)}
    idx = {"b": torch.tensor([0, 5], dtype=torch.int32)}
    val = {"b": torch.tensor([1.5, -2.0]).to(torch.bfloat16)}
    ref = write_payload(str(tmp_path / "p.safetensors"), full, idx, val, {"payload": {"b": 9}})
    assert ref.startswith("file:")
    f, i, v, c = decode_payload(ref)
    assert torch.equal(f["a"], full["a"]) and torch.equal(i["b"], idx["b"]) and torch.equal(v["b"], val["b"])
    assert c == {"payload": {"b": 9}}
    blob = encode_payload(full, idx, val)
    (tmp_path / "cut.safetensors").write_bytes(blob[: len(blob) // 2])
    for bad in (blob[: len(blob) // 2], b"\x00" * 16, "file:" + str(tmp_path / "cut.safetensors"), "file:" + str(tmp_path / "none")):
        with pytest.raises(WeightSyncError):
            decode_payload(bad)


def test_sparse_diff_compares_bits() -> None:
    a = torch.tensor([0.0, 1.0, float("nan"), 2.0]).to(torch.bfloat16)
    b = torch.tensor([-0.0, 1.0, float("nan"), 3.0]).to(torch.bfloat16)
    i, v = sparse_diff(a, b)
    assert i.tolist() == [0, 3] and i.dtype == torch.int32 and v[1].item() == 3.0


def test_lora_merged_for_targets_without_adapters() -> None:
    pol = TinyPolicy()
    sync = WeightSync(pol)
    s1 = _trainer_state(1)
    sync.publish(s1, 1)
    g = torch.Generator().manual_seed(4)
    adapter = LoRAAdapter({"m": (torch.randn(2, 32, generator=g), torch.randn(64, 2, generator=g))}, rank=2, alpha=4)
    r = sync.publish(adapter, 2)
    expect = (s1["m.weight"].to(torch.bfloat16).float() + 2.0 * adapter.weights["m"][1] @ adapter.weights["m"][0]).to(torch.bfloat16)
    assert r.kind == "lora-merged" and torch.equal(pol.state["m.weight"], expect)
    r2 = sync.publish(adapter, 3)  # the same adapter again: merged on the same base, nothing moves
    assert r2.changed == 0


def test_link_shim_and_publish_helper() -> None:
    link = LinkShim(rtt_s=0.02, bandwidth_bps=8e6)  # 1 MB/s
    assert link.delay(100_000) == pytest.approx(0.02 + 0.1)
    pol = TinyPolicy()
    r1 = publish(pol, _trainer_state(1), 1, link=link)
    r2 = publish(pol, _trainer_state(1) | {"m.weight": _trainer_state(1)["m.weight"] + 0.25}, 2)  # same WeightSync reused
    assert r1.kind == "full" and r2.kind in ("delta", "full") and r2.reason == ""
    assert r1.link_s == pytest.approx(link.delay(r1.bytes_sent)) and r2.link_s == pytest.approx(link.delay(r2.bytes_sent))

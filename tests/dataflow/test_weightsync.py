"""The one publishing path's protocol: full on the first publish, sparse bf16 deltas after, the fallback
rules (a version gap or a checksum mismatch sends the whole state), LoRA as an adapter or as merged
weights, and publish_to's outcomes.

The receiver here is a small in-process policy built on the same apply code HFPolicy uses
(:func:`agentgym.policies.weights.stage`); the real engines are in ``tests/policies/test_vllm_weights.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentgym.errors import ChecksumMismatch, ConfigurationError, VersionNotNewer, WeightUpdateRejected
from agentgym.weights import LoRAAdapter, Publication, WeightPublisher, WeightUpdate, check_version

torch = pytest.importorskip("torch")
from agentgym.policies.weights import apply_update  # noqa: E402


class TinyPolicy:
    """Holds bf16 tensors and applies updates like HFPolicy does."""

    def __init__(self, dtype: Any = None) -> None:
        g = torch.Generator().manual_seed(0)
        self.state = {"m.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16),
                      "v": torch.randn(32, 16, generator=g).to(torch.bfloat16)}
        if dtype is not None:
            self.state = {k: v.to(dtype) for k, v in self.state.items()}
        self.weight_version = 0
        self.updates: list[WeightUpdate] = []

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
    pub = WeightPublisher("bfloat16")
    s1 = _trainer_state(1)
    p1 = pub.publish(s1, 1)
    assert p1.deliver(pol) == "ok" and p1.update.kind == "full" and _served_equals(pol, s1)
    s2 = {k: v.clone() for k, v in s1.items()}
    s2["m.weight"].view(-1)[[3, 77, 500]] -= 1.0
    p2 = pub.publish(s2, 2)
    r2 = p2.report
    assert r2 is not None and r2.kind == "delta" and r2.changed == 3 and r2.bytes_sent == 3 * (4 + 2)
    assert r2.bytes_full == (64 * 32 + 32 * 16) * 2 and r2.unchanged_fraction > 0.99 and r2.compression > 100
    assert p2.deliver(pol) == "ok" and _served_equals(pol, s2) and pol.weight_version == 2
    assert set(pol.updates[-1].indices) == {"m.weight"} and not pol.updates[-1].tensors  # only what changed travelled
    # an update below bf16 resolution changes next to nothing: still a new version
    p3 = pub.publish({k: v + 1e-6 for k, v in s2.items()}, 3)
    assert p3.update.kind == "delta" and p3.update.num_changed() < 64 * 32 // 100
    assert p3.deliver(pol) == "ok" and pol.weight_version == 3


def test_fp32_policy_takes_bf16_deltas() -> None:
    """A policy serving fp32 (HFPolicy with dtype="float32") compares the delta's base in bf16."""
    pol = TinyPolicy(torch.float32)
    pub = WeightPublisher("bfloat16")
    s1 = _trainer_state(1)
    pub.publish(s1, 1).deliver(pol)
    s2 = {k: v.clone() for k, v in s1.items()}
    s2["m.weight"].view(-1)[[3, 77]] -= 1.0
    p = pub.publish(s2, 2)
    assert p.update.num_changed() == 2 and p.deliver(pol) == "ok" and pol.state["m.weight"].dtype == torch.float32
    assert _served_equals(pol, s2)
    pol.state["m.weight"][0, 0] += 1.0  # the served weights drifted: still caught
    s2["m.weight"].view(-1)[5] += 1.0
    assert pub.publish(s2, 3).deliver(pol) == "checksum_mismatch" and _served_equals(pol, s2)


def test_dense_tensor_goes_whole() -> None:
    pol = TinyPolicy()
    pub = WeightPublisher()
    s1 = _trainer_state(1)
    pub.publish(s1, 1).deliver(pol)
    s2 = {k: v.clone() for k, v in s1.items()}
    s2["v"] += 1.0  # every element: indices + values would be 3x the tensor
    p = pub.publish(s2, 2)
    p.deliver(pol)
    assert set(pol.updates[-1].tensors) == {"v"} and not pol.updates[-1].indices
    assert p.report is not None and p.report.bytes_sent == 32 * 16 * 2 and _served_equals(pol, s2)


def test_version_gap_falls_back_to_full() -> None:
    pol = TinyPolicy()
    pub = WeightPublisher()
    pub.publish(_trainer_state(1), 1).deliver(pol)
    pol.update_weights(WeightUpdate.full({"v": torch.zeros(32, 16)}), 2)  # someone else updated the policy
    p = pub.publish(_trainer_state(2), 3)
    assert p.choose(pol.weight_version)[1] == "version_gap"
    assert p.deliver(pol) == "version_gap" and _served_equals(pol, _trainer_state(2)) and pol.weight_version == 3
    late = TinyPolicy()  # a receiver that missed every version gets the whole state
    p = pub.publish(_trainer_state(3), 4)
    assert p.deliver(late) == "version_gap" and _served_equals(late, _trainer_state(3))


def test_checksum_mismatch_falls_back_to_full() -> None:
    pol = TinyPolicy()
    pub = WeightPublisher()
    s1 = _trainer_state(1)
    pub.publish(s1, 1).deliver(pol)
    pol.state["m.weight"][0, 0] = 123.0  # the served weights drifted, same version
    s2 = {k: v.clone() for k, v in s1.items()}
    s2["m.weight"].view(-1)[5] = -3.0
    p = pub.publish(s2, 2)
    with pytest.raises(ChecksumMismatch):  # the receiver refuses the delta, writing nothing
        pol.update_weights(p.update, 2)
    assert pol.state["m.weight"][0, 0].item() == 123.0 and pol.weight_version == 1
    assert p.deliver(pol) == "checksum_mismatch" and _served_equals(pol, s2) and pol.weight_version == 2


def test_assume_skips_the_first_full_transfer_and_is_checked() -> None:
    pol = TinyPolicy()
    pub = WeightPublisher()
    pub.assume(pol.state, 0)  # the trainer starts from the checkpoint the policy loaded
    s1 = {k: v.float().clone() for k, v in pol.state.items()}
    s1["v"].view(-1)[[4, 9]] += 1.0
    p = pub.publish(s1, 1)
    assert p.report is not None and (p.update.kind, p.report.changed, p.report.bytes_sent) == ("delta", 2, 2 * (4 + 2))
    assert p.deliver(pol) == "ok" and _served_equals(pol, s1)
    # a wrong assumption (the policy serves other weights) is caught by the base checksums
    pol2 = TinyPolicy()
    pub2 = WeightPublisher()
    pub2.assume(_trainer_state(7), 0)
    assert pub2.publish(s1, 1).deliver(pol2) == "checksum_mismatch" and _served_equals(pol2, s1)
    with pytest.raises(ConfigurationError, match="nothing was published"):
        WeightPublisher().full()


def test_lora_adapter_or_merged_weights() -> None:
    pol = TinyPolicy()
    pub = WeightPublisher()
    s1 = _trainer_state(1)
    pub.publish(s1, 1).deliver(pol)
    g = torch.Generator().manual_seed(4)
    adapter = LoRAAdapter({"m": (torch.randn(2, 32, generator=g), torch.randn(64, 2, generator=g))}, rank=2, alpha=4)
    p = pub.publish(adapter, 2)
    assert p.update.kind == "lora" and p.report is not None and p.report.bytes_sent == adapter.num_bytes()
    with pytest.raises(WeightUpdateRejected, match="LoRA"):  # a policy that serves no adapters refuses it
        pol.update_weights(p.update, 2)
    merged = adapter.merged_into({"m.weight": pol.state["m.weight"]})  # what such a backend is sent instead
    pm = pub.publish({**s1, **merged}, 3)
    assert pm.deliver(pol) == "version_gap"  # it is still at 1: the whole state goes
    expect = (s1["m.weight"].to(torch.bfloat16).float() + 2.0 * adapter.weights["m"][1] @ adapter.weights["m"][0]).to(torch.bfloat16)
    assert torch.equal(pol.state["m.weight"], expect)
    assert pub.publish({**s1, **merged}, 4).update.num_changed() == 0  # the same merge again: nothing moves


def test_publication_without_fallback_re_raises() -> None:
    pol = TinyPolicy()
    u = WeightUpdate.delta({"v": torch.tensor([0], dtype=torch.int32)}, {"v": torch.ones(1).to(torch.bfloat16)}, {"v": 1})
    with pytest.raises(ChecksumMismatch):
        Publication(1, u, base_version=0).deliver(pol)
    with pytest.raises(VersionNotNewer):
        Publication(0, WeightUpdate.full({})).deliver(pol)

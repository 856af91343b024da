"""Weight deltas computed on the shards (``agentgym.trainers.shard_delta``): two gloo ranks each diff their own
slices of a sharded full fine-tune, and rank 0 encodes exactly the update one process would from the whole new
state: the same indices, values, base checksums and whole tensors, step after step. Plus the publisher's side
(``WeightPublisher.publish_changes``) alone: equal to ``publish`` on the same change, and bad changes refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from agentgym.errors import ConfigurationError
from agentgym.weights import WeightPublisher

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_rank_deltas_equal_the_one_process_delta(dtype: str, tiny_model: str, tmp_path: Path) -> None:
    from test_fsdp import launch_ranks

    launch_ranks([str(HERE / "shard_delta_worker.py"), tiny_model, str(tmp_path), dtype], 2,
                 env={"PYTHONPATH": str(HERE)})
    report = json.loads((tmp_path / "report.json").read_text())
    steps = report["steps"]
    assert len(steps) == 3
    for s in steps:
        assert s["differences"] == [], s
        assert s["kind"] == "delta" and s["changed"] > 0, s  # every step trained and changed something
    assert report["shadow_differs"] == []
    if dtype == "bfloat16":  # small steps in bf16 leave most elements' bits alone: sparse tensors are sent
        assert any(s["sparse"] > 0 for s in steps), steps
        assert all(s["changed"] < s["elements"] for s in steps), steps
    else:  # in fp32 every element moves: everything goes whole, and still through the same encoding
        assert all(s["whole"] > 0 for s in steps), steps


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(64, 8, generator=g), "b.weight": torch.randn(300, generator=g),
            "c.weight": torch.randn(5, 3, generator=g)}


def test_publish_changes_is_publish() -> None:
    """A change computed elsewhere encodes as the one-process publish of the resulting state does."""
    old = _state(0)
    new = {k: v.clone() for k, v in old.items()}
    new["a.weight"].view(-1)[[3, 17, 200]] += 1.0  # a few elements: sparse
    new["b.weight"] += 1.0  # every element: whole
    # c unchanged
    ours, theirs = WeightPublisher("bfloat16"), WeightPublisher("bfloat16")
    ours.publish(old, 1)
    theirs.publish(old, 1)
    base = {k: v.to(torch.bfloat16) for k, v in old.items()}
    changes = {}
    for k in ("a.weight", "b.weight"):
        nb = new[k].to(torch.bfloat16).reshape(-1)
        i = (base[k].reshape(-1).view(torch.int16) != nb.view(torch.int16)).nonzero().reshape(-1)
        changes[k] = (i.to(torch.int64), nb[i])
    a = ours.publish_changes(changes, 2)
    b = theirs.publish(new, 2)
    assert a.update.kind == b.update.kind == "delta"
    assert sorted(a.update.indices) == sorted(b.update.indices) == ["a.weight"]
    assert sorted(a.update.tensors) == sorted(b.update.tensors) == ["b.weight"]
    assert torch.equal(a.update.indices["a.weight"], b.update.indices["a.weight"])
    assert a.update.indices["a.weight"].dtype == torch.int32
    assert torch.equal(a.update.values["a.weight"], b.update.values["a.weight"])
    assert a.update.base_crc == b.update.base_crc
    assert torch.equal(a.update.tensors["b.weight"], b.update.tensors["b.weight"])
    assert a.report is not None and b.report is not None
    assert (a.report.changed, a.report.bytes_sent, a.report.elements) == (
        b.report.changed, b.report.bytes_sent, b.report.elements)
    assert all(torch.equal(ours.shadow[k], theirs.shadow[k]) for k in old)  # type: ignore[index]


def test_publish_changes_refuses_what_does_not_fit() -> None:
    pub = WeightPublisher("bfloat16")
    with pytest.raises(ConfigurationError, match="first publish"):
        pub.publish_changes({}, 1)
    pub.publish(_state(0), 1)
    one = torch.ones(1, dtype=torch.bfloat16)
    with pytest.raises(ConfigurationError, match="never published"):
        pub.publish_changes({"z.weight": (torch.tensor([0]), one)}, 2)
    with pytest.raises(ConfigurationError, match="does not fit"):
        pub.publish_changes({"c.weight": (torch.tensor([15]), one)}, 2)
    with pytest.raises(ConfigurationError, match="does not fit"):
        pub.publish_changes({"c.weight": (torch.tensor([-1]), one)}, 2)
    with pytest.raises(ConfigurationError, match="does not fit"):
        pub.publish_changes({"c.weight": (torch.tensor([0, 1]), one)}, 2)
    assert pub.version == 1  # nothing refused was published


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))

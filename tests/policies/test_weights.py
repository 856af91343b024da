"""Weight updates: full tensors, sparse overwrite deltas, trainer-defined deltas, versions."""

from __future__ import annotations

from typing import Any

import pytest
from agentgym.policies.weights import WeightDelta, apply_update, check_version

from agentgym.errors import VersionNotNewer, WeightUpdateRejected

torch = pytest.importorskip("torch")


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {"a": torch.randn(4, 5, generator=g).to(torch.bfloat16), "b": torch.zeros(3)}


def test_delta_round_trip_touches_only_changed_elements() -> None:
    old = _state()
    new = {k: v.clone() for k, v in old.items()}
    new["a"][1, 2] = 7.0
    new["a"][3, 4] = -1.0
    d = WeightDelta.from_diff(old, new, base_version=3)
    assert d.num_changed() == 2 and list(d.indices) == ["a"] and d.base_version == 3
    target = {k: v.clone() for k, v in old.items()}
    assert apply_update(target, d) == ["a"]
    assert all(torch.equal(target[k], new[k]) for k in new)


def test_full_tensors_tuples_and_dict_form() -> None:
    s = _state()
    assert apply_update(s, {"b": torch.ones(3)}) == ["b"] and s["b"].tolist() == [1.0, 1.0, 1.0]
    apply_update(s, {"b": (torch.tensor([0]), torch.tensor([5.0]))})
    assert s["b"].tolist() == [5.0, 1.0, 1.0]
    apply_update(s, {"indices": {"b": torch.tensor([2])}, "values": {"b": torch.tensor([9.0])}})
    assert s["b"].tolist() == [5.0, 1.0, 9.0]


def test_trainer_defined_delta_with_apply_to() -> None:
    class Scale:
        def apply_to(self, state: dict[str, Any]) -> list[str]:
            state["b"].add_(2.0)
            return ["b"]

    s = _state()
    assert apply_update(s, Scale()) == ["b"] and s["b"].tolist() == [2.0, 2.0, 2.0]


def test_bad_updates_are_rejected() -> None:
    s = _state()
    with pytest.raises(WeightUpdateRejected, match="does not have"):
        apply_update(s, {"zzz": torch.ones(1)})
    with pytest.raises(WeightUpdateRejected, match="shape"):
        apply_update(s, {"b": torch.ones(4)})
    with pytest.raises(WeightUpdateRejected, match="cannot apply"):
        apply_update(s, [1, 2, 3])


def test_versions_strictly_increase() -> None:
    assert check_version(2, 3) == 3 and check_version(2, 5) == 5
    with pytest.raises(VersionNotNewer, match="not newer"):
        check_version(2, 2)  # an equal version is a second, different update under the same name
    with pytest.raises(VersionNotNewer, match="not newer"):
        check_version(5, 4)
    with pytest.raises(VersionNotNewer):
        check_version(0, -1)
    with pytest.raises(VersionNotNewer):
        check_version(0, True)  # type: ignore[arg-type]

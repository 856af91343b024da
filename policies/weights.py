"""Weight updates a policy accepts from the trainer: full tensors or sparse overwrite deltas.

``update_weights(update, version)`` on :class:`~agentgym.policies.hf.HFPolicy` and
:class:`~agentgym.policies.vllm.VLLMPolicy` takes any of:

* a mapping ``name -> Tensor``: full tensors (all of the model's, or a subset);
* a :class:`WeightDelta` (or a mapping ``name -> (flat_indices, values)``): bf16 overwrite
  encoding, the indices of the changed elements and their new values;
* any object with ``apply_to(state: dict[str, Tensor]) -> Iterable[str]`` that updates the
  tensors in place and returns the changed names (a trainer's own delta type).

Versions strictly increase: an update whose version is not newer than the policy's is rejected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentgym.errors import ConfigurationError, WeightSyncError

if TYPE_CHECKING:
    import torch

__all__ = ["WeightDelta", "apply_update", "check_version"]


@dataclass
class WeightDelta:
    """Sparse overwrite delta: for each changed tensor, flat indices and their new values.

    Attributes:
        indices: name -> int64 ``[K]`` flat indices into the tensor.
        values: name -> ``[K]`` new values (any float dtype; cast to the target's dtype).
        base_version: The version this delta applies on top of (informational).
    """

    indices: dict[str, torch.Tensor] = field(default_factory=dict)
    values: dict[str, torch.Tensor] = field(default_factory=dict)
    base_version: int | None = None

    @classmethod
    def from_diff(cls, old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor], base_version: int | None = None) -> WeightDelta:
        """The delta that turns ``old`` into ``new`` (elements compared in ``new``'s dtype)."""
        d = cls(base_version=base_version)
        for name, t in new.items():
            o = old[name].to(t.dtype).reshape(-1)
            n = t.reshape(-1)
            idx = (o != n).nonzero().reshape(-1)
            if idx.numel():
                d.indices[name] = idx
                d.values[name] = n[idx].clone()
        return d

    def num_changed(self) -> int:
        """Total number of overwritten elements."""
        return sum(int(i.numel()) for i in self.indices.values())

    def apply_to(self, state: dict[str, torch.Tensor]) -> list[str]:
        """Overwrite the elements in place; returns the changed names."""
        for name, idx in self.indices.items():
            if name not in state:
                raise ConfigurationError(f"weight delta names {name!r}, which the model does not have")
            target = state[name]
            flat = target.view(-1)
            flat[idx.to(flat.device)] = self.values[name].to(device=flat.device, dtype=flat.dtype)
        return list(self.indices)


def apply_update(state: dict[str, torch.Tensor], update: Any) -> list[str]:
    """Apply ``update`` (any supported form, see the module docstring) to ``state`` in place.

    Returns:
        The names of the tensors that were written.
    """
    import torch

    if hasattr(update, "apply_to"):
        with torch.no_grad():
            return list(update.apply_to(state))
    if not isinstance(update, Mapping):
        raise ConfigurationError(
            f"cannot apply a weight update of type {type(update).__name__}: pass a state dict, a WeightDelta, "
            "or an object with apply_to(state)"
        )
    if set(update.keys()) == {"indices", "values"} and all(isinstance(v, Mapping) for v in update.values()):
        return apply_update(state, WeightDelta(indices=dict(update["indices"]), values=dict(update["values"])))
    changed: list[str] = []
    with torch.no_grad():
        for name, value in update.items():
            if name not in state:
                raise ConfigurationError(f"weight update names {name!r}, which the model does not have")
            target = state[name]
            if isinstance(value, tuple) and len(value) == 2:
                idx, vals = value
                target.view(-1)[idx.to(target.device)] = vals.to(device=target.device, dtype=target.dtype)
            else:
                if tuple(value.shape) != tuple(target.shape):
                    raise ConfigurationError(
                        f"weight {name!r} has shape {tuple(target.shape)}, the update has {tuple(value.shape)}"
                    )
                target.copy_(value.to(device=target.device, dtype=target.dtype))
            changed.append(name)
    return changed


def check_version(current: int, new: int) -> int:
    """Validate a new weight version (strictly greater than ``current``) and return it.

    Raises:
        WeightSyncError: ``new`` is not an int, is negative, or is not newer than ``current``.
    """
    if not isinstance(new, int) or isinstance(new, bool) or new < 0:
        raise WeightSyncError(f"weight version must be a non-negative int, got {new!r}")
    if new <= current:
        raise WeightSyncError(f"weight version {new} is not newer than the served version {current}; "
                              "versions strictly increase (publish v+1)")
    return new


def names_of(update: Any) -> Iterable[str]:
    """Names an update touches, without applying it (for logging)."""
    if isinstance(update, WeightDelta):
        return list(update.indices)
    if isinstance(update, Mapping):
        return list(update.keys())
    return []

"""Weight updates a policy accepts from the trainer: full tensors or sparse overwrite deltas.

``update_weights(update, version)`` on :class:`~agentgym.policies.hf.HFPolicy` and
:class:`~agentgym.policies.vllm.VLLMPolicy` takes any of:

* a mapping ``name -> Tensor``: full tensors (all of the model's, or a subset);
* a :class:`WeightDelta`, a mapping ``name -> (flat_indices, values)``, or the plain-data form
  ``{"indices": {...}, "values": {...}, "full": {...}, "checks": {...}}`` that
  :mod:`agentgym.dataflow.weightsync` sends (its checksums are verified before anything is written):
  bf16 overwrite encoding, the indices of the changed elements and their new values;
* any object with ``apply_to(state: dict[str, Tensor]) -> Iterable[str]`` that updates the
  tensors in place and returns the changed names (a trainer's own delta type);
* a :class:`LoRAAdapter` (PEFT layout): ``VLLMPolicy(enable_lora=True)`` serves it as a vLLM LoRA
  adapter; policies that cannot load adapters take its merged delta instead
  (:meth:`LoRAAdapter.merged_into`, which :mod:`agentgym.dataflow.weightsync` does for them).

Versions strictly increase: an update whose version is not newer than the policy's is rejected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentgym.errors import ConfigurationError, VersionNotNewer, WeightUpdateRejected

if TYPE_CHECKING:
    import torch

__all__ = ["LoRAAdapter", "WeightDelta", "apply_update", "check_version", "split_update"]


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
        """Overwrite the elements in place (validated first); returns the changed names."""
        _, idx, val = split_update(self, {k: tuple(v.shape) for k, v in state.items()})
        for name, i in idx.items():
            flat = state[name].view(-1)
            flat[i.to(flat.device)] = val[name].to(device=flat.device, dtype=flat.dtype)
        return list(idx)


@dataclass
class LoRAAdapter:
    """A LoRA adapter in PEFT layout: ``W' = W + (alpha / rank) * B @ A`` for each target module.

    Attributes:
        weights: checkpoint module name (``model.layers.0.self_attn.q_proj``) -> ``(A [r, in], B [out, r])``.
        rank: LoRA rank ``r``.
        alpha: LoRA alpha (scale ``alpha / rank``).
        name: Adapter name (informational).
    """

    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]
    rank: int
    alpha: float
    name: str = "adapter"

    @property
    def scale(self) -> float:
        return float(self.alpha) / float(self.rank)

    def num_bytes(self, dtype_bytes: int = 2) -> int:
        """Size of the adapter's tensors at ``dtype_bytes`` per element (bf16: 2)."""
        return sum((a.numel() + b.numel()) * dtype_bytes for a, b in self.weights.values())

    def target_modules(self) -> list[str]:
        """Short names of the adapted modules (``q_proj``, ``v_proj``, ...), as PEFT lists them."""
        return sorted({m.rsplit(".", 1)[-1] for m in self.weights})

    def merged_deltas(self) -> dict[str, torch.Tensor]:
        """``{module.weight: scale * B @ A}`` in fp32."""
        return {f"{m}.weight": (b.float() @ a.float()) * self.scale for m, (a, b) in self.weights.items()}

    def merged_into(self, base: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The full tensors of ``base`` with this adapter merged (only the adapted ones), in base's dtype."""
        out = {}
        for name, d in self.merged_deltas().items():
            if name not in base:
                raise ConfigurationError(f"LoRA adapter targets {name!r}, which the model does not have")
            if tuple(d.shape) != tuple(base[name].shape):
                raise ConfigurationError(f"LoRA adapter for {name!r} has shape {tuple(d.shape)}, the weight {tuple(base[name].shape)}")
            out[name] = (base[name].float() + d).to(base[name].dtype)
        return out

    def save_peft(self, folder: str) -> None:
        """Write ``adapter_config.json`` and ``adapter_model.safetensors`` (PEFT's layout, which vLLM loads)."""
        import json
        import os

        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        tensors = {}
        for m, (a, b) in self.weights.items():
            tensors[f"base_model.model.{m}.lora_A.weight"] = a.detach().contiguous()
            tensors[f"base_model.model.{m}.lora_B.weight"] = b.detach().contiguous()
        save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
        config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank, "lora_alpha": self.alpha,
                  "target_modules": self.target_modules(), "bias": "none", "lora_dropout": 0.0}
        with open(os.path.join(folder, "adapter_config.json"), "w") as fh:
            json.dump(config, fh)

    @classmethod
    def from_peft(cls, folder: str, name: str = "adapter") -> LoRAAdapter:
        """Read a PEFT adapter folder (``save_pretrained`` output, or :meth:`save_peft`)."""
        import json
        import os

        from safetensors.torch import load_file

        with open(os.path.join(folder, "adapter_config.json")) as fh:
            config = json.load(fh)
        raw = load_file(os.path.join(folder, "adapter_model.safetensors"))
        mods: dict[str, dict[str, torch.Tensor]] = {}
        for key, t in raw.items():
            for part in ("lora_A", "lora_B"):
                marker = f".{part}."
                if marker in key:
                    mod = key.split(marker)[0].removeprefix("base_model.model.")
                    mods.setdefault(mod, {})[part] = t
        weights = {m: (d["lora_A"], d["lora_B"]) for m, d in mods.items() if "lora_A" in d and "lora_B" in d}
        if not weights:
            raise ConfigurationError(f"{folder} holds no lora_A/lora_B tensors")
        return cls(weights=weights, rank=int(config["r"]), alpha=float(config.get("lora_alpha", config["r"])), name=name)


def _is_delta_dict(update: Any) -> bool:
    """The plain-data delta form ``{"indices", "values"[, "full"][, "checks"]}`` (what WeightSync sends)."""
    return (isinstance(update, Mapping) and {"indices", "values"} <= set(update.keys())
            <= {"indices", "values", "full", "checks"} and isinstance(update["indices"], Mapping))


def split_update(update: Any, shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Normalize a full-tensor or sparse update into ``(full, indices, values)``, validated against ``shapes``.

    Nothing is applied. Trainer-defined ``apply_to`` objects and LoRA adapters are not handled here.

    Raises:
        WeightUpdateRejected: unknown names, wrong shapes, indices out of range or of another length than values.
    """
    import torch

    full: dict[str, torch.Tensor] = {}
    idx: dict[str, torch.Tensor] = {}
    val: dict[str, torch.Tensor] = {}
    if isinstance(update, WeightDelta):
        idx, val = dict(update.indices), dict(update.values)
    elif _is_delta_dict(update):
        idx, val = dict(update["indices"]), dict(update["values"])
        full = dict(update.get("full") or {})
    elif isinstance(update, Mapping):
        for name, value in update.items():
            if isinstance(value, tuple) and len(value) == 2:
                idx[name], val[name] = value
            else:
                full[name] = value
    else:
        raise WeightUpdateRejected(
            f"cannot apply a weight update of type {type(update).__name__}: pass a state dict, a WeightDelta, "
            "a LoRAAdapter, or an object with apply_to(state)"
        )
    for name, t in full.items():
        if name not in shapes:
            raise WeightUpdateRejected(f"weight update names {name!r}, which the model does not have")
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shapes[name]):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise WeightUpdateRejected(f"weight {name!r} has shape {tuple(shapes[name])}, the update has {got}")
    for name, i in idx.items():
        if name not in shapes:
            raise WeightUpdateRejected(f"weight delta names {name!r}, which the model does not have")
        v = val.get(name)
        if v is None or v.numel() != i.numel():
            raise WeightUpdateRejected(f"weight delta for {name!r}: {i.numel()} indices but {0 if v is None else v.numel()} values")
        numel = 1
        for d in shapes[name]:
            numel *= int(d)
        if i.numel() and (int(i.min()) < 0 or int(i.max()) >= numel):
            raise WeightUpdateRejected(f"weight delta for {name!r} has indices outside [0, {numel})")
        idx[name] = i.reshape(-1).long()
        val[name] = v.reshape(-1)
    return full, idx, val


def apply_update(state: dict[str, torch.Tensor], update: Any) -> list[str]:
    """Apply ``update`` (any supported form, see the module docstring) to ``state`` in place.

    Everything is validated before anything is written (a bad update leaves ``state`` unchanged).

    Returns:
        The names of the tensors that were written.
    """
    import torch

    if isinstance(update, LoRAAdapter):
        raise WeightUpdateRejected(
            "this policy cannot load LoRA adapters: publish through agentgym.dataflow.weightsync.WeightSync "
            "(which sends the merged weights), or pass adapter.merged_into(policy.state_dict())"
        )
    if hasattr(update, "apply_to"):
        with torch.no_grad():
            return list(update.apply_to(state))
    full, idx, val = split_update(update, {k: tuple(v.shape) for k, v in state.items()})
    if _is_delta_dict(update) and update.get("checks"):
        from agentgym.dataflow.weightsync import verify_checks

        verify_checks(state, idx, val, update["checks"])
    with torch.no_grad():
        for name, value in full.items():
            target = state[name]
            target.copy_(value.to(device=target.device, dtype=target.dtype))
        for name, i in idx.items():
            target = state[name]
            target.view(-1)[i.to(target.device)] = val[name].to(device=target.device, dtype=target.dtype)
    return list(dict.fromkeys([*full, *idx]))


def check_version(current: int, new: int) -> int:
    """Validate a new weight version (strictly greater than ``current``) and return it.

    Raises:
        VersionNotNewer: ``new`` is not an int, is negative, or is not newer than ``current``.
    """
    if not isinstance(new, int) or isinstance(new, bool) or new < 0:
        raise VersionNotNewer(f"weight version must be a non-negative int, got {new!r}")
    if new <= current:
        raise VersionNotNewer(f"weight version {new} is not newer than the served version {current}; "
                              "versions strictly increase (publish v+1)")
    return new


def names_of(update: Any) -> Iterable[str]:
    """Names an update touches, without applying it (for logging)."""
    if isinstance(update, WeightDelta):
        return list(update.indices)
    if isinstance(update, Mapping):
        return list(update.keys())
    return []

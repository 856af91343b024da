"""Publishing the trainer's weights to rollout policies, with strictly increasing versions.

What is sent:

* **Full fine-tune:** the model's parameters in the rollout policy's dtype, either whole
  (``mode="full"``) or as a sparse overwrite :class:`~agentgym.policies.weights.WeightDelta` against
  what was last sent (``mode="delta"``: indices and new values of the elements that changed in that
  dtype; with a bf16 rollout model most elements do not change in one step). ``mode="auto"`` sends
  whichever is smaller.
* **LoRA:** the *merged* weights of the adapted modules only (``W + scale * B @ A`` for each LoRA
  layer; embeddings, norms and unadapted layers are never sent), again whole or as a delta. The
  adapter itself is not sent: the rollout backends take plain tensors.

Every publish reports its bytes and seconds, which the recipe logs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

import torch

from agentgym.errors import ConfigurationError

__all__ = ["PublishMode", "WeightPublisher", "trainable_state"]

PublishMode = Literal["full", "delta", "auto"]
_PEFT_PREFIX = "base_model.model."


def _nbytes(t: torch.Tensor) -> int:
    return int(t.numel() * t.element_size())


def trainable_state(model: Any, adapter: str | None = None) -> dict[str, torch.Tensor]:
    """The rollout-model tensors the trainer changes, under the plain checkpoint names (no grad).

    Full fine-tune: every parameter. LoRA: for each layer carrying ``adapter``, the merged weight.
    """
    with torch.no_grad():
        if adapter is None:
            return {n: p.detach() for n, p in model.named_parameters()}
        out: dict[str, torch.Tensor] = {}
        for name, mod in model.named_modules():
            lora_a = getattr(mod, "lora_A", None)
            if lora_a is None or adapter not in lora_a:
                continue
            base = mod.get_base_layer().weight
            delta = mod.get_delta_weight(adapter)
            plain = name[len(_PEFT_PREFIX):] if name.startswith(_PEFT_PREFIX) else name
            out[f"{plain}.weight"] = (base + delta.to(base.dtype)).detach()
        if not out:
            raise ConfigurationError(f"no LoRA layer carries the adapter {adapter!r}")
        return out


class WeightPublisher:
    """Sends one trainer's weights to its rollout policies.

    Args:
        model: The trained model (plain or peft).
        adapter: The LoRA adapter this trainer owns (``None``: full fine-tune).
        dtype: The rollout policies' weight dtype (what changes is judged in that dtype).
        mode: ``"full"``, ``"delta"`` or ``"auto"`` (see the module docstring).
    """

    def __init__(self, model: Any, adapter: str | None = None, dtype: torch.dtype = torch.float32,
                 mode: PublishMode = "auto") -> None:
        self.model = model
        self.adapter = adapter
        self.dtype = dtype
        self.mode: PublishMode = mode
        self._sent: dict[str, torch.Tensor] | None = None
        self.history: list[dict[str, Any]] = []

    def build(self) -> tuple[Any, dict[str, Any]]:
        """The next update and its description (kind, tensors, bytes); records it as sent."""
        from agentgym.policies.weights import WeightDelta

        t0 = time.perf_counter()
        new = {k: v.to(self.dtype).clone() for k, v in trainable_state(self.model, self.adapter).items()}
        full_bytes = sum(_nbytes(v) for v in new.values())
        update: Any = new
        kind = "full"
        nbytes = full_bytes
        changed = sum(v.numel() for v in new.values())
        if self.mode != "full" and self._sent is not None:
            delta = WeightDelta.from_diff(self._sent, new)
            d_bytes = sum(_nbytes(i) + _nbytes(delta.values[k]) for k, i in delta.indices.items())
            if self.mode == "delta" or d_bytes < full_bytes:
                update, kind, nbytes, changed = delta, "delta", d_bytes, delta.num_changed()
        self._sent = new
        info = {"kind": kind, "tensors": len(new), "bytes": nbytes, "full_bytes": full_bytes,
                "changed_elements": int(changed), "total_elements": int(sum(v.numel() for v in new.values())),
                "build_s": time.perf_counter() - t0}
        return update, info

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every tensor the trainer changes, as last built (or now, before the first build): what a
        rollout model that missed updates (a late or restarted service) needs to catch up."""
        if self._sent is None:
            return {k: v.to(self.dtype).clone() for k, v in trainable_state(self.model, self.adapter).items()}
        return self._sent

    def publish(self, policies: Sequence[Any], version: int) -> dict[str, Any]:
        """Build the update and apply it to every policy with ``version``; returns bytes and seconds."""
        update, info = self.build()
        t0 = time.perf_counter()
        for p in policies:
            p.update_weights(update, version)
        info["apply_s"] = time.perf_counter() - t0
        info["version"] = version
        info["publish_s"] = info["build_s"] + info["apply_s"]
        self.history.append(info)
        return info

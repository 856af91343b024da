"""Applying a :class:`~agentgym.weights.WeightUpdate` to a policy's tensors: validate everything, then write
all of it or nothing.

Used by :class:`~agentgym.policies.hf.HFPolicy` (its model's tensors) and by the vLLM worker extension
(:mod:`agentgym.policies.vllm_worker`, its checkpoint-format master copy). The types, the diff and the
codec are the core's (:mod:`agentgym.weights`).

:func:`stage` checks the whole update before anything is written: every name is a tensor the model
has; whole tensors have exactly its shape; a delta's indices and values are 1-D, of one length, ints and
floats, with every index in range; each delta carries the CRC-32 of the base it was computed against, and
that base is what the receiver holds (else :class:`~agentgym.errors.ChecksumMismatch`). It converts
every tensor to the target's dtype and device there, so :meth:`Staged.commit` only copies into place;
if a copy still fails, the tensors written so far are restored from their backups and nothing is left
half-applied. :meth:`Staged.rollback` undoes a commit (the vLLM worker, when the engine's reload of the
written tensors fails).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentgym.errors import ChecksumMismatch, WeightUpdateRejected
from agentgym.weights import WeightUpdate, crc32, decode

if TYPE_CHECKING:
    import torch

__all__ = ["Staged", "apply_update", "signed_update", "stage", "validate"]


def validate(update: WeightUpdate, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Check a full or delta update against a model's tensor shapes (nothing is read or written).

    Raises:
        WeightUpdateRejected: a LoRA update, unknown names, wrong shapes, non-float values, indices that
            are not 1-D ints in range, values that are not 1-D of the indices' length, a delta without
            the base checksum of each tensor it changes.
    """
    import torch

    if not isinstance(update, WeightUpdate):
        raise WeightUpdateRejected(f"a weight update is an agentgym.weights.WeightUpdate, got {type(update).__name__}")
    if update.kind == "lora":
        raise WeightUpdateRejected("this receiver serves no LoRA adapters: publish the merged weights instead "
                                   "(LoRAAdapter.merged_into, or the trainer's merged state)")
    if update.kind not in ("full", "delta") or (update.kind == "full" and (update.indices or update.values)):
        raise WeightUpdateRejected(f"malformed {update.kind!r} update")
    for name, t in update.tensors.items():
        if name not in shapes:
            raise WeightUpdateRejected(f"weight update names {name!r}, which the model does not have")
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise WeightUpdateRejected(f"weight {name!r}: a whole tensor must be a float tensor, got {got}")
        if tuple(t.shape) != tuple(shapes[name]):
            raise WeightUpdateRejected(f"weight {name!r} has shape {tuple(shapes[name])}, the update has {tuple(t.shape)}")
    if set(update.indices) != set(update.values):
        raise WeightUpdateRejected("weight delta: indices and values name different tensors")
    for name, i in update.indices.items():
        v = update.values[name]
        if name not in shapes:
            raise WeightUpdateRejected(f"weight delta names {name!r}, which the model does not have")
        if name in update.tensors:
            raise WeightUpdateRejected(f"weight delta names {name!r} both whole and as a delta")
        if not isinstance(i, torch.Tensor) or i.dim() != 1 or i.dtype not in (torch.int32, torch.int64):
            raise WeightUpdateRejected(f"weight delta for {name!r}: indices must be a 1-D int32/int64 tensor")
        if not isinstance(v, torch.Tensor) or v.dim() != 1 or not v.is_floating_point():
            raise WeightUpdateRejected(f"weight delta for {name!r}: values must be a 1-D float tensor")
        if v.numel() != i.numel():
            raise WeightUpdateRejected(f"weight delta for {name!r}: {i.numel()} indices but {v.numel()} values")
        numel = 1
        for d in shapes[name]:
            numel *= int(d)
        if i.numel() and (int(i.min()) < 0 or int(i.max()) >= numel):
            raise WeightUpdateRejected(f"weight delta for {name!r} has indices outside [0, {numel})")
        if name not in update.base_crc:
            raise WeightUpdateRejected(f"weight delta for {name!r} carries no base checksum")
    extra = set(update.base_crc) - set(update.indices)
    if extra:
        raise WeightUpdateRejected(f"weight delta carries base checksums of tensors it does not change: {sorted(extra)[:5]}")


class Staged:
    """A validated update, converted for its target and not yet written (see the module docstring)."""

    def __init__(self, state: dict[str, torch.Tensor], whole: dict[str, torch.Tensor],
                 sparse: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.state = state
        self.whole = whole
        self.sparse = sparse
        self.changed = list(dict.fromkeys([*whole, *sparse]))
        self._undo: list[tuple[str, Any, torch.Tensor]] = []

    def commit(self) -> list[str]:
        """Write every tensor, or (if a write fails) none; returns the names written."""
        import torch

        self._undo = []
        try:
            with torch.no_grad():
                for name, t in self.whole.items():
                    target = self.state[name]
                    self._undo.append((name, None, target.clone()))
                    target.copy_(t)
                for name, (i, v) in self.sparse.items():
                    flat = self.state[name].view(-1)
                    self._undo.append((name, i, flat[i].clone()))
                    flat[i] = v
        except Exception as e:
            self.rollback()
            raise WeightUpdateRejected(f"writing the update failed and was undone: {type(e).__name__}: {e}") from e
        return list(self.changed)

    def rollback(self) -> None:
        """Restore what :meth:`commit` overwrote (newest first)."""
        import torch

        with torch.no_grad():
            for name, i, old in reversed(self._undo):
                if i is None:
                    self.state[name].copy_(old)
                else:
                    self.state[name].view(-1)[i] = old
        self._undo = []


def stage(state: dict[str, torch.Tensor], update: WeightUpdate) -> Staged:
    """Validate ``update`` against ``state`` (names, shapes, indices, base checksums) and convert it.

    Raises:
        WeightUpdateRejected: see :func:`validate`. ChecksumMismatch: a delta's base is not ``state``.
    """
    validate(update, {k: tuple(v.shape) for k, v in state.items()})
    for name, crc in update.base_crc.items():
        base = state[name]
        values = update.values[name]
        if base.dtype != values.dtype:  # an fp32 receiver of bf16 deltas compares in the values' dtype
            base = base.to(values.dtype)
        if crc32(base) != int(crc):
            raise ChecksumMismatch(f"{name!r} is not the base this delta was computed against (the publisher "
                                   "resends the whole state)")
    whole = {n: t.detach().to(device=state[n].device, dtype=state[n].dtype).contiguous()
             for n, t in update.tensors.items()}
    sparse = {n: (i.to(device=state[n].device, dtype=_long()),
                  update.values[n].detach().to(device=state[n].device, dtype=state[n].dtype))
              for n, i in update.indices.items()}
    return Staged(state, whole, sparse)


def _long() -> torch.dtype:
    import torch

    return torch.long


def apply_update(state: dict[str, torch.Tensor], update: WeightUpdate) -> list[str]:
    """Validate, then write ``update`` into ``state`` in place, all or nothing; returns the names written."""
    return stage(state, update).commit()


def signed_update(blob: Any, version: int, key: bytes | None) -> WeightUpdate:
    """The update in a signed wire payload (:func:`agentgym.weights.decode` with the receiver's ``key``),
    checked to be one whole update signed for ``version``.

    Raises:
        UpdateNotAuthenticated: no key, or the HMAC does not verify. WeightUpdateRejected: signed for
            another version (a replay under a new number), a chunk, or not a payload at all.
    """
    if not isinstance(blob, bytes | bytearray | memoryview | str):
        raise WeightUpdateRejected(f"a weight update is a WeightUpdate or its signed bytes, got {type(blob).__name__}")
    dec = decode(blob, key)
    if dec.version != version or dec.parts != 1:
        raise WeightUpdateRejected(f"the payload is signed for version {dec.version} (part {dec.part + 1} of "
                                   f"{dec.parts}), offered as version {version}")
    return dec.update

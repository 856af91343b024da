"""Weight updates, in the core next to the policy contract (DESIGN.md, Weights): one type, one diff, one
codec, the version rules and the one publisher.

Policies (``policies/``) apply updates, the trainer produces them, the dataflow layer distributes them
(:func:`agentgym.dataflow.publish_to`); all three import this module from below.

* :class:`WeightUpdate`: ``full`` (whole tensors), ``delta`` (the flat int32 indices and new values of
  the changed elements, plus the CRC-32 of each base tensor it applies to) or ``lora`` (a
  :class:`LoRAAdapter`). It is the only shape a policy accepts, apart from its signed wire form.
* :func:`diff`: bit-pattern overwrite diff ("bf16 overwrite encoding": ``-0.0`` vs ``0.0`` and NaNs
  count as stored); AstraFlow measured 98-99% of bf16 elements unchanged per RL step.
* :class:`WeightPublisher`: the trainer hands over its trainable state (full fine-tune: every
  parameter; LoRA: the adapter, or the merged adapted weights for backends that serve none) and gets a
  :class:`Publication`: the whole state on the first publish, then sparse deltas against what it
  published last (a tensor whose delta would not be smaller goes whole).
* **Fallback rules** (:meth:`Publication.choose`, :meth:`Publication.deliver`): a receiver that is not
  at the delta's base version (a version gap: it joined late, restarted, missed an update) gets the
  whole state; so does one that refuses a delta with :class:`~agentgym.errors.ChecksumMismatch` (its
  weights are not the delta's base). :func:`check_version`: versions strictly increase.
* **Codec** (:func:`encode` / :func:`decode`): the wire form for updates that cross a process or
  network boundary (a vLLM worker, ``vllm serve``, a Ray service actor): safetensors bytes
  (keys ``t/``, ``i/``, ``v/``, ``a/``, ``b/``; the kind, version, base checksums and LoRA shape in the
  metadata) behind an HMAC-SHA256 over everything, keyed with a shared secret
  (``AGENTGYM_WEIGHTS_KEY``, :func:`shared_key`). The HMAC is checked before anything is parsed: no key,
  a wrong key or changed bytes raise :class:`~agentgym.errors.UpdateNotAuthenticated`. It covers damage
  and tampering alike; the per-tensor CRC-32 that remains is the one that checks the receiver: a
  delta's base checksums. The signed version lets receivers refuse a replayed older payload
  (:class:`~agentgym.errors.VersionNotNewer`).

Nothing heavy is imported at module import (torch is loaded when a tensor function runs).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from agentgym.errors import (
    ChecksumMismatch,
    ConfigurationError,
    UpdateNotAuthenticated,
    VersionNotNewer,
    WeightUpdateRejected,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "KEY_ENV",
    "Decoded",
    "LoRAAdapter",
    "Publication",
    "PublishReport",
    "UpdateKind",
    "WeightPublisher",
    "WeightReceiver",
    "WeightUpdate",
    "check_version",
    "crc32",
    "decode",
    "diff",
    "encode",
    "shared_key",
]

KEY_ENV = "AGENTGYM_WEIGHTS_KEY"
MAGIC = b"AGW1"
_MAC_LEN = 32
UpdateKind = Literal["full", "delta", "lora"]


# --------------------------------------------------------------------------- tensors
def crc32(t: torch.Tensor) -> int:
    """CRC-32 of a tensor's bytes as stored (bf16: its 16-bit patterns)."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.is_floating_point():
        flat = flat.view(_int_view(flat))
    return zlib.crc32(flat.numpy().data) & 0xFFFFFFFF


def _int_view(t: torch.Tensor) -> torch.dtype:
    import torch

    return {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def diff(old: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices (int32 below 2**31 elements) and new values of the elements whose bits differ.

    ``old`` and ``new`` have the same dtype; floats are compared as bit patterns.
    """
    import torch

    o, n = old.reshape(-1), new.reshape(-1)
    if o.is_floating_point():
        o, n = o.view(_int_view(o)), n.view(_int_view(n))
    idx = (o != n).nonzero().reshape(-1)
    idx = idx.to(torch.int32) if new.numel() < 2**31 else idx
    return idx, new.reshape(-1)[idx.long()].clone()


def _nbytes(t: torch.Tensor) -> int:
    return int(t.numel() * t.element_size())


# --------------------------------------------------------------------------- types
@dataclass(frozen=True, eq=False)
class LoRAAdapter:
    """A LoRA adapter in PEFT layout: ``W' = W + (alpha / rank) * B @ A`` for each target module.

    Attributes:
        weights: checkpoint module name (``model.layers.0.self_attn.q_proj``) -> ``(A [r, in], B [out, r])``.
        rank: LoRA rank ``r``.
        alpha: LoRA alpha (scale ``alpha / rank``).
        name: Adapter name (informational).
    """

    weights: Mapping[str, tuple[torch.Tensor, torch.Tensor]]
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

    def merged_into(self, base: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The adapted tensors of ``base`` with this adapter merged (``W + scale * B @ A``), in base's dtype:
        what a backend that serves no adapters is sent (as a full or delta update).

        Raises:
            ConfigurationError: the adapter targets a module ``base`` does not have, or does not fit it.
        """
        out = {}
        for m, (a, b) in self.weights.items():
            name = f"{m}.weight"
            if name not in base:
                raise ConfigurationError(f"LoRA adapter targets {name!r}, which the model does not have")
            d = (b.float() @ a.float()) * self.scale
            if tuple(d.shape) != tuple(base[name].shape):
                raise ConfigurationError(f"LoRA adapter for {name!r} has shape {tuple(d.shape)}, the weight "
                                         f"{tuple(base[name].shape)}")
            out[name] = (base[name].float() + d).to(base[name].dtype)
        return out

    def save_peft(self, folder: str) -> None:
        """Write ``adapter_config.json`` and ``adapter_model.safetensors`` (PEFT's layout, which vLLM loads)."""
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


@dataclass(frozen=True, eq=False)
class WeightUpdate:
    """One weight update; build it with :meth:`full`, :meth:`delta` or :meth:`lora`.

    Attributes:
        kind: ``"full"``, ``"delta"`` or ``"lora"``.
        tensors: Whole tensors, by checkpoint name (``full``: all it sends; ``delta``: the tensors that
            changed so much they go whole).
        indices: ``delta``: name -> ``[K]`` flat int32 (or int64) indices of the changed elements.
        values: ``delta``: name -> ``[K]`` their new values (the publish dtype).
        base_crc: ``delta``: name -> CRC-32 of the tensor the indices apply to, in the values' dtype
            (the receiver refuses the delta with ChecksumMismatch if its tensor differs).
        adapter: ``lora``: the adapter, served as such by policies that serve adapters.
    """

    kind: UpdateKind
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)
    indices: Mapping[str, torch.Tensor] = field(default_factory=dict)
    values: Mapping[str, torch.Tensor] = field(default_factory=dict)
    base_crc: Mapping[str, int] = field(default_factory=dict)
    adapter: LoRAAdapter | None = None

    @classmethod
    def full(cls, tensors: Mapping[str, torch.Tensor]) -> WeightUpdate:
        """Whole tensors (all of a model's, or the subset a trainer changes)."""
        return cls("full", tensors=dict(tensors))

    @classmethod
    def delta(cls, indices: Mapping[str, torch.Tensor], values: Mapping[str, torch.Tensor],
              base_crc: Mapping[str, int], tensors: Mapping[str, torch.Tensor] | None = None) -> WeightUpdate:
        """A sparse overwrite delta (plus whole tensors), against the base whose CRC-32 it carries."""
        return cls("delta", tensors=dict(tensors or {}), indices=dict(indices), values=dict(values),
                   base_crc=dict(base_crc))

    @classmethod
    def lora(cls, adapter: LoRAAdapter) -> WeightUpdate:
        """A LoRA adapter, for policies that serve adapters."""
        return cls("lora", adapter=adapter)

    def names(self) -> list[str]:
        """The checkpoint tensors this update writes (LoRA: the adapted weights)."""
        if self.adapter is not None:
            return sorted(f"{m}.weight" for m in self.adapter.weights)
        return list(dict.fromkeys([*self.tensors, *self.indices]))

    def nbytes(self) -> int:
        """Bytes of tensor data it carries."""
        if self.adapter is not None:
            return sum(_nbytes(a) + _nbytes(b) for a, b in self.adapter.weights.values())
        return sum(_nbytes(t) for t in [*self.tensors.values(), *self.indices.values(), *self.values.values()])

    def num_changed(self) -> int:
        """Elements it overwrites (whole tensors count whole)."""
        return sum(t.numel() for t in self.tensors.values()) + sum(t.numel() for t in self.indices.values())


@runtime_checkable
class WeightReceiver(Protocol):
    """What takes weight updates: a policy with ``capabilities.weight_updates``, or a server target.

    ``update_weights`` takes a :class:`WeightUpdate`, or its signed wire form (``bytes`` from
    :func:`encode`, checked against the receiver's key), and returns the names it wrote.
    """

    @property
    def weight_version(self) -> int | None: ...

    def update_weights(self, update: WeightUpdate | bytes, version: int) -> list[str]: ...


def check_version(current: int | None, new: int) -> int:
    """Validate a new weight version (strictly greater than ``current``) and return it.

    Raises:
        VersionNotNewer: ``new`` is not a non-negative int, or is not newer than ``current``.
    """
    if not isinstance(new, int) or isinstance(new, bool) or new < 0:
        raise VersionNotNewer(f"weight version must be a non-negative int, got {new!r}")
    if current is not None and new <= current:
        raise VersionNotNewer(f"weight version {new} is not newer than the served version {current}; "
                              "versions strictly increase (publish v+1)")
    return new


# --------------------------------------------------------------------------- the publisher
@dataclass
class PublishReport:
    """What one publish encoded.

    Attributes:
        version: The version published; ``base_version``: the version its delta applies to.
        kind: ``"full"``, ``"delta"`` or ``"lora"``; ``reason``: why it went full (``first``, ``forced``).
        bytes_sent / bytes_full: the update's tensor bytes, and a full transfer's.
        elements / changed: elements compared, and sent as changed.
        encode_s: Seconds to diff and build the update.
        tensors: The names it writes.
    """

    version: int
    kind: str
    reason: str = ""
    base_version: int | None = None
    bytes_sent: int = 0
    bytes_full: int = 0
    elements: int = 0
    changed: int = 0
    encode_s: float = 0.0
    tensors: list[str] = field(default_factory=list)

    @property
    def unchanged_fraction(self) -> float:
        return 1.0 - self.changed / self.elements if self.elements else 1.0

    @property
    def compression(self) -> float:
        return self.bytes_full / self.bytes_sent if self.bytes_sent else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "kind": self.kind, "reason": self.reason, "base_version": self.base_version,
                "bytes": self.bytes_sent, "full_bytes": self.bytes_full, "tensors": len(self.tensors),
                "changed_elements": self.changed, "total_elements": self.elements, "encode_s": self.encode_s}


@dataclass(frozen=True, eq=False)
class Publication:
    """One published version: the update, what it applies to, and the whole state to fall back to.

    Attributes:
        version: The new version.
        update: A delta against ``base_version`` (or the whole state).
        base_version: The version a receiver must serve to take ``update`` (``None``: any).
        full: The whole state (``None`` when ``update`` already is).
        report: What the publisher encoded.
    """

    version: int
    update: WeightUpdate
    base_version: int | None = None
    full: WeightUpdate | None = None
    report: PublishReport | None = None

    def choose(self, served: int | None) -> tuple[WeightUpdate, str]:
        """The version-gap rule: ``update`` for a receiver at ``base_version``, else the whole state.

        Returns:
            ``(update, "ok")`` or ``(full, "version_gap")``.
        """
        if self.full is None or self.update.kind != "delta" or served == self.base_version:
            return self.update, "ok"
        return self.full, "version_gap"

    def fallback(self, sent: WeightUpdate) -> WeightUpdate | None:
        """The checksum-mismatch rule: what to resend after ``sent`` was refused with ChecksumMismatch."""
        return self.full if self.full is not None and sent is not self.full else None

    def deliver(self, receiver: WeightReceiver) -> str:
        """Apply this version to one receiver in this process, with both fallback rules.

        Returns:
            ``"ok"``, ``"version_gap"`` or ``"checksum_mismatch"`` (the last two: the whole state went).
        """
        update, how = self.choose(receiver.weight_version)
        try:
            receiver.update_weights(update, self.version)
        except ChecksumMismatch:
            full = self.fallback(update)
            if full is None:
                raise
            receiver.update_weights(full, self.version)
            return "checksum_mismatch"
        return how


class WeightPublisher:
    """The one publisher: turns a trainer's successive trainable states into :class:`Publication` s.

    It keeps a shadow of what it published last (in ``dtype``, the receivers' dtype), so each publish
    after the first is a sparse delta against it.

    Args:
        dtype: The dtype receivers serve and deltas compare in (``"bfloat16"`` or ``"float32"``).
    """

    def __init__(self, dtype: str = "bfloat16") -> None:
        import torch

        if dtype not in ("bfloat16", "float32", "float16"):
            raise ConfigurationError(f"publish dtype must be bfloat16, float16 or float32, got {dtype!r}")
        self.dtype = dtype
        self._torch_dtype = getattr(torch, dtype)
        self.shadow: dict[str, torch.Tensor] | None = None
        self.version: int | None = None  # the version the shadow holds
        self.history: list[PublishReport] = []

    def assume(self, state: Mapping[str, torch.Tensor], version: int | None) -> None:
        """Take ``state`` as what receivers serve now, as ``version`` (for a trainer and receivers that
        loaded the same checkpoint): the first publish is then a delta. The assumption is checked, not
        trusted: a receiver that serves something else refuses the delta (ChecksumMismatch) and gets the
        whole state, one at another version gets it too (the version gap)."""
        self.shadow = {k: self._cast(v).clone() for k, v in state.items()}
        self.version = version

    def full(self) -> WeightUpdate:
        """The whole state as last published (shares the publisher's tensors: use it before the next publish).

        Raises:
            ConfigurationError: nothing was published (or assumed) yet.
        """
        if self.shadow is None:
            raise ConfigurationError("nothing was published yet: publish (or assume) a state first")
        return WeightUpdate.full(self.shadow)

    def publish(self, state: Mapping[str, torch.Tensor] | LoRAAdapter, version: int, *,
                force_full: bool = False) -> Publication:
        """Encode ``state`` (name -> tensor, or a LoRA adapter) as ``version``.

        Raises:
            VersionNotNewer: ``version`` is not newer than the last one published.
        """
        check_version(self.version, version)
        t0 = time.perf_counter()
        if isinstance(state, LoRAAdapter):
            update = WeightUpdate.lora(state)
            n = state.num_bytes()
            report = PublishReport(version, "lora", base_version=self.version, bytes_sent=n, bytes_full=n,
                                   tensors=update.names())
            pub = Publication(version, update, None, None, report)
        elif self.shadow is None or force_full:
            pub = self._publish_full(state, version, "forced" if self.shadow is not None else "first")
        else:
            pub = self._publish_delta(state, version)
        assert pub.report is not None
        pub.report.encode_s = time.perf_counter() - t0
        self.version = version
        self.history.append(pub.report)
        return pub

    # ------------------------------------------------------------------ internals
    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu", self._torch_dtype)

    def _publish_full(self, state: Mapping[str, torch.Tensor], version: int, reason: str) -> Publication:
        self.shadow = {k: self._cast(v).clone() for k, v in state.items()}
        update = WeightUpdate.full(self.shadow)
        n = sum(_nbytes(t) for t in self.shadow.values())
        elements = sum(t.numel() for t in self.shadow.values())
        report = PublishReport(version, "full", reason, base_version=None, bytes_sent=n, bytes_full=n,
                               elements=elements, changed=elements, tensors=list(self.shadow))
        return Publication(version, update, None, None, report)

    def _publish_delta(self, state: Mapping[str, torch.Tensor], version: int) -> Publication:
        assert self.shadow is not None
        whole: dict[str, torch.Tensor] = {}
        changes: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        elements = changed = bytes_full = 0
        for k, v in state.items():
            new = self._cast(v)
            old = self.shadow.get(k)
            elements += new.numel()
            bytes_full += _nbytes(new)
            if old is None or tuple(old.shape) != tuple(new.shape):  # a tensor not published before goes whole
                whole[k] = new.clone()
                changed += new.numel()
                continue
            i, x = diff(old, new)
            if i.numel() == 0:
                continue
            changed += i.numel()
            if _nbytes(i) + _nbytes(x) >= _nbytes(new):
                whole[k] = new.clone()
            else:
                changes[k] = (i, x)
        return self._encode_delta(version, changes, whole, elements, changed, bytes_full)

    def publish_changes(self, changes: Mapping[str, tuple[torch.Tensor, torch.Tensor]], version: int) -> Publication:
        """Encode ``version`` from changes computed elsewhere: name -> (flat indices, new values in the publish
        dtype) against the state last published (a sharded trainer's ranks diff their own shards,
        :class:`agentgym.trainers.shard_delta.ShardDeltas`). A tensor absent from ``changes`` is unchanged. The
        same update as :meth:`publish` of the new state would encode, without the whole new state at hand.

        Raises:
            ConfigurationError: nothing was published yet, or a change names a tensor never published, or its
                indices fall outside it.
            VersionNotNewer: ``version`` is not newer than the last one published.
        """
        check_version(self.version, version)
        if self.shadow is None:
            raise ConfigurationError("publish_changes needs a first publish (the whole state) to diff against")
        t0 = time.perf_counter()
        import torch

        whole: dict[str, torch.Tensor] = {}
        kept: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        elements = changed = bytes_full = 0
        for t in self.shadow.values():
            elements += t.numel()
            bytes_full += _nbytes(t)
        for k, (i, x) in changes.items():
            old = self.shadow.get(k)
            if old is None:
                raise ConfigurationError(f"a change to {k!r}, which was never published")
            if i.numel() != x.numel() or (i.numel() and (int(i.min()) < 0 or int(i.max()) >= old.numel())):
                raise ConfigurationError(f"the change to {k!r} does not fit its {old.numel()} elements")
            if i.numel() == 0:
                continue
            changed += i.numel()
            i = i.to(torch.int32) if old.numel() < 2**31 else i.to(torch.int64)
            x = x.to("cpu", self._torch_dtype)
            if _nbytes(i) + _nbytes(x) >= _nbytes(old):
                new = old.clone()
                new.view(-1)[i.long()] = x
                whole[k] = new
            else:
                kept[k] = (i, x)
        pub = self._encode_delta(version, kept, whole, elements, changed, bytes_full)
        assert pub.report is not None
        pub.report.encode_s = time.perf_counter() - t0
        self.version = version
        self.history.append(pub.report)
        return pub

    def _encode_delta(self, version: int, changes: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
                      whole: Mapping[str, torch.Tensor], elements: int, changed: int,
                      bytes_full: int) -> Publication:
        """The delta update of ``changes`` (sparse) and ``whole`` (tensors sent whole) against the shadow, which
        then becomes the new state."""
        assert self.shadow is not None
        idx = {k: i for k, (i, _) in changes.items()}
        val = {k: x for k, (_, x) in changes.items()}
        base = {k: crc32(self.shadow[k]) for k in changes}
        update = WeightUpdate.delta(idx, val, base, whole)
        for k, t in whole.items():  # the shadow becomes the new state (after the base checksums were taken)
            if k in self.shadow and tuple(self.shadow[k].shape) == tuple(t.shape):
                self.shadow[k].copy_(t)
            else:
                self.shadow[k] = t.clone()
        for k, i in idx.items():
            self.shadow[k].view(-1)[i.long()] = val[k]
        report = PublishReport(version, "delta", base_version=self.version, bytes_sent=update.nbytes(),
                               bytes_full=bytes_full, elements=elements, changed=changed, tensors=update.names())
        return Publication(version, update, self.version, WeightUpdate.full(self.shadow), report)


# --------------------------------------------------------------------------- the codec
def shared_key(create: bool = False) -> bytes | None:
    """The shared HMAC key: ``AGENTGYM_WEIGHTS_KEY`` from the environment (its UTF-8 bytes).

    Args:
        create: If unset, make a random key for this process and put it in its environment, so the
            processes it starts afterwards (a vLLM engine's workers) share it.
    """
    key = os.environ.get(KEY_ENV)
    if not key and create:
        key = secrets.token_hex(32)
        os.environ[KEY_ENV] = key
    return key.encode() if key else None


def _as_key(key: bytes | str | None) -> bytes | None:
    if isinstance(key, str):
        key = key.encode()
    return key or None


def _mac(key: bytes, body: bytes | memoryview) -> bytes:
    h = hmac.new(key, MAGIC, hashlib.sha256)
    h.update(body)
    return h.digest()


@dataclass(frozen=True, eq=False)
class Decoded:
    """A verified wire payload: the update, its signed version, and (chunked sends) which part it is."""

    update: WeightUpdate
    version: int
    part: int = 0
    parts: int = 1
    update_id: str = ""


def encode(update: WeightUpdate, version: int, key: bytes | str | None, *, part: int = 0, parts: int = 1,
           update_id: str = "") -> bytes:
    """The signed wire form of ``update`` as ``version`` (``part`` of ``parts`` when sent in chunks).

    Raises:
        ConfigurationError: no key (set ``AGENTGYM_WEIGHTS_KEY`` on both ends).
    """
    from safetensors.torch import save

    k = _as_key(key)
    if k is None:
        raise ConfigurationError(f"signing a weight update needs the shared key: set {KEY_ENV} (the same value on "
                                 "the publisher and the receiver)")
    check_version(None, version)
    tensors: dict[str, Any] = {f"t/{n}": t.detach().to("cpu").contiguous() for n, t in update.tensors.items()}
    for n, i in update.indices.items():
        tensors[f"i/{n}"] = i.detach().to("cpu").contiguous()
        tensors[f"v/{n}"] = update.values[n].detach().to("cpu").contiguous()
    meta: dict[str, Any] = {"kind": update.kind, "version": version, "base_crc": dict(update.base_crc),
                            "part": part, "parts": parts, "update_id": update_id}
    if update.adapter is not None:
        a = update.adapter
        meta["lora"] = {"rank": a.rank, "alpha": a.alpha, "name": a.name}
        for m, (la, lb) in a.weights.items():
            tensors[f"a/{m}"] = la.detach().to("cpu").contiguous()
            tensors[f"b/{m}"] = lb.detach().to("cpu").contiguous()
    body = save(tensors, metadata={"agentgym": json.dumps(meta)})
    return MAGIC + _mac(k, body) + body


def decode(blob: bytes | bytearray | memoryview | str, key: bytes | str | None, *,
           max_bytes: int | None = None) -> Decoded:
    """Verify and parse a wire payload (``bytes``, or ``"b64:..."`` as an HTTP server passes it).

    The HMAC is checked first; nothing is parsed from an unauthenticated payload.

    Raises:
        UpdateNotAuthenticated: no key here, no MAC, or a MAC that does not verify.
        WeightUpdateRejected: over ``max_bytes``, or malformed (after the MAC verified).
    """
    import base64
    import binascii

    if isinstance(blob, str):
        if not blob.startswith("b64:"):
            raise WeightUpdateRejected("a string weight payload must be 'b64:' + base64 of the signed bytes")
        if max_bytes is not None and len(blob) > 4 + (max_bytes * 4) // 3 + 8:
            raise WeightUpdateRejected(f"weight payload larger than {max_bytes} bytes")
        try:
            data = base64.b64decode(blob[4:], validate=True)
        except (binascii.Error, ValueError) as e:
            raise WeightUpdateRejected(f"weight payload is not valid base64: {e}") from None
    elif isinstance(blob, bytes | bytearray | memoryview):
        data = bytes(blob)
    else:
        raise WeightUpdateRejected(f"unsupported weight payload {type(blob).__name__}")
    if max_bytes is not None and len(data) > max_bytes:
        raise WeightUpdateRejected(f"weight payload of {len(data)} bytes is larger than {max_bytes}")
    k = _as_key(key)
    if k is None:
        raise UpdateNotAuthenticated(f"this receiver has no weights key ({KEY_ENV}): it accepts no signed update")
    if len(data) < len(MAGIC) + _MAC_LEN or not data.startswith(MAGIC):
        raise UpdateNotAuthenticated("the weight payload carries no HMAC (not an agentgym.weights.encode payload)")
    mac, body = data[len(MAGIC): len(MAGIC) + _MAC_LEN], memoryview(data)[len(MAGIC) + _MAC_LEN:]
    if not hmac.compare_digest(mac, _mac(k, body)):
        raise UpdateNotAuthenticated("the weight payload's HMAC does not verify (another key, or changed bytes)")
    return _parse(bytes(body))


def _parse(body: bytes) -> Decoded:
    from safetensors.torch import load

    try:
        raw = load(body)
        header = json.loads(body[8: 8 + int.from_bytes(body[:8], "little")])
        meta = json.loads((header.get("__metadata__") or {})["agentgym"])
        kind, version = meta["kind"], meta["version"]
        base_crc = {str(n): int(c) for n, c in dict(meta.get("base_crc") or {}).items()}
        part, parts, update_id = int(meta.get("part", 0)), int(meta.get("parts", 1)), str(meta.get("update_id", ""))
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise WeightUpdateRejected(f"malformed weight payload: {type(e).__name__}: {e}") from None
    except Exception as e:  # safetensors' SafetensorError is a plain Exception subclass
        raise WeightUpdateRejected(f"malformed weight payload: {type(e).__name__}: {e}") from None
    if kind not in ("full", "delta", "lora") or not isinstance(version, int) or not 0 <= part < parts:
        raise WeightUpdateRejected(f"malformed weight payload metadata: kind {kind!r}, version {version!r}, "
                                   f"part {part} of {parts}")
    groups: dict[str, dict[str, Any]] = {p: {} for p in ("t", "i", "v", "a", "b")}
    for name, t in raw.items():
        prefix, _, rest = name.partition("/")
        if prefix not in groups or not rest:
            raise WeightUpdateRejected(f"malformed weight payload: unexpected tensor {name!r}")
        groups[prefix][rest] = t
    if kind == "lora":
        lora = meta.get("lora")
        if not isinstance(lora, dict) or set(groups["a"]) != set(groups["b"]) or groups["t"] or groups["i"]:
            raise WeightUpdateRejected("malformed LoRA payload")
        try:
            adapter = LoRAAdapter({m: (groups["a"][m], groups["b"][m]) for m in groups["a"]}, rank=int(lora["rank"]),
                                  alpha=float(lora["alpha"]), name=str(lora.get("name", "adapter")))
        except (KeyError, TypeError, ValueError) as e:
            raise WeightUpdateRejected(f"malformed LoRA payload: {e}") from None
        update = WeightUpdate.lora(adapter)
    else:
        if set(groups["i"]) != set(groups["v"]) or groups["a"] or groups["b"] or (kind == "full" and groups["i"]):
            raise WeightUpdateRejected("malformed weight payload: indices and values name different tensors")
        update = WeightUpdate(kind, tensors=groups["t"], indices=groups["i"], values=groups["v"], base_crc=base_crc)
    return Decoded(update, version, part, parts, update_id)

"""WeightSync: publish a trainer's weights to rollout policies, full or as a sparse bf16 delta.

A :class:`WeightSync` keeps a *shadow* of what its target serves (the tensors in the sync dtype,
bf16 by default) and the version it published last. ``publish(state, version)``:

* **first sync, version gap, or checksum mismatch: full transfer.** The first publish sends every
  tensor. If the target reports a version other than the one last published (someone else updated
  it, it restarted), the shadow is stale and the whole state goes again. A delta carries the CRC-32
  of each base tensor it applies to and of its own bytes; a target whose tensors differ from the
  shadow (or that received damaged bytes) refuses it *before writing anything*, and WeightSync
  resends the same version in full.
* **otherwise a sparse delta**: for each tensor, the flat indices (int32) and new bf16 values of the
  elements whose bf16 bits changed ("bf16 overwrite encoding"); a tensor where that is not smaller
  than the tensor itself goes whole.
* **LoRA** (an object with ``weights``/``rank``/``alpha`` and ``merged_into``, e.g.
  :class:`agentgym.policies.weights.LoRAAdapter`): the adapter itself to targets that serve
  adapters, or its merged weights (as a delta) to those that cannot, whichever is smaller.

Targets: an in-process policy with ``update_weights(update, version)`` (HFPolicy, VLLMPolicy), a
Ray actor holding one (:class:`PolicyActor`), or an OpenAI-compatible ``vllm serve``
(:class:`VLLMServerTarget`). ``link`` simulates a network between trainer and target
(:class:`LinkShim`: round-trip time plus bandwidth) to measure cross-region sync.

Trainers call one function: ``publish(policy_or_target, state_or_model, version)``. A trainer that
starts from the checkpoint its targets loaded can skip the first full transfer with
:meth:`WeightSync.assume_served` (checked by the same checksums).

Wire format (:func:`encode_payload`): safetensors bytes with keys ``full/<name>``, ``idx/<name>``,
``val/<name>`` and metadata ``{"checks": json}``; the same bytes go to an in-process engine worker
and, base64 in JSON, to a server's ``/collective_rpc``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
import time
import weakref
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentgym.errors import (
    ChecksumMismatch,
    ConfigurationError,
    VersionNotNewer,
    WeightSyncError,
    WeightUpdateRejected,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "LinkShim",
    "PolicyActor",
    "PolicyTarget",
    "RayPolicyTarget",
    "SyncReport",
    "SyncTarget",
    "VLLMServerTarget",
    "WeightSync",
    "crc32_of",
    "decode_payload",
    "encode_payload",
    "publish",
    "sparse_diff",
    "verify_checks",
    "worker_error",
    "write_payload",
]


# --------------------------------------------------------------------------- codec
def crc32_of(t: Any) -> int:
    """CRC-32 of a tensor's bytes as stored (bf16: its 16-bit patterns)."""
    import torch

    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.dtype == torch.bfloat16:
        flat = flat.view(torch.int16)
    return zlib.crc32(memoryview(flat.numpy())) & 0xFFFFFFFF


def _payload_crc(idx: Any, val: Any) -> int:
    """CRC-32 of a delta's indices (as int64, whatever they travelled as) and values (as stored)."""
    import torch

    return zlib.crc32(memoryview(val.contiguous().view(-1).view(_int_view(val)).numpy()),
                      zlib.crc32(memoryview(idx.reshape(-1).to(torch.int64).contiguous().numpy()))) & 0xFFFFFFFF


def _int_view(t: Any) -> Any:
    import torch

    return {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def encode_payload(full: Mapping[str, Any], indices: Mapping[str, Any], values: Mapping[str, Any],
                   checks: Mapping[str, Any] | None = None) -> bytes:
    """Full tensors and a sparse delta as safetensors bytes; ``checks`` go in the metadata."""
    from safetensors.torch import save

    return save(_payload_tensors(full, indices, values), metadata={"checks": json.dumps(dict(checks or {}))})


def write_payload(path: str, full: Mapping[str, Any], indices: Mapping[str, Any], values: Mapping[str, Any],
                  checks: Mapping[str, Any] | None = None) -> str:
    """:func:`encode_payload` into a file (no in-memory copy of the whole payload); returns ``"file:PATH"``."""
    from safetensors.torch import save_file

    save_file(_payload_tensors(full, indices, values), path, metadata={"checks": json.dumps(dict(checks or {}))})
    return "file:" + path


def _payload_tensors(full: Mapping[str, Any], indices: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    tensors: dict[str, Any] = {f"full/{k}": v.detach().to("cpu").contiguous() for k, v in full.items()}
    for k, i in indices.items():
        tensors[f"idx/{k}"] = i.detach().to("cpu").contiguous()
        tensors[f"val/{k}"] = values[k].detach().to("cpu").contiguous()
    return tensors


def decode_payload(payload: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(full, indices, values, checks)`` from :func:`encode_payload` bytes, ``"b64:..."`` or ``"file:PATH"``."""
    if isinstance(payload, str) and payload.startswith("file:"):
        from safetensors import safe_open

        try:
            with safe_open(payload[5:], framework="pt") as fh:
                raw = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (safe_open is not a Mapping)
                meta = fh.metadata() or {}
        except Exception as e:  # OSError, or safetensors' SafetensorError (an Exception subclass)
            raise WeightUpdateRejected(f"cannot read weight payload {payload[5:]!r}: {type(e).__name__}: {e}") from e
        return _split_payload(raw, json.loads(meta.get("checks", "{}")))
    if isinstance(payload, str):
        if payload.startswith("b64:"):
            data = base64.b64decode(payload[4:])
        else:
            raise WeightUpdateRejected("a string weight payload must start with 'file:' or 'b64:'")
    elif isinstance(payload, bytes | bytearray | memoryview):
        data = bytes(payload)
    else:
        raise WeightUpdateRejected(f"unsupported weight payload {type(payload).__name__}")
    from safetensors.torch import load

    try:
        raw = load(data)
        header = json.loads(data[8: 8 + int.from_bytes(data[:8], "little")])
    except Exception as e:  # safetensors' SafetensorError on damaged bytes, or bad JSON
        raise WeightUpdateRejected(f"damaged weight payload: {type(e).__name__}: {e}") from e
    return _split_payload(raw, json.loads((header.get("__metadata__") or {}).get("checks", "{}")))


def _split_payload(raw: Mapping[str, Any], checks: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    full: dict[str, Any] = {}
    idx: dict[str, Any] = {}
    val: dict[str, Any] = {}
    for key, t in raw.items():
        kind, _, name = key.partition("/")
        {"full": full, "idx": idx, "val": val}[kind][name] = t
    if set(idx) != set(val):
        raise WeightUpdateRejected("sparse delta: indices and values name different tensors")
    return full, idx, val, checks


def verify_checks(state: Mapping[str, Any], indices: Mapping[str, Any], values: Mapping[str, Any],
                  checks: Mapping[str, Any]) -> None:
    """Check a delta before applying it: the payload's own CRC and the CRC of each base tensor.

    A receiver that holds a tensor in another dtype than the delta's values (an fp32 policy taking
    bf16 deltas) is compared in the values' dtype, which is what the sender's shadow holds.

    Raises:
        ChecksumMismatch: the payload was damaged, or the receiver's tensor is not the base the
            delta was computed against (the sender must fall back to a full transfer).
    """
    for name, crc in (checks.get("payload") or {}).items():
        if name in indices and _payload_crc(indices[name], values[name]) != int(crc):
            raise ChecksumMismatch(f"the delta for {name!r} was damaged in transit")
    for name, crc in (checks.get("base") or {}).items():
        if name not in state:
            continue
        base = state[name]
        if name in values and base.dtype != values[name].dtype:  # an fp32 receiver of bf16 deltas: compare in bf16
            base = base.to(values[name].dtype)
        if crc32_of(base) != int(crc):
            raise ChecksumMismatch(f"{name!r} is not the base this delta was computed against")


def sparse_diff(old: Any, new: Any) -> tuple[Any, Any]:
    """Flat int32 indices and new values of the elements whose bits differ (``old``/``new``: same dtype)."""
    import torch

    o = old.reshape(-1)
    n = new.reshape(-1)
    if o.dtype.is_floating_point:  # compare bit patterns: -0.0 vs 0.0 and NaNs count as they are stored
        o, n = o.view(_int_view(o)), n.view(_int_view(n))
    idx = (o != n).nonzero().reshape(-1)
    idx = idx.to(torch.int32) if new.numel() < 2**31 else idx
    return idx, new.reshape(-1)[idx.long()]


_WORKER_ERRORS: dict[str, type[WeightSyncError]] = {
    "ChecksumMismatch": ChecksumMismatch, "VersionNotNewer": VersionNotNewer, "WeightUpdateRejected": WeightUpdateRejected}


def worker_error(result: Any, context: str) -> WeightSyncError:
    """The exception for a refusal a worker returned as data (``{"error": msg, "type": class name}``).

    The class travels as a field (a worker RPC cannot raise without taking a served engine down); an
    unknown or missing type is a refusal (:class:`~agentgym.errors.WeightUpdateRejected`).
    """
    kind = result.get("type") if isinstance(result, dict) else None
    msg = result.get("error") if isinstance(result, dict) else result
    return _WORKER_ERRORS.get(str(kind), WeightUpdateRejected)(f"{context}: {msg}")


# --------------------------------------------------------------------------- link shim
@dataclass
class LinkShim:
    """A simulated network link: each transfer waits ``rtt_s`` plus its bytes at ``bandwidth_bps``.

    Attributes:
        rtt_s: Round-trip time (one request and its acknowledgement).
        bandwidth_bps: Bits per second (``None``: unlimited).
    """

    rtt_s: float = 0.0
    bandwidth_bps: float | None = None
    waited_s: float = 0.0

    def delay(self, nbytes: int) -> float:
        return self.rtt_s + (0.0 if not self.bandwidth_bps else nbytes * 8.0 / self.bandwidth_bps)

    def transfer(self, nbytes: int) -> float:
        d = self.delay(nbytes)
        if d > 0:
            time.sleep(d)
        self.waited_s += d
        return d


# --------------------------------------------------------------------------- targets
@runtime_checkable
class SyncTarget(Protocol):
    """Where weights go. ``names`` are the tensors the target holds; updates never add others."""

    supports_lora: bool

    def names(self) -> Mapping[str, tuple[int, ...]]: ...

    def version(self) -> int | None: ...

    def apply(self, update: Any, version: int, nbytes: int) -> list[str]: ...

    def checksums(self, names: list[str]) -> dict[str, int] | None: ...


class PolicyTarget:
    """An in-process policy with ``update_weights(update, version)`` (HFPolicy, VLLMPolicy, ...).

    Deltas go as ``{"indices", "values", "checks"}`` dicts, which the policy verifies before writing.
    """

    def __init__(self, policy: Any, **update_kwargs: Any) -> None:
        if not callable(getattr(policy, "update_weights", None)):
            raise ConfigurationError(f"{type(policy).__name__} cannot take weight updates (no update_weights)")
        self.policy = policy
        self.update_kwargs = update_kwargs
        self.supports_lora = bool(getattr(policy, "enable_lora", False))
        self._names: dict[str, tuple[int, ...]] | None = None

    def names(self) -> Mapping[str, tuple[int, ...]]:
        if self._names is None:
            shapes = getattr(self.policy, "_shapes", None)
            if isinstance(shapes, Mapping):
                self._names = dict(shapes)
            else:  # tied weights (lm_head.weight = embed_tokens.weight) are one tensor: listed once
                seen: set[tuple[int, int]] = set()
                self._names = {}
                for k, v in self.policy.state_dict().items():
                    key = (v.data_ptr(), v.numel())
                    if key not in seen:
                        seen.add(key)
                        self._names[k] = tuple(v.shape)
        return self._names

    def version(self) -> int | None:
        v = getattr(self.policy, "weight_version", None)
        return int(v) if v is not None else None

    def apply(self, update: Any, version: int, nbytes: int) -> list[str]:
        return list(self.policy.update_weights(update, version, **self.update_kwargs))

    def checksums(self, names: list[str]) -> dict[str, int] | None:
        fn = getattr(self.policy, "weight_checksums", None)
        if callable(fn):
            return dict(fn(names))
        state = self.policy.state_dict()
        return {n: crc32_of(state[n]) for n in names}


class PolicyActor:
    """A policy hosted in a Ray actor: ``ray.remote(PolicyActor).remote(factory)``.

    The dataflow layer talks to it only through these methods (plain data in and out), so the same
    WeightSync publishes to it as to an in-process policy (:class:`RayPolicyTarget`).
    """

    def __init__(self, factory: Any, *args: Any, **kwargs: Any) -> None:
        self.policy = factory(*args, **kwargs)

    def update_weights(self, update: Any, version: int, **kwargs: Any) -> list[str]:
        return list(self.policy.update_weights(update, version, **kwargs))

    def weight_version(self) -> int:
        return int(self.policy.weight_version)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return PolicyTarget(self.policy).names()  # type: ignore[return-value]

    def weight_checksums(self, names: list[str]) -> dict[str, int] | None:
        return PolicyTarget(self.policy).checksums(names)

    def supports_lora(self) -> bool:
        return bool(getattr(self.policy, "enable_lora", False))

    async def generate(self, requests: Any) -> Any:
        return await self.policy.generate(requests)


class RayPolicyTarget:
    """A :class:`PolicyActor` handle (``ray.remote(PolicyActor)``); calls block on ``ray.get``."""

    def __init__(self, actor: Any, timeout_s: float = 600.0) -> None:
        import ray

        self._ray = ray
        self.actor = actor
        self.timeout_s = timeout_s
        self.supports_lora = bool(ray.get(actor.supports_lora.remote(), timeout=timeout_s))
        self._names: dict[str, tuple[int, ...]] | None = None

    def names(self) -> Mapping[str, tuple[int, ...]]:
        if self._names is None:
            self._names = {k: tuple(v) for k, v in self._ray.get(self.actor.weight_shapes.remote(), timeout=self.timeout_s).items()}
        return self._names

    def version(self) -> int | None:
        return int(self._ray.get(self.actor.weight_version.remote(), timeout=self.timeout_s))

    def apply(self, update: Any, version: int, nbytes: int) -> list[str]:
        return list(self._ray.get(self.actor.update_weights.remote(update, version), timeout=self.timeout_s))

    def checksums(self, names: list[str]) -> dict[str, int] | None:
        return self._ray.get(self.actor.weight_checksums.remote(names), timeout=self.timeout_s)


class VLLMServerTarget:
    """An OpenAI-compatible ``vllm serve`` started with dev mode and AgentGym's worker extension::

        VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model M \\
            --worker-extension-cls agentgym.policies.vllm_worker.WeightWorkerExtension

    A publish drains the server (``POST /pause?mode=wait``: requests in flight finish, new ones
    queue), sends the payload to the worker (``POST /collective_rpc`` with
    ``agentgym_update("b64:...")``; a payload over ``chunk_bytes`` goes as several
    ``agentgym_stage`` calls and one ``agentgym_commit``, validated and written as one update), clears the prefix cache, records the version
    (``POST /update_weight_version``, readable at ``GET /weight_info``) and resumes (``POST /resume``).
    If ``policy`` (an :class:`~agentgym.policies.openai.OpenAIPolicy`) is given, its
    ``weight_version`` is set once the server has confirmed.

    Args:
        base_url: The server's root or its ``/v1`` URL.
        policy: An OpenAIPolicy reading from this server (optional).
        timeout_s: Per-call deadline.
        chunk_bytes: Largest tensor payload per ``/collective_rpc`` call (a publish is several calls
            inside one pause; vLLM's HTTP server resets connections on bodies of hundreds of MB).
    """

    supports_lora = False  # runtime LoRA loading needs a shared filesystem; merged deltas work anywhere

    def __init__(self, base_url: str, policy: Any = None, timeout_s: float = 600.0, chunk_bytes: int = 32 << 20) -> None:
        import httpx

        self.chunk_bytes = chunk_bytes
        root = base_url.rstrip("/")
        self.root = root[:-3] if root.endswith("/v1") else root
        self.policy = policy
        self.client = httpx.Client(base_url=self.root, timeout=timeout_s)
        self._names: dict[str, tuple[int, ...]] | None = None
        self.served_version: int | None = None

    def _rpc(self, method: str, *args: str) -> list[Any]:
        r = self.client.post("/collective_rpc", json={"method": method, "args": list(args)})
        if r.status_code == 404:
            raise ConfigurationError(f"{self.root} has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1")
        if r.status_code != 200:
            raise WeightSyncError(f"{self.root}/collective_rpc {method}: HTTP {r.status_code}: {r.text[:500]}")
        return list(r.json().get("results", [])) if r.content else []

    def names(self) -> Mapping[str, tuple[int, ...]]:
        if self._names is None:
            (shapes,) = self._rpc("agentgym_shapes")
            if not isinstance(shapes, dict):
                raise ConfigurationError(f"{self.root}: the worker extension is missing (start vllm serve with "
                                         "--worker-extension-cls agentgym.policies.vllm_worker.WeightWorkerExtension)")
            self._names = {k: tuple(v) for k, v in shapes.items()}
        return self._names

    def version(self) -> int | None:
        r = self.client.get("/weight_info")
        if r.status_code != 200:
            return self.served_version
        v = r.json().get("weight_version")
        try:
            return int(v) if v is not None else None
        except (TypeError, ValueError):
            return None

    def apply(self, update: Any, version: int, nbytes: int) -> list[str]:
        """Send ``{"full", "indices", "values", "checks"}`` in chunks of at most ``chunk_bytes``."""
        import httpx

        full, idx, val = dict(update.get("full") or {}), dict(update["indices"]), dict(update["values"])
        checks = update.get("checks") or {}
        chunks: list[tuple[dict[str, Any], dict[str, Any]]] = [({}, {})]
        size = 0
        for name in [*full, *idx]:
            n = full[name].numel() * full[name].element_size() if name in full else (
                idx[name].numel() * idx[name].element_size() + val[name].numel() * val[name].element_size())
            if size and size + n > self.chunk_bytes:
                chunks.append(({}, {}))
                size = 0
            chunks[-1][0 if name in full else 1][name] = None
            size += n
        self.client.post("/pause", params={"mode": "wait"}).raise_for_status()
        staged = False
        try:
            def blob(cf: dict[str, Any], cd: dict[str, Any]) -> str:  # encoded one chunk at a time
                sub_checks = {kind: {k: v for k, v in (checks.get(kind) or {}).items() if k in cd} for kind in ("base", "payload")}
                data = encode_payload({k: full[k] for k in cf}, {k: idx[k] for k in cd}, {k: val[k] for k in cd}, sub_checks)
                return "b64:" + base64.b64encode(data).decode()

            if len(chunks) == 1:
                (result,) = self._rpc("agentgym_update", blob(*chunks[0]))
            else:  # staged in the worker, validated and written as one update: all or nothing
                staged = True
                for cf, cd in chunks:
                    (result,) = self._rpc("agentgym_stage", blob(cf, cd))
                    if not isinstance(result, dict) or "error" in result:
                        break
                else:
                    staged = False  # commit clears the stage, whatever it answers
                    (result,) = self._rpc("agentgym_commit")
            if not isinstance(result, dict) or "error" in result:
                raise worker_error(result, f"{self.root} refused the update")
            changed = list(result.get("changed", []))
            self.client.post("/reset_prefix_cache")
            self.client.post("/update_weight_version", json={"new_version": str(version)}).raise_for_status()
        finally:
            if staged:
                with contextlib.suppress(WeightSyncError, httpx.HTTPError):
                    self._rpc("agentgym_discard")
            self.client.post("/resume").raise_for_status()
        self.served_version = version
        if self.policy is not None:
            self.policy.weight_version = version
        return changed

    def checksums(self, names: list[str]) -> dict[str, int] | None:
        (crc,) = self._rpc("agentgym_crc32_json", json.dumps(names))
        return {k: int(v) for k, v in crc.items()}

    def close(self) -> None:
        self.client.close()


# --------------------------------------------------------------------------- WeightSync
@dataclass
class SyncReport:
    """What one publish did.

    Attributes:
        version: The version published.
        kind: ``"full"``, ``"delta"``, ``"lora"`` or ``"lora-merged"``.
        reason: Why a full transfer was sent (``first``, ``version_gap``, ``checksum_mismatch``, ``forced``).
        bytes_sent: Payload bytes (tensors, as encoded).
        bytes_full: What a full transfer of the same tensors costs.
        elements: Elements compared; ``changed``: elements sent as changed.
        seconds: Wall time of the whole publish; ``link_s``: of it, simulated link delay.
    """

    version: int
    kind: str
    reason: str = ""
    bytes_sent: int = 0
    bytes_full: int = 0
    elements: int = 0
    changed: int = 0
    seconds: float = 0.0
    link_s: float = 0.0
    encode_s: float = 0.0
    apply_s: float = 0.0
    changed_tensors: list[str] = field(default_factory=list)

    @property
    def unchanged_fraction(self) -> float:
        return 1.0 - self.changed / self.elements if self.elements else 1.0

    @property
    def compression(self) -> float:
        return self.bytes_full / self.bytes_sent if self.bytes_sent else float("inf")


def _is_lora(obj: Any) -> bool:
    return hasattr(obj, "merged_into") and hasattr(obj, "weights") and hasattr(obj, "rank")


class WeightSync:
    """Publishes successive weight versions to one target, as full transfers or sparse deltas.

    Args:
        target: A policy (wrapped in :class:`PolicyTarget`), or a :class:`SyncTarget`.
        dtype: The dtype the target serves and deltas compare in (``"bfloat16"``).
        verify: Send base/payload checksums with each delta (the target refuses a mismatch).
        link: A :class:`LinkShim` to simulate the network to the target.
    """

    def __init__(self, target: Any, *, dtype: str = "bfloat16", verify: bool = True, link: LinkShim | None = None) -> None:
        self.target: Any = target if isinstance(target, SyncTarget) else PolicyTarget(target)
        self.dtype = dtype
        self.verify = verify
        self.link = link
        self.shadow: dict[str, torch.Tensor] | None = None
        self.base_version: int | None = None  # the version the shadow holds
        self.history: list[SyncReport] = []
        self._lora_base: dict[str, torch.Tensor] | None = None
        self._lock = threading.Lock()

    # -------------------------------------------------------------- public
    def publish(self, state_or_model: Any, version: int, *, force_full: bool = False) -> SyncReport:
        """Publish ``state_or_model`` (a state dict, an ``nn.Module`` or a LoRA adapter) as ``version``."""
        with self._lock:
            t0 = time.perf_counter()
            if _is_lora(state_or_model):
                report = self._publish_lora(state_or_model, version)
            else:
                report = self._publish_state(self._state_of(state_or_model), version, force_full)
            report.seconds = time.perf_counter() - t0
            self.history.append(report)
            return report

    async def publish_async(self, state_or_model: Any, version: int, *, force_full: bool = False) -> SyncReport:
        """:meth:`publish` in a worker thread."""
        return await asyncio.to_thread(self.publish, state_or_model, version, force_full=force_full)

    def assume_served(self, state_or_model: Any, version: int | None) -> None:
        """Take ``state_or_model`` as what the target serves now, as ``version`` (what it reports).

        For a trainer and a target that started from the same checkpoint: the first publish is then a
        delta, not a full transfer. The assumption is checked, not trusted: each delta carries the
        CRC-32 of the base tensors it applies to, so a target that serves something else refuses it
        and gets the full state (``reason="checksum_mismatch"``); a target that reports another
        version gets the full state too (``"version_gap"``). ``version`` may be ``None`` for a target
        that reports none yet (a fresh ``vllm serve`` reports ``"default"``).

        Raises:
            ConfigurationError: ``verify=False`` (the assumption could not be checked), or the state
            does not hold every weight the target serves.
        """
        if not self.verify:
            raise ConfigurationError("assume_served needs verify=True: the base checksums are what checks the assumption")
        with self._lock:
            self.shadow = None
            state = self._state_of(state_or_model)
            self.shadow = {k: v.clone() for k, v in state.items()}
            self.base_version = version

    # -------------------------------------------------------------- internals
    def _state_of(self, obj: Any) -> dict[str, torch.Tensor]:
        import torch

        state = obj.state_dict() if hasattr(obj, "state_dict") and not isinstance(obj, Mapping) else obj
        if not isinstance(state, Mapping):
            raise ConfigurationError(f"cannot publish a {type(obj).__name__}: pass a state dict, a module or a LoRA adapter")
        names = self.target.names()
        dtype = getattr(torch, self.dtype)
        out = {}
        for k, v in state.items():
            if k in names:
                if tuple(v.shape) != tuple(names[k]):
                    raise ConfigurationError(f"weight {k!r} has shape {tuple(v.shape)}, the target serves {tuple(names[k])}")
                out[k] = v.detach().to("cpu", dtype)
        missing = [n for n in names if n not in out]
        if missing and self.shadow is None:
            raise ConfigurationError(f"the first publish must hold every weight the target serves; missing {missing[:5]}")
        return out

    def _full_reason(self, version: int, force: bool) -> str:
        if force:
            return "forced"
        if self.shadow is None:
            return "first"
        served = self.target.version()
        if served != self.base_version:  # someone else updated it, or it restarted
            return "version_gap"
        if self.base_version is not None and version != self.base_version + 1:  # the trainer skipped a version
            return "version_gap"
        return ""

    def _send(self, update: Any, version: int, nbytes: int, report: SyncReport) -> list[str]:
        if self.link is not None:
            report.link_s += self.link.transfer(nbytes)
        t = time.perf_counter()
        changed = self.target.apply(update, version, nbytes)
        report.apply_s += time.perf_counter() - t
        return changed

    def _publish_full(self, state: dict[str, torch.Tensor], version: int, reason: str) -> SyncReport:
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        report = SyncReport(version, "full", reason, bytes_sent=nbytes, bytes_full=nbytes,
                            elements=sum(t.numel() for t in state.values()))
        report.changed = report.elements
        update: Any = {"indices": {}, "values": {}, "full": dict(state)}
        report.changed_tensors = self._send(update, version, nbytes, report)
        if self.shadow is None:
            self.shadow = {k: v.clone() for k, v in state.items()}
        else:
            for k, v in state.items():
                self.shadow[k].copy_(v)
        self.base_version = version
        return report

    def _publish_state(self, state: dict[str, torch.Tensor], version: int, force_full: bool) -> SyncReport:
        reason = self._full_reason(version, force_full)
        if reason:
            return self._publish_full(state, version, reason)
        assert self.shadow is not None
        t = time.perf_counter()
        full: dict[str, Any] = {}
        idx: dict[str, Any] = {}
        val: dict[str, Any] = {}
        elements = changed = bytes_full = 0
        for k, new in state.items():
            elements += new.numel()
            tensor_bytes = new.numel() * new.element_size()
            bytes_full += tensor_bytes
            i, v = sparse_diff(self.shadow[k], new)
            if i.numel() == 0:
                continue
            changed += i.numel()
            if i.numel() * (i.element_size() + v.element_size()) >= tensor_bytes:
                full[k] = new
            else:
                idx[k], val[k] = i, v
        checks: dict[str, Any] = {}
        if self.verify:
            checks = {"base": {k: crc32_of(self.shadow[k]) for k in idx},
                      "payload": {k: _payload_crc(idx[k], val[k]) for k in idx}}
        update: Any = {"indices": idx, "values": val, "checks": checks, "full": full}
        nbytes = sum(t.numel() * t.element_size() for t in full.values()) + sum(
            idx[k].numel() * idx[k].element_size() + val[k].numel() * val[k].element_size() for k in idx)
        report = SyncReport(version, "delta", bytes_sent=nbytes, bytes_full=bytes_full, elements=elements, changed=changed)
        report.encode_s = time.perf_counter() - t
        try:
            report.changed_tensors = self._send(update, version, nbytes, report)
        except ChecksumMismatch:
            full_report = self._publish_full(state, version, "checksum_mismatch")
            full_report.link_s += report.link_s
            return full_report
        for k, v in full.items():
            self.shadow[k].copy_(v)
        for k, i in idx.items():
            self.shadow[k].view(-1)[i.long()] = val[k]
        self.base_version = version
        return report

    def _publish_lora(self, adapter: Any, version: int) -> SyncReport:
        adapter_bytes = int(adapter.num_bytes())
        if self.target.supports_lora:
            report = SyncReport(version, "lora", bytes_sent=adapter_bytes, bytes_full=adapter_bytes,
                                elements=adapter_bytes // 2, changed=adapter_bytes // 2)
            report.changed_tensors = self._send(adapter, version, adapter_bytes, report)
            self.base_version = version
            return report
        # merged: base (the shadow at the first adapter publish) + scale * B @ A, sent as a delta
        if self.shadow is None:
            raise ConfigurationError("publish the base weights once before a LoRA adapter to a target that merges")
        if self._lora_base is None:
            self._lora_base = {f"{m}.weight": self.shadow[f"{m}.weight"].clone() for m in adapter.weights}
        merged = adapter.merged_into(self._lora_base)
        report = self._publish_state(merged, version, force_full=False)
        report.kind = "lora-merged" if report.kind == "delta" else report.kind
        return report


# --------------------------------------------------------------------------- publish()
_SYNCS: weakref.WeakKeyDictionary[Any, WeightSync] = weakref.WeakKeyDictionary()
_SYNCS_LOCK = threading.Lock()


def publish(policy_or_target: Any, state_or_model: Any, version: int, **kwargs: Any) -> SyncReport:
    """Publish weights to a policy or target, reusing one :class:`WeightSync` per target.

    ``kwargs`` (``verify``, ``link``, ``dtype``) configure the WeightSync made on the first call.
    """
    with _SYNCS_LOCK:
        sync = _SYNCS.get(policy_or_target)
        if sync is None:
            sync = WeightSync(policy_or_target, **kwargs)
            _SYNCS[policy_or_target] = sync
    return sync.publish(state_or_model, version)

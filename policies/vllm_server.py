"""``VLLMServerTarget``: weight updates into an OpenAI-compatible ``vllm serve`` over HTTP.

The server runs AgentGym's worker extension in dev mode, with the publisher's weights key::

    AGENTGYM_WEIGHTS_KEY=... VLLM_SERVER_DEV_MODE=1 VLLM_API_KEY=... \\
        python -m vllm.entrypoints.openai.api_server --model M \\
        --worker-extension-cls agentgym.policies.vllm_worker.WeightWorkerExtension

What guards what: vLLM's ``--api-key`` (``VLLM_API_KEY``) guards only its ``/v1`` routes, not the dev-mode
ones this target uses (``/collective_rpc``, ``/pause``, ``/resume``, ``/update_weight_version``), so the
target sends the API key on every call (for the ``/v1`` routes and any proxy in front), and what
protects the weights is the HMAC: the worker applies only payloads signed with its
``AGENTGYM_WEIGHTS_KEY`` and newer than the last version it applied (:mod:`agentgym.policies.vllm_worker`).
The dev-mode routes still let anyone who reaches them pause the server or read its weights: keep it on
a trusted network.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import uuid
from collections.abc import Mapping
from typing import Any

from agentgym.errors import ConfigurationError, PolicyServerError, WeightUpdateRejected
from agentgym.weights import WeightUpdate, encode, shared_key

from .vllm_worker import refusal
from .weights import validate

__all__ = ["VLLMServerTarget"]


class VLLMServerTarget:
    """A ``vllm serve`` (see the module docstring) as a :class:`~agentgym.weights.WeightReceiver`.

    An update drains the server (``POST /pause?mode=wait``: requests in flight finish, new ones queue),
    sends the signed payload to the worker (``POST /collective_rpc`` with ``agentgym_update("b64:...")``;
    an update over ``chunk_bytes`` goes as several signed ``agentgym_stage`` chunks and one
    ``agentgym_commit``, validated and written as one update), clears the prefix cache, records the version
    (``POST /update_weight_version``, readable at ``GET /weight_info``) and resumes (``POST /resume``).
    If ``policy`` (an :class:`~agentgym.policies.openai.OpenAIPolicy`) is given, its ``weight_version`` is
    set once the server has confirmed.

    Args:
        base_url: The server's root or its ``/v1`` URL.
        policy: An OpenAIPolicy reading from this server (optional).
        api_key: Sent as ``Authorization: Bearer`` on every call (default: ``VLLM_API_KEY``).
        weights_key: Signs the payloads (default: ``AGENTGYM_WEIGHTS_KEY``; the server needs the same).
        timeout_s: Per-call deadline.
        chunk_bytes: Largest payload per ``/collective_rpc`` call (vLLM's HTTP server resets connections
            on bodies of hundreds of MB).

    Raises:
        ConfigurationError: no weights key.
    """

    supports_lora = False  # runtime LoRA loading needs a shared filesystem; merged weights work anywhere

    def __init__(self, base_url: str, policy: Any = None, *, api_key: str | None = None, weights_key: str | None = None,
                 timeout_s: float = 600.0, chunk_bytes: int = 32 << 20) -> None:
        import httpx

        key = weights_key.encode() if weights_key else shared_key()
        if key is None:
            raise ConfigurationError("VLLMServerTarget signs updates with the shared weights key: set "
                                     "AGENTGYM_WEIGHTS_KEY here and on the server (or pass weights_key=)")
        self._key = key
        self.chunk_bytes = chunk_bytes
        root = base_url.rstrip("/")
        self.root = root[:-3] if root.endswith("/v1") else root
        self.policy = policy
        api_key = api_key if api_key is not None else os.environ.get("VLLM_API_KEY")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.root, timeout=timeout_s, headers=headers)
        self._shapes: dict[str, tuple[int, ...]] | None = None

    # ------------------------------------------------------------------ reads
    @property
    def weight_version(self) -> int | None:
        """The last signed version the server's worker applied (``None``: none since it started)."""
        (v,) = self._rpc("agentgym_version")
        return None if v is None else int(v)

    def weight_shapes(self) -> Mapping[str, tuple[int, ...]]:
        """Names and shapes of the served checkpoint tensors."""
        if self._shapes is None:
            (shapes,) = self._rpc("agentgym_shapes")
            if not isinstance(shapes, dict):
                raise ConfigurationError(f"{self.root}: the worker extension is missing (start vllm serve with "
                                         "--worker-extension-cls agentgym.policies.vllm_worker.WeightWorkerExtension)")
            self._shapes = {k: tuple(v) for k, v in shapes.items()}
        return self._shapes

    def weight_checksums(self, names: list[str]) -> dict[str, int]:
        """CRC-32 of the served tensors ``names``, computed in the worker."""
        (crc,) = self._rpc("agentgym_crc32_json", json.dumps(names))
        return {k: int(v) for k, v in crc.items()}

    # ------------------------------------------------------------------ the update
    def update_weights(self, update: WeightUpdate | bytes, version: int) -> list[str]:
        """Apply ``update`` as ``version`` on the server (see the class docstring); returns the names written.

        Raises:
            VersionNotNewer, ChecksumMismatch, WeightUpdateRejected: the worker refused it (nothing was
            written). PolicyServerError: the server failed.
        """
        import httpx

        if isinstance(update, WeightUpdate):
            if update.kind == "lora":
                raise WeightUpdateRejected(f"{self.root} serves no LoRA adapters at runtime: publish the merged weights")
            validate(update, self.weight_shapes())
            chunks = [encode(part, version, self._key, part=i, parts=n, update_id=uid)
                      for i, n, uid, part in self._chunks(update)]
        else:
            chunks = [bytes(update)]
        self._post("/pause", params={"mode": "wait"})
        staged = False
        try:
            if len(chunks) == 1:
                (result,) = self._rpc("agentgym_update", _b64(chunks[0]))
            else:  # staged in the worker, validated and written as one update: all or nothing
                staged = True
                for blob in chunks:
                    (result,) = self._rpc("agentgym_stage", _b64(blob))
                    if not isinstance(result, dict) or "error" in result:
                        break
                else:
                    staged = False  # commit clears the stage, whatever it answers
                    (result,) = self._rpc("agentgym_commit", self._update_id)
            if not isinstance(result, dict) or "error" in result:
                raise refusal(result if isinstance(result, dict) else {"error": result}, f"{self.root} refused the update")
            changed = list(result.get("changed", []))
            self._post("/reset_prefix_cache")
            self._post("/update_weight_version", json={"new_version": str(version)})
        finally:
            if staged:
                with contextlib.suppress(WeightUpdateRejected, PolicyServerError, httpx.HTTPError):
                    self._rpc("agentgym_discard")
            self._post("/resume")
        if self.policy is not None:
            self.policy.weight_version = version
        return changed

    def close(self) -> None:
        self.client.close()

    # ------------------------------------------------------------------ internals
    def _chunks(self, update: WeightUpdate) -> list[tuple[int, int, str, WeightUpdate]]:
        """``update`` split into parts of at most ``chunk_bytes`` (a tensor is never split)."""
        groups: list[list[str]] = [[]]
        size = 0
        for name in update.names():
            n = (update.tensors[name].numel() * update.tensors[name].element_size() if name in update.tensors else
                 update.indices[name].numel() * update.indices[name].element_size()
                 + update.values[name].numel() * update.values[name].element_size())
            if size and size + n > self.chunk_bytes:
                groups.append([])
                size = 0
            groups[-1].append(name)
            size += n
        self._update_id = uuid.uuid4().hex
        if len(groups) == 1:
            return [(0, 1, "", update)]
        parts = []
        for names in groups:
            whole = {k: update.tensors[k] for k in names if k in update.tensors}
            if update.kind == "full":
                part = WeightUpdate.full(whole)
            else:
                sparse = [k for k in names if k in update.indices]
                part = WeightUpdate.delta({k: update.indices[k] for k in sparse}, {k: update.values[k] for k in sparse},
                                          {k: update.base_crc[k] for k in sparse}, whole)
            parts.append(part)
        return [(i, len(parts), self._update_id, p) for i, p in enumerate(parts)]

    def _post(self, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            r = self.client.post(path, **kwargs)
        except httpx.HTTPError as e:
            raise PolicyServerError(f"{self.root}{path}: {type(e).__name__}: {e}") from None
        if r.status_code == 404:
            raise ConfigurationError(f"{self.root} has no {path}: start vllm serve with VLLM_SERVER_DEV_MODE=1")
        if r.status_code != 200:
            raise PolicyServerError(f"{self.root}{path}: HTTP {r.status_code}: {r.text[:500]}")
        return r

    def _rpc(self, method: str, *args: str) -> list[Any]:
        r = self._post("/collective_rpc", json={"method": method, "args": list(args)})
        return list(r.json().get("results", [])) if r.content else []


def _b64(blob: bytes) -> str:
    return "b64:" + base64.b64encode(blob).decode()

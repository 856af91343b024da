"""Worker-side weight updates for vLLM: a ``worker_extension_cls`` mixed into vLLM's GPU/CPU worker.

vLLM runs the model in a worker process; ``collective_rpc("agentgym_...")`` calls the methods below
there (in-process engines through :class:`~agentgym.policies.vllm.VLLMPolicy`, and ``vllm serve``
through its dev-mode ``POST /collective_rpc``, see :class:`~agentgym.policies.vllm_server.VLLMServerTarget`).

The worker keeps the **checkpoint-format master copy** of the weights (names as in the model's
safetensors, e.g. ``model.layers.3.self_attn.k_proj.weight``). An update (full tensors and/or a
sparse overwrite delta: flat indices + new values) is written into that copy in place, and only the
engine modules it touched are reloaded, through vLLM's own in-place loader
(``model_runner.reload_weights(weights_iterator=...)``). That loader maps checkpoint names onto
vLLM's fused parameters (``qkv_proj`` = q/k/v stacked, ``gate_up_proj`` = gate/up) and re-runs the
per-layer post-processing (on CPU, linear weights are repacked for oneDNN/sgl kernels, so the live
parameters cannot be poked element by element). A fused module is always reloaded whole: a change
to ``k_proj`` also sends that layer's ``q_proj`` and ``v_proj`` from the master.

**Only signed payloads are applied.** A payload is :func:`agentgym.weights.encode` bytes (in-process
engines), the same as ``"b64:..."`` (an HTTP server's ``/collective_rpc`` passes strings only) or
``"file:PATH"`` (a large in-process update staged in ``/dev/shm``). Its HMAC is checked with this
process's ``AGENTGYM_WEIGHTS_KEY`` before anything is parsed (a worker without the key applies
nothing); its signed version must be newer than the last one applied here (a replayed payload is
refused). Then :func:`agentgym.policies.weights.stage` validates all of it and checks each delta's base
checksum, the master is written all or nothing, and if the engine's reload fails the master is
restored and reloaded. Any refusal comes back as data, ``{"error": message, "type": class name}``
(an exception raised in a worker RPC takes a ``vllm serve`` engine down), which the caller raises as
that :mod:`agentgym.errors` class (:func:`refusal`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentgym.errors import (
    ChecksumMismatch,
    UpdateNotAuthenticated,
    VersionNotNewer,
    WeightSyncError,
    WeightUpdateRejected,
)
from agentgym.weights import Decoded, WeightUpdate, check_version, crc32, decode, shared_key

from .weights import stage

__all__ = ["WeightWorkerExtension", "fused_groups", "refusal"]

log = logging.getLogger(__name__)

# checkpoint sub-module -> the other members of the fused vLLM module it lives in (Llama-style models)
_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
FILE_PREFIX = "agentgym-update-"
_REFUSALS: dict[str, type[WeightSyncError]] = {c.__name__: c for c in (
    ChecksumMismatch, VersionNotNewer, WeightUpdateRejected, UpdateNotAuthenticated)}


def refusal(result: Mapping[str, Any], context: str) -> WeightSyncError:
    """The exception for a refusal the worker returned as data (its class travels as the ``type`` field)."""
    return _REFUSALS.get(str(result.get("type")), WeightUpdateRejected)(f"{context}: {result.get('error')}")


def fused_groups(names: list[str], available: Mapping[str, Any]) -> list[str]:
    """``names`` plus every checkpoint tensor that shares a fused vLLM module with one of them."""
    out: dict[str, None] = {}
    for name in names:
        out[name] = None
        for group in _FUSED:
            for member in group:
                pat = re.compile(rf"(^|\.){member}\.")
                if pat.search(name):
                    for other in group:
                        sib = pat.sub(rf"\g<1>{other}.", name, count=1)
                        if sib in available:
                            out[sib] = None
    return list(out)


class WeightWorkerExtension:
    """Methods vLLM mixes into its worker (``worker_extension_cls``); called via ``collective_rpc``."""

    _ag_master: dict[str, Any] | None = None
    _ag_version: int | None = None  # the last signed version applied here
    _ag_staged: dict[str, Any] | None = None  # a chunked update being received

    def agentgym_init_master(self) -> int:
        """Load the checkpoint-format master copy from the engine's own model folder (idempotent).
        Returns #tensors. It takes no path: ``POST /collective_rpc`` reaches this method without vLLM's API key,
        so a path argument would let any caller load weights from any folder on the server's disk."""
        if self._ag_master is None:
            from safetensors.torch import load_file

            model_path = str(self.model_runner.model_config.model)  # type: ignore[attr-defined]
            files = sorted(Path(model_path).glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"{model_path} has no *.safetensors files")
            state: dict[str, Any] = {}
            for f in files:
                state.update(load_file(str(f)))
            self._ag_master = state
        return len(self._ag_master)

    def agentgym_update(self, payload: Any, verify: bool = False) -> dict[str, Any]:
        """Verify and apply one signed payload (see the module docstring); a refusal comes back as data.

        Returns:
            ``{"changed": [...], "reloaded": [...], "version": v, "crc32": {...} (verify)}`` or
            ``{"error": message, "type": class name}``.
        """
        def run() -> dict[str, Any]:
            dec = self._agentgym_decode(payload)
            if dec.parts != 1:
                raise WeightUpdateRejected("a chunked update goes through agentgym_stage and agentgym_commit")
            return self._agentgym_apply(dec.update, dec.version, verify)

        return self._agentgym_guarded(run)

    def agentgym_stage(self, payload: Any) -> dict[str, Any]:
        """Keep one verified chunk of a multi-chunk update (nothing is written until :meth:`agentgym_commit`).

        A chunk of another update (``update_id``) replaces what was staged.
        """
        def run() -> dict[str, Any]:
            dec = self._agentgym_decode(payload)
            if dec.parts < 2 or not dec.update_id:
                raise WeightUpdateRejected("a staged chunk must be part of a multi-part update with an id")
            check_version(self._ag_version, dec.version)
            st = self._ag_staged
            if st is None or st["update_id"] != dec.update_id:
                st = {"update_id": dec.update_id, "version": dec.version, "parts": dec.parts, "got": {}}
            if (st["version"], st["parts"]) != (dec.version, dec.parts) or dec.update.kind == "lora":
                raise WeightUpdateRejected("chunks of one update disagree on its version or part count")
            st["got"][dec.part] = dec.update
            self._ag_staged = st
            return {"staged": len(st["got"]), "parts": st["parts"]}

        return self._agentgym_guarded(run)

    def agentgym_commit(self, update_id: str, verify: bool = False) -> dict[str, Any]:
        """Apply every staged chunk of ``update_id`` as one update (all or nothing); clears the stage."""
        def run() -> dict[str, Any]:
            st, self._ag_staged = self._ag_staged, None
            if st is None or st["update_id"] != update_id:
                raise WeightUpdateRejected(f"no update {update_id!r} is staged")
            if len(st["got"]) != st["parts"]:
                raise WeightUpdateRejected(f"update {update_id!r}: {len(st['got'])} of {st['parts']} chunks arrived")
            return self._agentgym_apply(_merge(list(st["got"].values())), st["version"], verify)

        return self._agentgym_guarded(run)

    def agentgym_discard(self) -> bool:
        """Drop staged chunks (a publish that failed half way)."""
        self._ag_staged = None
        return True

    def agentgym_version(self) -> int | None:
        """The last signed version applied here (``None``: none since the engine started)."""
        return self._ag_version

    def agentgym_reload_all(self) -> int:
        """Reload every module from the master copy (a full in-place reload). Returns #tensors."""
        master = self._master()
        return len(self._agentgym_reload(list(master)))

    def agentgym_state(self, names: list[str] | None = None) -> bytes:
        """The master tensors (all, or ``names``) as safetensors bytes (a read: nothing is written)."""
        from safetensors.torch import save

        master = self._master()
        return save({n: master[n].contiguous() for n in (names if names is not None else list(master))})

    def agentgym_shapes(self) -> dict[str, list[int]]:
        """Names and shapes of the master tensors (JSON-friendly)."""
        return {n: list(t.shape) for n, t in self._master().items()}

    def agentgym_crc32_json(self, names_json: str) -> dict[str, int]:
        """:meth:`agentgym_crc32` for string-only callers (``POST /collective_rpc``)."""
        return self.agentgym_crc32(json.loads(names_json))

    def agentgym_crc32(self, names: list[str] | None = None) -> dict[str, int]:
        """CRC-32 of master tensors (all, or ``names``)."""
        master = self._master()
        return {n: crc32(master[n]) for n in (names if names is not None else list(master)) if n in master}

    # ------------------------------------------------------------------ internals
    def _agentgym_guarded(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return dict(fn())
        except WeightSyncError as e:  # the class travels as data: the caller raises the same one
            return {"error": str(e), "type": type(e).__name__}
        except Exception as e:  # nothing a payload does may take the engine down: a refusal, as data
            log.warning("weight update refused: %s: %s", type(e).__name__, e)
            return {"error": f"{type(e).__name__}: {e}", "type": "WeightUpdateRejected"}

    def _agentgym_decode(self, payload: Any) -> Decoded:
        limit = 4 * sum(int(t.numel() * t.element_size()) for t in self._master().values()) + (64 << 20)
        if isinstance(payload, str) and payload.startswith("file:"):
            payload = _read_update_file(payload[5:], limit)
        return decode(payload, shared_key(), max_bytes=limit)

    def _agentgym_apply(self, update: WeightUpdate, version: int, verify: bool) -> dict[str, Any]:
        """Validate, write the master all or nothing, reload the touched modules (undone if that fails)."""
        check_version(self._ag_version, version)
        master = self._master()
        staged = stage(master, update)  # every check before any write
        changed = staged.commit()
        try:
            reloaded = self._agentgym_reload(changed)
        except Exception as e:
            staged.rollback()
            try:  # put the engine back on the restored master
                self._agentgym_reload(changed)
            except Exception:
                log.exception("restoring the engine after a failed weight reload failed")
            raise WeightUpdateRejected(f"the engine could not load the update ({type(e).__name__}: {e}); "
                                       "the previous weights were restored") from e
        self._ag_version = version
        out: dict[str, Any] = {"changed": changed, "reloaded": reloaded, "version": version}
        if verify:
            out["crc32"] = {n: crc32(master[n]) for n in changed}
        return out

    def _master(self) -> dict[str, Any]:
        if self._ag_master is None:
            self.agentgym_init_master()
        assert self._ag_master is not None
        return self._ag_master

    def _agentgym_reload(self, changed: list[str]) -> list[str]:
        master = self._master()
        names = fused_groups(changed, master)
        if not names:
            return []
        # a partial reload leaves untouched layers as they are; vLLM logs each of them as "not loaded"
        loggers = [logging.getLogger(n) for n in ("vllm.model_executor.model_loader.reload.layerwise",
                                                  "vllm.model_executor.model_loader.reload.inplace")]
        levels = [lg.level for lg in loggers]
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            self.model_runner.reload_weights(  # type: ignore[attr-defined]
                weights_iterator=[(n, master[n]) for n in names], is_checkpoint_format=True
            )
        finally:
            for lg, lvl in zip(loggers, levels, strict=True):
                lg.setLevel(lvl)
        if any(n.endswith("embed_tokens.weight") for n in names):
            self._agentgym_refresh_tied_head()
        return names

    def _agentgym_refresh_tied_head(self) -> None:
        """Re-run the tied LM head's post-load processing after its embedding changed.

        With tied embeddings the head shares the embedding's parameter, but on CPU its matmul uses
        a packed copy made at load time (``cpu_linear``); vLLM's reload refreshes only the
        embedding module, so the head would keep scoring with the old weights.
        """
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if head is None or embed is None or getattr(head, "weight", None) is not getattr(embed, "weight", None):
            return
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)


def _merge(parts: list[WeightUpdate]) -> WeightUpdate:
    """One update from the chunks of a chunked send (a name in two chunks is refused)."""
    tensors: dict[str, Any] = {}
    indices: dict[str, Any] = {}
    values: dict[str, Any] = {}
    base: dict[str, int] = {}
    for p in parts:
        for name in [*p.tensors, *p.indices]:
            if name in tensors or name in indices:
                raise WeightUpdateRejected(f"chunks of one update both carry {name!r}")
        tensors.update(p.tensors)
        indices.update(p.indices)
        values.update(p.values)
        base.update(p.base_crc)
    if any(p.kind == "delta" for p in parts):
        return WeightUpdate.delta(indices, values, base, tensors)
    return WeightUpdate.full(tensors)


def _read_update_file(path: str, limit: int) -> bytes:
    """A staged update file: a regular ``agentgym-update-*`` file in /dev/shm or the temp folder, read whole."""
    real = os.path.realpath(path)
    folders = {os.path.realpath(d) for d in ("/dev/shm", tempfile.gettempdir())}
    if os.path.dirname(real) not in folders or not os.path.basename(real).startswith(FILE_PREFIX):
        raise WeightUpdateRejected(f"update files must be {FILE_PREFIX}* in /dev/shm or the temp folder, not {path!r}")
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise WeightUpdateRejected(f"cannot open the update file {path!r}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        import stat

        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            raise WeightUpdateRejected(f"the update file {path!r} is not a regular file of at most {limit} bytes")
        return fh.read(limit + 1)

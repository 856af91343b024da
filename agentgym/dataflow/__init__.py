"""The dataflow layer: autonomous rollout services, buffers and trainers (see DESIGN.md, Dataflow).

What a recipe (or a notebook) uses:

* :func:`make_runtime` builds the runtime the ``[dataflow]`` table names (:class:`DataflowConfig`, plus
  the run's derived :class:`FlowParams`): embedded (one process) or Ray (actors, possibly on other
  nodes). Both implement :class:`FlowRuntime`: add services (:class:`ServiceSpec`), pull batches,
  publish weights, checkpoint the data position.
* :func:`publish_to` distributes a :class:`~agentgym.weights.Publication` to a flow's services, with the
  fallback rules; the weights API itself (:class:`WeightPublisher`, :class:`WeightUpdate`,
  :class:`Publication`, :class:`LoRAAdapter`) lives in the core, :mod:`agentgym.weights`, and is
  re-exported here.

The pieces (``flow``, ``service``, ``ledger``, ``tasks``, ``replay``, ``host``) are importable as
submodules. Submodules load lazily (nothing heavy at import time).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Batch",
    "DataflowConfig",
    "FlowParams",
    "FlowRuntime",
    "LoRAAdapter",
    "Publication",
    "ServiceSpec",
    "TaskRef",
    "WeightPublisher",
    "WeightUpdate",
    "make_runtime",
    "publish_to",
]

_WHERE = {
    "Batch": "agentgym.dataflow.flow",
    "DataflowConfig": "agentgym.dataflow.config",
    "FlowParams": "agentgym.dataflow.config",
    "FlowRuntime": "agentgym.dataflow.spec",
    "ServiceSpec": "agentgym.dataflow.spec",
    "publish_to": "agentgym.dataflow.spec",
    "make_runtime": "agentgym.dataflow.runtime",
    "TaskRef": "agentgym.dataflow.tasks",
    "LoRAAdapter": "agentgym.weights",
    "Publication": "agentgym.weights",
    "WeightPublisher": "agentgym.weights",
    "WeightUpdate": "agentgym.weights",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

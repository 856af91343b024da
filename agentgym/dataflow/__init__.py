"""The dataflow layer: autonomous rollout services, buffers and trainers (see DESIGN.md, Dataflow).

* :class:`~agentgym.dataflow.service.RolloutService`: runs submitted tasks on a rollout engine,
  takes weight updates; reached through a :class:`~agentgym.dataflow.service.ServiceHandle`
  (in-process, or a Ray actor: :mod:`agentgym.dataflow.ray_runtime`).
* :class:`~agentgym.dataflow.flow.DataFlow`: the task stream, dispatch, per-policy buffers,
  filters, the staleness budget, fault handling and exactly-once accounting.
* :mod:`agentgym.dataflow.weightsync`: full, sparse-delta or LoRA weight publishing.

Submodules load lazily (nothing heavy at import time).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Batch",
    "DataFlow",
    "DataflowConfig",
    "Ledger",
    "LocalService",
    "RolloutService",
    "ServiceDead",
    "ServiceHandle",
    "TaskRef",
    "TaskStream",
    "Ticket",
    "ZeroVarianceSkipper",
]

_WHERE = {
    "Batch": "flow",
    "DataFlow": "flow",
    "DataflowConfig": "flow",
    "Ledger": "ledger",
    "Ticket": "ledger",
    "LocalService": "service",
    "RolloutService": "service",
    "ServiceDead": "service",
    "ServiceHandle": "service",
    "TaskRef": "tasks",
    "TaskStream": "tasks",
    "ZeroVarianceSkipper": "tasks",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

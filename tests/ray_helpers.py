"""A Ray instance of a test's own, shared by the Ray test modules (tests/ is on sys.path through its conftest)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def own_ray(pythonpath: Sequence[Path], env_vars: dict[str, str] | None = None, **init: Any) -> Iterator[Any]:
    """Start a local Ray (2 CPUs, no dashboard, quiet) whose workers import from ``pythonpath``; shut it down after.

    ``address="local"``: a Ray of its own, even where ``ray start`` left a cluster on this machine (``ray.init()``
    would join it, and refuse ``num_cpus`` there)."""
    import ray

    path = os.pathsep.join([*map(str, pythonpath), os.environ.get("PYTHONPATH", "")])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, **(env_vars or {})}}, **init)
    try:
        yield ray
    finally:
        ray.shutdown()

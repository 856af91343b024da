"""Standardized evaluation: :func:`run_eval` (``agentgym eval``) and :func:`write_report` (``agentgym report``).

Only the core is imported here; policies come in as objects (the CLI turns a spec string into one).
The report module (matplotlib) is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentgym.eval.runner import (
    EvalConfig,
    arun_eval,
    episode_key,
    load_episodes,
    run_eval,
    select_tasks,
    summarize,
)
from agentgym.eval.stats import mean_ci, pass_at_k, wilson_interval

if TYPE_CHECKING:
    from agentgym.eval.report import load_run, write_report

__all__ = [
    "EvalConfig",
    "arun_eval",
    "episode_key",
    "load_episodes",
    "load_run",
    "mean_ci",
    "pass_at_k",
    "run_eval",
    "select_tasks",
    "summarize",
    "wilson_interval",
    "write_report",
]


def __getattr__(name: str) -> Any:
    if name in ("write_report", "load_run"):
        from agentgym.eval import report

        return getattr(report, name)
    raise AttributeError(f"module 'agentgym.eval' has no attribute {name!r}")

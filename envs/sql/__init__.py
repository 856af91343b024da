"""SQL environments: multi-turn text-to-SQL over sandboxed SQLite with execution-based rewards.

``SQLEnv`` (generated databases) and ``SpiderSQLEnv`` (Spider/BIRD layout) live in
:mod:`agentgym.envs.sql.env`, ``AgentBenchSQLEnv`` (AgentBench dbbench JSONL, scored as AgentBench
scores it) in :mod:`agentgym.envs.sql.agentbench`; they load lazily.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AgentBenchSQLEnv", "SQLEnv", "SpiderSQLEnv"]


def __getattr__(name: str) -> Any:
    if name == "AgentBenchSQLEnv":
        from . import agentbench

        return agentbench.AgentBenchSQLEnv
    if name in __all__:
        from . import env

        return getattr(env, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

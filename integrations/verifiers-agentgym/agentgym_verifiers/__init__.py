"""AgentGym envs for verifiers: ``vf-eval agentgym-verifiers --env.taskset.env-id agentgym/SQL-v0``.

verifiers imports a taskset id's module (``agentgym-verifiers`` -> ``agentgym_verifiers``) and takes the
``Taskset`` and ``Harness`` subclasses it exports; the classes live in
:mod:`agentgym.integrations.verifiers`.
"""

from agentgym.integrations.verifiers import (
    AgentGymData,
    AgentGymHarness,
    AgentGymHarnessConfig,
    AgentGymTask,
    AgentGymTaskset,
    AgentGymTasksetConfig,
)

__all__ = [
    "AgentGymData",
    "AgentGymHarness",
    "AgentGymHarnessConfig",
    "AgentGymTask",
    "AgentGymTaskset",
    "AgentGymTasksetConfig",
]

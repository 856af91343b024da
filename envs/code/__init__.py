"""Code environments: ``agentgym/Code-v0`` (Python, HumanEval and more) and ``agentgym/Bash-v0``
(AgentBench-OS-style shell tasks), both running agent code in :mod:`agentgym.sandbox`.

Implementations live in :mod:`.env` and :mod:`.bash`; nothing heavy is imported here.
"""

__all__: list[str] = []

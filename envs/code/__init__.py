"""Code environments: ``agentgym/Code-v0`` (Python, HumanEval and more) and ``agentgym/Bash-v0``
(AgentBench-OS-style shell tasks), both running agent code in :mod:`agentgym.sandbox`, and
``agentgym/OS-v0`` (AgentBench's OS-interaction tasks, one root Docker container per episode).

Implementations live in :mod:`.env`, :mod:`.bash` and :mod:`.os_env` (with :mod:`.os_shell` and
:mod:`.os_image`); nothing heavy is imported here.
"""

__all__: list[str] = []

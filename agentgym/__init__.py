"""AgentGym: Gymnasium-compatible multi-turn agent environments for training and evaluating LLM agents.

Importing ``agentgym`` registers every built-in env id with gymnasium (as strings: no env, policy
or heavy backend is imported)::

    import agentgym, gymnasium
    env = gymnasium.make("agentgym/SQL-v0")
    obs, info = env.reset(seed=0)

Third-party envs (the ``agentgym.envs`` entry-point group) load on first use of :func:`make`,
:func:`list_envs` or :func:`env_entry`, never at import: a slow or broken plugin costs nothing until
an env is looked up. Call :func:`load_plugins` before a plain ``gymnasium.make`` of a plugin's id.
Evaluation lives in :mod:`agentgym.eval` (``run_eval``), the checker in :mod:`agentgym.checker`
(``check_env``, also here, loaded on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from agentgym import errors
from agentgym.core import AgentEnv, StepResult
from agentgym.parsers import ActionParser, ParsedAction, get_parser
from agentgym.registration import env_entry, list_envs, load_plugins, make, register_env
from agentgym.spaces import ActionSpace, ChatSpace, TextSpace
from agentgym.tools import Tool, ToolResult, ToolSet, tool
from agentgym.types import Message, TaskSpec, ToolCall, ToolSpec, Trajectory, Turn

if TYPE_CHECKING:
    from agentgym.checker import CheckReport, check_env

__all__ = [
    "ActionParser",
    "ActionSpace",
    "AgentEnv",
    "ChatSpace",
    "CheckReport",
    "Message",
    "ParsedAction",
    "StepResult",
    "TaskSpec",
    "TextSpace",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolSet",
    "ToolSpec",
    "Trajectory",
    "Turn",
    "__version__",
    "check_env",
    "env_entry",
    "errors",
    "get_parser",
    "list_envs",
    "load_plugins",
    "make",
    "register_env",
    "tool",
]


_LAZY = {"check_env": "agentgym.checker", "CheckReport": "agentgym.checker"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentgym' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

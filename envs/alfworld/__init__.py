"""ALFWorld household tasks: a native engine (``ALFWorld-v0``) and the real package (``ALFWorld-TW-v0``).

``ObservationExpert`` is ALFWorld-v0's default expert, a function of the transcript's text alone.

Nothing heavy is imported here; the classes load on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentgym.envs.alfworld.env import ALFWorldEnv
    from agentgym.envs.alfworld.observer import ObservationExpert
    from agentgym.envs.alfworld.scene import SceneSpec, load_scene, save_scene
    from agentgym.envs.alfworld.tw import ALFWorldTWEnv

__all__ = ["ALFWorldEnv", "ALFWorldTWEnv", "ObservationExpert", "SceneSpec", "load_scene", "save_scene"]

_WHERE = {
    "ALFWorldEnv": "env",
    "ALFWorldTWEnv": "tw",
    "ObservationExpert": "observer",
    "SceneSpec": "scene",
    "load_scene": "scene",
    "save_scene": "scene",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"agentgym.envs.alfworld.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

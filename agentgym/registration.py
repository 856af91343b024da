"""The env registry: gymnasium's own ``register``/``make``/``spec``, under the ``agentgym/`` prefix.

Built-in envs are registered here by entry-point *strings*, so importing ``agentgym`` imports no
env implementation. Third-party packages register through the ``agentgym.envs`` entry-point group;
each entry point is either

* a zero-argument function that calls :func:`register_env` (keep its module light), or
* an :class:`~agentgym.core.AgentEnv` subclass; the entry point's name is the env id
  (``agentgym/`` is prepended if missing).

Plugins load on first use of :func:`make`, :func:`list_envs` or :func:`env_entry` (never on
``import agentgym``); a plain ``gymnasium.make`` of a plugin's id needs :func:`load_plugins` first.
"""

from __future__ import annotations

import difflib
import logging
import threading
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import gymnasium

from agentgym.errors import UnknownEnvError

__all__ = ["EnvEntry", "env_entry", "list_envs", "load_plugins", "make", "register_env"]

log = logging.getLogger(__name__)
PREFIX = "agentgym/"
ENTRY_POINT_GROUP = "agentgym.envs"


@dataclass(frozen=True)
class EnvEntry:
    """Registry metadata beyond gymnasium's EnvSpec (for ``agentgym list``)."""

    id: str
    entry_point: str
    family: str = "custom"
    description: str = ""
    max_episode_steps: int | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    requires: str = ""  # what to install if the env needs an extra (shown by `agentgym list`)
    plugin: str = ""  # distribution name for third-party envs


_ENTRIES: dict[str, EnvEntry] = {}
_plugins_loaded = False
_plugins_lock = threading.RLock()


def register_env(
    env_id: str,
    entry_point: str | type,
    *,
    family: str = "custom",
    description: str = "",
    max_episode_steps: int | None = None,
    kwargs: dict[str, Any] | None = None,
    requires: str = "",
    plugin: str = "",
) -> EnvEntry:
    """Register an env with gymnasium and record its metadata.

    Args:
        env_id: ``"agentgym/Name-vN"`` (the prefix is added if missing).
        entry_point: ``"module:Class"`` (imported lazily) or the class itself.
        family: Group shown by ``agentgym list``.
        max_episode_steps: Turn limit applied by gymnasium's ``TimeLimit`` (gives ``truncated``).
        kwargs: Default constructor kwargs (overridable in ``make``).
        requires: Install hint for optional dependencies.
    """
    if not env_id.startswith(PREFIX):
        env_id = PREFIX + env_id
    ep = entry_point if isinstance(entry_point, str) else f"{entry_point.__module__}:{entry_point.__qualname__}"
    if env_id in gymnasium.registry:
        del gymnasium.registry[env_id]
    gymnasium.register(
        id=env_id,
        entry_point=entry_point,  # type: ignore[arg-type]
        max_episode_steps=max_episode_steps,
        kwargs=dict(kwargs or {}),
        order_enforce=True,
    )
    entry = EnvEntry(env_id, ep, family, description, max_episode_steps, dict(kwargs or {}), requires, plugin)
    _ENTRIES[env_id] = entry
    return entry


# Built-in envs: strings only, nothing imported here.
_BUILTINS: list[dict[str, Any]] = [
    dict(env_id="agentgym/Demo-v0", entry_point="agentgym.envs.demo:GuessNumberEnv", family="demo",
         max_episode_steps=12, description="Guess a number with a tool; for tests and tutorials."),
    dict(env_id="agentgym/ALFWorld-v0", entry_point="agentgym.envs.alfworld.env:ALFWorldEnv", family="alfworld",
         max_episode_steps=50, description="ALFWorld household tasks, native engine (text commands)."),
    dict(env_id="agentgym/ALFWorld-TW-v0", entry_point="agentgym.envs.alfworld.tw:ALFWorldTWEnv",
         family="alfworld", max_episode_steps=50, requires="alfworld",
         description="The real alfworld package (TextWorld); needs alfworld and its data."),
    dict(env_id="agentgym/SQL-v0", entry_point="agentgym.envs.sql.env:SQLEnv", family="sql",
         max_episode_steps=15, description="Multi-turn text-to-SQL over generated SQLite databases."),
    dict(env_id="agentgym/SQL-Spider-v0", entry_point="agentgym.envs.sql.env:SpiderSQLEnv", family="sql",
         max_episode_steps=15, requires="path=", description="Spider/BIRD layout; needs path=DATASET_DIR."),
    dict(env_id="agentgym/SQL-AgentBench-v0", entry_point="agentgym.envs.sql.agentbench:AgentBenchSQLEnv",
         family="sql", max_episode_steps=15, requires="path=",
         description="AgentBench dbbench JSONL, every row type, scored as AgentBench does; needs path=FILE."),
    dict(env_id="agentgym/Search-v0", entry_point="agentgym.envs.search.env:SearchEnv", family="search",
         max_episode_steps=10, description="Multi-hop retrieval QA over a generated fictional wiki (BM25)."),
    dict(env_id="agentgym/Code-v0", entry_point="agentgym.envs.code.env:CodeEnv", family="code",
         max_episode_steps=10, description="Write, run and submit Python in a sandbox (HumanEval and more)."),
    dict(env_id="agentgym/Bash-v0", entry_point="agentgym.envs.code.bash:BashEnv", family="code",
         max_episode_steps=15, description="AgentBench-OS-style shell tasks in a sandbox."),
    dict(env_id="agentgym/OS-v0", entry_point="agentgym.envs.code.os_env:OSEnv", family="code",
         max_episode_steps=8, requires="path=, Docker",
         description="AgentBench OS-interaction JSON, one root container and persistent shell per task; needs path=."),
    dict(env_id="agentgym/Remote-v0", entry_point="agentgym.serve.client:RemoteEnv", family="remote",
         requires="url=", description="An env served by `agentgym serve` or any OpenEnv server; needs url=."),
]


def _register_builtins() -> None:
    for b in _BUILTINS:
        register_env(**b)


def load_plugins(force: bool = False) -> list[str]:
    """Load third-party envs from the ``agentgym.envs`` entry-point group (once; ``force``: again).

    Called by :func:`make`, :func:`list_envs` and :func:`env_entry`; call it yourself before a plain
    ``gymnasium.make`` of a plugin's id. A plugin that fails to load is logged and skipped.

    Returns:
        The env ids this call registered.
    """
    with _plugins_lock:  # envs are made from worker threads: none may look an id up mid-load
        return _load_plugins(force)


def _load_plugins(force: bool) -> list[str]:
    global _plugins_loaded
    if _plugins_loaded and not force:
        return []
    _plugins_loaded = True  # first: a plugin's own register() may call list_envs() (same thread, RLock)
    before = set(_ENTRIES)
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # pragma: no cover - broken metadata must not break agentgym
        return []
    for ep in eps:
        dist = ep.dist.name if ep.dist is not None else ""
        try:
            obj = ep.load()
        except Exception as e:
            log.warning("agentgym plugin %s (%s) failed to load: %s", ep.name, ep.value, e)
            continue
        from agentgym.core import AgentEnv

        if isinstance(obj, type) and issubclass(obj, AgentEnv):
            register_env(ep.name, obj, family=getattr(obj, "family", "custom"),
                         max_episode_steps=getattr(obj, "max_episode_steps", None),
                         description=(obj.__doc__ or "").strip().splitlines()[0] if obj.__doc__ else "",
                         plugin=dist)
        elif callable(obj):
            n = len(_ENTRIES)
            try:
                obj()
            except Exception as e:
                log.warning("agentgym plugin %s failed to register: %s", ep.name, e)
                continue
            for k in list(_ENTRIES)[n:]:
                e0 = _ENTRIES[k]
                _ENTRIES[k] = EnvEntry(**{**e0.__dict__, "plugin": e0.plugin or dist})
    return sorted(set(_ENTRIES) - before)


def list_envs() -> list[EnvEntry]:
    """Every registered AgentGym env (built-in and plugins), sorted by id."""
    load_plugins()
    return [_ENTRIES[k] for k in sorted(_ENTRIES)]


def _resolve_id(env_id: str) -> str:
    load_plugins()
    if env_id in _ENTRIES:
        return env_id
    if PREFIX + env_id in _ENTRIES:
        return PREFIX + env_id
    lowered = {k.lower(): k for k in _ENTRIES}
    for cand in (env_id.lower(), (PREFIX + env_id).lower()):
        if cand in lowered:
            return lowered[cand]
    choices = list(_ENTRIES)
    close = difflib.get_close_matches(env_id, choices, n=3, cutoff=0.5)
    close += [c for c in difflib.get_close_matches(PREFIX + env_id, choices, n=3, cutoff=0.5) if c not in close]
    raise UnknownEnvError(env_id, close)


def env_entry(env_id: str) -> EnvEntry:
    """The registry entry for an id (``"SQL-v0"`` and ``"agentgym/SQL-v0"`` both work)."""
    return _ENTRIES[_resolve_id(env_id)]


def spec(env_id: str) -> gymnasium.envs.registration.EnvSpec:
    """gymnasium's spec for an id (``"SQL-v0"`` and ``"agentgym/SQL-v0"`` both work; did-you-mean otherwise)."""
    return gymnasium.spec(_resolve_id(env_id))


def make(env_id: str, /, **kwargs: Any) -> gymnasium.Env[Any, Any]:
    """``gymnasium.make`` with a did-you-mean for unknown ids.

    ``max_episode_steps`` may be passed to override the registered turn limit. ``env_id`` is
    positional-only, so an env's own ``env_id`` kwarg (``agentgym/Remote-v0``) passes through.
    """
    return gymnasium.make(_resolve_id(env_id), **kwargs)


_register_builtins()

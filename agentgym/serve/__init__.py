"""Env services: any registered env over the network, in the OpenEnv protocol, and back.

* :func:`~agentgym.serve.server.create_app` / ``agentgym serve ENV_ID...``: a FastAPI server that
  speaks OpenEnv's HTTP, WebSocket and MCP shapes (with AgentGym's extensions under ``/agentgym/``);
  :class:`~agentgym.serve.server.EnvServer` runs one in a background thread.
* :class:`~agentgym.serve.client.RemoteEnv` (``agentgym/Remote-v0``): an env behind such a server,
  or behind any OpenEnv server, with the local env contract.
* :class:`~agentgym.serve.pool.RemotePool` and :func:`~agentgym.serve.client.remote_env_factory`:
  spread sessions over several servers, skipping dead ones.
* :mod:`~agentgym.serve.runner`: uvicorn with bounded connections, in the foreground or a thread.
* :class:`~agentgym.serve.latency.LatencyProxy`: a TCP proxy that adds round-trip time (benchmarks).

The wire format is documented in :mod:`agentgym.serve.protocol` and in the README.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EnvServer", "LatencyProxy", "RemoteEnv", "RemotePool", "ServeConfig", "create_app", "remote_env_factory"]

_LAZY = {
    "EnvServer": "agentgym.serve.server",
    "ServeConfig": "agentgym.serve.config",
    "create_app": "agentgym.serve.server",
    "RemoteEnv": "agentgym.serve.client",
    "remote_env_factory": "agentgym.serve.client",
    "RemotePool": "agentgym.serve.pool",
    "LatencyProxy": "agentgym.serve.latency",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentgym.serve' has no attribute {name!r}")

"""Train agents whose loop AgentGym does not own, through an OpenAI-compatible endpoint.

* :class:`PolicyEndpoint` (:mod:`~agentgym.harness.endpoint`): rollout policies behind OpenAI's chat
  and completions APIs, recording each rollout's token-exact trace (:mod:`~agentgym.harness.traces`).
* :class:`EndpointServer` / :func:`create_app` (:mod:`~agentgym.harness.server`): the HTTP routes,
  Agent Lightning's proxy and event routes included (``agentgym serve-policy``).
* :class:`HarnessWorkflow` (:mod:`~agentgym.harness.workflow`): a dataflow workflow that hands each
  task to an external agent (:mod:`~agentgym.harness.agents`: a callable, a command, a container, an
  Agent Lightning agent class) and trains on what it did.
* :func:`register_workflow` (:mod:`~agentgym.harness.registry`): workflows selectable from a training
  config (``[multi] workflow = "harness"``).

Heavy pieces load lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "AgentLightningAgent",
    "AgentTask",
    "CallableAgent",
    "CommandAgent",
    "ContainerAgent",
    "EndpointError",
    "EndpointServer",
    "FinalState",
    "HarnessOptions",
    "HarnessWorkflow",
    "PolicyEndpoint",
    "Rollout",
    "RolloutTrace",
    "create_app",
    "register_workflow",
    "workflow_factory",
]

_WHERE = {
    "AgentLightningAgent": "agents", "AgentTask": "agents", "CallableAgent": "agents", "CommandAgent": "agents",
    "ContainerAgent": "agents", "EndpointError": "openai_api", "EndpointServer": "server", "create_app": "server",
    "FinalState": "workflow", "HarnessWorkflow": "workflow", "HarnessOptions": "registry",
    "register_workflow": "registry", "workflow_factory": "registry", "PolicyEndpoint": "endpoint",
    "Rollout": "endpoint", "RolloutTrace": "traces",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"agentgym.harness.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'agentgym.harness' has no attribute {name!r}")

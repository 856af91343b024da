"""Adapters that put AgentGym envs into the trainers and agent frameworks users already have.

Each adapter is its own module and imports its framework lazily, so ``import agentgym`` (and this
package) never imports trl, agents or verifiers:

* :mod:`agentgym.integrations.trl`: a spec for TRL's ``GRPOTrainer(environment_factory=...)``
  (``train_dataset``, ``environment_factory`` with the env's exact tool schemas, ``reward_funcs``,
  and a tokenizer whose chat template TRL can parse).
* :mod:`agentgym.integrations.openai_agents`: ``env_tools(env)``, the env's tools as OpenAI Agents SDK
  ``FunctionTool`` objects bound to one episode, a tool-use behaviour that stops the agent when the
  episode ends, and the episode's reward.
* :mod:`agentgym.integrations.verifiers`: AgentGym envs as a verifiers environment
  (``vf-eval agentgym``; the installable package is ``integrations/verifiers-agentgym``).

All three drive the env through its public API (``reset`` and ``step`` with an assistant message
that carries structured ``tool_calls``), so they work the same over ``agentgym/Remote-v0``.
"""

from __future__ import annotations

from agentgym.integrations.episode import EpisodeOver, ToolEpisode

__all__ = ["EpisodeOver", "ToolEpisode"]

"""Workflows selectable by name from a training config (``[multi] workflow = "NAME"``).

A *workflow factory* builds a :class:`~agentgym.rollout.workflow.Workflow` from the training config
(a plain dict, so it also runs inside a Ray rollout service) and the rollout policies::

    def my_workflow(cfg: Mapping[str, Any], policies: Mapping[str, Policy]) -> Workflow: ...

    register_workflow("my_workflow", my_workflow)   # in a module listed in rollout.imports

Names resolve, in order, to: a factory registered here; one published under the entry-point group
``agentgym.workflows`` (loaded lazily); or a ``"package.module:factory"`` path. The factory reads its
own settings from ``[multi.options]`` (a table passed through untouched) and validates them.

``harness`` is built in: :func:`harness_workflow` with :class:`HarnessOptions`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, Literal

from pydantic import Field, model_validator

from agentgym.config import ConfigModel
from agentgym.errors import ConfigurationError
from agentgym.policy import Policy, SamplingParams
from agentgym.rollout.runtime import RolloutLimits
from agentgym.rollout.workflow import Workflow

__all__ = ["HarnessOptions", "WorkflowFactory", "harness_workflow", "register_workflow", "registered_workflows",
           "workflow_factory"]

WorkflowFactory = Callable[[Mapping[str, Any], Mapping[str, Policy]], Workflow]
ENTRY_POINT_GROUP = "agentgym.workflows"
_NAME = re.compile(r"[A-Za-z_][\w\-]*(\.[A-Za-z_]\w*)*(:[A-Za-z_][\w.]*)?")
_REGISTRY: dict[str, WorkflowFactory] = {}


def register_workflow(name: str, factory: WorkflowFactory) -> None:
    """Make ``factory`` selectable as ``[multi] workflow = name``.

    Raises:
        ConfigurationError: a built-in name, or a name taken by another factory.
    """
    if name in ("none", "solver_verifier") or not re.fullmatch(r"[A-Za-z_][\w\-]*", name):
        raise ConfigurationError(f"cannot register a workflow named {name!r}")
    if _REGISTRY.get(name, factory) is not factory:
        raise ConfigurationError(f"a workflow named {name!r} is already registered")
    _REGISTRY[name] = factory


def registered_workflows() -> list[str]:
    """The names :func:`workflow_factory` knows (registered and entry points)."""
    return sorted({*_REGISTRY, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


def valid_workflow_name(name: str) -> bool:
    """A name or ``package.module:factory`` path (checked when the config is read; resolved later)."""
    return bool(_NAME.fullmatch(name))


def workflow_factory(name: str) -> WorkflowFactory:
    """The factory of ``name`` (see the module docstring).

    Raises:
        ConfigurationError: nothing by that name (the message lists the known ones).
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            factory = ep.load()
            _REGISTRY[name] = factory
            return factory  # type: ignore[no-any-return]
    if ":" in name:
        from agentgym.harness.agents import load_callable

        factory = load_callable(name)
        if not callable(factory):
            raise ConfigurationError(f"multi.workflow {name!r} is not a callable workflow factory")
        return factory  # type: ignore[no-any-return]
    known = ", ".join(["none", "solver_verifier", *registered_workflows()])
    raise ConfigurationError(f"multi.workflow: no workflow named {name!r}; known: {known} (or 'package.module:factory'; "
                             "a module in rollout.imports may register one)")


class HarnessOptions(ConfigModel):
    """``[multi.options]`` of ``workflow = "harness"``: which agent runs, and where its reward comes from.

    Exactly one of ``agent`` (a Python callable), ``command`` (a process; with ``image``: in a
    container) or ``agentlightning`` (an Agent Lightning agent class) names the agent.

    Attributes:
        agent: ``"package.module:function"``, called with the task dict.
        command: A command run per task (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``AGENTGYM_TASK``).
        image: Run ``command`` in this local Docker image (``--network none``).
        agentlightning: ``"package.module:Class"`` with ``run()`` (Agent Lightning 1.0's agent class).
        python: The interpreter of the Agent Lightning agent's environment.
        env_map: Agent Lightning's ``local.env_map`` (``{"QUESTION": "input.prompt"}``).
        env: Extra environment variables (commands, containers, Agent Lightning agents).
        cwd: Working directory of a command or Agent Lightning agent.
        timeout_s: Deadline of one agent run.
        reward: ``"env"``, ``"call"`` or ``"final"`` (see :mod:`agentgym.harness.workflow`).
        reward_fn: ``"package.module:function"`` of the final state, for ``reward = "final"``.
        env_access: Give the agent the env's URL.
        task_data: Hand the task's data (gold answers) to the agent (not with ``reward = "env"``).
        max_requests: Model calls one run may make.
    """

    agent: str | None = None
    command: list[str] | None = None
    image: str | None = None
    agentlightning: str | None = None
    python: str | None = None
    env_map: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    timeout_s: float = Field(default=600.0, gt=0)
    reward: Literal["env", "call", "final"] = "env"
    reward_fn: str | None = None
    env_access: bool = True
    task_data: bool = False
    max_requests: int = Field(default=256, ge=1)

    @model_validator(mode="after")
    def _one_agent(self) -> HarnessOptions:
        named = [k for k in ("agent", "command", "agentlightning") if getattr(self, k)]
        if len(named) != 1:
            raise ValueError("name exactly one agent: agent = 'pkg.module:function', command = [...] (with image: in "
                             f"a container) or agentlightning = 'pkg.module:Class'; got {named or 'none'}")
        if self.image and not self.command:
            raise ValueError("image runs command in a container: set command too")
        if (self.reward == "final") != (self.reward_fn is not None):
            raise ValueError("reward = 'final' and reward_fn go together")
        return self

    def build_agent(self) -> Any:
        from agentgym.harness.agents import AgentLightningAgent, CallableAgent, CommandAgent, ContainerAgent

        if self.agent:
            return CallableAgent(self.agent)
        if self.agentlightning:
            return AgentLightningAgent(self.agentlightning, python=self.python, env_map=self.env_map, env=self.env,
                                       cwd=self.cwd)
        assert self.command is not None
        if self.image:
            return ContainerAgent(self.image, self.command, env=self.env)
        return CommandAgent(self.command, env=self.env, cwd=self.cwd)


def harness_workflow(cfg: Mapping[str, Any], policies: Mapping[str, Policy]) -> Workflow:
    """``[multi] workflow = "harness"``: :class:`~agentgym.harness.workflow.HarnessWorkflow` over the
    ``policy`` rollout policy, sampling and limits from ``[rollout]``, the agent from ``[multi.options]``."""
    from agentgym.harness.agents import load_callable
    from agentgym.harness.workflow import HarnessWorkflow

    opts = HarnessOptions(**dict(cfg["multi"].get("options") or {}))
    r = cfg["rollout"]
    reward_fn = load_callable(opts.reward_fn) if opts.reward_fn else None
    return HarnessWorkflow(
        policies["policy"], opts.build_agent(), r["group_size"],
        sampling=SamplingParams(temperature=r["temperature"], top_p=r["top_p"], max_tokens=r["max_tokens"]),
        limits=RolloutLimits(max_turns=r.get("max_turns"), policy_timeout_s=r["policy_timeout_s"]),
        timeout_s=opts.timeout_s, reward=opts.reward, reward_fn=reward_fn, env_access=opts.env_access,
        task_data=opts.task_data, max_requests=opts.max_requests)


register_workflow("harness", harness_workflow)

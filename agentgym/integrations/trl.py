"""AgentGym envs in TRL's ``GRPOTrainer(environment_factory=...)``.

One :class:`AgentGymSpec` gives every argument TRL's environment hook needs, in the shape of TRL's own
specs (``trl.experimental.openreward.OpenRewardSpec``)::

    from trl import GRPOConfig, GRPOTrainer
    from agentgym.integrations.trl import AgentGymSpec

    spec = AgentGymSpec("agentgym/Demo-v0", split="train", num_tasks=16)
    trainer = GRPOTrainer(
        model=spec.model_path("smollm2-135m-instruct"),
        processing_class=spec.tokenizer("smollm2-135m-instruct"),   # the template fix
        args=GRPOConfig(num_generations=4, max_steps=2, max_tool_calling_iterations=8),
        train_dataset=spec.train_dataset,           # one row per task: the env's opening messages
        environment_factory=spec.environment_factory,
        reward_funcs=spec.reward_funcs,             # the episode's return, from the env
    )
    trainer.train()

What it fixes over a hand-written wrapper:

* **The exact prompt.** TRL rebuilds tool schemas from Python signatures (tools sorted by name, the
  docstring's ``Returns:`` moved out of the description, pydantic's details lost), so a model trained
  or evaluated with AgentGym saw another prompt inside TRL. The environment class here hands TRL the
  env's own schemas (``info["tools"]``, in the env's order) and the dataset holds the env's own opening
  messages, so TRL renders token for token what ``agentgym eval`` renders (tested on the ids).
* **The template.** TRL parses completions with a response template it knows only for some models'
  templates ("Unrecognized chat template" otherwise). :meth:`AgentGymSpec.tokenizer` derives one for
  Hermes-style ChatML templates (SmolLM2 as AgentGym prepares it, Qwen) and checks it by a round trip.
* **The reward.** Every tool call is one ``env.step`` (the env's parser, argument validation, error
  observations, turn limit and reward apply as in ``agentgym eval``), and ``reward_funcs`` reads the
  episode's return from the env. Calls after the episode ended do not reach the env.

What TRL's loop still does differently from ``agentgym eval`` (TRL owns it): a completion without a
tool call ends the rollout (AgentGym answers it with an error observation and goes on), the model keeps
generating after the env's last tool result, and each call of a multi-call turn is its own env step.
Envs without tools (ALFWorld's text commands) cannot be used: TRL only takes tool calls (ALFWorld has
``action_mode="tool"``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

from agentgym.errors import ConfigurationError, DependencyNotInstalled, EnvError
from agentgym.integrations.episode import ToolEpisode, tool_names
from agentgym.types import Message, ToolSpec

__all__ = ["AgentGymSpec", "TRLEnvironment", "add_response_template", "episode_reward"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _require(module: str, feature: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise DependencyNotInstalled(feature, "agentgym[trl]") from e


class _ExactTool(dict):  # type: ignore[type-arg]
    """A tool TRL can call whose schema transformers renders verbatim.

    ``apply_chat_template`` uses a ``dict`` in ``tools`` as the schema itself (a function would be
    re-derived from its signature), and TRL dispatches a parsed call by the callable's ``__name__``.
    """

    def __init__(self, spec: ToolSpec, episode: ToolEpisode) -> None:
        super().__init__(json.loads(json.dumps(spec)))
        self.__name__ = spec["function"]["name"]
        self.__doc__ = spec["function"].get("description", "")
        self._episode = episode

    def __call__(self, **arguments: Any) -> str:
        return self._episode.call(self.__name__, arguments)

    # dict equality would make two episodes' tools "equal"; TRL dedups its tool list with `in`
    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = object.__hash__  # type: ignore[assignment]


class TRLEnvironment:
    """One TRL rollout slot over one AgentGym env (built by :attr:`AgentGymSpec.environment_factory`).

    TRL finds an environment's tools as the public functions of its class, sorted by name, and calls
    ``getattr(instance, name)``. Each spec's subclass declares one placeholder function per tool,
    named ``tool_<k>_<name>`` so that sorting keeps the env's order, and every instance shadows it
    with an :class:`_ExactTool` carrying the env's schema.

    Attributes:
        episode: The :class:`~agentgym.integrations.ToolEpisode` of the current rollout (reward,
            success, transcript, ``calls_after_end``).
    """

    _spec_tools: list[ToolSpec] = []  # noqa: RUF012 (set per subclass)
    _make_env: Callable[[], Any]

    def __init__(self) -> None:
        self.env = type(self)._make_env()
        self.episode = ToolEpisode(self.env)
        for k, spec in enumerate(self._spec_tools):
            setattr(self, _slot_name(k, spec, len(self._spec_tools)), _ExactTool(spec, self.episode))

    def reset(self, *, task_id: str, split: str | None = None, seed: int | None = None,
              prompt: list[Message] | None = None, **_: Any) -> None:
        """Reset the env to the row's task and seed; the row's ``prompt`` already holds its opening messages.

        Raises:
            EnvError: the env's opening messages or tools differ from the dataset's (the env broke
                its same-seed-same-text contract, or its tools changed): TRL would train on a prompt
                the env never showed.
        """
        messages = self.episode.reset(task_id=task_id, seed=seed)
        if prompt is not None and _plain(messages) != _plain(prompt):
            raise EnvError(
                f"task {task_id!r} (seed {seed}) opened with other messages than the dataset row holds; "
                "the env must give the same text for the same seed"
            )
        if self.episode.tools != self._spec_tools:
            raise EnvError(
                f"task {task_id!r} offers the tools {tool_names(self.episode.tools)}, but the trainer renders "
                f"{tool_names(self._spec_tools)}; use one spec per tool set"
            )
        return None

    # Every public function is a tool to TRL, so the rest of the surface starts with "_".
    def _close(self) -> None:
        """Close the env (TRL never does; for users' own cleanup)."""
        self.env.close()


def _slot_name(k: int, spec: ToolSpec, n: int) -> str:
    name = spec["function"]["name"]
    safe = name if _IDENT.match(name) else re.sub(r"\W", "_", name)
    return f"tool_{k:0{len(str(n))}d}_{safe}"


def _plain(messages: Sequence[Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in dict(m).items() if v is not None} for m in messages]


def episode_reward(environments: Sequence[TRLEnvironment], **_: Any) -> list[float]:
    """TRL reward function: each rollout's return as its env counted it (the sum of step rewards)."""
    return [float(e.episode.reward) for e in environments]


def episode_success(environments: Sequence[TRLEnvironment], **_: Any) -> list[float]:
    """1.0 where the env reported success. Pass it with ``reward_weights`` 0 to log success only."""
    return [float(e.episode.success) for e in environments]


class AgentGymSpec:
    """An AgentGym env as the three arguments of ``GRPOTrainer``'s environment hook.

    Args:
        env_id: A registered id (``agentgym/Demo-v0``, ``agentgym/Remote-v0``...).
        split: The split whose tasks make the dataset.
        num_tasks: Use the first ``num_tasks`` tasks of the split (default: all of them).
        task_ids: Use exactly these tasks (instead of ``num_tasks``).
        seed: The seed every episode is reset with (the same seed gives the same text).
        env_kwargs: Passed to ``agentgym.make`` (``url=`` and ``env_id=`` for ``agentgym/Remote-v0``).

    Attributes (each plugs into the ``GRPOTrainer`` argument of the same name):
        train_dataset: ``datasets.Dataset`` with ``prompt`` (the env's opening messages), ``task_id``,
            ``split`` and ``seed``.
        environment_factory: A zero-argument callable returning a fresh :class:`TRLEnvironment`.
        reward_funcs: ``[episode_reward]``.
        tools: The env's tool specs, exactly as TRL renders them.
    """

    def __init__(
        self,
        env_id: str,
        *,
        split: str = "train",
        num_tasks: int | None = None,
        task_ids: Sequence[str] | None = None,
        seed: int = 0,
        env_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if num_tasks is not None and task_ids is not None:
            raise ConfigurationError("give num_tasks or task_ids, not both")
        if num_tasks is not None and num_tasks < 1:
            raise ConfigurationError(f"num_tasks must be >= 1, got {num_tasks}")
        self.env_id = env_id
        self.split = split
        self.num_tasks = num_tasks
        self.task_ids = list(task_ids) if task_ids is not None else None
        self.seed = int(seed)
        self.env_kwargs = dict(env_kwargs or {})

    def make_env(self) -> Any:
        import agentgym

        return agentgym.make(self.env_id, **self.env_kwargs)

    # ---------------------------------------------------------------- what TRL takes
    @cached_property
    def _rows(self) -> list[dict[str, Any]]:
        env = self.make_env()
        try:
            ids = self.task_ids if self.task_ids is not None else self._list_task_ids(env)
            if not ids:
                raise ConfigurationError(f"{self.env_id} has no tasks in split {self.split!r}")
            episode = ToolEpisode(env)
            rows: list[dict[str, Any]] = []
            self._tools: list[ToolSpec] = []
            for i, tid in enumerate(ids):
                messages = episode.reset(task_id=tid, seed=self.seed)
                if not episode.tools:
                    raise ConfigurationError(
                        f"{self.env_id} offers no tools, and TRL's environment hook only takes tool calls "
                        "(ALFWorld: env_kwargs={'action_mode': 'tool'})"
                    )
                if i == 0:
                    self._tools = episode.tools
                elif episode.tools != self._tools:
                    raise ConfigurationError(
                        f"task {tid!r} offers other tools than task {ids[0]!r}; make one spec per tool set"
                    )
                rows.append({"prompt": _chat_rows(messages, tid), "task_id": tid, "split": self.split,
                             "seed": self.seed})
            return rows
        finally:
            env.close()

    def _list_task_ids(self, env: Any) -> list[str]:
        tasks = getattr(env.unwrapped, "tasks", None)
        if tasks is None:
            raise ConfigurationError(f"{self.env_id} does not list its tasks; pass task_ids=")
        ids = [t.task_id for t in tasks(self.split)]
        return ids[: self.num_tasks] if self.num_tasks is not None else ids

    @cached_property
    def train_dataset(self) -> Any:
        """One row per task: ``prompt`` (the env's opening messages), ``task_id``, ``split``, ``seed``."""
        datasets = _require("datasets", "AgentGymSpec.train_dataset")
        return datasets.Dataset.from_list(self._rows)

    @property
    def tools(self) -> list[ToolSpec]:
        """The env's tool specs, in the env's order, exactly as the rollouts render them."""
        _ = self._rows
        return list(self._tools)

    @cached_property
    def environment_factory(self) -> Callable[[], TRLEnvironment]:
        tools = self.tools
        make_env = self.make_env
        slots: dict[str, Any] = {}
        for k, spec in enumerate(tools):
            slots[_slot_name(k, spec, len(tools))] = _placeholder(spec)
        cls = type(
            "AgentGymEnv_" + re.sub(r"\W", "_", self.env_id.rsplit("/", 1)[-1]),
            (TRLEnvironment,),
            {"_spec_tools": tools, "_make_env": staticmethod(make_env), **slots},
        )
        return cls  # a class is a zero-argument callable returning an instance

    @property
    def reward_funcs(self) -> list[Callable[..., list[float]]]:
        return [episode_reward]

    # ---------------------------------------------------------------- model side
    @staticmethod
    def model_path(model: str | os.PathLike[str]) -> str:
        """A model folder TRL can load (``smollm2-135m-instruct`` -> its prepared folder)."""
        from agentgym.policies.models import resolve_model

        return resolve_model(model)

    @staticmethod
    def tokenizer(model: str | os.PathLike[str]) -> Any:
        """The model's tokenizer as ``agentgym eval`` uses it, with a response template TRL can parse."""
        from agentgym.policies.models import load_tokenizer

        return add_response_template(load_tokenizer(model))


def _placeholder(spec: ToolSpec) -> Callable[..., str]:
    name = spec["function"]["name"]

    def call(self: TRLEnvironment, **arguments: Any) -> str:
        return self.episode.call(name, arguments)

    call.__doc__ = spec["function"].get("description", "")
    return call


def _chat_rows(messages: list[Message], task_id: str) -> list[dict[str, str]]:
    out = []
    for m in messages:
        extra = set(m) - {"role", "content"}
        if extra or not isinstance(m.get("content"), str):
            raise ConfigurationError(
                f"task {task_id!r}: an opening message has {sorted(extra) or 'non-text content'}; "
                "TRL's dataset holds plain role/content messages"
            )
        out.append({"role": m["role"], "content": m["content"]})
    return out


# ------------------------------------------------------------------------ the template fix
_HERMES_CHATML = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def add_response_template(tokenizer: Any) -> Any:
    """Give ``tokenizer`` a response template TRL can parse tool calls with, checked by a round trip.

    TRL's own ``add_response_schema`` knows some models' templates by their exact text; AgentGym's
    prepared SmolLM2 template is not among them, so TRL rejected it ("Unrecognized chat template").
    This keeps a template the tokenizer already has, then tries TRL's, then a Hermes/ChatML one
    (``<|im_start|>assistant`` turns with ``<tool_call>{json}</tool_call>`` blocks). A template is
    used only if parsing what the chat template renders for a probe tool call gives that call back.

    Raises:
        ConfigurationError: no known response format round-trips through this chat template.
    """
    if getattr(tokenizer, "response_template", None) is not None:
        return tokenizer
    _require("trl", "add_response_template")
    from trl.chat_template_utils import add_response_schema

    tokenizer.padding_side = "left"
    try:
        add_response_schema(tokenizer)
        return tokenizer
    except ValueError:  # TRL does not recognise this template's text
        pass
    tokenizer.response_template = _HERMES_CHATML
    if not _round_trips(tokenizer):
        tokenizer.response_template = None
        raise ConfigurationError(
            "TRL cannot parse tool calls with this chat template: it is neither one TRL knows nor a "
            "Hermes/ChatML template (<|im_start|>assistant ... <tool_call>{json}</tool_call>). Set "
            "tokenizer.response_template yourself (transformers' response parsing docs)."
        )
    return tokenizer


def _round_trips(tokenizer: Any) -> bool:
    call = {"name": "probe_tool", "arguments": {"text": "a b", "n": 7}}
    tools = [{"type": "function", "function": {
        "name": "probe_tool", "description": "probe",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
                       "required": ["text", "n"]}}}]
    user: Message = {"role": "user", "content": "hi"}
    try:
        prefix = tokenizer.apply_chat_template([user], tools=tools, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(
            [user, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]}],
            tools=tools, tokenize=False,
        )
    except Exception:  # a template that cannot render tool calls at all
        return False
    if not full.startswith(prefix):
        return False
    enc = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    ids = tokenizer(full[len(prefix):], add_special_tokens=False)["input_ids"]
    plain = tokenizer(f'<tool_call>{json.dumps(call)}</tool_call>{tokenizer.eos_token}',
                      add_special_tokens=False)["input_ids"]
    try:
        for completion in (ids, plain):  # as the template renders it, and as a model trained on the expert writes it
            parsed = tokenizer.parse_response(completion, prefix=enc, tools=tools)
            calls = (parsed or {}).get("tool_calls") or []
            if len(calls) != 1 or calls[0].get("function") != call:
                return False
    except Exception:
        return False
    return True

"""The environment contract: :class:`AgentEnv`, a multi-turn ``gymnasium.Env`` over chat messages.

``reset`` returns the opening messages (system prompt, task). ``step`` takes the assistant's raw
text or an assistant :class:`~agentgym.types.Message` and returns **only the new messages** (tool
results, feedback); the agent loop keeps the history. ``terminated`` (the task ended) and
``truncated`` (a limit was hit) are never merged.

Writing an env means subclassing and filling three hooks::

    class GuessEnv(AgentEnv):
        family = "demo"

        def tasks(self, split="train"):
            return [TaskSpec(f"{split}-{n}", split, data={"n": n}) for n in range(10)]

        def reset_task(self, task):
            return [{"role": "user", "content": "Guess my number (0-9)."}]

        @tool
        def guess(self, n: int) -> str:
            '''Guess the number.

            Args:
                n: Your guess.
            '''
            ok = n == self.task.data["n"]
            self.finish(reward=float(ok), success=ok)
            return "Correct!" if ok else "Wrong."

Bad agent output is never an exception: parse errors, unknown tools, invalid arguments and tool
failures come back as messages, are counted in ``info["metrics"]``, and set ``info["parse_error"]``
where parsing failed. Misuse of the API (``step`` before ``reset`` or after the end) raises
:class:`~agentgym.errors.ResetNeeded`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium

from agentgym.errors import ResetNeeded, TaskNotFound
from agentgym.loading import LoadReport
from agentgym.parsers import ActionParser, ParsedAction, get_parser
from agentgym.spaces import ActionSpace, ChatSpace
from agentgym.tools import ToolSet
from agentgym.types import Message, TaskSpec, ToolCall

__all__ = ["RENAMED_HOOKS", "AgentEnv", "StepResult"]

Action = str | Message

# Old hook name -> public name (0.2). Overriding the old name still works until 0.3, with a DeprecationWarning.
RENAMED_HOOKS = {"_reset_task": "reset_task", "_on_command": "on_command", "_on_text": "on_text",
                 "_run_tool_calls": "run_tool_calls", "_format_error": "format_error"}


@dataclass
class StepResult:
    """What a step hook returns; the base class adds the standard ``info`` keys."""

    messages: list[Message]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class AgentEnv(gymnasium.Env[list[Message], Action]):
    """Base class of every AgentGym environment.

    Subclasses implement :meth:`tasks` and :meth:`reset_task`, and either declare ``@tool``
    methods (tool-calling envs; a tool ends the episode with :meth:`finish`) or override
    :meth:`on_command` (text-command envs such as ALFWorld). :meth:`on_text` handles a turn with
    neither a tool call nor a command; :meth:`run_tool_calls` runs a turn's tool calls.

    Class attributes:
        family: Short family name shown by ``agentgym list`` (``"sql"``, ``"alfworld"``...).
        default_parser: ``"hermes"``, ``"json"`` or ``"react"``.
        splits: The split names :meth:`tasks` accepts.
        default_split: Used when ``reset`` gets no ``split`` option.
    """

    metadata: dict[str, Any] = {  # noqa: RUF012 (gymnasium declares it as an instance attribute)
       "render_modes": ["ansi"], "render_fps": 1}
    family: ClassVar[str] = "custom"
    default_parser: ClassVar[str] = "hermes"
    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    default_split: ClassVar[str] = "train"

    def __init__(
        self,
        *,
        parser: str | ActionParser | None = None,
        format_penalty: float = 0.0,
        render_mode: str | None = None,
    ) -> None:
        """Args:
        parser: How to read actions (``hermes``/``json``/``react`` or an ActionParser).
        format_penalty: Subtracted from the reward of a step whose action could not be parsed.
        render_mode: ``"ansi"`` or ``None``.
        """
        self.observation_space = ChatSpace()
        self.action_space = ActionSpace()
        self.render_mode = render_mode
        self.tools: ToolSet = ToolSet.from_object(self)
        self.parser: ActionParser = get_parser(parser or self.default_parser)
        self.format_penalty = float(format_penalty)
        self.task: TaskSpec | None = None
        self.metrics: dict[str, float] = {}
        self._state = "new"  # new | running | done
        self._turn = 0
        self._outcome: tuple[float, bool] | None = None
        self._task_index: dict[str, TaskSpec] | None = None
        self._last_messages: list[Message] = []
        # Loaders that read benchmark files record kept and skipped rows here (see load_report).
        self.load_log = LoadReport(env=type(self).__name__)

    # ------------------------------------------------------------------ hooks for subclasses
    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        """All tasks of a split, in a stable order."""
        raise NotImplementedError

    def reset_task(self, task: TaskSpec) -> list[Message]:
        """Set up ``task`` and return the opening messages. Draw randomness from ``self.np_random``."""
        raise NotImplementedError

    def on_command(self, command: str) -> StepResult:
        """Handle a plain-text command (react parser). Default: tell the agent to call a tool."""
        return self.format_error(f"expected a tool call, got the command {command[:80]!r}")

    def on_text(self, text: str) -> StepResult:
        """Handle a turn with no tool call and no command. Default: a parse-error observation."""
        return self.format_error("no tool call found")

    def run_tool_calls(self, calls: list[ToolCall]) -> StepResult:
        """Run the turn's tool calls in order (stopping after one that ends the episode) and return
        one ``tool`` message each. Override to post-process a turn's tool results."""
        out: list[Message] = []
        for call in calls:
            res = self.tools.call(call)
            self.count("tool_calls")
            if not res.ok:
                self.count("tool_errors")
                self.count(f"tool_{res.error_kind}")
            out.append({"role": "tool", "tool_call_id": call["id"], "name": res.name, "content": res.content})
            if self._outcome is not None:
                break
        return StepResult(out)

    # The hooks' names before 0.2. A subclass that overrides an old name still works (with a
    # DeprecationWarning when the class is defined) until 0.3; the aliases keep ``super()._on_text(...)``
    # in such a subclass reaching the base behaviour.
    _reset_task = reset_task
    _on_command = on_command
    _on_text = on_text
    _run_tool_calls = run_tool_calls

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for old, new in RENAMED_HOOKS.items():
            own = cls.__dict__
            if old in own and new not in own:
                warnings.warn(f"{cls.__qualname__} overrides {old}(), the hook's old name: rename it {new}() "
                              "(the old name works until agentgym 0.3).", DeprecationWarning, stacklevel=2)
                setattr(cls, new, own[old])
            elif new in own and old not in own:
                setattr(cls, old, own[new])  # a subclass of this one that still calls super().<old>() finds it

    def load_report(self, split: str | None = None) -> dict[str, Any]:
        """How many tasks were loaded and which source rows were left out, and why.

        An env whose loader reads benchmark files fills :attr:`load_log` (a
        :class:`~agentgym.loading.LoadReport`) as it loads, and logs a WARNING for any row it
        skips. Otherwise nothing was skipped and ``loaded`` counts the tasks of ``split`` (of every
        split when ``split`` is ``None``). ``agentgym eval`` records this in ``summary.json``.

        Returns:
            ``{"source", "loaded", "skipped", "skip_reasons", "skipped_items", "notes"}``.
        """
        d = self.load_log.to_dict()
        if not self.load_log.loaded and not self.load_log.skipped:
            splits = [split] if split is not None else list(self.splits)
            d["loaded"] = sum(len(self.tasks(s)) for s in splits)
        return d

    def admissible_actions(self) -> list[str] | None:
        """Commands that are valid now, where the env knows them (``info["admissible_actions"]``)."""
        return None

    def expert_action(self) -> Action | None:
        """The next action of the env's privileged expert, or ``None`` if it has none."""
        return None

    def system_prompt(self) -> str | None:
        """Optional system prompt describing the env; used by ``reset_task`` implementations."""
        return None

    # ------------------------------------------------------------------ helpers for subclasses
    def finish(self, reward: float, success: bool) -> None:
        """End the episode (called from a tool such as ``submit``). The current step terminates."""
        self._outcome = (float(reward), bool(success))

    def count(self, key: str, n: float = 1) -> None:
        """Increment ``info["metrics"][key]``."""
        self.metrics[key] = self.metrics.get(key, 0) + n

    def format_error(self, reason: str) -> StepResult:
        """A parse-error observation: ``reason`` and the parser's format instructions, counted in
        ``metrics["parse_errors"]``, minus ``format_penalty``, with ``info["parse_error"]`` set."""
        self.count("parse_errors")
        hint = self.parser.format_instructions(self.tools)
        msg: Message = {"role": "user", "content": f"Error: {reason}. {hint}"}
        return StepResult([msg], -self.format_penalty, info={"parse_error": reason})

    _format_error = format_error  # the old name (see RENAMED_HOOKS)

    # ------------------------------------------------------------------ task lookup
    def get_task(self, task_id: str) -> TaskSpec:
        if self._task_index is None:
            self._task_index = {t.task_id: t for s in self.splits for t in self.tasks(s)}
        try:
            return self._task_index[task_id]
        except KeyError:
            raise TaskNotFound(f"{type(self).__name__} has no task {task_id!r}.") from None

    def _select_task(self, options: dict[str, Any] | None) -> TaskSpec:
        options = options or {}
        task = options.get("task")
        if isinstance(task, TaskSpec):
            return task
        if options.get("task_id") is not None:
            return self.get_task(str(options["task_id"]))
        split = options.get("split", self.default_split)
        if split not in self.splits:
            raise TaskNotFound(f"{type(self).__name__} has no split {split!r}; splits: {', '.join(self.splits)}.")
        pool = self.tasks(split)
        if not pool:
            raise TaskNotFound(f"{type(self).__name__} split {split!r} has no tasks.")
        if options.get("index") is not None:
            return pool[int(options["index"]) % len(pool)]
        return pool[int(self.np_random.integers(len(pool)))]

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode.

        Args:
            seed: Seeds the env's own RNG. The same seed gives the same task and the same text.
            options: ``{"task_id": ...}`` picks a task; ``{"split": ..., "index": ...}`` picks by
                position; ``{"task": TaskSpec}`` passes one directly. Otherwise a task is drawn from
                ``default_split`` with the env's RNG.
        """
        super().reset(seed=seed)
        task = self._select_task(options)
        self.task = task
        self._turn = 0
        self._outcome = None
        self.metrics = {}
        messages = self.reset_task(task)
        self._state = "running"
        self._last_messages = messages
        info: dict[str, Any] = {"task_id": task.task_id, "task_type": task.task_type, "metrics": {},
                                "tools": self.tools.specs() if len(self.tools) else [],
                                "parser": self.parser.name}
        adm = self.admissible_actions()
        if adm is not None:
            info["admissible_actions"] = adm
        return messages, info

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Apply one assistant turn; return only the new messages."""
        if self._state == "new":
            raise ResetNeeded(f"{type(self).__name__}.step() called before reset().")
        if self._state == "done":
            raise ResetNeeded(f"{type(self).__name__}.step() called after the episode ended; call reset().")
        self._turn += 1
        parsed = self.parser.parse(action, self.tools if len(self.tools) else None)
        result = self._dispatch(parsed)
        info = result.info
        terminated = result.terminated
        reward = result.reward
        if self._outcome is not None:
            terminated = True
            reward += self._outcome[0]
            info["success"] = self._outcome[1]
        elif terminated and "success" not in info:
            info["success"] = False
        info["task_id"] = self.task.task_id if self.task else None
        info["tool_calls"] = parsed.tool_calls
        info["command"] = parsed.command
        info["metrics"] = dict(self.metrics)
        if terminated or result.truncated:
            self._state = "done"
        else:
            adm = self.admissible_actions()
            if adm is not None:
                info["admissible_actions"] = adm
        self._last_messages = result.messages
        return result.messages, float(reward), bool(terminated), bool(result.truncated), info

    def _dispatch(self, parsed: ParsedAction) -> StepResult:
        if parsed.error is not None:
            return self.format_error(parsed.error)
        if parsed.tool_calls:
            return self.run_tool_calls(parsed.tool_calls)
        if parsed.command is not None:
            return self.on_command(parsed.command)
        return self.on_text(parsed.text)

    def render(self) -> str | None:  # type: ignore[override]
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{m['role']}] {m['content']}" for m in self._last_messages)

    @property
    def done(self) -> bool:
        return self._state == "done"

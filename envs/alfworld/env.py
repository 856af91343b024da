"""ALFWorld's household tasks on a native engine: the same text and commands, no TextWorld.

The engine implements the semantics of ALFWorld's PDDL domain (``alfred.pddl``) and phrases
everything as its TextWorld grammar (``alfred.twl2``) does::

    You are in the middle of a room. Looking quickly around you, you see a cabinet 2, a cabinet 1,
    a countertop 1, a fridge 1, a microwave 1, and a sinkbasin 1.
    Your task is to: heat some egg and put it in countertop.
    > go to fridge 1
    The fridge 1 is closed.
    > open fridge 1
    You open the fridge 1. The fridge 1 is open. In it, you see a egg 1, and a lettuce 2.

Three observation styles: ``"react"`` (default) is the text ReAct/AgentBench agents see (no
TextWorld banner, no ``You arrive at loc N.`` prefix); ``"raw"`` is TextWorld's own output;
``"compact"`` says the same facts in fewer tokens (``fridge 1: closed.``, ``fridge 1: egg 2, cup 3.``,
``Took egg 2.``), for training where tokens are the budget. Two
grammars: ``"classic"`` (``put X in/on Y``, as in the ALFWorld paper, ReAct and AgentBench) and
``"v0.4"`` (alfworld 0.4's ``move X to Y``, ``You arrive at cabinet 1.`` and ``help``). With
``grammar="v0.4", obs_style="raw"`` the text and admissible commands are the same as alfworld
0.4.2's, step for step (``tests/envs/alfworld/test_alfworld_tw.py`` checks it against the package).

Action modes: ``"text"`` (default; plain-text commands through the ``react`` parser) or ``"tool"``
(one ``take_action(action)`` tool, as in AgentBench's function-calling prompts).

Two experts (``expert=`` kwarg; :meth:`ALFWorldEnv.expert_action` plays the chosen one, so
``--policy expert`` and ``--relabel`` use it): ``"observer"`` (default), whose next command is a
function of the observations shown so far (:mod:`agentgym.envs.alfworld.observer`), and
``"planner"``, which sees the whole scene and walks straight to the object.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentgym.envs.alfworld import scene as S
from agentgym.envs.alfworld import vocab as V
from agentgym.envs.alfworld.observer import Goal, ObservationExpert

from agentgym.core import AgentEnv, StepResult
from agentgym.errors import ConfigurationError
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec

__all__ = ["ALFWorldEnv"]

NOTHING = "Nothing happens."
_WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
_APPLIANCE_VERB = {"SinkBasin": "clean", "Microwave": "heat", "Fridge": "cool"}


class _Recep:
    __slots__ = ("accepts", "contents", "idx", "loc", "name", "openable", "opened", "rtype")

    def __init__(self, name: str, rtype: str, openable: bool, opened: bool, loc: int, idx: int) -> None:
        self.name = name
        self.rtype = rtype
        self.openable = openable
        self.opened = opened
        self.contents: list[_Obj] = []
        self.loc = loc
        self.accepts = V.RECEPTACLE_TYPES[rtype]
        self.idx = idx


class _Obj:
    __slots__ = ("clean", "cool", "hot", "key", "name", "on", "otype", "pickupable", "recep", "toggleable")

    def __init__(self, name: str, otype: str, clean: bool, hot: bool, cool: bool, on: bool) -> None:
        self.name = name
        word, _, num = name.rpartition(" ")
        self.key = (word, -int(num))  # ALFWorld lists things by type, then by number downwards
        self.otype = otype
        self.recep: _Recep | None = None
        self.clean = clean
        self.hot = hot
        self.cool = cool
        self.on = on
        self.toggleable = otype in V.TOGGLEABLE
        self.pickupable = otype in V.PICKUPABLE


def _listing(objs: list[_Obj]) -> str:
    n = len(objs)
    if n == 0:
        return "nothing"
    if n == 1:
        return "a " + objs[0].name
    return ", ".join(["a " + o.name for o in objs[:-1]]) + ", and a " + objs[-1].name


class ALFWorldEnv(AgentEnv):
    """ALFWorld household tasks (six task types), native engine.

    Args:
        action_mode: ``"text"`` (plain commands, react parser) or ``"tool"`` (``take_action`` tool).
        obs_style: ``"react"`` (ReAct/AgentBench text), ``"raw"`` (TextWorld's own output) or
            ``"compact"`` (the same facts in fewer tokens: ``cabinet 1: mug 1, cup 2.``,
            ``Took mug 1.``; see ``docs/alfworld.md``). Use one style for collection, training
            and evaluation alike: it is an env kwarg, so it travels in ``[rollout] env_kwargs``
            and ``--env-kwarg obs_style=compact``.
        grammar: ``"classic"`` (``put X in/on Y``) or ``"v0.4"`` (``move X to Y``).
        split_sizes: Override the number of tasks per split (default: ALFWorld's 3553/140/134).
        system_prompt: Put a system message describing the commands before the first observation.
        lenient: Accept commands in any case, with extra spaces or a final period, and
            ``toggle {lamp} [{recep}]`` for ``use {lamp}``. ALFWorld itself (the default, ``False``)
            answers those with "Nothing happens.".
        expert: Which expert :meth:`expert_action` plays: ``"observer"`` (default; the
            observation-only expert, :mod:`~agentgym.envs.alfworld.observer`: its next command
            depends only on the transcript, so a student can imitate it) or ``"planner"`` (sees
            the whole state and walks straight to the object; for checks and as a reference).
        parser, format_penalty, render_mode: See :class:`~agentgym.core.AgentEnv`. The parser
            defaults to ``react`` in text mode and ``hermes`` in tool mode.
    """

    family = "alfworld"
    default_parser = "react"
    splits: ClassVar[tuple[str, ...]] = ("train", "valid_seen", "valid_unseen")
    default_split = "train"

    def __init__(
        self,
        *,
        action_mode: str = "text",
        obs_style: str = "react",
        grammar: str = "classic",
        split_sizes: dict[str, int] | None = None,
        system_prompt: bool = True,
        lenient: bool = False,
        expert: str = "observer",
        parser: Any = None,
        **kwargs: Any,
    ) -> None:
        if action_mode not in ("text", "tool"):
            raise ConfigurationError(f"action_mode must be 'text' or 'tool', got {action_mode!r}.")
        if obs_style not in ("react", "raw", "compact"):
            raise ConfigurationError(f"obs_style must be 'react', 'raw' or 'compact', got {obs_style!r}.")
        if grammar not in ("classic", "v0.4"):
            raise ConfigurationError(f"grammar must be 'classic' or 'v0.4', got {grammar!r}.")
        if expert not in ("observer", "planner"):
            raise ConfigurationError(f"expert must be 'observer' or 'planner', got {expert!r}.")
        if parser is None:
            parser = "react" if action_mode == "text" else "hermes"
        super().__init__(parser=parser, **kwargs)
        self.action_mode = action_mode
        self.obs_style = obs_style
        self.compact = obs_style == "compact"
        self.grammar = grammar
        self.expert = expert
        self.split_sizes = dict(S.SPLIT_SIZES)
        for k, v in (split_sizes or {}).items():
            if k not in self.splits or int(v) < 1:
                raise ConfigurationError(f"split_sizes: unknown split {k!r} or size {v!r} < 1.")
            self.split_sizes[k] = int(v)
        self.include_system = bool(system_prompt)
        self.lenient = bool(lenient)
        if action_mode == "text":
            self.tools.remove("take_action")
        self._handlers = {
            "go": self._cmd_go, "open": self._cmd_open, "close": self._cmd_close, "take": self._cmd_take,
            "examine": self._cmd_examine, "use": self._cmd_use,
            "clean": self._cmd_clean, "heat": self._cmd_heat, "cool": self._cmd_cool,
            "inventory": self._cmd_inventory, "look": self._cmd_look,
        }
        if self.lenient:  # AgentBench-style prompts also say "toggle {obj} {recep}"
            self._handlers["toggle"] = self._cmd_toggle
        if grammar == "classic":
            self._handlers["put"] = self._cmd_put
        else:
            self._handlers["move"] = self._cmd_move
            self._handlers["help"] = self._cmd_help
        self._tasks: dict[str, list[TaskSpec]] = {}
        self._receps: dict[str, _Recep] = {}
        self._objs: dict[str, _Obj] = {}
        self._order: list[_Recep] = []
        self._at: _Recep | None = None
        self._held: _Obj | None = None
        self._adm: list[str] | None = None
        self._goto_all: list[str] = []
        self._spec: S.SceneSpec | None = None
        self._won = False
        self._texts: list[str] = []  # every observation text shown this episode, for the observer
        self._observer: ObservationExpert | None = None
        self._observed = 0

    # ------------------------------------------------------------------------------- tasks
    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        """The split's generated tasks (ALFWorld's game counts by default)."""
        if split not in self.splits:
            return []
        if split not in self._tasks:
            goals = S.split_goals(split, self.split_sizes[split])
            self._tasks[split] = [
                TaskSpec(f"{split}/{g['name']}", split, g["task_type"], dict(g)) for g in goals
            ]
        return self._tasks[split]

    @staticmethod
    def task_from_scene(source: Any) -> TaskSpec:
        """A :class:`TaskSpec` for an explicit scene (a path, JSON string, dict or SceneSpec)."""
        spec = S.load_scene(source)
        data = spec.model_dump(exclude_none=True)
        key = json.dumps(data, sort_keys=True)
        tid = spec.name or f"scene-{zlib.crc32(key.encode()):08x}"
        return TaskSpec(f"scene/{tid}", "scene", spec.goal.task_type, {"scene": data})

    def _select_task(self, options: dict[str, Any] | None) -> TaskSpec:
        if options and options.get("scene") is not None:
            return self.task_from_scene(options["scene"])
        return super()._select_task(options)

    def scene_spec(self) -> S.SceneSpec:
        """The current episode's scene as it was at reset (save it with :func:`save_scene`)."""
        if self._spec is None:
            raise ConfigurationError("scene_spec() needs a reset() first.")
        return self._spec

    def save_scene(self, path: str | Path) -> None:
        """Write the current episode's starting scene as JSON."""
        S.save_scene(self.scene_spec(), path)

    # ------------------------------------------------------------------------------- reset
    def system_prompt(self) -> str:
        put = "put {obj} in/on {recep}" if self.grammar == "classic" else "move {obj} to {recep}"
        if self.compact:
            how = "Call take_action with one command per turn" if self.action_mode == "tool" else "One command per turn"
            return (
                f"Household task. {how}: go to R, open R, close R, take O from R, "
                f"{'put O in/on R' if self.grammar == 'classic' else 'move O to R'}, "
                "use O, clean/heat/cool O with R, examine O, inventory, look. Names exactly as shown."
            )
        how = (
            "Call the take_action tool with exactly one command per turn."
            if self.action_mode == "tool"
            else "Reply with exactly one command per turn, optionally after a thought: "
            "'Thought: ...' then 'Action: <command>'."
        )
        return (
            "You are in a household and must complete the task given in the first observation. "
            f"{how} Available commands: go to {{recep}}; open {{recep}}; close {{recep}}; "
            f"take {{obj}} from {{recep}}; {put}; use {{lamp}}; clean {{obj}} with {{recep}}; "
            "heat {obj} with {recep}; cool {obj} with {recep}; examine {obj or recep}; inventory; look. "
            "Use the exact names from the observations (e.g. 'cabinet 1'). "
            "A command that cannot be carried out gives 'Nothing happens.'"
        )

    def reset_task(self, task: TaskSpec) -> list[Message]:
        data = task.data
        spec = S.load_scene(data["scene"]) if "scene" in data else S.generate_scene(data)
        self._build(spec)
        intro = self._intro()
        task_line = f"{'Task' if self.compact else 'Your task is to'}: {spec.goal.description}"
        if self.obs_style == "raw":
            text = f"{_WELCOME}\n\n{intro}\n\n{task_line}"
        else:
            text = f"{intro}\n{task_line}"
        self._texts = [text]
        self._observer = None
        self._observed = 0
        msgs: list[Message] = []
        if self.include_system:
            msgs.append({"role": "system", "content": self.system_prompt()})
        msgs.append({"role": "user", "content": text})
        return msgs

    def _build(self, spec: S.SceneSpec) -> None:
        self._spec = spec
        self._receps = {}
        self._objs = {}
        self._order = []
        for i, r in enumerate(sorted(spec.receptacles, key=lambda r: _name_key(r.name))):
            assert r.type is not None
            rec = _Recep(r.name, r.type, bool(r.openable), bool(r.open or not r.openable), r.loc or i + 1, i)
            self._receps[r.name] = rec
            self._order.append(rec)
            for c in r.contents:
                assert isinstance(c, S.ObjectSpec) and c.type is not None
                o = _Obj(c.name, c.type, c.clean, c.hot, c.cool, c.on)
                o.recep = rec
                rec.contents.append(o)
                self._objs[c.name] = o
            rec.contents.sort(key=_key)
        g = spec.goal
        self._gtype = g.task_type
        self._gobj = g.object
        self._grecep = g.receptacle
        self._glamp = g.lamp
        self._gneed = 2 if g.task_type == "pick_two_obj_and_place" else 1
        self._gstate = V.APPLIANCE[g.task_type][1] if g.task_type in V.APPLIANCE else None
        self._targets = [r for r in self._order if r.rtype == g.receptacle]
        self._lamps = [o for o in self._objs.values() if o.otype == g.lamp]
        self._at = None
        self._held = None
        self._adm = None
        self._won = False
        self._goto_all = ["go to " + r.name for r in self._order]

    def _intro(self) -> str:
        if self.compact:
            return "You see: " + ", ".join(r.name for r in self._order) + "."
        return "You are in the middle of a room. Looking quickly around you, you see " + \
            _listing_names([r.name for r in self._order]) + "."

    # ------------------------------------------------------------------------------- acting
    @tool
    def take_action(self, action: str) -> str:
        """Take one action in the household, e.g. "go to cabinet 1" or "take apple 1 from countertop 1".

        Args:
            action: One ALFWorld command, with object and receptacle names exactly as observed.

        Returns:
            The observation after the action ("Nothing happens." if it could not be carried out).
        """
        return self._execute(action)

    def on_command(self, command: str) -> StepResult:
        if self.action_mode == "tool":
            return super().on_command(command)
        return StepResult([{"role": "user", "content": self._execute(command)}])

    def run_tool_calls(self, calls: list[Any]) -> StepResult:
        if self.action_mode == "tool":
            return super().run_tool_calls(calls)
        # text mode has no tools: "name[arg]" or structured calls are just unknown commands
        self.count("invalid_actions")
        return StepResult([{"role": "user", "content": NOTHING}])

    def on_text(self, text: str) -> StepResult:
        if self.action_mode == "tool":
            return super().on_text(text)
        return StepResult([{"role": "user", "content": self._execute(text)}])

    def _execute(self, command: str) -> str:
        """Run one command and return its observation; never raises for the agent's input."""
        cmd = command.strip()  # ALFWorld matches the stripped command exactly
        if self.lenient:
            cmd = " ".join(cmd.lower().split())
            if cmd.endswith("."):
                cmd = cmd[:-1].rstrip()
        if cmd.startswith("think:"):
            return "OK."
        verb, _, rest = cmd.partition(" ")
        handler = self._handlers.get(verb)
        out = handler(rest) if handler is not None else None
        if out is None:
            self.count("invalid_actions")
            out = NOTHING
        self._texts.append(out)
        return out

    def _done_check(self) -> None:
        if not self._won and self._goal_met():
            self._won = True
            self.finish(1.0, True)

    def _goal_met(self) -> bool:
        if self._gtype == "look_at_obj_in_light":
            h = self._held
            at = self._at
            if h is None or at is None or h.otype != self._gobj:
                return False
            return any(lamp.on and lamp.recep is at for lamp in self._lamps)
        for r in self._targets:
            n = 0
            for o in r.contents:
                if o.otype == self._gobj and self._treated(o):
                    n += 1
            if n >= self._gneed:
                return True
        return False

    def _treated(self, o: _Obj) -> bool:
        st = self._gstate
        if st is None:
            return True
        return o.clean if st == "clean" else o.hot if st == "heat" else o.cool

    # commands: each returns the observation, or None for "Nothing happens."
    def _describe(self, r: _Recep) -> str:
        if self.compact:
            if r.openable and not r.opened:
                return f"{r.name}: closed."
            return f"{r.name}: {', '.join(o.name for o in r.contents) or 'nothing'}."
        if r.openable:
            if not r.opened:
                return f"The {r.name} is closed."
            return f"The {r.name} is open. In it, you see {_listing(r.contents)}."
        return f"On the {r.name}, you see {_listing(r.contents)}."

    def _here(self, name: str) -> _Recep | None:
        r = self._at
        return r if r is not None and r.name == name else None

    def _cmd_go(self, rest: str) -> str | None:
        if not rest.startswith("to "):
            return None
        r = self._receps.get(rest[3:])
        if r is None:
            return None
        if r is self._at:
            return None  # ALFWorld offers no "go to" the current receptacle
        self._at = r
        self._adm = None
        if self._gtype == "look_at_obj_in_light":
            self._done_check()
        desc = self._describe(r)
        if self.compact:
            return desc
        if self.grammar == "v0.4":  # "You arrive at cabinet 1." survives the harnesses' clean-up
            return f"You arrive at {r.name}. {desc}"
        if self.obs_style == "raw":
            return f"You arrive at loc {r.loc}. {desc}"
        return desc

    def _cmd_open(self, rest: str) -> str | None:
        r = self._here(rest)
        if r is None or not r.openable or r.opened:
            return None
        r.opened = True
        self._adm = None
        if self.compact:
            return self._describe(r)
        return f"You open the {r.name}. {self._describe(r)}"

    def _cmd_close(self, rest: str) -> str | None:
        r = self._here(rest)
        if r is None or not r.openable or not r.opened:
            return None
        r.opened = False
        self._adm = None
        return f"Closed {r.name}." if self.compact else f"You close the {r.name}."

    def _cmd_take(self, rest: str) -> str | None:
        oname, sep, rname = rest.partition(" from ")
        if not sep or self._held is not None:
            return None
        r = self._here(rname)
        o = self._objs.get(oname)
        if r is None or o is None or o.recep is not r or not r.opened or not o.pickupable:
            return None
        r.contents.remove(o)
        o.recep = None
        self._held = o
        self._adm = None
        self._done_check()
        return f"Took {o.name}." if self.compact else f"You pick up the {o.name} from the {r.name}."

    def _place(self, oname: str, rname: str) -> tuple[_Obj, _Recep] | None:
        o = self._held
        if o is None or o.name != oname:
            return None
        r = self._here(rname)
        if r is None or not r.opened or o.otype not in r.accepts:
            return None
        r.contents.append(o)
        r.contents.sort(key=_key)
        o.recep = r
        self._held = None
        self._adm = None
        self._done_check()
        return o, r

    def _cmd_put(self, rest: str) -> str | None:
        oname, sep, rname = rest.partition(" in/on ")
        if not sep:
            return None
        res = self._place(oname, rname)
        if res is None:
            return None
        return f"Put {res[0].name}." if self.compact else f"You put the {res[0].name} in/on the {res[1].name}."

    def _cmd_move(self, rest: str) -> str | None:
        oname, sep, rname = rest.partition(" to ")
        if not sep:
            return None
        res = self._place(oname, rname)
        if res is None:
            return None
        return f"Put {res[0].name}." if self.compact else f"You move the {res[0].name} to the {res[1].name}."

    def _transform(self, rest: str, rtype: str) -> tuple[_Obj, _Recep] | None:
        oname, sep, rname = rest.partition(" with ")
        o = self._held
        if not sep or o is None or o.name != oname:
            return None
        r = self._here(rname)
        if r is None or r.rtype != rtype:
            return None
        return o, r

    def _cmd_clean(self, rest: str) -> str | None:
        res = self._transform(rest, "SinkBasin")
        if res is None or res[0].otype not in V.CLEANABLE:
            return None
        res[0].clean = True
        return self._treated_text("Cleaned", "clean", res)

    def _cmd_heat(self, rest: str) -> str | None:
        res = self._transform(rest, "Microwave")
        if res is None or res[0].otype not in V.HEATABLE:
            return None
        res[0].hot, res[0].cool = True, False
        return self._treated_text("Heated", "heat", res)

    def _cmd_cool(self, rest: str) -> str | None:
        res = self._transform(rest, "Fridge")
        if res is None or res[0].otype not in V.COOLABLE:
            return None
        res[0].cool, res[0].hot = True, False
        return self._treated_text("Cooled", "cool", res)

    def _treated_text(self, done: str, verb: str, res: tuple[_Obj, _Recep]) -> str:
        if self.compact:
            return f"{done} {res[0].name}."
        return f"You {verb} the {res[0].name} using the {res[1].name}."

    def _cmd_use(self, rest: str) -> str | None:
        o = self._objs.get(rest)
        if o is None or o.recep is None or o.recep is not self._at:
            return None
        if not o.toggleable:
            return f"No switch on {o.name}." if self.compact else f"You don't see any switch on the {o.name}."
        o.on = True
        self._done_check()
        return f"Turned on {o.name}." if self.compact else f"You turn on the {o.name}."

    def _cmd_toggle(self, rest: str) -> str | None:
        at = self._at
        if at is not None and rest.endswith(" " + at.name):
            rest = rest[: -len(at.name) - 1]
        return self._cmd_use(rest)

    def _cmd_examine(self, rest: str) -> str | None:
        r = self._here(rest)
        if r is not None:
            return self._describe(r)
        o = self._objs.get(rest)
        if o is None:
            return None
        if o is not self._held:  # ALFWorld examines only the object in hand
            return None
        n = o.name
        if o.otype in V.RECEPTACLE_OBJECTS:
            return f"This is a normal {n}. In it, you see nothing."
        if o.clean and o.hot:
            return f"This is a hot and clean {n}."
        if o.clean and o.cool:
            return f"This is a cool and clean {n}."
        if o.hot:
            return f"This is a hot {n}."
        if o.clean:
            return f"This is a clean {n}."
        if o.cool:
            return f"This is a cold {n}."
        if o.toggleable:
            return f"This {n} is on." if o.on else f"This {n} is off."
        return f"There's nothing special about {n}."

    def _cmd_inventory(self, rest: str) -> str | None:
        if rest:
            return None
        if self._held is None:
            return "Carrying nothing." if self.compact else "You are not carrying anything."
        return f"Carrying: {self._held.name}." if self.compact else f"You are carrying: a {self._held.name}."

    def _cmd_look(self, rest: str) -> str | None:
        if rest:
            return None
        if self.compact:
            return "You see: nothing." if self._at is None else f"At {self._at.name}."
        if self._at is None:
            # ALFWorld's look rule lists the receptacles at the agent's location: none at the start
            return "You are in the middle of a room. Looking quickly around you, you see nothing."
        return f"You are facing the {self._at.name}. Next to it, you see nothing."

    def _cmd_help(self, rest: str) -> str | None:
        if rest:
            return None
        return (
            "Available commands:\n  look:                             look around your current location\n"
            "  inventory:                        check your current inventory\n"
            "  go to (receptacle):               move to a receptacle\n"
            "  open (receptacle):                open a receptacle\n"
            "  close (receptacle):               close a receptacle\n"
            "  take (object) from (receptacle):  take an object from a receptacle\n"
            "  move (object) to (receptacle):  place an object in or on a receptacle\n"
            "  examine (something):              examine a receptacle or an object\n"
            "  use (object):                     use an object\n"
            "  heat (object) with (receptacle):  heat an object using a receptacle\n"
            "  clean (object) with (receptacle): clean an object using a receptacle\n"
            "  cool (object) with (receptacle):  cool an object using a receptacle\n"
            "  slice (object) with (object):     slice an object using a sharp object\n"
        )

    # ------------------------------------------------------------------------------- admissible
    def admissible_actions(self) -> list[str] | None:
        """ALFWorld's admissible commands in the current state (a fresh list each call)."""
        if self._adm is None:
            self._adm = self._compute_admissible()
        return self._adm[:]

    def _compute_admissible(self) -> list[str]:
        cur = self._at
        held = self._held
        if cur is None:
            adm = self._goto_all[:]
        else:
            i = cur.idx
            adm = self._goto_all[:i] + self._goto_all[i + 1:]
            name = cur.name
            if cur.openable:
                adm.append(("close " if cur.opened else "open ") + name)
            if cur.opened:
                for o in cur.contents:
                    if o.toggleable:
                        adm.append("use " + o.name)
                    elif held is None and o.pickupable:
                        adm.append(f"take {o.name} from {name}")
                if held is not None and held.otype in cur.accepts:
                    if self.grammar == "classic":
                        adm.append(f"put {held.name} in/on {name}")
                    else:
                        adm.append(f"move {held.name} to {name}")
            if held is not None:
                verb = _APPLIANCE_VERB.get(cur.rtype)
                if verb is not None and held.otype in (
                    V.CLEANABLE if verb == "clean" else V.HEATABLE if verb == "heat" else V.COOLABLE
                ):
                    adm.append(f"{verb} {held.name} with {name}")
            adm.append("examine " + name)
        if held is not None:
            adm.append("examine " + held.name)
        if self.grammar == "classic":
            adm.append("inventory")
            adm.append("look")
            return adm
        adm += ("help", "inventory", "look")
        adm.sort()  # alfworld 0.4 (TextWorld) lists them sorted
        return adm

    # ------------------------------------------------------------------------------- expert
    def expert_action(self) -> Any:
        """The expert's next action (a command, wrapped for the tool mode's parser).

        The ``expert`` kwarg picks which: the observation-only expert (default) or the planner.
        """
        if self._state != "running":
            return None
        cmd = self.expert_command()
        if self.action_mode == "text":
            return cmd
        call = {"name": "take_action", "arguments": {"action": cmd}}
        pname = self.parser.name
        if pname == "hermes":
            return f"<tool_call>{json.dumps(call)}</tool_call>"
        if pname == "react":
            return f"Action: take_action[{cmd}]"
        if pname == "json":
            return json.dumps(call)
        return {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", **call}]}

    def expert_command(self) -> str:
        """The next command of the expert the ``expert`` kwarg names."""
        if self.expert == "planner":
            return self.planner_command()
        return self.observer_command()

    def observer_command(self) -> str:
        """The next command of the observation-only expert: a function of this episode's observations.

        It reads the observation texts the agent was shown (the opening one, then each command's
        feedback) and nothing else; see :mod:`agentgym.envs.alfworld.observer`.
        """
        ob = self._observer
        if ob is None:
            g = self._spec.goal if self._spec is not None else None
            # the goal the task sentence states, for a scene whose own wording the observer cannot parse
            hint = Goal(g.task_type, g.object, g.receptacle, g.lamp) if g is not None else None
            ob = self._observer = ObservationExpert(self.grammar, hint)
        texts = self._texts
        while self._observed < len(texts):
            ob.observe(texts[self._observed])
            self._observed += 1
        return ob.command()

    def planner_command(self) -> str:
        """The next command of a planner that sees the whole state; it solves every task."""
        held, cur = self._held, self._at
        g = self._gobj
        if self._gtype == "look_at_obj_in_light":
            if held is not None and held.otype != g:
                return self._drop(held)
            if held is None:
                return self._fetch([o for o in self._objs.values() if o.otype == g])
            lamp = next((lp for lp in self._lamps if lp.recep is not None), None)
            if lamp is None or lamp.recep is None:
                return "look"
            if cur is not lamp.recep:
                return self._go(lamp.recep)
            return "use " + lamp.name
        # choose the target receptacle: the one holding most finished goal objects
        best = max(self._targets, key=lambda r: sum(o.otype == g and self._treated(o) for o in r.contents))
        done_here = [o for o in best.contents if o.otype == g and self._treated(o)]
        if held is not None:
            if held.otype != g:
                return self._drop(held)
            if not self._treated(held):
                app_type, verb = V.APPLIANCE[self._gtype]
                app = next(r for r in self._order if r.rtype == app_type)
                if cur is not app:
                    return self._go(app)
                return f"{verb} {held.name} with {app.name}"
            return self._put_into(held, best)
        cands = [o for o in self._objs.values() if o.otype == g and o not in done_here and o.recep is not None]
        return self._fetch(cands)

    def _go(self, r: _Recep) -> str:
        return "go to " + r.name

    def _fetch(self, cands: list[_Obj]) -> str:
        cur = self._at
        cands = [o for o in cands if o.recep is not None and o.pickupable]
        if not cands:
            return "look"
        here = [o for o in cands if o.recep is cur]
        o = here[0] if here else cands[0]
        r = o.recep
        assert r is not None
        if r is not cur:
            return self._go(r)
        if not r.opened:
            return "open " + r.name
        return f"take {o.name} from {r.name}"

    def _put_into(self, o: _Obj, r: _Recep) -> str:
        if self._at is not r:
            return self._go(r)
        if not r.opened:
            return "open " + r.name
        if self.grammar == "classic":
            return f"put {o.name} in/on {r.name}"
        return f"move {o.name} to {r.name}"

    def _drop(self, o: _Obj) -> str:
        cur = self._at
        if cur is not None and o.otype in cur.accepts and cur.rtype != self._grecep:
            return self._put_into(o, cur)
        homes = [r for r in self._order if o.otype in r.accepts]
        home = next((r for r in homes if r.rtype != self._grecep), homes[0] if homes else None)
        if home is None:
            return "look"
        return self._put_into(o, home)


def _name_key(name: str) -> tuple[str, int]:
    word, _, num = name.rpartition(" ")
    return (word, -int(num))


def _key(o: _Obj) -> tuple[str, int]:
    return o.key


def _listing_names(names: list[str]) -> str:
    if len(names) == 1:
        return "a " + names[0]
    return ", ".join(["a " + n for n in names[:-1]]) + ", and a " + names[-1]

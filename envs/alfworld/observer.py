"""The observation-only expert: its next command is a function of the transcript's text alone.

:class:`ObservationExpert` reads the observations an agent is shown (the room listing and task
sentence, then each command's feedback) and keeps what they told it: where it is, what it holds,
what each receptacle it has looked into contained, which receptacles were closed, which objects
it cleaned, heated or cooled. It never sees the scene; it holds no reference to the engine.

Its policy, in order (one command per call):

1. **Holding something the task does not need**: put it down here if this open receptacle can
   hold it (and is not of the task's target type), else take it back where it came from.
2. **Holding the task's object**: if the task needs it cleaned/heated/cooled and this transcript
   has not shown that, go to the first sink basin/microwave/fridge of the listing and do it; then
   go to the target (open it if it shows closed) and put it there. For a look-at task: go to
   where a lamp of the goal's type was seen and ``use`` it (search the lamp's homes first if none
   was seen yet).
3. **Hands empty**: take a goal object seen earlier (one here first, else the first receptacle
   of the listing that showed one; never one already finished in the target), going there and
   opening it as needed.
4. **Otherwise search**: the next receptacle, in :func:`search_order`, whose contents this
   transcript has not shown: go to it, open it if it shows closed.

The search order is the one learnable rule: of the listed receptacles, those whose type can hold
the sought object type (ALFWorld's own ``VAL_RECEPTACLE_OBJECTS``, ``vocab.RECEPTACLE_TYPES``, and
the start homes of lamps and fixtures, ``vocab.START_HOMES``); open surfaces before receptacles
that open (one step to look instead of two); receptacles of the task's target type last (a
generated task never starts its object there); ties in the room listing's order. The native
generator places each object uniformly over the receptacles that can hold it, so every candidate
is equally likely and cheaper looks come first; the others are never searched (they cannot hold
the object) unless every candidate was searched without finding it.

Which target: the target-type receptacle the transcript shows holding most finished goal
objects, else the first of its type in the listing. Commands follow the env's grammar
(``put X in/on Y`` or ``move X to Y``). It parses every observation style the env writes
(``react``, ``raw``, ``compact``); an unparsed observation changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from agentgym.envs.alfworld import vocab as V

__all__ = ["Goal", "ObservationExpert", "can_hold", "can_put", "parse_goal", "search_order"]

_APPLIANCE_STATE = {"clean": ("SinkBasin", "clean"), "heat": ("Microwave", "heat"), "cool": ("Fridge", "cool")}
_NAME = r"[a-z]+ \d+"
_ITEM = re.compile(r"(?:^|, |and )a ([a-z]+ \d+)")
_LOWER_TYPES = {t.lower(): t for t in V.OBJECT_TYPES | set(V.RECEPTACLE_TYPES)}


@dataclass(frozen=True)
class Goal:
    """A task as its sentence states it: the task type, the object type, the target or lamp type."""

    task_type: str
    object: str
    receptacle: str | None = None
    lamp: str | None = None


def _goal_patterns() -> list[tuple[re.Pattern[str], str]]:
    out = []
    for task_type, templates in V.GOAL_TEMPLATES.items():
        for tpl in templates:
            rx = re.escape(tpl).replace(r"\{o\}", "(?P<o>[a-z]+)").replace(r"\{r\}", "(?P<r>[a-z]+)")
            rx = rx.replace(r"\{l\}", "(?P<l>[a-z]+)")
            out.append((re.compile(rx + "$"), task_type))
    return out


_GOALS = _goal_patterns()


def parse_goal(sentence: str) -> Goal | None:
    """The goal an ALFWorld task sentence states (``"put a clean lettuce in diningtable."``), or ``None``."""
    s = sentence.strip()
    for rx, task_type in _GOALS:
        m = rx.match(s)
        if m is None:
            continue
        groups = m.groupdict()
        obj = _LOWER_TYPES.get(groups["o"])
        rec = _LOWER_TYPES.get(groups["r"]) if groups.get("r") else None
        lamp = _LOWER_TYPES.get(groups["l"]) if groups.get("l") else None
        if obj is None or (groups.get("r") and rec is None) or (groups.get("l") and lamp is None):
            return None
        return Goal(task_type, obj, rec, lamp)
    return None


def _type(name: str) -> str | None:
    return _LOWER_TYPES.get(name.rsplit(" ", 1)[0])


@cache
def can_hold(rtype: str, otype: str) -> bool:
    """Whether an ``otype`` can be found on a ``rtype`` (ALFWorld's tables, and where lamps and fixtures stand)."""
    return can_put(rtype, otype) or rtype in V.START_HOMES.get(otype, ())


@cache
def can_put(rtype: str, otype: str) -> bool:
    """Whether an ``otype`` can be put in or on a ``rtype`` (ALFWorld's ``VAL_RECEPTACLE_OBJECTS``)."""
    return otype in V.RECEPTACLE_TYPES.get(rtype, frozenset())


def search_order(receptacles: Iterable[str], otype: str, target: str | None) -> list[str]:
    """The receptacles (names, in listing order) to look into for an ``otype``, in the order to do it.

    Those that can hold the type, open surfaces first, the target type last, then the listing's
    order; then the rest, in listing order.
    """
    names = list(receptacles)
    ranked = []
    for i, n in enumerate(names):
        rt = _type(n) or ""
        if not can_hold(rt, otype):
            continue
        ranked.append(((rt == target, rt in V.OPENABLE, i), n))
    ranked.sort()
    first = [n for _, n in ranked]
    chosen = set(first)
    return first + [n for n in names if n not in chosen]


class ObservationExpert:
    """The observation-only expert (see the module docstring).

    Args:
        grammar: ``"classic"`` (``put X in/on Y``) or ``"v0.4"`` (``move X to Y``).
        goal: The goal to use if the task sentence is none of ALFWorld's phrasings (a scene spec's
            own ``description``); a parsed sentence always wins.

    Feed it every observation text, in order (:meth:`observe`), and ask :meth:`command`.
    """

    def __init__(self, grammar: str = "classic", goal: Goal | None = None) -> None:
        self.grammar = grammar
        self.goal: Goal | None = goal
        self.receptacles: list[str] = []
        self._index: dict[str, int] = {}
        self.at: str | None = None
        self.held: str | None = None
        self.held_from: str | None = None
        self.contents: dict[str, list[str]] = {}  # receptacle -> what it last showed holding
        self.closed: dict[str, bool] = {}  # receptacle -> shown closed (True) or open/surface (False)
        self.states: dict[str, set[str]] = {"clean": set(), "heat": set(), "cool": set()}
        self.lamps_on: set[str] = set()
        self._orders: dict[str, list[str]] = {}
        self._search_pos: dict[str, int] = {}  # how far each search order is known to be looked into
        self._word_at: dict[str, set[str]] = {}  # object word ("mug ") -> receptacles last showing one
        self._targets: list[str] | None = None

    @classmethod
    def from_transcript(cls, texts: Iterable[str], grammar: str = "classic", goal: Goal | None = None) -> ObservationExpert:
        """An expert that has read ``texts`` (the observations, first to last)."""
        ex = cls(grammar, goal)
        for t in texts:
            ex.observe(t)
        return ex

    # ------------------------------------------------------------------------------ reading
    def observe(self, text: str) -> None:
        """Read one observation (the env's feedback to one command, or the opening observation)."""
        for line in text.strip().split("\n"):
            self._line(line.strip())

    def _line(self, s: str) -> None:
        if not s:
            return
        if s.startswith("You arrive at "):  # raw ("loc 5. ") and v0.4 ("cabinet 1. ") prefixes
            s = s[s.find(". ") + 2:] if ". " in s else ""
            if not s:
                return
        if s.startswith(("Your task is to: ", "Task: ")):
            goal = parse_goal(s.partition(": ")[2])
            if goal is not None:
                self.goal = goal
                self._targets = None
            return
        for prefix in ("You are in the middle of a room. Looking quickly around you, you see ", "You see: "):
            if s.startswith(prefix):
                names = _items(s[len(prefix):]) if prefix.startswith("You are") else _plain(s[len(prefix):])
                if not self.receptacles and names:
                    self.receptacles = names
                    self._targets = None
                    self._index = {n: i for i, n in enumerate(names)}
                if not names:
                    self.at = None
                return
        sp = s.find(" ")
        key = s[:sp]
        if key == "You":
            key = s[: s.find(" ", sp + 1)]
        for rx, kind in _DISPATCH.get(key, _DISPATCH["*"]):
            m = rx.match(s)
            if m is None:
                continue
            g = m.groupdict()
            if kind == "shown":
                self._saw(g["r"], False, _items(g["l"]))
            elif kind == "closed":
                self._saw(g["r"], True, None)
            elif kind == "compact":
                lst = g["l"]
                self._saw(g["r"], lst == "closed.", None if lst == "closed." else _plain(lst))
            else:
                self._event(kind, g)
            return

    def _saw(self, r: str, closed: bool, items: list[str] | None) -> None:
        if r not in self._index:
            return
        self.at = r
        self.closed[r] = closed
        if items is not None:
            for o in self.contents.get(r, ()):
                self._word_at.get(_word(o), set()).discard(r)
            self.contents[r] = items
            for o in items:
                self._word_at.setdefault(_word(o), set()).add(r)

    def _event(self, kind: str, g: dict[str, str]) -> None:
        o, r = g.get("o"), g.get("r") or self.at
        if kind == "take" and o is not None:
            self.held, self.held_from = o, r
            if r is not None:
                self.at = r
                items = self.contents.get(r)
                if items is not None and o in items:
                    items.remove(o)
                    w = _word(o)
                    if not any(x.startswith(w) for x in items):
                        self._word_at[w].discard(r)
        elif kind == "put" and o is not None and r is not None:
            self.at = r
            self.contents.setdefault(r, []).append(o)
            self._word_at.setdefault(_word(o), set()).add(r)
            self.closed[r] = False
            if self.held == o:
                self.held = self.held_from = None
        elif kind in ("clean", "heat", "cool") and o is not None:
            if r is not None:
                self.at = r
            self.states[kind].add(o)
            if kind == "heat":
                self.states["cool"].discard(o)
            elif kind == "cool":
                self.states["heat"].discard(o)
        elif kind == "close" and r is not None:
            self.at = r
            self.closed[r] = True
        elif kind == "on" and o is not None:
            self.lamps_on.add(o)
        elif kind == "carry":
            self.held = o if o else None
        elif kind == "facing" and r is not None and r in self._index:
            self.at = r

    # ------------------------------------------------------------------------------ acting
    def command(self) -> str:
        """The next command."""
        g = self.goal
        if g is None or not self.receptacles:
            return "look"
        held = self.held
        if held is not None and _type(held) != g.object:
            return self._drop(held)
        if g.task_type == "look_at_obj_in_light":
            if held is None:
                return self._get(g.object, None)
            lamp_type = g.lamp or "DeskLamp"
            where = self._where(lamp_type, None)
            if where is None:
                return self._search(lamp_type, None)
            lamp, r = where
            if self.at != r:
                return "go to " + r
            return "use " + lamp
        assert g.receptacle is not None
        target = self._target()
        if held is not None:
            verb = V.APPLIANCE.get(g.task_type, (None, None))[1]
            if verb is not None and held not in self.states[verb]:
                app = next((r for r in self.receptacles if _type(r) == V.APPLIANCE[g.task_type][0]), None)
                if app is None:
                    return "look"
                if self.at != app:
                    return "go to " + app
                return f"{verb} {held} with {app}"
            return self._put(held, target)
        return self._get(g.object, set(self._finished(target)) or None)

    def _finished(self, r: str) -> list[str]:
        g = self.goal
        assert g is not None
        word = g.object.lower() + " "
        if r not in self._word_at.get(word, ()):
            return []
        verb = V.APPLIANCE.get(g.task_type, (None, None))[1]
        return [o for o in self.contents[r] if o.startswith(word) and (verb is None or o in self.states[verb])]

    def _target(self) -> str:
        g = self.goal
        assert g is not None and g.receptacle is not None
        targets = self._targets
        if targets is None:
            word = g.receptacle.lower() + " "
            targets = self._targets = [r for r in self.receptacles if r.startswith(word)]
        if len(targets) < 2:
            return targets[0] if targets else self.receptacles[0]
        return max(targets, key=lambda r: len(self._finished(r)))  # ties: the first in the listing

    def _where(self, otype: str, exclude: set[str] | None) -> tuple[str, str] | None:
        """A seen object of ``otype`` and its receptacle: one here first, else by listing order."""
        found = None
        best = len(self.receptacles)
        word = otype.lower() + " "
        index = self._index
        for r in self._word_at.get(word, ()):
            for o in self.contents[r]:
                if o.startswith(word) and (exclude is None or o not in exclude):
                    if r == self.at:
                        return o, r
                    i = index.get(r, best)
                    if i < best:
                        best, found = i, (o, r)
                    break
        return found

    def _get(self, otype: str, exclude: set[str] | None) -> str:
        where = self._where(otype, exclude)
        if where is None:
            return self._search(otype, self.goal.receptacle if self.goal else None)
        o, r = where
        if self.at != r:
            return "go to " + r
        if self.closed.get(r):
            return "open " + r
        return f"take {o} from {r}"

    def _search(self, otype: str, target: str | None) -> str:
        key = f"{otype}|{target}"
        order = self._orders.get(key)
        if order is None:
            order = self._orders[key] = search_order(self.receptacles, otype, target)
        i = self._search_pos.get(key, 0)
        while i < len(order) and order[i] in self.contents:  # what was looked into stays looked into
            i += 1
        self._search_pos[key] = i
        if i == len(order):
            return "look"
        r = order[i]
        if self.at != r:
            return "go to " + r
        return "open " + r  # here and its contents not shown: it showed closed

    def _put(self, o: str, r: str) -> str:
        if self.at != r:
            return "go to " + r
        if self.closed.get(r):
            return "open " + r
        if self.grammar == "classic":
            return f"put {o} in/on {r}"
        return f"move {o} to {r}"

    def _drop(self, o: str) -> str:
        ot = _type(o) or ""
        avoid = self.goal.receptacle if self.goal else None
        here = self.at
        if here is not None and self.closed.get(here) is False and (_type(here) or "") != avoid and \
                can_put(_type(here) or "", ot):
            return self._put(o, here)
        home = self.held_from
        if home is None or not can_put(_type(home) or "", ot):
            homes = [r for r in self.receptacles if can_put(_type(r) or "", ot)]
            home = next((r for r in homes if _type(r) != avoid), homes[0] if homes else None)
        if home is None:  # nothing takes it back (a teddy bear, a scrub brush): ALFWorld has no way out
            return "look"
        return self._put(o, home)


def _word(name: str) -> str:
    """``"mug 2"`` -> ``"mug "``."""
    return name[: name.rfind(" ") + 1]


def _items(listing: str) -> list[str]:
    """``"a mug 1, and a cup 2."`` -> ``["mug 1", "cup 2"]``; ``"nothing."`` -> ``[]``."""
    return _ITEM.findall(listing.rstrip(". "))


def _plain(listing: str) -> list[str]:
    """``"mug 1, cup 2."`` (the compact style) -> ``["mug 1", "cup 2"]``; ``"nothing."`` -> ``[]``."""
    s = listing.rstrip(". ")
    if not s or s == "nothing":
        return []
    return [p.strip() for p in s.split(",") if re.fullmatch(_NAME, p.strip())]


_N = _NAME
# (the line's first word, or "You" and the second; a pattern; what it tells) for every line the env writes
_PATTERNS: list[tuple[str, str, str]] = [
    ("You open", rf"You open the (?P<r>{_N})\. The (?:{_N}) is open\. In it, you see (?P<l>.*)$", "shown"),
    ("The", rf"The (?P<r>{_N}) is closed\.$", "closed"),
    ("The", rf"The (?P<r>{_N}) is open\. In it, you see (?P<l>.*)$", "shown"),
    ("On", rf"On the (?P<r>{_N}), you see (?P<l>.*)$", "shown"),
    ("You pick", rf"You pick up the (?P<o>{_N}) from the (?P<r>{_N})\.$", "take"),
    ("You put", rf"You put the (?P<o>{_N}) in/on the (?P<r>{_N})\.$", "put"),
    ("You move", rf"You move the (?P<o>{_N}) to the (?P<r>{_N})\.$", "put"),
    ("You clean", rf"You clean the (?P<o>{_N}) using the (?P<r>{_N})\.$", "clean"),
    ("You heat", rf"You heat the (?P<o>{_N}) using the (?P<r>{_N})\.$", "heat"),
    ("You cool", rf"You cool the (?P<o>{_N}) using the (?P<r>{_N})\.$", "cool"),
    ("You close", rf"You close the (?P<r>{_N})\.$", "close"),
    ("You turn", rf"You turn on the (?P<o>{_N})\.$", "on"),
    ("You are", rf"You are carrying: a (?P<o>{_N})\.$", "carry"),
    ("You are", r"You are not carrying anything\.$", "carry"),
    ("You are", rf"You are facing the (?P<r>{_N})\.", "facing"),
    # the compact style
    ("*", rf"(?P<r>{_N}): (?P<l>.*)$", "compact"),
    ("Took", rf"Took (?P<o>{_N})\.$", "take"),
    ("Put", rf"Put (?P<o>{_N})\.$", "put"),
    ("Cleaned", rf"Cleaned (?P<o>{_N})\.$", "clean"),
    ("Heated", rf"Heated (?P<o>{_N})\.$", "heat"),
    ("Cooled", rf"Cooled (?P<o>{_N})\.$", "cool"),
    ("Closed", rf"Closed (?P<r>{_N})\.$", "close"),
    ("Turned", rf"Turned on (?P<o>{_N})\.$", "on"),
    ("Carrying", rf"Carrying: (?P<o>{_N})\.$", "carry"),
    ("Carrying", r"Carrying nothing\.$", "carry"),
    ("At", rf"At (?P<r>{_N})\.$", "facing"),
]
_DISPATCH: dict[str, list[tuple[re.Pattern[str], str]]] = {}
for _key, _rx, _kind in _PATTERNS:
    _DISPATCH.setdefault(_key, []).append((re.compile(_rx), _kind))

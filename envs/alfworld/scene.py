"""Scenes: the JSON scene spec (pydantic), and seeded generation of ALFWorld-like tasks.

A scene is a list of receptacles with their contents, plus a goal::

    {
      "version": 1,
      "receptacles": [
        {"name": "countertop 1", "contents": ["apple 1", {"name": "mug 1", "hot": true}]},
        {"name": "fridge 1", "open": false, "contents": ["egg 2"]},
        {"name": "microwave 1"}
      ],
      "goal": {"task_type": "pick_heat_then_place_in_recep", "object": "Apple", "receptacle": "CounterTop"}
    }

Types are inferred from names (``"sinkbasin 1"`` -> ``SinkBasin``) unless given. A receptacle's
``openable`` defaults to its type's (ALFWorld's openable classes: cabinet, drawer, fridge,
microwave, safe) and ``open`` to ``false`` (ALFWorld's games start with everything closed); a spec
may state either, e.g. a cabinet without doors (``"openable": false``: "On the cabinet 3, you
see..."). The goal's wording is ALFWorld's: ``template`` picks one of its two phrasings per task
type (``0`` by default) and ``description`` replaces it with any sentence. A look-at goal's
``lamp`` defaults to the scene's only lamp type. Receptacles are listed in the order the opening
observation names them.

Generated tasks follow ALFRED's layout: a floorplan (room) fixes the receptacles, a goal
(task type, object type, target type) is drawn per task, and each trial places objects with its
own seed. ``valid_unseen`` uses ALFRED's unseen floorplans and (task, object, receptacle)
combinations that ``train`` and ``valid_seen`` never use.
"""

from __future__ import annotations

import json
import random
import re
import zlib
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, Literal

import pydantic
from agentgym.envs.alfworld import vocab as V

from agentgym.errors import ValidationError

__all__ = [
    "SPLIT_SIZES",
    "GoalSpec",
    "ObjectSpec",
    "ReceptacleSpec",
    "SceneSpec",
    "floorplan_lamps",
    "generate_scene",
    "goal_description",
    "is_unseen_combo",
    "layout",
    "load_scene",
    "save_scene",
    "split_goals",
]

# ALFWorld's game counts per split.
SPLIT_SIZES: dict[str, int] = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
_SPLIT_SEED = {"train": 0, "valid_seen": 10_000_000, "valid_unseen": 20_000_000}

TaskType = Literal[
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
]


# ---------------------------------------------------------------------------------------- spec
class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")


_NAME = r"^[a-z][a-z]* [0-9]+$"
_NAME_RE = re.compile(_NAME)


class ObjectSpec(_Model):
    """An object instance, e.g. ``{"name": "apple 1", "hot": true}``."""

    name: str = pydantic.Field(pattern=_NAME)
    type: str | None = None
    clean: bool = False
    hot: bool = False
    cool: bool = False
    on: bool = False


class ReceptacleSpec(_Model):
    """A receptacle with its contents (object names or :class:`ObjectSpec`)."""

    name: str = pydantic.Field(pattern=_NAME)
    type: str | None = None
    openable: bool | None = None
    open: bool = False
    loc: int | None = None
    contents: list[str | ObjectSpec] = pydantic.Field(default_factory=list)


class GoalSpec(_Model):
    """The task: its type, the object type, the target receptacle type (or the lamp type)."""

    task_type: TaskType
    object: str
    receptacle: str | None = None
    lamp: str | None = None
    template: int | None = pydantic.Field(default=None, ge=0, le=1)
    description: str | None = None


class SceneSpec(_Model):
    """A whole scene: receptacles (in the order the opening observation lists them) and a goal."""

    version: Literal[1] = 1
    name: str | None = None
    floorplan: int | None = None
    receptacles: list[ReceptacleSpec] = pydantic.Field(min_length=1)
    goal: GoalSpec

    @pydantic.model_validator(mode="after")
    def _check(self) -> SceneSpec:
        names: set[str] = set()
        rtypes: set[str] = set()
        otypes: dict[str, str] = {}
        for i, r in enumerate(self.receptacles):
            if r.loc is None:
                r.loc = i + 1
            rt = r.type or V.type_from_name(r.name)
            if rt not in V.RECEPTACLE_TYPES:
                raise ValueError(
                    f"receptacle {r.name!r}: unknown receptacle type {rt or r.name!r}; "
                    f"known types: {', '.join(sorted(V.RECEPTACLE_TYPES))}"
                )
            r.type = rt
            if r.openable is None:
                r.openable = rt in V.OPENABLE
            if r.open and not r.openable:
                raise ValueError(f"receptacle {r.name!r}: open is true but it is not openable")
            if r.name in names:
                raise ValueError(f"duplicate name {r.name!r}")
            names.add(r.name)
            rtypes.add(rt)
            for i, c in enumerate(r.contents):
                if isinstance(c, str):
                    if not _NAME_RE.match(c):
                        raise ValueError(f"object name {c!r} in {r.name!r} must look like 'apple 1'")
                    o = ObjectSpec(name=c)
                else:
                    o = c
                ot = o.type or V.type_from_name(o.name)
                if ot not in V.OBJECT_TYPES:
                    raise ValueError(
                        f"object {o.name!r} in {r.name!r}: unknown object type {ot or o.name!r}; "
                        f"known types: {', '.join(sorted(V.OBJECT_TYPES))}"
                    )
                o.type = ot
                if o.name in names:
                    raise ValueError(f"duplicate name {o.name!r}")
                names.add(o.name)
                otypes[o.name] = ot
                r.contents[i] = o
        g = self.goal
        g.object = _canon(g.object, V.OBJECT_TYPES, "goal.object")
        if g.object not in V.PICKUPABLE:
            raise ValueError(f"goal.object {g.object!r}: not an object one can take")
        if g.object not in otypes.values():
            raise ValueError(f"goal.object {g.object!r}: the scene has no object of that type")
        if g.task_type == "look_at_obj_in_light":
            lamps = sorted(set(otypes.values()) & V.TOGGLEABLE)
            g.lamp = _canon(g.lamp or (lamps[0] if len(lamps) == 1 else "DeskLamp"), V.TOGGLEABLE, "goal.lamp")
            if g.lamp not in otypes.values():
                raise ValueError(f"goal.lamp {g.lamp!r}: the scene has no lamp of that type")
            g.receptacle = None
        else:
            if g.receptacle is None:
                raise ValueError(f"goal.receptacle is required for {g.task_type}")
            g.receptacle = _canon(g.receptacle, set(V.RECEPTACLE_TYPES), "goal.receptacle")
            if g.receptacle not in rtypes:
                raise ValueError(f"goal.receptacle {g.receptacle!r}: the scene has no receptacle of that type")
            g.lamp = None
        if g.task_type in V.APPLIANCE and V.APPLIANCE[g.task_type][0] not in rtypes:
            raise ValueError(f"{g.task_type} needs a {V.APPLIANCE[g.task_type][0].lower()} in the scene")
        if g.task_type == "pick_two_obj_and_place" and list(otypes.values()).count(g.object) < 2:
            raise ValueError(f"pick_two_obj_and_place needs two objects of type {g.object!r}")
        if g.description is None:
            g.description = goal_description(g.task_type, g.object, g.receptacle, g.lamp, g.template or 0)
        return self


def _canon(value: str, known: set[str] | frozenset[str], field: str) -> str:
    lower = {k.lower(): k for k in known}
    key = value.replace(" ", "").lower()
    if key not in lower:
        raise ValueError(f"{field}: unknown type {value!r}; known: {', '.join(sorted(known))}")
    return lower[key]


def _validate(data: Any) -> SceneSpec:
    try:
        return SceneSpec.model_validate(data)
    except pydantic.ValidationError as e:
        parts = []
        for err in e.errors()[:8]:
            loc = ".".join(str(x) for x in err.get("loc", ())) or "(scene)"
            parts.append(f"{loc}: {err.get('msg', 'invalid')}")
        raise ValidationError("Invalid ALFWorld scene spec: " + "; ".join(parts)) from None


def load_scene(source: str | Path | dict[str, Any] | SceneSpec) -> SceneSpec:
    """Load and validate a scene from a JSON file path, a JSON string, a dict or a spec.

    Raises:
        agentgym.errors.ValidationError: the scene does not match the schema (message says where).
    """
    if isinstance(source, SceneSpec):
        return source
    if isinstance(source, dict):
        return _validate(source)
    text = str(source)
    if not text.lstrip().startswith("{"):
        path = Path(text)
        if not path.is_file():
            raise ValidationError(f"ALFWorld scene file {path} does not exist.")
        text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValidationError(f"ALFWorld scene is not valid JSON: {e.msg} at line {e.lineno}.") from None
    return _validate(data)


def save_scene(spec: SceneSpec, path: str | Path) -> None:
    """Write a scene spec as JSON (round-trips through :func:`load_scene`)."""
    Path(path).write_text(spec.model_dump_json(indent=2, exclude_none=True), encoding="utf-8")


def goal_description(task_type: str, obj: str, recep: str | None, lamp: str | None, variant: int) -> str:
    """ALFWorld's goal sentence, e.g. ``"put a clean lettuce in diningtable."``."""
    tpl = V.GOAL_TEMPLATES[task_type][variant % 2]
    return tpl.format(o=obj.lower(), r=(recep or "").lower(), l=(lamp or "").lower())


# ---------------------------------------------------------------------------------- generation
@cache
def layout(fp: int) -> tuple[tuple[str, int], ...]:
    """The receptacles of a floorplan: ``((type, count), ...)``, fixed per floorplan."""
    room = V.room_of_floorplan(fp)
    rng = random.Random(fp * 7919 + 13)
    out = []
    for rt, (lo, hi) in sorted(V.ROOMS[room].items()):
        n = rng.randint(lo, hi)
        if n:
            out.append((rt, n))
    return tuple(out)


@cache
def floorplan_lamps(fp: int) -> tuple[str, ...]:
    """The lamp types a floorplan has (fixed per floorplan): living rooms a floor lamp, about a quarter
    of them a desk lamp too; bedrooms a desk lamp; each where a surface for it exists."""
    room = V.room_of_floorplan(fp)
    rtypes = {rt for rt, _ in layout(fp)}
    rng = random.Random(fp * 104729 + 5)
    out = []
    for lamp in V.ROOM_LAMPS[room]:
        if lamp == "DeskLamp" and room == "livingroom" and rng.random() >= 0.25:
            continue
        if rtypes & set(V.START_HOMES[lamp]):
            out.append(lamp)
    return tuple(out)


def is_unseen_combo(task_type: str, obj: str, target: str) -> bool:
    """Whether a (task, object, target) combination is held out for ``valid_unseen``."""
    return zlib.crc32(f"{task_type}|{obj}|{target}".encode()) % 5 == 0


@cache
def _combos(fp: int, task_type: str) -> tuple[tuple[str, str], ...]:
    """Feasible (object type, target type) pairs of a task type in a floorplan."""
    room = V.room_of_floorplan(fp)
    rtypes = {rt for rt, _ in layout(fp)}
    objs = V.ROOM_OBJECTS[room] & V.PICKUPABLE
    out: list[tuple[str, str]] = []
    if task_type == "look_at_obj_in_light":
        for lamp in floorplan_lamps(fp):
            for o in sorted(objs):
                if any(o in V.RECEPTACLE_TYPES[rt] for rt in rtypes):
                    out.append((o, lamp))
        return tuple(out)
    need: frozenset[str] | None = None
    appliance = None
    if task_type in V.APPLIANCE:
        appliance = V.APPLIANCE[task_type][0]
        if appliance not in rtypes:
            return ()
        need = {"SinkBasin": V.CLEANABLE, "Microwave": V.HEATABLE, "Fridge": V.COOLABLE}[appliance]
    for o in sorted(objs):
        if need is not None and o not in need:
            continue
        for t in sorted(rtypes):
            if t == appliance or o not in V.RECEPTACLE_TYPES[t] or (t == "GarbageCan" and task_type != "pick_and_place_simple"):
                continue
            # the object must be able to start somewhere other than a target-type receptacle
            if any(o in V.RECEPTACLE_TYPES[s] for s in rtypes if s != t):
                out.append((o, t))
    return tuple(out)


def _room_types_for(task_type: str) -> tuple[str, ...]:
    return {
        "look_at_obj_in_light": ("bedroom", "livingroom"),
        "pick_heat_then_place_in_recep": ("kitchen",),
        "pick_cool_then_place_in_recep": ("kitchen",),
        "pick_clean_then_place_in_recep": ("kitchen", "bathroom"),
    }.get(task_type, ("kitchen", "livingroom", "bedroom", "bathroom"))


@lru_cache(maxsize=8)
def split_goals(split: str, size: int) -> tuple[dict[str, Any], ...]:
    """The goals of a split: one dict per task (floorplan, task type, object, target, seed...)."""
    unseen = split == "valid_unseen"
    base = _SPLIT_SEED.get(split, zlib.crc32(split.encode()) * 1000)
    out = []
    for i in range(size):
        task_type = V.TASK_TYPES[i % len(V.TASK_TYPES)]
        seed = base + i
        rng = random.Random(seed)
        rooms = _room_types_for(task_type)
        fps = [fp for fp in V.FLOORPLANS if V.room_of_floorplan(fp) in rooms and (fp in V.UNSEEN_FLOORPLANS) == unseen]
        choices: list[tuple[int, str, str]] = []
        while not choices:
            fp = rng.choice(fps)
            choices = [(fp, o, t) for o, t in _combos(fp, task_type) if is_unseen_combo(task_type, o, t) == unseen]
        fp, obj, target = rng.choice(choices)
        variant = rng.randrange(2)
        lamp = target if task_type == "look_at_obj_in_light" else None
        recep = None if lamp else target
        out.append({
            "floorplan": fp, "room": V.room_of_floorplan(fp), "task_type": task_type, "object": obj,
            "receptacle": recep, "lamp": lamp, "seed": seed,
            "description": goal_description(task_type, obj, recep, lamp, variant),
            "name": f"{task_type}-{obj}-None-{target}-{fp}/trial_{i:05d}",
        })
    return tuple(out)


def _sort_key(name: str) -> tuple[str, int]:
    word, _, num = name.rpartition(" ")
    return (word, -int(num))


def generate_scene(goal: dict[str, Any]) -> SceneSpec:
    """Place objects for one task (deterministic in ``goal["seed"]``) and return its scene."""
    fp = int(goal["floorplan"])
    room = V.room_of_floorplan(fp)
    rng = random.Random(int(goal["seed"]) * 31 + 7)
    lay = layout(fp)
    receps: list[tuple[str, str]] = [(rt, f"{rt.lower()} {k}") for rt, n in lay for k in range(1, n + 1)]
    locs = list(range(1, len(receps) + 1))
    rng.shuffle(locs)
    contents: dict[str, list[str]] = {name: [] for _, name in receps}
    counts: dict[str, int] = {}
    task_type, gobj = goal["task_type"], goal["object"]
    target = goal.get("receptacle")

    def place(otype: str, avoid: str | None) -> bool:
        starts = V.START_HOMES.get(otype, ())
        homes = [name for rt, name in receps if (otype in V.RECEPTACLE_TYPES[rt] or rt in starts) and rt != avoid]
        if not homes or (otype in V.FIXTURES and otype in counts):  # one television, one houseplant...
            return False
        counts[otype] = counts.get(otype, 0) + 1
        contents[rng.choice(homes)].append(f"{otype.lower()} {counts[otype]}")
        return True

    for lamp in floorplan_lamps(fp):  # the room's lamps (a look-at goal's lamp is one of them)
        place(lamp, None)
    n_goal = rng.randint(2, 3) if task_type == "pick_two_obj_and_place" else rng.randint(1, 3)
    for _ in range(n_goal):
        if not place(gobj, target):
            raise ValueError(f"cannot place {gobj} in floorplan {fp}")
    pool = sorted(V.ROOM_OBJECTS[room] - {gobj})  # takeable objects and fixtures (a houseplant, a television)
    n_extra = {"kitchen": (10, 24), "bathroom": (6, 12), "bedroom": (6, 14), "livingroom": (6, 14)}[room]
    for _ in range(rng.randint(*n_extra)):
        place(rng.choice(pool), None)
    recs: list[dict[str, Any]] = []
    gname = gobj.lower() + " "
    for (rt, name), loc in zip(receps, locs, strict=True):
        items: list[Any] = sorted(contents[name], key=_sort_key)
        if rt == "Fridge":
            # as in ALFWorld's generator, goal-type objects that start in the fridge are already cool
            items = [{"name": n, "cool": True} if n.startswith(gname) else n for n in items]
        recs.append({"name": name, "type": rt, "loc": loc, "contents": items})
    recs.sort(key=lambda r: _sort_key(r["name"]))
    return SceneSpec.model_validate({
        "floorplan": fp,
        "name": goal.get("name"),
        "receptacles": recs,
        "goal": {"task_type": task_type, "object": gobj, "receptacle": target, "lamp": goal.get("lamp"),
                 "description": goal["description"]},
    })

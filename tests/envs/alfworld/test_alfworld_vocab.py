"""ALFWorld's whole vocabulary: every type, its affordances, the spec fields, and both lamps.

With the ``alfworld`` package installed, the tables are compared with the lists it ships
(``alfworld/gen/constants.py``); without it, the invariants and the scenes below still run.
"""

from __future__ import annotations

import collections
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from agentgym.envs.alfworld import vocab as V
from agentgym.envs.alfworld.env import ALFWorldEnv
from agentgym.envs.alfworld.scene import floorplan_lamps, layout, load_scene

from agentgym.errors import ValidationError

NOTHING = "Nothing happens."


def alfworld_constants() -> Any:
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("alfworld is not installed (pip install alfworld)")
    path = Path(next(iter(spec.submodule_search_locations))) / "gen" / "constants.py"
    mod_spec = importlib.util.spec_from_file_location("alfworld_constants", path)
    assert mod_spec is not None and mod_spec.loader is not None
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def test_tables_are_alfworlds_own() -> None:
    c = alfworld_constants()

    def unsliced(xs: Any) -> set[str]:
        return {x for x in xs if "Sliced" not in x}

    assert set(V.RECEPTACLE_TYPES) == set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES)
    assert V.OBJECT_TYPES | set(V.RECEPTACLE_TYPES) == set(c.OBJECTS) | set(c.RECEPTACLES)
    for rtype, holds in c.VAL_RECEPTACLE_OBJECTS.items():
        if rtype not in c.MOVABLE_RECEPTACLES:
            assert V.RECEPTACLE_TYPES[rtype] == unsliced(holds), rtype
    acts = c.VAL_ACTION_OBJECTS
    assert tuple(
        unsliced(acts[k]) for k in ("Cleanable", "Heatable", "Coolable", "Sliceable", "Toggleable")) == (V.CLEANABLE, V.HEATABLE, V.COOLABLE, V.SLICEABLE, V.TOGGLEABLE)
    assert set(c.OPENABLE_CLASS_LIST) - set(c.MOVABLE_RECEPTACLES) == V.OPENABLE
    assert set(c.MOVABLE_RECEPTACLES) == V.RECEPTACLE_OBJECTS


def test_vocabulary_invariants() -> None:
    assert {"FloorLamp", "Television", "HousePlant", "Plunger", "ScrubBrush", "Glassbottle", "Boots"} <= V.OBJECT_TYPES
    assert V.PICKUPABLE | V.TOGGLEABLE | V.FIXTURES == V.OBJECT_TYPES
    assert not (V.PICKUPABLE & V.TOGGLEABLE) and not (V.PICKUPABLE & V.FIXTURES) and not (V.OBJECT_TYPES & set(V.RECEPTACLE_TYPES))
    assert all(holds <= V.PICKUPABLE for holds in V.RECEPTACLE_TYPES.values())
    assert V.CLEANABLE | V.HEATABLE | V.COOLABLE <= V.PICKUPABLE
    for otype, homes in V.START_HOMES.items():
        assert otype in V.OBJECT_TYPES and set(homes) <= set(V.RECEPTACLE_TYPES)
    for room, objs in V.ROOM_OBJECTS.items():
        for o in objs:  # every generated object has somewhere to start in that room type
            assert any(o in V.RECEPTACLE_TYPES[rt] or rt in V.START_HOMES.get(o, ()) for rt in V.ROOMS[room]), (room, o)
    assert V.type_from_name("floorlamp 1") == "FloorLamp" and V.type_from_name("paintinghanger 2") == "PaintingHanger"


def test_generated_tasks_use_both_lamps_and_the_new_types() -> None:
    env = ALFWorldEnv()
    lamps: collections.Counter[str] = collections.Counter()
    seen: set[str] = set()
    for split in env.splits:
        for task in env.tasks(split):
            if task.task_type == "look_at_obj_in_light":
                lamps[task.data["lamp"]] += 1
                assert task.data["lamp"] in floorplan_lamps(task.data["floorplan"])
                assert task.data["description"].endswith(f"{task.data['lamp'].lower()}.")
    for task in env.tasks("train")[:600]:
        env.reset(options={"task": task})
        seen |= {o.type for r in env.scene_spec().receptacles for o in r.contents if not isinstance(o, str) and o.type}
    assert lamps["FloorLamp"] > 100 and lamps["DeskLamp"] > 100
    assert {"FloorLamp", "DeskLamp", "Television", "HousePlant", "Plunger", "ScrubBrush", "Pillow", "TeddyBear"} <= seen
    living = [fp for fp in V.FLOORPLANS if V.room_of_floorplan(fp) == "livingroom"]
    assert all("FloorLamp" in floorplan_lamps(fp) for fp in living)
    assert all(floorplan_lamps(fp) == ("DeskLamp",) for fp in V.FLOORPLANS if V.room_of_floorplan(fp) == "bedroom"
               and {rt for rt, _ in layout(fp)} & set(V.START_HOMES["DeskLamp"]))


FLOOR_LAMP_SCENE: dict[str, Any] = {
    "receptacles": [
        {"name": "armchair 1", "contents": ["pillow 1"]},
        {"name": "sidetable 1", "contents": ["desklamp 1", "keychain 1"]},
        {"name": "sofa 1", "contents": ["floorlamp 1", "remotecontrol 1"]},
        {"name": "tvstand 1", "contents": ["television 1"]},
    ],
    "goal": {"task_type": "look_at_obj_in_light", "object": "Pillow", "lamp": "FloorLamp"},
}


def test_look_at_in_light_with_a_floor_lamp() -> None:
    env = ALFWorldEnv()
    obs, info = env.reset(options={"scene": FLOOR_LAMP_SCENE})
    assert obs[-1]["content"].endswith("Your task is to: look at pillow under the floorlamp.")
    steps = [("go to armchair 1", "On the armchair 1, you see a pillow 1."),
             ("take pillow 1 from armchair 1", "You pick up the pillow 1 from the armchair 1."),
             ("go to sidetable 1", "On the sidetable 1, you see a desklamp 1, and a keychain 1."),
             ("use desklamp 1", "You turn on the desklamp 1."),  # the wrong lamp: not the goal
             ("go to sofa 1", None)]
    for cmd, want in steps:
        obs, reward, term, _, info = env.step(cmd)
        if want is not None:
            assert obs[0]["content"] == want and reward == 0.0 and not term, cmd
    assert obs[0]["content"] == "On the sofa 1, you see a floorlamp 1, and a remotecontrol 1."
    assert "use floorlamp 1" in info["admissible_actions"]
    assert "take floorlamp 1 from sofa 1" not in info["admissible_actions"]
    obs, reward, term, _, info = env.step("use floorlamp 1")
    assert obs[0]["content"] == "You turn on the floorlamp 1." and reward == 1.0 and term and info["success"]
    # the expert solves it too, and the lamp defaults to the scene's only lamp type
    scene = {**FLOOR_LAMP_SCENE, "receptacles": [r for r in FLOOR_LAMP_SCENE["receptacles"] if r["name"] != "sidetable 1"],
             "goal": {"task_type": "look_at_obj_in_light", "object": "pillow"}}
    assert load_scene(scene).goal.lamp == "FloorLamp"
    env.reset(options={"scene": scene})
    while not env.done:
        _, reward, *_ = env.step(env.expert_action())
    assert reward == 1.0


def test_fixtures_cannot_be_taken() -> None:
    env = ALFWorldEnv()
    env.reset(options={"scene": FLOOR_LAMP_SCENE})
    obs, _, _, _, info = env.step("go to tvstand 1")
    assert obs[0]["content"] == "On the tvstand 1, you see a television 1."
    assert not any(a.startswith("take television") for a in info["admissible_actions"])
    assert env.step("take television 1 from tvstand 1")[0][0]["content"] == NOTHING


def test_spec_states_openable_open_and_goal_wording() -> None:
    scene = {
        "receptacles": [
            {"name": "cabinet 1", "openable": False, "contents": ["soapbottle 1"]},  # a cabinet without doors
            {"name": "drawer 1", "open": True, "contents": ["spraybottle 1"]},        # left open
            {"name": "toilet 1"},
        ],
        "goal": {"task_type": "pick_and_place_simple", "object": "SprayBottle", "receptacle": "Toilet", "template": 1},
    }
    env = ALFWorldEnv()
    obs, info = env.reset(options={"scene": scene})
    assert obs[-1]["content"].endswith("Your task is to: put some spraybottle on toilet.")
    assert env.step("go to cabinet 1")[0][0]["content"] == "On the cabinet 1, you see a soapbottle 1."
    obs, _, _, _, info = env.step("go to drawer 1")
    assert obs[0]["content"] == "The drawer 1 is open. In it, you see a spraybottle 1."
    assert "close drawer 1" in info["admissible_actions"] and "take spraybottle 1 from drawer 1" in info["admissible_actions"]
    spec = env.scene_spec()
    assert [(r.openable, r.open) for r in spec.receptacles] == [(False, False), (True, True), (False, False)]
    worded = {**scene, "goal": {**scene["goal"], "template": None, "description": "put a spraybottle in toilet."}}
    assert load_scene(worded).goal.description == "put a spraybottle in toilet."
    assert load_scene({**scene, "goal": {**scene["goal"], "template": 0}}).goal.description == "put a spraybottle in toilet."
    defaults = load_scene({**scene, "receptacles": [{"name": "cabinet 1", "contents": ["spraybottle 1"]}, {"name": "toilet 1"}]})
    assert (defaults.receptacles[0].openable, defaults.receptacles[0].open) == (True, False)  # ALFWorld's defaults
    with pytest.raises(ValidationError, match="open is true but it is not openable"):
        load_scene({**scene, "receptacles": [{"name": "toilet 1", "open": True, "contents": ["spraybottle 1"]}]})
    with pytest.raises(ValidationError, match="not an object one can take"):
        load_scene({"receptacles": [{"name": "tvstand 1", "contents": ["television 1"]}],
                    "goal": {"task_type": "pick_and_place_simple", "object": "Television", "receptacle": "TVStand"}})
    with pytest.raises(ValidationError, match="template"):
        load_scene({**scene, "goal": {**scene["goal"], "template": 2}})

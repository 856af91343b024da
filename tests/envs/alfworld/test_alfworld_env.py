"""The native ALFWorld engine: checker, expert on every task type, splits, phrasing, bad input, scenes."""

from __future__ import annotations

import collections
import json
import random
from pathlib import Path
from typing import Any

import gymnasium
import pytest
from agentgym.envs.alfworld import vocab as V
from agentgym.envs.alfworld.env import ALFWorldEnv
from agentgym.envs.alfworld.scene import SceneSpec, is_unseen_combo, load_scene, save_scene
from agentgym.policies.scripted import ExpertPolicy

import agentgym
from agentgym.errors import ConfigurationError, ValidationError

NOTHING = "Nothing happens."

# The scene of ReAct's public "put a clean lettuce in diningtable" ALFWorld transcript.
LETTUCE_SCENE: dict[str, Any] = {
    "receptacles": (
        [{"name": f"cabinet {i}"} for i in range(1, 14)]
        + [{"name": "coffeemachine 1"}, {"name": "countertop 1"}]
        + [{"name": "diningtable 1", "contents": [
            "apple 1", "bread 1", "butterknife 2", "cup 2", "fork 2", "knife 2", "knife 1", "ladle 1",
            "lettuce 1", "mug 2", "mug 1", "pan 2", "peppershaker 1", "spatula 3", "tomato 2", "tomato 1"]}]
        + [{"name": "drawer 1"}, {"name": "fridge 1", "contents": ["cup 3", "egg 2", "potato 3", "potato 2"]},
           {"name": "garbagecan 1"}, {"name": "microwave 1"}]
        + [{"name": f"shelf {i}"} for i in range(1, 4)]
        + [{"name": "sinkbasin 1", "contents": ["apple 2", "ladle 2", "spoon 1", "tomato 3"]}]
        + [{"name": f"stoveburner {i}"} for i in range(1, 5)]
        + [{"name": "toaster 1"}]
    ),
    "goal": {"task_type": "pick_clean_then_place_in_recep", "object": "Lettuce", "receptacle": "DiningTable"},
}

LETTUCE_INTRO = (
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 13, a cabinet 12, "
    "a cabinet 11, a cabinet 10, a cabinet 9, a cabinet 8, a cabinet 7, a cabinet 6, a cabinet 5, a cabinet 4, "
    "a cabinet 3, a cabinet 2, a cabinet 1, a coffeemachine 1, a countertop 1, a diningtable 1, a drawer 1, "
    "a fridge 1, a garbagecan 1, a microwave 1, a shelf 3, a shelf 2, a shelf 1, a sinkbasin 1, "
    "a stoveburner 4, a stoveburner 3, a stoveburner 2, a stoveburner 1, and a toaster 1.\n"
    "Your task is to: put a clean lettuce in diningtable."
)

LAMP_SCENE: dict[str, Any] = {
    "receptacles": [
        {"name": "bed 1", "contents": ["pillow 1", "laptop 1"]},
        {"name": "desk 1", "contents": ["desklamp 1", "pen 1"]},
        {"name": "drawer 1", "contents": []},
        {"name": "safe 1", "contents": ["cd 1", "watch 1"]},
    ],
    "goal": {"task_type": "look_at_obj_in_light", "object": "pillow", "lamp": "desklamp"},
}


def run(env: ALFWorldEnv, cmds: list[str]) -> list[str]:
    out = []
    for c in cmds:
        obs, *_ = env.step(c)
        out.append(obs[0]["content"])
    return out


def scene_env(scene: dict[str, Any], **kw: Any) -> tuple[ALFWorldEnv, str]:
    env = ALFWorldEnv(**kw)
    obs, _ = env.reset(options={"scene": scene})
    return env, obs[-1]["content"]


# ------------------------------------------------------------------------------------- contract
def test_checker_passes_text_mode() -> None:
    report = agentgym.check_env(agentgym.make("agentgym/ALFWorld-v0"), expert_episodes=3)
    assert "expert finishes an episode; step after end raises ResetNeeded" in report.passed


@pytest.mark.parametrize("parser", ["hermes", "json", "react"])
def test_checker_passes_tool_mode(parser: str) -> None:
    env = agentgym.make("agentgym/ALFWorld-v0", action_mode="tool", parser=parser)
    assert env.unwrapped.tools.names == ["take_action"]
    agentgym.check_env(env, expert_episodes=2)


def test_registered_limits_and_truncation() -> None:
    env = gymnasium.make("agentgym/ALFWorld-v0")
    assert env.spec is not None and env.spec.max_episode_steps == 50
    env.reset(seed=3)
    truncs = []
    for _ in range(50):
        _, r, term, trunc, _ = env.step("look")
        assert r == 0.0 and not term
        truncs.append(trunc)
    assert truncs == [False] * 49 + [True]


def test_text_mode_has_no_tools_and_tool_mode_one() -> None:
    assert len(ALFWorldEnv().tools) == 0
    spec = ALFWorldEnv(action_mode="tool").tools.specs()[0]["function"]
    assert spec["name"] == "take_action"
    assert spec["parameters"]["required"] == ["action"]
    with pytest.raises(ConfigurationError):
        ALFWorldEnv(action_mode="voice")


def test_tool_mode_steps_through_the_tool() -> None:
    env = ALFWorldEnv(action_mode="tool", parser="json")
    env.reset(options={"scene": LAMP_SCENE})
    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "take_action", "arguments": '{"action": "go to desk 1"}'}}]}
    obs, *_ , info = env.step(msg)
    assert obs == [{"role": "tool", "tool_call_id": "c1", "name": "take_action",
                    "content": "On the desk 1, you see a desklamp 1, and a pen 1."}]
    obs, *_ , info = env.step("go to desk 1")  # plain text is no tool call in tool mode
    assert obs[0]["content"].startswith("Error:") and info["metrics"]["parse_errors"] == 1


# ------------------------------------------------------------------------------------- expert
@pytest.mark.parametrize("expert", ["observer", "planner"])
def test_expert_solves_every_generated_task(expert: str) -> None:
    # both experts, within the registered 50-step limit (the observer searches, so it needs more steps)
    env = ALFWorldEnv(expert=expert)
    solved: collections.Counter[str] = collections.Counter()
    tasks = [t for split in env.splits for t in env.tasks(split)]
    assert len(tasks) == 3827
    for task in tasks:
        env.reset(options={"task": task})
        for _ in range(50):
            _, reward, term, trunc, info = env.step(env.expert_action())
            if term or trunc:
                break
        assert term and info["success"] and reward == 1.0, task.task_id
        solved[task.task_type] += 1
    assert set(solved) == set(V.TASK_TYPES)
    assert min(solved.values()) >= 600
    assert sum(solved.values()) == len(tasks)


def test_expert_is_an_env_side_policy() -> None:
    env = ALFWorldEnv()
    env.reset(seed=11)
    policy = ExpertPolicy()
    assert policy.capabilities.env_side
    for _ in range(50):
        _, reward, term, _, _ = env.step(policy.act(env))
        if term:
            break
    assert reward == 1.0


def test_expert_recovers_from_a_detour() -> None:
    env, _ = scene_env(LETTUCE_SCENE)
    run(env, ["go to diningtable 1", "take apple 1 from diningtable 1", "go to fridge 1", "open fridge 1"])
    for _ in range(20):
        _, reward, term, _, _ = env.step(env.expert_action())
        if term:
            break
    assert reward == 1.0


# ------------------------------------------------------------------------------------- splits
def test_splits_match_alfworld_sizes_and_are_disjoint() -> None:
    env = ALFWorldEnv()
    tasks = {s: env.tasks(s) for s in env.splits}
    assert {s: len(t) for s, t in tasks.items()} == {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
    ids = [t.task_id for ts in tasks.values() for t in ts]
    assert len(ids) == len(set(ids))
    for s, ts in tasks.items():
        assert {t.task_type for t in ts} == set(V.TASK_TYPES), s
    seen_fps = {t.data["floorplan"] for s in ("train", "valid_seen") for t in tasks[s]}
    unseen_fps = {t.data["floorplan"] for t in tasks["valid_unseen"]}
    assert unseen_fps <= V.UNSEEN_FLOORPLANS and not seen_fps & V.UNSEEN_FLOORPLANS

    def combo(t: Any) -> tuple[str, str, str]:
        return (t.task_type, t.data["object"], t.data["receptacle"] or t.data["lamp"])

    seen_combos = {combo(t) for s in ("train", "valid_seen") for t in tasks[s]}
    unseen_combos = {combo(t) for t in tasks["valid_unseen"]}
    assert not seen_combos & unseen_combos
    assert all(is_unseen_combo(*c) for c in unseen_combos)
    assert not any(is_unseen_combo(*c) for c in seen_combos)


def test_seeding_is_deterministic_and_varied() -> None:
    env = ALFWorldEnv()
    a, ia = env.reset(seed=5)
    b, ib = env.reset(seed=5)
    assert a == b and ia == ib
    firsts = {env.reset(seed=s)[0][-1]["content"] for s in range(20)}
    assert len(firsts) >= 15
    c, _ = ALFWorldEnv().reset(options={"task_id": ia["task_id"]})
    assert c == a


def test_generated_scenes_follow_affordances() -> None:
    env = ALFWorldEnv()
    for task in env.tasks("train")[:300]:
        env.reset(options={"task": task})
        spec = env.scene_spec()
        room = V.room_of_floorplan(task.data["floorplan"])
        rtypes = {r.type for r in spec.receptacles}
        assert rtypes <= set(V.ROOMS[room])
        for r in spec.receptacles:
            assert r.openable == (r.type in V.OPENABLE)
            for o in r.contents:
                assert not isinstance(o, str) and o.type is not None
                assert o.type in V.RECEPTACLE_TYPES[r.type] or r.type in V.START_HOMES.get(o.type, ())
                # goal objects never start where they must end up
                if o.type == task.data["object"]:
                    assert r.type != task.data["receptacle"]
        if task.task_type in V.APPLIANCE:
            assert V.APPLIANCE[task.task_type][0] in rtypes
            need = {"clean": V.CLEANABLE, "heat": V.HEATABLE, "cool": V.COOLABLE}[V.APPLIANCE[task.task_type][1]]
            assert task.data["object"] in need


# ------------------------------------------------------------------------------------- phrasing
def test_react_transcript_of_the_lettuce_task() -> None:
    env, intro = scene_env(LETTUCE_SCENE)
    assert intro == LETTUCE_INTRO
    out = run(env, ["think: First I need to find a lettuce.", "go to fridge 1", "open fridge 1",
                    "go to diningtable 1", "take lettuce 1 from diningtable 1", "go to sinkbasin 1",
                    "clean lettuce 1 with sinkbasin 1", "think: Now I put it in diningtable 1.",
                    "go to diningtable 1"])
    assert out == [
        "OK.",
        "The fridge 1 is closed.",
        "You open the fridge 1. The fridge 1 is open. In it, you see a cup 3, a egg 2, a potato 3, and a potato 2.",
        "On the diningtable 1, you see a apple 1, a bread 1, a butterknife 2, a cup 2, a fork 2, a knife 2, "
        "a knife 1, a ladle 1, a lettuce 1, a mug 2, a mug 1, a pan 2, a peppershaker 1, a spatula 3, "
        "a tomato 2, and a tomato 1.",
        "You pick up the lettuce 1 from the diningtable 1.",
        "On the sinkbasin 1, you see a apple 2, a ladle 2, a spoon 1, and a tomato 3.",
        "You clean the lettuce 1 using the sinkbasin 1.",
        "OK.",
        "On the diningtable 1, you see a apple 1, a bread 1, a butterknife 2, a cup 2, a fork 2, a knife 2, "
        "a knife 1, a ladle 1, a mug 2, a mug 1, a pan 2, a peppershaker 1, a spatula 3, a tomato 2, and a tomato 1.",
    ]
    obs, reward, term, trunc, info = env.step("Thought: done soon.\nAction: put lettuce 1 in/on diningtable 1")
    assert obs[0]["content"] == "You put the lettuce 1 in/on the diningtable 1."
    assert (reward, term, trunc, info["success"]) == (1.0, True, False, True)


def test_states_inventory_examine_look() -> None:
    env, _ = scene_env(LETTUCE_SCENE)
    out = run(env, ["inventory", "look", "go to fridge 1", "look", "open fridge 1", "take egg 2 from fridge 1",
                    "inventory", "examine egg 2", "go to microwave 1", "heat egg 2 with microwave 1",
                    "examine egg 2", "go to fridge 1", "cool egg 2 with fridge 1", "examine egg 2",
                    "put egg 2 in/on fridge 1", "close fridge 1", "examine fridge 1", "go to drawer 1", "open drawer 1",
                    "examine microwave 1"])
    assert out == [
        "You are not carrying anything.",
        "You are in the middle of a room. Looking quickly around you, you see nothing.",
        "The fridge 1 is closed.",
        "You are facing the fridge 1. Next to it, you see nothing.",
        "You open the fridge 1. The fridge 1 is open. In it, you see a cup 3, a egg 2, a potato 3, and a potato 2.",
        "You pick up the egg 2 from the fridge 1.",
        "You are carrying: a egg 2.",
        "There's nothing special about egg 2.",
        "The microwave 1 is closed.",
        "You heat the egg 2 using the microwave 1.",
        "This is a hot egg 2.",
        "The fridge 1 is open. In it, you see a cup 3, a potato 3, and a potato 2.",
        "You cool the egg 2 using the fridge 1.",
        "This is a cold egg 2.",
        "You put the egg 2 in/on the fridge 1.",
        "You close the fridge 1.",
        "The fridge 1 is closed.",
        "The drawer 1 is closed.",
        "You open the drawer 1. The drawer 1 is open. In it, you see nothing.",
        NOTHING,
    ]


def test_lamp_task_and_listing_of_two() -> None:
    env, intro = scene_env(LAMP_SCENE)
    assert intro.endswith("a bed 1, a desk 1, a drawer 1, and a safe 1.\nYour task is to: look at pillow under the desklamp.")
    out = run(env, ["go to bed 1", "take pillow 1 from bed 1", "go to desk 1", "examine desklamp 1"])
    assert out == ["On the bed 1, you see a laptop 1, and a pillow 1.", "You pick up the pillow 1 from the bed 1.",
                   "On the desk 1, you see a desklamp 1, and a pen 1.", NOTHING]
    obs, reward, term, _, info = env.step("use desklamp 1")
    assert obs[0]["content"] == "You turn on the desklamp 1." and reward == 1.0 and term and info["success"]


def test_lamp_can_be_turned_on_first() -> None:
    env, _ = scene_env(LAMP_SCENE)
    assert run(env, ["go to desk 1", "toggle desklamp 1"])[1] == NOTHING  # not ALFWorld's grammar
    env, _ = scene_env(LAMP_SCENE, lenient=True)
    assert run(env, ["go to desk 1", "toggle desklamp 1 desk 1", "go to bed 1", "take pillow 1 from bed 1"])[1] == \
        "You turn on the desklamp 1."
    _, reward, term, _, _ = env.step("go to desk 1")
    assert reward == 1.0 and term


def test_raw_style_and_v04_grammar() -> None:
    env, intro = scene_env(LAMP_SCENE, obs_style="raw")
    assert intro.startswith("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.")
    assert intro.endswith("a safe 1.\n\nYour task is to: look at pillow under the desklamp.")
    loc = next(r.loc for r in env.scene_spec().receptacles if r.name == "safe 1")
    assert run(env, ["go to safe 1"]) == [f"You arrive at loc {loc}. The safe 1 is closed."]
    env, _ = scene_env(LAMP_SCENE, obs_style="raw", grammar="v0.4")
    assert run(env, ["go to bed 1", "take laptop 1 from bed 1", "put laptop 1 in/on bed 1", "move laptop 1 to bed 1"]) == [
        "You arrive at bed 1. On the bed 1, you see a laptop 1, and a pillow 1.",
        "You pick up the laptop 1 from the bed 1.", NOTHING, "You move the laptop 1 to the bed 1."]
    assert "help" in env.admissible_actions()
    env, _ = scene_env(LAMP_SCENE, grammar="v0.4")  # react style keeps alfworld 0.4's arrival sentence
    assert run(env, ["go to safe 1"]) == ["You arrive at safe 1. The safe 1 is closed."]
    assert run(env, ["help"])[0].startswith("Available commands:\n  look:")


def test_compact_style_says_the_same_in_fewer_words() -> None:
    cmds = ["go to fridge 1", "open fridge 1", "go to diningtable 1", "take lettuce 1 from diningtable 1",
            "go to sinkbasin 1", "clean lettuce 1 with sinkbasin 1", "inventory", "look", "go to drawer 1",
            "close drawer 1", "go to cabinet 1", "open cabinet 1", "close cabinet 1", "go to diningtable 1"]
    env, intro = scene_env(LETTUCE_SCENE, obs_style="compact")
    assert intro == (
        "You see: cabinet 13, cabinet 12, cabinet 11, cabinet 10, cabinet 9, cabinet 8, cabinet 7, cabinet 6, "
        "cabinet 5, cabinet 4, cabinet 3, cabinet 2, cabinet 1, coffeemachine 1, countertop 1, diningtable 1, drawer 1, "
        "fridge 1, garbagecan 1, microwave 1, shelf 3, shelf 2, shelf 1, sinkbasin 1, stoveburner 4, stoveburner 3, "
        "stoveburner 2, stoveburner 1, toaster 1.\nTask: put a clean lettuce in diningtable.")
    out = run(env, cmds)
    assert out == [
        "fridge 1: closed.",
        "fridge 1: cup 3, egg 2, potato 3, potato 2.",
        "diningtable 1: apple 1, bread 1, butterknife 2, cup 2, fork 2, knife 2, knife 1, ladle 1, lettuce 1, mug 2, "
        "mug 1, pan 2, peppershaker 1, spatula 3, tomato 2, tomato 1.",
        "Took lettuce 1.",
        "sinkbasin 1: apple 2, ladle 2, spoon 1, tomato 3.",
        "Cleaned lettuce 1.",
        "Carrying: lettuce 1.",
        "At sinkbasin 1.",
        "drawer 1: closed.",
        NOTHING,
        "cabinet 1: closed.",
        "cabinet 1: nothing.",
        "Closed cabinet 1.",
        "diningtable 1: apple 1, bread 1, butterknife 2, cup 2, fork 2, knife 2, knife 1, ladle 1, mug 2, mug 1, "
        "pan 2, peppershaker 1, spatula 3, tomato 2, tomato 1.",
    ]
    # the same commands in the default style: same admissible commands, longer text
    env2, intro2 = scene_env(LETTUCE_SCENE)
    assert len(intro) < len(intro2)
    out2 = run(env2, cmds)
    assert all(len(a) <= len(b) for a, b in zip(out, out2, strict=True))
    assert sum(map(len, out)) < 0.75 * sum(map(len, out2))
    assert env.admissible_actions() == env2.admissible_actions()
    obs, reward, term, _, _ = env.step("put lettuce 1 in/on diningtable 1")
    assert obs[0]["content"] == "Put lettuce 1." and reward == 1.0 and term
    env, _ = scene_env(LAMP_SCENE, obs_style="compact", grammar="v0.4")
    assert run(env, ["go to bed 1", "take pillow 1 from bed 1", "move pillow 1 to bed 1", "take pillow 1 from bed 1",
                     "go to desk 1", "use pen 1"]) == [
        "bed 1: laptop 1, pillow 1.", "Took pillow 1.", "Put pillow 1.", "Took pillow 1.", "desk 1: desklamp 1, pen 1.",
        "No switch on pen 1."]
    obs, reward, *_ = env.step("use desklamp 1")
    assert obs[0]["content"] == "Turned on desklamp 1." and reward == 1.0
    with pytest.raises(ConfigurationError, match="obs_style"):
        ALFWorldEnv(obs_style="terse")


# ------------------------------------------------------------------------------------- admissible
def _replay(scene: SceneSpec, history: list[str], cmd: str) -> str:
    env = ALFWorldEnv()
    env.reset(options={"scene": scene})
    run(env, history)
    return run(env, [cmd])[0]


def test_admissible_commands_are_exactly_the_valid_ones() -> None:
    rng = random.Random(0)
    env = ALFWorldEnv()
    for idx in range(6):
        _, info = env.reset(options={"split": "valid_seen", "index": idx})
        scene = env.scene_spec()
        history: list[str] = []
        for _ in range(8):
            adm = info["admissible_actions"]
            assert len(adm) == len(set(adm))
            for cmd in adm:
                assert _replay(scene, history, cmd) != NOTHING, (history, cmd)
            # a few commands that are not admissible do nothing
            held = env._held
            for cmd in ["take apple 1 from countertop 1", "open desk 1", "put mug 1 in/on toaster 1",
                        f"clean {held.name if held else 'x 1'} with fridge 1"]:
                if cmd not in adm:
                    assert _replay(scene, history, cmd) == NOTHING
            cmd = rng.choice(adm)
            history.append(cmd)
            _, _, term, _, info = env.step(cmd)
            if term:
                break


# ------------------------------------------------------------------------------------- bad input
BAD = ["", "   ", "\n\n", "asdf", "go", "go to", "go to nowhere 9", "go to cabinet", "take", "take apple 99 from diningtable 1",
       "take lettuce 1 from fridge 1", "put lettuce 1 in/on diningtable 1", "put x in/on y", "open countertop 1",
       "close fridge 1", "heat lettuce 1 with microwave 1", "use lettuce 1", "examine unicorn 1", "inventory please",
       "look around", "\x00\ud7ff🙂" * 30, "x" * 10_000, "Action: take_action[go to fridge 1]", "{\"name\": 1}",
       "<tool_call>{not json</tool_call>", "go to fridge 1 please"]


@pytest.mark.parametrize("bad", BAD)
def test_bad_commands_do_nothing(bad: str) -> None:
    env, _ = scene_env(LETTUCE_SCENE)
    obs, reward, term, trunc, info = env.step(bad)
    assert obs == [{"role": "user", "content": NOTHING}]
    assert (reward, term, trunc) == (0.0, False, False)
    assert info["metrics"]["invalid_actions"] == 1
    assert "admissible_actions" in info


def test_commands_match_exactly_unless_lenient() -> None:
    env, _ = scene_env(LETTUCE_SCENE)
    assert run(env, ["Go to fridge 1", "go to  fridge 1", "go to fridge 1.", "  go to fridge 1 ", "go to fridge 1"]) == [
        NOTHING, NOTHING, NOTHING, "The fridge 1 is closed.", NOTHING]  # no "go to" where you already are
    env, _ = scene_env(LETTUCE_SCENE, lenient=True)
    assert run(env, ["  GO TO   Fridge 1. ", "> open fridge 1", "`go to sinkbasin 1`"])[:2] == [
        "The fridge 1 is closed.",
        "You open the fridge 1. The fridge 1 is open. In it, you see a cup 3, a egg 2, a potato 3, and a potato 2."]


def test_non_text_actions_are_observations() -> None:
    env, _ = scene_env(LETTUCE_SCENE)
    for bad in [None, 12345, {"role": "assistant", "content": None}, ["go to fridge 1"]]:
        obs, reward, term, trunc, info = env.step(bad)  # type: ignore[arg-type]
        assert obs[0]["role"] == "user" and obs[0]["content"] and not term
    obs, *_ = env.step({"role": "assistant", "content": "", "tool_calls": [{"name": "take_action", "arguments": {}}]})
    assert obs[0]["content"] == NOTHING


# ------------------------------------------------------------------------------------- scene spec
def test_scene_round_trip(tmp_path: Path) -> None:
    env = ALFWorldEnv()
    for idx in (0, 1, 2, 3, 4, 5):
        obs, info = env.reset(options={"split": "train", "index": idx})
        plan = []
        while not env.done:
            plan.append(env.expert_action())
            env.step(plan[-1])
        path = tmp_path / f"scene{idx}.json"
        save_scene(env.scene_spec(), path)
        assert json.loads(path.read_text())["goal"]["task_type"] == info["task_type"]
        env2 = ALFWorldEnv()
        obs2, info2 = env2.reset(options={"scene": str(path)})
        assert obs2 == obs and info2["admissible_actions"] == info["admissible_actions"]
        assert load_scene(path) == env.scene_spec()
        for cmd in plan[:-1]:
            assert not env2.step(cmd)[2]
        assert env2.step(plan[-1])[1] == 1.0
    t = ALFWorldEnv.task_from_scene(LAMP_SCENE)
    assert t.split == "scene" and t.task_type == "look_at_obj_in_light"
    assert ALFWorldEnv().reset(options={"task": t})[0] == ALFWorldEnv().reset(options={"scene": LAMP_SCENE})[0]


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s.pop("goal"), "goal"),
    (lambda s: s["receptacles"].append({"name": "spaceship 1"}), "unknown receptacle type"),
    (lambda s: s["receptacles"][0]["contents"].append("Apple1"), "must look like"),
    (lambda s: s["receptacles"][0]["contents"].append("dragon 1"), "unknown object type"),
    (lambda s: s["receptacles"][0]["contents"].append("pen 1"), "duplicate name"),
    (lambda s: s["goal"].update(task_type="pick_heat_then_place_in_recep", receptacle="Desk"), "needs a microwave"),
    (lambda s: s["goal"].update(task_type="pick_and_place_simple", receptacle="Fridge"), "no receptacle of that type"),
    (lambda s: s["goal"].update(task_type="pick_two_obj_and_place", receptacle="Desk"), "needs two objects"),
    (lambda s: s["goal"].update(task_type="dance"), "task_type"),
    (lambda s: s.update(extra_field=1), "extra"),
    (lambda s: s.update(receptacles=[]), "receptacles"),
])
def test_invalid_scenes_raise_validation_error(mutate: Any, message: str) -> None:
    scene = json.loads(json.dumps(LAMP_SCENE))
    mutate(scene)
    with pytest.raises(ValidationError, match=message):
        load_scene(scene)
    with pytest.raises(ValidationError):
        ALFWorldEnv().reset(options={"scene": scene})


def test_scene_files_errors(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="does not exist"):
        load_scene(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValidationError, match="not valid JSON"):
        load_scene(bad)
    assert load_scene(json.dumps(LAMP_SCENE)).goal.lamp == "DeskLamp"

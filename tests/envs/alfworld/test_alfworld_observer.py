"""The observation-only expert: it never reads hidden state, its search order, every task type, styles."""

from __future__ import annotations

import collections
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agentgym.envs.alfworld import vocab as V
from agentgym.envs.alfworld.env import ALFWorldEnv
from agentgym.envs.alfworld.observer import Goal, ObservationExpert, parse_goal, search_order

from agentgym.errors import ConfigurationError


def texts_of(obs: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in obs if m["role"] != "system"]


def expert_episode(env: ALFWorldEnv, reset: dict[str, Any], limit: int = 80) -> tuple[list[str], list[str], float]:
    obs, _ = env.reset(options=reset)
    texts = texts_of(obs)
    cmds: list[str] = []
    reward = 0.0
    for _ in range(limit):
        cmds.append(env.expert_command())
        obs, reward, term, trunc, _ = env.step(env.expert_action())  # wrapped as a tool call in tool mode
        texts += texts_of(obs)
        if term or trunc:
            break
    return cmds, texts, float(reward)


def sample_tasks(per_type: int) -> list[Any]:
    env = ALFWorldEnv()
    out = []
    for split in env.splits:
        by_type: dict[str, list[Any]] = collections.defaultdict(list)
        for t in env.tasks(split):
            by_type[t.task_type].append(t)
        for ts in by_type.values():
            out += ts[:: max(1, len(ts) // per_type)][:per_type]
    return out


# ------------------------------------------------------------------------------ hidden state
def scrambled(scene: dict[str, Any], cmds: list[str], rng: random.Random) -> dict[str, Any]:
    """The scene with everything ``cmds`` never revealed shuffled: the contents of every receptacle the
    agent never opened or stood at with it open, and the open/closed state of those it never went to
    (the goal objects stay out of target-type receptacles, or the task would already be done)."""
    visited = {c[len("go to "):] for c in cmds if c.startswith("go to ")}
    shown = {c[len("open "):] for c in cmds if c.startswith("open ")}
    receps = scene["receptacles"]
    hidden = [r for r in receps if r["name"] not in visited or (r.get("openable") and not r.get("open")
                                                                  and r["name"] not in shown)]
    pool = [o for r in hidden for o in r.get("contents", [])]
    rng.shuffle(pool)
    for r in hidden:
        r["contents"] = []
        if r["name"] not in visited and r.get("openable"):
            r["open"] = rng.random() < 0.5
    goal = scene["goal"]
    for o in pool:  # as the generator does, no goal object starts in a target (the task would be done)
        gobj = V.type_from_name(o["name"]) == goal["object"]
        rng.choice([r for r in hidden if not (gobj and r["type"] == goal.get("receptacle"))])["contents"].append(o)
    return scene


def hidden_state_probe(expert: str, per_type: int) -> tuple[int, int, int]:
    """Replay each expert episode's prefixes in scenes whose unseen parts are scrambled.

    Returns (decisions compared, decisions that changed, scenes whose hidden part changed).
    """
    rng = random.Random(0)
    a = ALFWorldEnv(expert=expert)
    b = ALFWorldEnv(expert=expert)
    compared = changed = differs = 0
    for task in sample_tasks(per_type):
        cmds, texts, reward = expert_episode(a, {"task": task})
        assert reward == 1.0, task.task_id
        base = a.scene_spec().model_dump(exclude_none=True)
        for t in range(len(cmds)):
            scene = scrambled(a.scene_spec().model_dump(exclude_none=True), cmds[:t], rng)
            differs += scene != base
            obs, _ = b.reset(options={"scene": scene})
            seen = texts_of(obs)
            for c in cmds[:t]:
                obs, *_ = b.step(c)
                seen += texts_of(obs)
            assert seen == texts[: len(seen)], "the scramble changed something the transcript showed"
            compared += 1
            changed += b.expert_command() != cmds[t]
    return compared, changed, differs


def test_observer_never_reads_hidden_state() -> None:
    compared, changed, differs = hidden_state_probe("observer", per_type=3)
    assert compared > 500 and differs > compared // 2  # the probe really moved hidden things
    assert changed == 0


def test_the_hidden_state_probe_catches_the_planner() -> None:
    # the same probe on the planner, which walks straight to hidden objects: its decisions change
    compared, changed, _ = hidden_state_probe("planner", per_type=1)
    assert changed > compared // 10


@pytest.mark.parametrize("kwargs", [{}, {"obs_style": "raw"}, {"obs_style": "compact"},
                                    {"grammar": "v0.4", "obs_style": "raw"}, {"grammar": "v0.4", "obs_style": "compact"},
                                    {"action_mode": "tool"}])
def test_observer_is_a_function_of_the_transcript_text(kwargs: dict[str, Any]) -> None:
    # a fresh ObservationExpert (no env, no goal hint) fed only the texts gives the env expert's commands
    env = ALFWorldEnv(**kwargs)
    grammar = kwargs.get("grammar", "classic")
    for task in sample_tasks(1):
        cmds, texts, reward = expert_episode(env, {"task": task})
        assert reward == 1.0, task.task_id
        assert len(texts) == len(cmds) + 1
        for t, cmd in enumerate(cmds):
            assert ObservationExpert.from_transcript(texts[: t + 1], grammar).command() == cmd


# ------------------------------------------------------------------------------ search order
KITCHEN = ["cabinet 3", "cabinet 2", "cabinet 1", "coffeemachine 1", "countertop 2", "countertop 1", "drawer 2",
           "drawer 1", "fridge 1", "garbagecan 1", "microwave 1", "shelf 1", "sinkbasin 1", "stoveburner 1",
           "toaster 1"]


def test_search_order_surfaces_first_target_last_then_the_rest() -> None:
    # a mug: cabinets, coffee machine, countertops, fridge, microwave, shelf, sink basin can hold it;
    # drawers, the garbage can, stove burners and the toaster cannot
    assert search_order(KITCHEN, "Mug", "CounterTop") == [
        "coffeemachine 1", "shelf 1", "sinkbasin 1",                      # open surfaces, listing order
        "cabinet 3", "cabinet 2", "cabinet 1", "fridge 1", "microwave 1",  # receptacles that open
        "countertop 2", "countertop 1",                                    # the target type
        "drawer 2", "drawer 1", "garbagecan 1", "stoveburner 1", "toaster 1",  # cannot hold a mug
    ]
    assert search_order(KITCHEN, "Apple", "Fridge")[:4] == ["countertop 2", "countertop 1", "garbagecan 1", "sinkbasin 1"]
    # lamps stand where ALFWorld's scenes put them, though nothing takes a lamp
    assert search_order(["bed 1", "desk 1", "drawer 1", "sidetable 1"], "DeskLamp", None)[:2] == ["desk 1", "sidetable 1"]


def test_goal_sentences_parse() -> None:
    assert parse_goal("put a clean lettuce in diningtable.") == Goal("pick_clean_then_place_in_recep", "Lettuce", "DiningTable")
    assert parse_goal("find two pen and put them in drawer.") == Goal("pick_two_obj_and_place", "Pen", "Drawer")
    assert parse_goal("examine the alarmclock with the desklamp.") == Goal("look_at_obj_in_light", "AlarmClock", None, "DeskLamp")
    assert parse_goal("put some cd on safe.") == Goal("pick_and_place_simple", "CD", "Safe")
    for task_type in V.TASK_TYPES:
        for variant in (0, 1):
            tpl = V.GOAL_TEMPLATES[task_type][variant]
            g = parse_goal(tpl.format(o="mug", r="shelf", l="floorlamp"))
            assert g is not None and g.task_type == task_type
    assert parse_goal("tidy up the kitchen.") is None
    assert parse_goal("put a clean unicorn in diningtable.") is None


# ------------------------------------------------------------------------------ each task type
def expert_run(scene: dict[str, Any], **kw: Any) -> tuple[list[str], float]:
    env = ALFWorldEnv(**kw)
    cmds, _, reward = expert_episode(env, {"scene": scene})
    return cmds, reward


def test_pick_and_place_searches_surfaces_then_opens() -> None:
    scene = {"receptacles": [{"name": "cabinet 2", "contents": ["mug 1"]}, {"name": "cabinet 1"},
                             {"name": "countertop 1", "contents": ["apple 1"]}, {"name": "drawer 1"},
                             {"name": "shelf 1"}, {"name": "shelf 2"}],
             "goal": {"task_type": "pick_and_place_simple", "object": "Mug", "receptacle": "Shelf"}}
    cmds, reward = expert_run(scene)
    assert reward == 1.0
    # shelves are the target: searched last; the drawer cannot hold a mug; listing order is cabinet 2, cabinet 1
    assert cmds == ["go to countertop 1", "go to cabinet 2", "open cabinet 2", "take mug 1 from cabinet 2",
                    "go to shelf 2", "put mug 1 in/on shelf 2"]
    cmds, reward = expert_run(scene, grammar="v0.4")
    assert reward == 1.0 and cmds[-1] == "move mug 1 to shelf 2"


@pytest.mark.parametrize("task, appliance, verb", [("pick_clean_then_place_in_recep", "sinkbasin 1", "clean"),
                                                   ("pick_heat_then_place_in_recep", "microwave 1", "heat"),
                                                   ("pick_cool_then_place_in_recep", "fridge 1", "cool")])
def test_transform_tasks(task: str, appliance: str, verb: str) -> None:
    scene = {"receptacles": [{"name": "cabinet 1"}, {"name": "countertop 1"},
                             {"name": "diningtable 1", "contents": ["bread 1", "potato 1"]},
                             {"name": "fridge 1"}, {"name": "microwave 1"}, {"name": "sinkbasin 1"}],
             "goal": {"task_type": task, "object": "Potato", "receptacle": "CounterTop"}}
    cmds, reward = expert_run(scene)
    assert reward == 1.0
    # a cabinet cannot hold a potato; the countertop is the target: the dining table comes first
    assert cmds == ["go to diningtable 1", "take potato 1 from diningtable 1", f"go to {appliance}",
                    f"{verb} potato 1 with {appliance}", "go to countertop 1", "put potato 1 in/on countertop 1"]


def test_an_object_found_in_the_fridge_is_still_cooled() -> None:
    # the transcript never says it is cold, so the expert cools it (the planner, which knows, does not)
    scene = {"receptacles": [{"name": "fridge 1", "contents": [{"name": "apple 1", "cool": True}]},
                             {"name": "countertop 1"}],
             "goal": {"task_type": "pick_cool_then_place_in_recep", "object": "Apple", "receptacle": "CounterTop"}}
    cmds, reward = expert_run(scene)
    assert reward == 1.0 and "cool apple 1 with fridge 1" in cmds
    cmds, reward = expert_run(scene, expert="planner")
    assert reward == 1.0 and "cool apple 1 with fridge 1" not in cmds


def test_two_objects_remembers_where_the_second_was_seen() -> None:
    scene = {"receptacles": [{"name": "sidetable 1", "contents": ["book 1"]}, {"name": "shelf 1", "contents": ["book 2"]},
                             {"name": "bed 1"}, {"name": "drawer 1"}],
             "goal": {"task_type": "pick_two_obj_and_place", "object": "Book", "receptacle": "Bed"}}
    cmds, reward = expert_run(scene)
    assert reward == 1.0
    assert cmds == ["go to shelf 1", "take book 2 from shelf 1", "go to bed 1", "put book 2 in/on bed 1",
                    "go to sidetable 1", "take book 1 from sidetable 1", "go to bed 1", "put book 1 in/on bed 1"]


def test_look_at_in_light_searches_the_lamp_after_the_object() -> None:
    scene = {"receptacles": [{"name": "bed 1", "contents": ["pillow 1"]}, {"name": "desk 1", "contents": ["desklamp 1"]},
                             {"name": "drawer 1"}, {"name": "armchair 1"}],
             "goal": {"task_type": "look_at_obj_in_light", "object": "Pillow", "lamp": "DeskLamp"}}
    cmds, reward = expert_run(scene)
    assert reward == 1.0
    # a pillow: armchair then bed (listing order); then the lamp's homes: the desk
    assert cmds == ["go to armchair 1", "go to bed 1", "take pillow 1 from bed 1", "go to desk 1", "use desklamp 1"]


def test_look_at_in_light_goes_back_to_a_lamp_seen_on_the_way() -> None:
    scene = {"receptacles": [{"name": "sidetable 1", "contents": ["floorlamp 1"]}, {"name": "sofa 1", "contents": ["cellphone 1"]}],
             "goal": {"task_type": "look_at_obj_in_light", "object": "CellPhone", "lamp": "FloorLamp"}}
    cmds, reward = expert_run(scene)
    assert reward == 1.0
    assert cmds == ["go to sidetable 1", "go to sofa 1", "take cellphone 1 from sofa 1", "go to sidetable 1",
                    "use floorlamp 1"]


def test_unwanted_objects_go_back_where_they_came_from() -> None:
    scene = {"receptacles": [{"name": "countertop 1", "contents": ["apple 1"]}, {"name": "cabinet 1", "contents": ["mug 1"]},
                             {"name": "shelf 1"}],
             "goal": {"task_type": "pick_and_place_simple", "object": "Mug", "receptacle": "Shelf"}}
    env = ALFWorldEnv()
    env.reset(options={"scene": scene})
    for c in ["go to countertop 1", "take apple 1 from countertop 1", "go to shelf 1"]:
        env.step(c)
    # the shelf cannot hold an apple (and it is the target type): back to the countertop
    assert env.expert_command() == "go to countertop 1"
    env.step("go to countertop 1")
    assert env.expert_command() == "put apple 1 in/on countertop 1"


def test_a_custom_goal_wording_uses_the_stated_goal() -> None:
    scene = {"receptacles": [{"name": "countertop 1", "contents": ["apple 1"]}, {"name": "fridge 1"}],
             "goal": {"task_type": "pick_and_place_simple", "object": "Apple", "receptacle": "Fridge",
                      "description": "the apple belongs in the cold."}}
    cmds, reward = expert_run(scene)
    assert reward == 1.0 and cmds[-1] == "put apple 1 in/on fridge 1"
    assert ObservationExpert.from_transcript(["You see: countertop 1, fridge 1.\nTask: the apple belongs in the cold."]
                                             ).command() == "look"  # without the hint it cannot know


def test_expert_kwarg() -> None:
    assert ALFWorldEnv().expert == "observer"
    with pytest.raises(ConfigurationError, match="expert must be"):
        ALFWorldEnv(expert="oracle")


def test_observer_survives_random_detours() -> None:
    # DAgger-style: random admissible commands between the expert's; the expert never issues an invalid
    # command, and finishes unless a detour picked up a thing ALFWorld lets no receptacle take back
    env = ALFWorldEnv()
    rng = random.Random(1)
    stuck = solved = 0
    for task in sample_tasks(6):
        _, info = env.reset(options={"task": task})
        for _ in range(200):
            if rng.random() < 0.3:
                cmd = rng.choice(info["admissible_actions"])
                _, reward, term, _, info = env.step(cmd)
            else:
                before = info["metrics"].get("invalid_actions", 0)
                _, reward, term, _, info = env.step(env.expert_command())
                assert info["metrics"].get("invalid_actions", 0) == before, task.task_id
            if term:
                break
        if reward == 1.0:
            solved += 1
        else:
            held = env._held
            assert held is not None and not any(held.otype in a for a in V.RECEPTACLE_TYPES.values()), task.task_id
            stuck += 1
    assert solved >= 100 and stuck <= solved // 20


# ------------------------------------------------------------------------------ selecting it
def test_collect_and_eval_select_either_expert(tmp_path: Path) -> None:
    # agentgym collect --policy expert plays the observer unless --env-kwarg expert=planner; the env kwargs
    # (e.g. obs_style=compact) reach every env the rollout makes, and agentgym eval selects the same way
    steps: dict[str, int] = {}
    for expert in ("observer", "planner"):
        out = tmp_path / f"{expert}.jsonl"
        res = subprocess.run([sys.executable, "-m", "agentgym", "collect", "--env", "agentgym/ALFWorld-v0",
                              "--policy", "expert", "--split", "valid_unseen", "--tasks", "12",
                              "--env-kwarg", f"expert={expert}", "--env-kwarg", "obs_style=compact", "--out", str(out), "--json"],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        summary = json.loads(res.stdout)
        assert summary["success_rate"] == 1.0 and summary["env_kwargs"] == {"expert": expert, "obs_style": "compact"}
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) == 12
        env = ALFWorldEnv(expert=expert, obs_style="compact")
        for r in rows:
            users = [m["content"] for m in r["messages"] if m["role"] == "user"]
            assert users[0].startswith("You see: ")
            cmds, _, _ = expert_episode(env, {"task_id": r["task_id"]})
            assert [m["content"] for m in r["messages"] if m["role"] == "assistant"] == cmds
        steps[expert] = sum(sum(m["role"] == "assistant" for m in r["messages"]) for r in rows)
    assert steps["observer"] > steps["planner"]  # it searches
    bad = subprocess.run([sys.executable, "-m", "agentgym", "collect", "--env", "agentgym/ALFWorld-v0", "--tasks", "1",
                          "--env-kwarg", "expert=oracle", "--out", str(tmp_path / "x.jsonl")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "expert must be" in bad.stderr
    res = subprocess.run([sys.executable, "-m", "agentgym", "eval", "--env", "agentgym/ALFWorld-v0", "--policy", "expert",
                          "--split", "valid_unseen", "--tasks", "6", "--env-kwarg", "expert=planner",
                          "--out", str(tmp_path / "eval")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr

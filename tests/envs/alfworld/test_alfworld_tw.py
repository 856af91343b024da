"""ALFWorld-TW-v0 (the real alfworld package) and the native engine played side by side.

Without ``alfworld`` installed, only the install-instruction tests run. With it (``pip install
alfworld``; no game data needed), native scenes are exported as ``.tw-pddl`` games and both
engines must produce the same text, rewards and admissible commands step by step.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from pathlib import Path

import pytest
from agentgym.envs.alfworld.env import ALFWorldEnv

import agentgym
from agentgym.errors import DependencyNotInstalled

HAVE_ALFWORLD = all(importlib.util.find_spec(m) is not None for m in ("alfworld", "textworld", "fast_downward"))
needs_alfworld = pytest.mark.skipif(
    not HAVE_ALFWORLD, reason="alfworld is not installed (pip install alfworld); the native engine is tested alone"
)


def test_missing_package_raises_with_install_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "alfworld", None)  # makes `import alfworld` fail
    with pytest.raises(DependencyNotInstalled) as err:
        agentgym.make("agentgym/ALFWorld-TW-v0")
    msg = str(err.value)
    assert "pip install alfworld" in msg and "alfworld-download" in msg and "ALFWorld-v0" in msg


@needs_alfworld
def test_missing_data_raises_with_download_instructions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(DependencyNotInstalled, match="alfworld-download"):
        agentgym.make("agentgym/ALFWorld-TW-v0")


@needs_alfworld
@pytest.mark.slow
@pytest.mark.parametrize("split, indices", [("valid_unseen", range(0, 6)), ("train", range(100, 106))])
def test_native_engine_matches_real_alfworld(tmp_path: Path, split: str, indices: range) -> None:
    from agentgym.envs.alfworld.tw import ALFWorldTWEnv, write_tw_game

    native = ALFWorldEnv(grammar="v0.4", obs_style="raw")
    rng = random.Random(len(split))
    types, steps = set(), 0
    for idx in indices:
        native.reset(options={"split": split, "index": idx})
        scene = native.scene_spec()
        game = write_tw_game(scene, tmp_path / f"game{idx}.tw-pddl")
        real = ALFWorldTWEnv(game_files=[str(game)], obs_style="raw")
        o_real, i_real = real.reset(seed=0)
        o_nat, i_nat = native.reset(options={"scene": scene})
        assert o_real[-1] == o_nat[-1]
        assert i_real["admissible_actions"] == i_nat["admissible_actions"]
        adm = i_nat["admissible_actions"]
        for _ in range(30):
            u = rng.random()
            if u < 0.4:
                cmd = native.expert_action()
            elif u < 0.85:
                cmd = rng.choice(adm)
            else:
                here = native._at.name if native._at is not None else "moon 1"
                cmd = rng.choice(["look", "inventory", "help", "", "go to moon 1", "examine " + rng.choice(list(native._objs)),
                                  "use desklamp 1", "take mug 1 from fridge 1", "put apple 1 in/on countertop 1",
                                  "go to " + here, "Go to " + here, "open " + here, "close " + here, "LOOK",
                                  "go  to cabinet 1", "think: where is it?"])
            r_real = real.step(cmd)
            r_nat = native.step(cmd)
            steps += 1
            assert r_real[0] == r_nat[0], cmd
            assert r_real[1:4] == r_nat[1:4], cmd
            assert r_real[4].get("admissible_actions") == r_nat[4].get("admissible_actions"), cmd
            if r_nat[2]:
                break
            adm = r_nat[4]["admissible_actions"]
        types.add(scene.goal.task_type)
        real.close()
    assert len(types) == 6 and steps >= 60


@needs_alfworld
@pytest.mark.slow
def test_react_style_strips_like_the_harnesses(tmp_path: Path) -> None:
    from agentgym.envs.alfworld.tw import ALFWorldTWEnv, write_tw_game

    native = ALFWorldEnv(grammar="v0.4")
    o_nat, _ = native.reset(options={"split": "valid_seen", "index": 3})
    game = write_tw_game(native.scene_spec(), tmp_path / "g.tw-pddl")
    real = ALFWorldTWEnv(game_files=[str(game)])
    argv = sys.argv[:]
    o_real, _ = real.reset()
    assert sys.argv == argv  # Fast Downward rewrites sys.argv; the adapter puts it back
    assert o_real[-1] == o_nat[-1] and "Welcome" not in o_real[-1]["content"]
    for _ in range(4):
        cmd = native.expert_action()
        assert real.step(cmd)[0] == native.step(cmd)[0], cmd
    real.close()


@needs_alfworld
@pytest.mark.slow
@pytest.mark.skipif(
    not (Path(os.environ.get("ALFWORLD_DATA", Path.home() / ".cache" / "alfworld")) / "json_2.1.1").is_dir(),
    reason="ALFWorld's game data is not downloaded (run alfworld-download)",
)
def test_real_alfworld_data_passes_the_checker() -> None:
    env = agentgym.make("agentgym/ALFWorld-TW-v0")
    assert len(env.unwrapped.tasks("valid_seen")) > 0
    agentgym.check_env(env, gym_checks=False)


def test_game_files_left_out_are_counted_with_reasons(tmp_path: Path) -> None:
    import json

    from agentgym.envs.alfworld.tw import _collect_games

    from agentgym.loading import LoadReport

    games = {
        "pick_and_place_simple-Mug-None-Desk-308/trial_1": {"solvable": True},
        "look_at_obj_in_light-Pillow-None-FloorLamp-219/trial_2": {"solvable": True},
        "pick_and_place_with_movable_recep-Pen-Mug-Desk-308/trial_3": {"solvable": True},
        "pick_heat_then_place_in_recep-AppleSliced-None-Fridge-10/trial_4": {"solvable": True},
        "pick_cool_then_place_in_recep-Pan-None-Fridge-10/trial_5": {"solvable": False},
        "pick_clean_then_place_in_recep-Cloth-None-Cart-401/trial_6": "not json {",
    }
    for name, body in games.items():
        f = tmp_path / "valid_seen" / name / "game.tw-pddl"
        f.parent.mkdir(parents=True)
        f.write_text(body if isinstance(body, str) else json.dumps(body))
    report = LoadReport("ALFWorld-TW-v0")
    kept = _collect_games(tmp_path / "valid_seen", report)
    assert [Path(g).parent.parent.name for g in kept] == ["look_at_obj_in_light-Pillow-None-FloorLamp-219",
                                                           "pick_and_place_simple-Mug-None-Desk-308"]
    assert report.reasons() == {"movable-receptacle or sliced game (left out by ALFWorld's text env too)": 2,
                                "unreadable game file": 1, "game marked unsolvable": 1}


@needs_alfworld
@pytest.mark.slow
def test_floor_lamp_fixtures_and_stated_open_states_match_real_alfworld(tmp_path: Path) -> None:
    from agentgym.envs.alfworld.scene import load_scene
    from agentgym.envs.alfworld.tw import ALFWorldTWEnv, write_tw_game

    scenes = {
        "lamp": ({"receptacles": [
            {"name": "armchair 1", "contents": ["pillow 1"]},
            {"name": "sidetable 1", "contents": ["desklamp 1", "houseplant 1"]},
            {"name": "sofa 1", "contents": ["floorlamp 1", "remotecontrol 1"]},
            {"name": "tvstand 1", "contents": ["television 1"]}],
            "goal": {"task_type": "look_at_obj_in_light", "object": "Pillow", "lamp": "FloorLamp", "template": 1}},
            ["go to tvstand 1", "take television 1 from tvstand 1", "go to armchair 1", "take pillow 1 from armchair 1",
             "go to sidetable 1", "use desklamp 1", "examine pillow 1", "go to sofa 1", "use floorlamp 1"]),
        "open": ({"receptacles": [
            {"name": "cabinet 1", "openable": False, "contents": ["plunger 1"]},
            {"name": "drawer 1", "open": True, "contents": ["spraybottle 1"]},
            {"name": "toilet 1", "contents": ["scrubbrush 1"]}],
            "goal": {"task_type": "pick_and_place_simple", "object": "SprayBottle", "receptacle": "Toilet", "template": 1}},
            ["go to cabinet 1", "open cabinet 1", "examine cabinet 1", "go to drawer 1", "close drawer 1",
             "open drawer 1", "take spraybottle 1 from drawer 1", "go to toilet 1", "put spraybottle 1 in/on toilet 1"]),
    }
    for name, (scene, cmds) in scenes.items():
        spec = load_scene(scene)
        native = ALFWorldEnv(grammar="v0.4", obs_style="raw")
        game = write_tw_game(spec, tmp_path / f"{name}.tw-pddl")
        real = ALFWorldTWEnv(game_files=[str(game)], obs_style="raw")
        o_real, i_real = real.reset(seed=0)
        o_nat, i_nat = native.reset(options={"scene": spec})
        assert o_real[-1] == o_nat[-1] and i_real["admissible_actions"] == i_nat["admissible_actions"]
        for cmd in [c.replace("put spraybottle 1 in/on", "move spraybottle 1 to") for c in cmds]:
            r_real, r_nat = real.step(cmd), native.step(cmd)
            assert r_real[0] == r_nat[0] and r_real[1:4] == r_nat[1:4], (name, cmd)
            assert r_real[4].get("admissible_actions") == r_nat[4].get("admissible_actions"), (name, cmd)
        assert r_nat[1] == 1.0, name
        real.close()

"""``ALFWorld-TW-v0``: the real ``alfworld`` package (TextWorld + Fast Downward) behind AgentEnv.

It plays ALFWorld's own game files (``$ALFWORLD_DATA/json_2.1.1/{train,valid_seen,valid_unseen}``,
fetched by ``alfworld-download``), or any ``.tw-pddl`` files passed as ``game_files``.
:func:`write_tw_game` turns a native :class:`~agentgym.envs.alfworld.scene.SceneSpec` into such a
file, so one scene can be played by both engines side by side.

Nothing from ``alfworld``/``textworld`` is imported until the env is built. Without them (or
without their data) the constructor raises :class:`~agentgym.errors.DependencyNotInstalled` with
install instructions.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentgym.envs.alfworld import scene as S
from agentgym.envs.alfworld import vocab as V

from agentgym.core import AgentEnv, StepResult
from agentgym.errors import ConfigurationError, DependencyNotInstalled
from agentgym.loading import LoadReport
from agentgym.types import Message, TaskSpec

__all__ = ["ALFWorldTWEnv", "scene_to_tw_game", "write_tw_game"]

log = logging.getLogger(__name__)

_INSTALL_HINT = (
    "ALFWorld-TW-v0 also needs ALFWorld's game files: run `alfworld-download` (it fills $ALFWORLD_DATA, "
    "default ~/.cache/alfworld), or pass game_files=[...] with .tw-pddl files. "
    "The native engine agentgym/ALFWorld-v0 needs none of this"
)
_SPLIT_DIRS = {"train": "train", "valid_seen": "valid_seen", "valid_unseen": "valid_unseen"}


def _import_alfworld() -> Any:
    try:
        import alfworld.agents.environment.alfred_tw_env as atw
        import alfworld.info  # noqa: F401
        import textworld  # noqa: F401
    except ImportError as e:
        raise DependencyNotInstalled("agentgym/ALFWorld-TW-v0", "alfworld", _INSTALL_HINT + f" (import failed: {e})") from None
    return atw


class ALFWorldTWEnv(AgentEnv):
    """The real ALFWorld (TextWorld) engine as an AgentEnv; plain-text commands, react parser.

    Args:
        data_path: ALFWorld's data folder (default ``$ALFWORLD_DATA`` or ``~/.cache/alfworld``).
        game_files: Explicit ``.tw-pddl`` files; they form the ``custom`` split.
        obs_style: ``"react"`` strips TextWorld's banner and ``You arrive at loc N.`` (as ReAct
            and AgentBench do); ``"raw"`` keeps TextWorld's text.
        system_prompt: Put a system message describing the commands first.
    """

    family = "alfworld"
    default_parser = "react"
    splits: ClassVar[tuple[str, ...]] = ("train", "valid_seen", "valid_unseen")
    default_split = "train"

    def __init__(
        self,
        *,
        data_path: str | None = None,
        game_files: Sequence[str] | None = None,
        obs_style: str = "react",
        system_prompt: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if obs_style not in ("react", "raw"):
            raise ConfigurationError(f"obs_style must be 'react' or 'raw', got {obs_style!r}.")
        self._atw = _import_alfworld()
        import textworld

        self._textworld = textworld
        self.obs_style = obs_style
        self.include_system = bool(system_prompt)
        self._games: dict[str, list[str]] = {}
        if game_files:
            missing = [g for g in game_files if not Path(g).is_file()]
            if missing:
                raise ConfigurationError(f"ALFWorld game files not found: {missing[:3]}")
            self.splits = ("custom",)  # type: ignore[misc]  # this instance plays only the given games
            self.default_split = "custom"  # type: ignore[misc]
            self._games["custom"] = [str(Path(g).resolve()) for g in game_files]
        else:
            root = Path(data_path or os.environ.get("ALFWORLD_DATA") or Path.home() / ".cache" / "alfworld")
            base = root / "json_2.1.1"
            if not base.is_dir():
                raise DependencyNotInstalled(
                    "agentgym/ALFWorld-TW-v0", "alfworld", _INSTALL_HINT + f" ({base} does not exist)"
                )
            self.load_log.env, self.load_log.source = "ALFWorld-TW-v0", str(base)
            for split, sub in _SPLIT_DIRS.items():
                self._games[split] = _collect_games(base / sub, self.load_log)
            self.load_log.loaded = sum(len(g) for g in self._games.values())
            self.load_log.warn(log)
        self._tw: Any = None
        self._adm: list[str] = []

    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        games = self._games.get(split, [])
        out = []
        for g in games:
            p = Path(g)
            name = f"{p.parent.parent.name}/{p.parent.name}" if p.name == "game.tw-pddl" else p.stem
            task_type = next((t for t in V.TASK_TYPES if name.startswith(t)), "default")
            out.append(TaskSpec(f"{split}/{name}", split, task_type, {"game_file": g}))
        return out

    def system_prompt(self) -> str:
        return (
            "You are in a household and must complete the task given in the first observation. "
            "Reply with exactly one command per turn (e.g. 'go to cabinet 1', 'take apple 1 from countertop 1'). "
            "A command that cannot be carried out gives 'Nothing happens.'"
        )

    def reset_task(self, task: TaskSpec) -> list[Message]:
        tw = self._textworld
        atw = self._atw
        if self._tw is not None:
            self._tw.close()
        infos = tw.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        argv = sys.argv[:]  # Fast Downward's translator overwrites sys.argv while loading a game
        try:
            self._tw = tw.start(task.data["game_file"], request_infos=infos,
                                wrappers=[atw.AlfredDemangler, atw.AlfredInfos])
            state = self._tw.reset()
        finally:
            sys.argv[:] = argv
        self._adm = list(state["admissible_commands"])
        text = state["feedback"]
        if self.obs_style == "react":
            text = "\n".join(text.strip().split("\n\n")[1:])
        msgs: list[Message] = []
        if self.include_system:
            msgs.append({"role": "system", "content": self.system_prompt()})
        msgs.append({"role": "user", "content": text})
        return msgs

    def on_command(self, command: str) -> StepResult:
        return self._play(command)

    def on_text(self, text: str) -> StepResult:
        return self._play(text)

    def run_tool_calls(self, calls: list[Any]) -> StepResult:
        return self._play("")

    def _play(self, command: str) -> StepResult:
        if command.strip().startswith("think:"):  # the ReAct harness's thought action
            return StepResult([{"role": "user", "content": "OK."}])
        state, _score, done = self._tw.step(command.strip())
        self._adm = list(state["admissible_commands"])
        text = state["feedback"]
        if self.obs_style == "react":
            text = text.strip()
            if text.startswith("You arrive at loc "):
                text = text[text.find(". ") + 2:]
        if text.strip() == "Nothing happens.":
            self.count("invalid_actions")
        won = bool(state["won"])
        if won:
            self.finish(1.0, True)
        return StepResult([{"role": "user", "content": text}], terminated=bool(done) and not won)

    def admissible_actions(self) -> list[str] | None:
        return list(self._adm)

    def close(self) -> None:
        if self._tw is not None:
            self._tw.close()
            self._tw = None
        super().close()


def _collect_games(folder: Path, report: LoadReport | None = None) -> list[str]:
    """ALFWorld's solvable, non-sliced, non-movable games under ``folder`` (as AlfredTWEnv picks them).

    Every game left out is recorded in ``report`` with its reason.
    """
    out: list[str] = []
    if not folder.is_dir():
        return out

    def skip(game: Path, reason: str) -> None:
        if report is not None:
            report.skip(f"{folder.name}/{game.parent.parent.name}/{game.parent.name}", reason)

    for game in sorted(folder.glob("*/*/game.tw-pddl")):
        name = game.parent.parent.name
        if "movable" in name or "Sliced" in name:
            skip(game, "movable-receptacle or sliced game (left out by ALFWorld's text env too)")
            continue
        try:
            solvable = json.loads(game.read_text()).get("solvable", False)
        except (OSError, json.JSONDecodeError, AttributeError):
            skip(game, "unreadable game file")
            continue
        if not solvable:
            skip(game, "game marked unsolvable")
            continue
        out.append(str(game))
    return out


# --------------------------------------------------------------------------- native scene -> game
def _ids(names: list[str]) -> dict[str, str]:
    """PDDL ids that alfworld's Demangler turns back into exactly these names."""
    by_word: dict[str, list[str]] = {}
    for n in names:
        by_word.setdefault(n.rsplit(" ", 1)[0], []).append(n)
    out: dict[str, str] = {}
    for word, group in by_word.items():
        nums = sorted(int(n.rsplit(" ", 1)[1]) for n in group)
        if nums != list(range(1, len(nums) + 1)):
            raise ConfigurationError(f"write_tw_game needs {word} numbered 1..N, got {nums}.")
        stem, tail = (word[: -len("basin")], "_bar_basin") if word.endswith("basin") else (word, "")
        count = len(nums)
        for k in nums:
            # the Demangler numbers sorted ids from the highest down
            out[f"{word} {k}"] = f"{stem}_bar_{count - k + 1:03d}{tail}"
    return out


def scene_to_tw_game(spec: S.SceneSpec, domain: str, grammar: str) -> dict[str, Any]:
    """A TextWorld ``.tw-pddl`` game (dict) for a native scene, under ALFWorld's domain and grammar."""
    spec = S.load_scene(spec)
    rnames = [r.name for r in spec.receptacles]
    onames = [c.name for r in spec.receptacles for c in r.contents if isinstance(c, S.ObjectSpec)]
    ids = _ids(rnames + onames)
    objs = ["agent1 - agent", "loc_bar_start - location"]
    init = ["(atLocation agent1 loc_bar_start)", "(= (total-cost) 0)"]
    rtypes: set[str] = set()
    otypes: set[str] = set()
    for i, r in enumerate(spec.receptacles):
        assert r.type is not None
        rid = ids[r.name]
        loc = f"loc_bar_{i + 1:03d}"
        objs += [f"{rid} - receptacle", f"{loc} - location"]
        init += [f"(receptacleAtLocation {rid} {loc})", f"(receptacleType {rid} {r.type}Type)"]
        rtypes.add(r.type)
        if r.openable:
            init.append(f"(openable {rid})")
            if r.open:
                init.append(f"(opened {rid})")
        for c in r.contents:
            assert isinstance(c, S.ObjectSpec) and c.type is not None
            oid = ids[c.name]
            otypes.add(c.type)
            objs.append(f"{oid} - object")
            init += [f"(inReceptacle {oid} {rid})", f"(objectAtLocation {oid} {loc})", f"(objectType {oid} {c.type}Type)"]
            flags = {
                "pickupable": c.type in V.PICKUPABLE, "cleanable": c.type in V.CLEANABLE,
                "heatable": c.type in V.HEATABLE, "coolable": c.type in V.COOLABLE,
                "toggleable": c.type in V.TOGGLEABLE, "isReceptacleObject": c.type in V.RECEPTACLE_OBJECTS,
                "isClean": c.clean, "isHot": c.hot, "isCool": c.cool,
                "isToggled": c.on,
            }
            init += [f"({k} {oid})" for k, v in flags.items() if v]
    objs += [f"{t}Type - rtype" for t in sorted(rtypes)] + [f"{t}Type - otype" for t in sorted(otypes)]
    init += [
        f"(canContain {rt}Type {ot}Type)"
        for rt in sorted(rtypes) for ot in sorted(otypes) if ot in V.RECEPTACLE_TYPES[rt]
    ]
    g = spec.goal
    if g.task_type == "look_at_obj_in_light":
        goal = (
            f"(exists (?t - object ?o - object ?a - agent ?l - location) (and (objectType ?t {g.lamp}Type) "
            f"(toggleable ?t) (isToggled ?t) (objectAtLocation ?t ?l) (atLocation ?a ?l) "
            f"(objectType ?o {g.object}Type) (holds ?a ?o)))"
        )
    elif g.task_type == "pick_two_obj_and_place":
        goal = (
            f"(exists (?r - receptacle ?o1 - object ?o2 - object) (and (receptacleType ?r {g.receptacle}Type) "
            f"(objectType ?o1 {g.object}Type) (objectType ?o2 {g.object}Type) (inReceptacle ?o1 ?r) "
            "(inReceptacle ?o2 ?r) (not (= ?o1 ?o2))))"
        )
    else:
        state = {"pick_clean_then_place_in_recep": "(isClean ?o) ", "pick_heat_then_place_in_recep": "(isHot ?o) ",
                 "pick_cool_then_place_in_recep": "(isCool ?o) "}.get(g.task_type, "")
        goal = (
            f"(exists (?r - receptacle ?o - object) (and (receptacleType ?r {g.receptacle}Type) "
            f"(objectType ?o {g.object}Type) {state}(inReceptacle ?o ?r)))"
        )
    problem = (
        "(define (problem agentgym_scene)\n(:domain alfred)\n(:objects\n  " + "\n  ".join(objs) + "\n)\n"
        "(:init\n  " + "\n  ".join(init) + "\n)\n(:goal " + goal + ")\n(:metric minimize (total-cost))\n)\n"
    )
    assert g.description is not None
    return {
        "pddl_domain": domain,
        "grammar": grammar.replace("UNKNOWN GOAL.", g.description),
        "pddl_problem": problem,
        "solvable": True,
    }


def write_tw_game(spec: S.SceneSpec, path: str | Path) -> Path:
    """Write a native scene as an ALFWorld ``.tw-pddl`` game (needs the ``alfworld`` package)."""
    _import_alfworld()
    import alfworld.info as info

    domain = Path(info.ALFRED_PDDL_PATH).read_text()
    grammar = Path(info.ALFRED_TWL2_PATH).read_text()
    p = Path(path)
    p.write_text(json.dumps(scene_to_tw_game(spec, domain, grammar)))
    return p

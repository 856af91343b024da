"""Trajectories round-trip through JSONL exactly, and interrupted files stay readable."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from rollout_fakes import FakeTokenPolicy

from agentgym.rollout import (
    GroupRequest,
    MultiTurnWorkflow,
    RolloutEngine,
    RolloutRuntime,
    append_jsonl,
    read_jsonl,
    write_jsonl,
)
from agentgym.rollout.jsonl import dumps_trajectory, loads_trajectory
from agentgym.types import Trajectory, Turn


def rich_trajectory() -> Trajectory:
    turns = [
        Turn("solver", [1, 2, 3], [4, 5], [-0.1, -1e-300], [3, 4], "héllo <tool_call>🙂",
             [{"id": "c0", "name": "f", "arguments": {"x": [1, {"y": None}], "s": "ü\n\"q\""}}],
             [{"role": "tool", "tool_call_id": "c0", "name": "f", "content": "out"}], "length", 0.5),
        Turn("verifier", [], [9], [0.0], 2, "APPROVE", [], [], "stop", -1.0),
    ]
    return Trajectory("task-1", "agentgym/X-v0", "grp", 2, turns,
                      [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                      reward=0.1 + 0.2, success=True, terminated=True, truncated=False, early_stopped=True,
                      error=None, metrics={"parse_errors": 2, "nested": {"a": [1.5]}},
                      timing={"wall_s": 1 / 3}, info={"actions": ["a", "b"], "seed": 7})


def test_round_trip_is_exact(tmp_path: Path) -> None:
    t = rich_trajectory()
    assert loads_trajectory(dumps_trajectory(t)) == t
    p = tmp_path / "t.jsonl"
    assert write_jsonl(p, [t, t]) == 2
    back = read_jsonl(p)
    assert back == [t, t]
    assert back[0].turns[0].completion_logprobs[1] == -1e-300 and back[0].reward == 0.1 + 0.2
    assert back[0].segments() == t.segments()


def test_nonfinite_and_numpy_values(tmp_path: Path) -> None:
    t = rich_trajectory()
    t.metrics = {"nan": float("nan"), "inf": float("inf"), "np": np.int64(3), "arr": np.array([1.5, 2.0])}
    back = loads_trajectory(dumps_trajectory(t))
    assert math.isnan(back.metrics["nan"]) and back.metrics["inf"] == math.inf
    assert back.metrics["np"] == 3 and back.metrics["arr"] == [1.5, 2.0]


async def test_real_rollout_round_trips(tmp_path: Path) -> None:
    with RolloutRuntime() as rt:
        [trajs] = await RolloutEngine(rt).run(MultiTurnWorkflow(FakeTokenPolicy(), group_size=2),
                                              [GroupRequest("agentgym/TestCounter-v0", "ok-2")])
    p = tmp_path / "r.jsonl"
    append_jsonl(p, trajs[:1])
    append_jsonl(p, trajs[1:])
    assert read_jsonl(p) == trajs.trajectories


def test_interrupted_write_is_skipped_and_repaired(tmp_path: Path) -> None:
    t = rich_trajectory()
    p = tmp_path / "e.jsonl"
    append_jsonl(p, [t])
    with open(p, "a") as f:  # a writer killed mid-line
        f.write(dumps_trajectory(t)[:40])
    assert read_jsonl(p) == [t]
    append_jsonl(p, [t])  # the next append closes the broken line first
    assert read_jsonl(p) == [t, t]
    assert len(p.read_text().splitlines()) == 3

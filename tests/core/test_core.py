"""The env contract on the demo env: seeding, step semantics, errors and gymnasium integration."""

from __future__ import annotations

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env

import agentgym
from agentgym.errors import ResetNeeded, TaskNotFound
from agentgym.spaces import ActionSpace, ChatSpace, TextSpace
from agentgym.types import Trajectory, Turn


def make(**kw):
    return gymnasium.make("agentgym/Demo-v0", **kw)


def test_step_before_reset_and_after_end_raise() -> None:
    env = make().unwrapped
    with pytest.raises(ResetNeeded, match="before reset"):
        env.step("hi")
    env.reset(seed=0)
    env.step('<tool_call>{"name": "give_up", "arguments": {}}</tool_call>')
    with pytest.raises(ResetNeeded, match="after the episode ended"):
        env.step("hi")


def test_seeding_is_per_env_and_reproducible() -> None:
    import random

    import numpy as np

    a, b = make(), make()
    state = (random.getstate(), np.random.get_state()[1].copy())
    oa, ia = a.reset(seed=5)
    ob, ib = b.reset(seed=5)
    assert oa == ob and ia["task_id"] == ib["task_id"]
    assert random.getstate() == state[0] and (np.random.get_state()[1] == state[1]).all()
    ids = {a.reset(seed=s)[1]["task_id"] for s in range(20)}
    assert len(ids) > 5


def test_options_pick_tasks() -> None:
    env = make().unwrapped
    _, info = env.reset(options={"task_id": "guess-7"})
    assert info["task_id"] == "guess-7"
    _, info = env.reset(options={"split": "test", "index": 0})
    assert info["task_id"] == "guess-1"
    with pytest.raises(TaskNotFound, match="no task"):
        env.reset(options={"task_id": "nope"})
    with pytest.raises(TaskNotFound, match="no split"):
        env.reset(options={"split": "dev"})


def test_step_returns_only_new_messages_and_info_keys() -> None:
    env = make()
    obs, info = env.reset(options={"task_id": "guess-10"})
    assert [m["role"] for m in obs] == ["system", "user"]
    obs, r, term, trunc, info = env.step('<tool_call>{"name": "guess", "arguments": {"n": 3}}</tool_call>')
    assert obs == [{"role": "tool", "tool_call_id": "call_0", "name": "guess", "content": "higher"}]
    assert (r, term, trunc) == (0.0, False, False)
    assert info["task_id"] == "guess-10" and info["tool_calls"][0]["arguments"] == {"n": 3}
    assert info["metrics"]["tool_calls"] == 1
    obs, r, term, trunc, info = env.step('<tool_call>{"name": "guess", "arguments": {"n": 10}}</tool_call>')
    assert (r, term, trunc, info["success"]) == (1.0, True, False, True)


def test_bad_actions_are_observations_with_metrics() -> None:
    env = make(format_penalty=0.1)
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step("<tool_call>{oops</tool_call>")
    assert obs[0]["role"] == "user" and "not valid JSON" in obs[0]["content"]
    assert info["parse_error"] and r == pytest.approx(-0.1) and not term
    obs, r, *_, info = env.step('<tool_call>{"name": "guess", "arguments": {"n": "seven"}}</tool_call>')
    assert obs[0]["role"] == "tool" and "invalid arguments" in obs[0]["content"]
    assert info["metrics"] == {"parse_errors": 1, "tool_calls": 1, "tool_errors": 1, "tool_bad_arguments": 1}
    obs, *_, info = env.step("I think it's 5")
    assert "no tool call found" in obs[0]["content"] and info["parse_error"] == "no tool call found"


def test_truncation_is_separate_from_termination() -> None:
    env = make(max_episode_steps=2)
    env.reset(seed=0)
    _, _, term, trunc, _ = env.step('<tool_call>{"name": "guess", "arguments": {"n": -1}}</tool_call>')
    assert (term, trunc) == (False, False)
    _, _, term, trunc, _ = env.step('<tool_call>{"name": "guess", "arguments": {"n": -1}}</tool_call>')
    assert (term, trunc) == (False, True)


def test_gymnasium_checker_and_wrappers() -> None:
    gym_check_env(make().unwrapped, skip_render_check=True)
    env = gymnasium.wrappers.RecordEpisodeStatistics(make())
    env.reset(seed=1)
    while True:
        _, _, term, trunc, info = env.step(env.unwrapped.expert_action())
        if term or trunc:
            break
    assert info["episode"]["r"] == 1.0


def test_render_ansi() -> None:
    env = make(render_mode="ansi")
    env.reset(seed=0)
    assert "[user] Find the secret number." in env.render()


def test_spaces() -> None:
    t, a, c = TextSpace(), ActionSpace(seed=0), ChatSpace(seed=0)
    assert t.contains("漢字 <tool_call> 🙂") and not t.contains(3)
    assert TextSpace(max_length=3).contains("abc") and not TextSpace(max_length=3).contains("abcd")
    assert a.contains({"role": "assistant", "content": "x"}) and not a.contains({"role": "user", "content": "x"})
    s1 = [c.sample() for _ in range(5)]
    c.seed(0)
    assert [c.sample() for _ in range(5)] == s1 and all(c.contains(s) for s in s1)
    assert not c.contains([{"role": "robot", "content": "x"}]) and not c.contains([{"role": "user"}])
    assert isinstance(a.sample(), str)


def test_trajectory_segments_one_per_policy_and_session() -> None:
    traj = Trajectory(task_id="t", env_id="e", turns=[
        Turn("solver", [1, 2, 3], [4, 5], [-0.1, -0.2], 3, new_session=True),
        Turn("verifier", [6], [7], [-0.5], [4], new_session=True),
        Turn("solver", [8], [9, 10], [-0.3, -0.4], [3, 5]),
        Turn("solver", [1, 2, 3, 4, 5, 8, 9, 10, 11], [12], [-0.6], 6, new_session=True),  # restart
    ])
    segs = traj.segments()
    assert [(s.policy_id, s.turns) for s in segs] == [("solver", [0, 2]), ("verifier", [1]), ("solver", [3])]
    s0 = segs[0]
    # [L] per-token: prompt delta (mask 0), completion (mask 1), next delta, next completion
    assert s0.token_ids == [1, 2, 3, 4, 5, 8, 9, 10]
    assert s0.loss_mask == [0, 0, 0, 1, 1, 0, 1, 1]
    assert s0.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.3, -0.4]
    assert s0.versions == [-1, -1, -1, 3, 3, -1, 3, 5] and s0.min_version == 3
    assert segs[1].token_ids == [6, 7] and segs[1].loss_mask == [0, 1] and segs[1].versions == [-1, 4]
    assert segs[2].token_ids == [1, 2, 3, 4, 5, 8, 9, 10, 11, 12] and segs[2].num_generated == 1
    assert [s.policy_id for s in traj.segments("verifier")] == ["verifier"]
    assert traj.min_version == 3 and traj.policy_ids == ["solver", "verifier"]
    traj.truncated = True
    assert all(set(s.loss_mask) == {0} for s in traj.segments(zero_truncated=True))
    assert Trajectory.from_dict(traj.to_dict()) == traj


def test_segments_refuse_inconsistent_lengths() -> None:
    from agentgym.errors import TrainingDataError

    bad_lp = Trajectory("t", "e", turns=[Turn("p", [1], [2, 3], [-0.1], 0)])
    with pytest.raises(TrainingDataError, match="1 logprobs for 2"):
        bad_lp.segments()
    bad_v = Trajectory("t", "e", turns=[Turn("p", [1], [2, 3], [-0.1, -0.2], [1])])
    with pytest.raises(TrainingDataError, match="1 weight versions for 2"):
        bad_v.segments()
    mixed = Trajectory("t", "e", turns=[Turn("p", [1], [2], [-0.1], 0), Turn("p", [3], [4], [], 0)])
    with pytest.raises(TrainingDataError, match="some turns"):
        mixed.segments()
    # no logprobs at all (a scripted policy): fine for SFT, None
    [seg] = Trajectory("t", "e", turns=[Turn("p", [1], [2], [], 0)]).segments()
    assert seg.logprobs is None and seg.loss_mask == [0, 1]
    from agentgym.types import Segment

    with pytest.raises(TrainingDataError):
        Segment("p", [1, 2], [0], None, [-1, 0])


def test_check_env_on_demo_all_parsers() -> None:
    for parser in ("hermes", "json", "react"):
        report = agentgym.check_env(agentgym.make("Demo-v0", parser=parser))
        assert len(report.passed) == 6, report


def test_load_report_defaults_to_the_split_size_with_nothing_skipped() -> None:
    import agentgym

    env = agentgym.make("agentgym/Demo-v0").unwrapped
    rep = env.load_report("test")
    assert rep["loaded"] == len(env.tasks("test")) > 0 and rep["skipped"] == 0 and rep["skip_reasons"] == {}
    assert env.load_report()["loaded"] == sum(len(env.tasks(s)) for s in env.splits)
    env.load_log.skip("row 3", "no label")
    env.load_log.loaded = 7
    assert env.load_report("test") | {"skipped_items": None} == {
        "source": None, "loaded": 7, "skipped": 1, "skip_reasons": {"no label": 1}, "skipped_items": None, "notes": {}}

"""From trajectory groups to masked, packed micro-batches: masks, filters, advantages, packing."""

from __future__ import annotations

import math

import pytest
import torch
from agentgym.trainers.batching import TrainSample, collate, pack_micro_batches, samples_from_groups

from agentgym.errors import TrainingDataError
from agentgym.types import Trajectory, TrajectoryGroup, Turn


def _traj(reward: float, *, policy: str = "a", member: int = 0, **kw: object) -> Trajectory:
    """A two-turn episode of ``policy``: prompt [1,2] -> [10,11]; tool tokens [3,4,5] -> [12]."""
    turns = [
        Turn(policy, prompt_token_ids=[1, 2], completion_token_ids=[10, 11], completion_logprobs=[-0.1, -0.2],
             weight_version=3, new_session=True),
        Turn(policy, prompt_token_ids=[3, 4, 5], completion_token_ids=[12], completion_logprobs=[-0.3],
             weight_version=4),
    ]
    return Trajectory("t", "env", group_id="g", member=member, turns=turns, reward=reward, success=reward > 0,
                      **kw)  # type: ignore[arg-type]


def test_multi_turn_mask_with_tool_tokens_in_between() -> None:
    g = TrajectoryGroup("g", "t", "env", [_traj(1.0), _traj(0.0, member=1)])
    samples, stats = samples_from_groups([g], "a", estimator="dr_grpo")
    assert len(samples) == 2
    s = samples[0]
    # tokens:       1  2  10 11 3  4  5  12
    assert s.token_ids == [1, 2, 10, 11, 3, 4, 5, 12]
    assert s.loss_mask == [0, 0, 1, 1, 0, 0, 0, 1]
    assert s.versions == [-1, -1, 3, 3, -1, -1, -1, 4]
    assert s.advantage == pytest.approx(0.5) and samples[1].advantage == pytest.approx(-0.5)
    assert stats.trained_tokens == 6
    mb = collate(samples, [0, 1], [1 / 6, 1 / 6])
    # [B=2, W-1=7]: target t+1 is trained where loss_mask[t+1] == 1
    assert mb.target_mask[0].tolist() == [0, 1, 1, 0, 0, 0, 1]
    assert mb.weights[0].tolist() == pytest.approx([0, 1 / 6, 1 / 6, 0, 0, 0, 1 / 6])
    assert mb.behaviour_logp is not None
    assert mb.behaviour_logp[0].tolist() == pytest.approx([0.0, -0.1, -0.2, 0.0, 0.0, 0.0, -0.3])
    assert mb.advantages.tolist() == [[0.5], [-0.5]]


def test_other_policies_tokens_are_not_trained() -> None:
    t = _traj(1.0)
    t.turns.insert(1, Turn("b", prompt_token_ids=[7, 8], completion_token_ids=[20, 21], completion_logprobs=[-1.0, -1.0],
                           new_session=True))
    t.policy_rewards = {"b": 0.0}
    g = TrajectoryGroup("g", "t", "env", [t, _traj(0.0, member=1)])
    a, _ = samples_from_groups([g], "a", estimator="dr_grpo")
    assert all(20 not in s.token_ids for s in a)  # a's segment never contains b's tokens
    b, stats_b = samples_from_groups([g], "b", estimator="dr_grpo")
    # b acted in one episode only: a group of one has no baseline, so no sample
    assert b == [] and stats_b.episodes == 1


def test_filters_are_counted() -> None:
    stopped = TrajectoryGroup("g1", "t", "env", [_traj(1.0, early_stopped=True), _traj(0.0, member=1, early_stopped=True)],
                              early_stopped=True)
    flat = TrajectoryGroup("g2", "t", "env", [_traj(1.0), _traj(1.0, member=1)])
    lost = TrajectoryGroup("g3", "t", "env", [_traj(1.0), _traj(0.0, member=1, error="EnvError: boom"),
                                             _traj(0.0, member=2)])
    trunc = TrajectoryGroup("g4", "t", "env", [_traj(1.0), _traj(0.0, member=1, truncated=True)])
    samples, st = samples_from_groups([stopped, flat, lost, trunc], "a", mask_truncated=True)
    assert st.early_stopped_groups == 1
    assert st.zero_variance_groups == 1 and st.zero_advantage_samples == 2
    assert st.error_episodes == 1
    assert st.truncated_episodes == 1
    # lost: 2 valid episodes; trunc: the truncated one has an all-zero mask -> 1 sample
    assert len(samples) == 3
    assert all(s.num_masked > 0 for s in samples)


def test_overlong_penalty_changes_rewards() -> None:
    g = TrajectoryGroup("g", "t", "env", [_traj(1.0), _traj(1.0, member=1)])
    g.trajectories[1].turns[1].completion_token_ids = [12] * 8  # 10 generated tokens
    g.trajectories[1].turns[1].completion_logprobs = [-0.1] * 8
    samples, st = samples_from_groups([g], "a", estimator="dr_grpo", overlong_max_tokens=8, overlong_buffer=4)
    assert st.rewards == pytest.approx([1.0, 0.0])  # 3 tokens: no penalty; 10 > 8: -1
    assert [s.advantage for s in samples] == pytest.approx([0.5, -0.5])


def test_inconsistent_lengths_raise() -> None:
    t = _traj(1.0)
    t.turns[0].completion_logprobs = [-0.1]
    with pytest.raises(TrainingDataError):
        samples_from_groups([TrajectoryGroup("g", "t", "env", [t, _traj(0.0, member=1)])], "a")


def test_packing_sorts_and_respects_the_budget() -> None:
    lengths = [5, 50, 7, 48, 6, 200]
    batches = pack_micro_batches(lengths, token_budget=100)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert batches[0] == [5]  # longer than the budget: alone, not truncated
    for b in batches[1:]:
        assert len(b) * max(lengths[i] for i in b) <= 100
    # padding only to each micro-batch's longest: similar lengths end up together
    assert {1, 3} in [set(b) for b in batches]
    assert {0, 2, 4} in [set(b) for b in batches]


def test_collate_pads_right_and_masks() -> None:
    s1 = TrainSample("a", [1, 2, 3], [0, 1, 1], 1.0, None)
    s2 = TrainSample("a", [1, 2, 3, 4, 5], [0, 0, 0, 1, 1], -1.0, None)
    mb = collate([s1, s2], [1, 0], [0.25, 0.25])
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 2, 3, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert mb.target_mask.tolist() == [[0, 0, 1, 1], [1, 1, 0, 0]]
    assert mb.behaviour_logp is None
    assert math.isclose(float(mb.weights.sum()), 1.0)
    assert mb.padded_tokens == 10 and mb.real_tokens == 8
    assert torch.equal(mb.advantages, torch.tensor([[-1.0], [1.0]]))


def test_keep_zero_advantage_trains_a_zero_variance_group() -> None:
    """``filter.keep_zero_advantage``: a group whose rewards tie still gives samples (advantage 0), so the
    trainer steps on it; by default it gives none."""
    from agentgym.trainers.config import validate_config

    g = TrajectoryGroup("g", "t", "env", [_traj(1.0), _traj(1.0, member=1)])
    assert samples_from_groups([g], "a")[0] == []
    kept, st = samples_from_groups([g], "a", keep_zero_advantage=True)
    assert len(kept) == 2 and all(s.advantage == 0.0 for s in kept) and st.zero_variance_groups == 1
    assert validate_config({"filter": {"keep_zero_advantage": True}}).filter.keep_zero_advantage

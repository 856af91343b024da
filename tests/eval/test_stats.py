"""pass@k, confidence intervals."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from agentgym.eval.stats import (
    clip,
    mean_ci,
    paired_difference,
    pass_at_k,
    ratio_ci,
    success_interval,
    t_quantile_975,
    wilson_interval,
)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of all k-subsets of the n samples that contain at least one success."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_matches_brute_force(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k))


def test_pass_at_k_edges() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 0, 10) == 0.0 and pass_at_k(10, 1, 10) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_mean_ci_t_interval() -> None:
    vals = [0.5, 0.7, 0.6]
    r = mean_ci(vals)
    half = 4.303 * statistics.stdev(vals) / math.sqrt(3)
    assert r["mean"] == pytest.approx(0.6) and r["ci95"] == pytest.approx([0.6 - half, 0.6 + half])
    assert mean_ci([0.4])["ci95"] is None and mean_ci([0.4])["mean"] == 0.4
    assert mean_ci([])["mean"] is None
    assert t_quantile_975(1000) == 1.96 and t_quantile_975(2) == 4.303


def test_wilson() -> None:
    lo, hi = wilson_interval(5, 10)  # type: ignore[misc]
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    assert wilson_interval(0, 0) is None
    assert wilson_interval(10, 10)[1] == 1.0  # type: ignore[index]


# ----------------------------------------------------------------------------- intervals over tasks
def test_wilson_matches_newcombe_1998() -> None:
    """Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (score interval without correction)."""
    for (s, n), (lo, hi) in {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605), (0, 20): (0.0, 0.1611),
                             (1, 29): (0.0061, 0.1718)}.items():
        assert wilson_interval(s, n) == pytest.approx([lo, hi], abs=1e-4)


def test_tied_tasks_get_a_wilson_interval_never_a_zero_width_one() -> None:
    # 8 tasks x 4 seeds, every task solved in exactly one seed: every seed and every task scores 25%
    outcomes = {f"t{i}": [1.0, 0.0, 0.0, 0.0] for i in range(8)}
    r = success_interval(outcomes)
    assert r["mean"] == 0.25 and r["method"] == "wilson" and r["episodes"] == 32 and r["tasks"] == 8
    assert r["ci95"] == pytest.approx(wilson_interval(8, 32))
    assert r["ci95"][0] < 0.25 < r["ci95"][1]
    everything = success_interval({f"t{i}": [1.0, 1.0] for i in range(5)})
    assert everything["ci95"][1] == 1.0 and everything["ci95"][0] < 1.0
    assert success_interval({})["ci95"] is None


def test_bootstrap_over_tasks_keeps_a_tasks_episodes_together() -> None:
    # half the tasks always solved, half never: per-episode resampling would see 160 independent coin flips
    outcomes = [(f"t{i}", float(i % 2)) for i in range(20) for _ in range(8)]
    r = success_interval(outcomes)
    assert r["method"] == "bootstrap over tasks" and r["mean"] == 0.5
    clustered = r["ci95"][1] - r["ci95"][0]
    naive = wilson_interval(80, 160)
    assert clustered > 1.8 * (naive[1] - naive[0])  # ~ sqrt(8): tasks, not episodes, are the independent units


def test_intervals_are_clipped_to_the_possible_range() -> None:
    r = success_interval({"a": [1.0] * 10, "b": [1.0] * 9 + [0.0], "c": [1.0] * 10})
    assert 0.0 <= r["ci95"][0] <= r["mean"] <= r["ci95"][1] <= 1.0
    assert clip([-0.2, 1.3], 0.0, 1.0) == [0.0, 1.0] and clip(None) is None


def test_bootstrap_over_tasks_covers_the_true_rate() -> None:
    """Coverage on a known case: tasks with heterogeneous difficulty, 30 tasks x 4 seeds, 200 experiments."""
    import numpy as np

    rng = np.random.default_rng(1)
    true, hits, trials = 0.4, 0, 200
    for _ in range(trials):
        p = rng.beta(2 * true / (1 - true), 2, size=30)  # per-task success probability, mean 0.4
        outcomes = {i: list(map(float, rng.random(4) < p[i])) for i in range(30)}
        lo, hi = success_interval(outcomes, n_boot=2000, seed=int(rng.integers(1 << 30)))["ci95"]
        hits += lo <= true <= hi
    assert 0.88 <= hits / trials <= 0.99


def test_paired_difference_excludes_zero_on_a_clear_effect_and_includes_it_on_none() -> None:
    import random

    rng = random.Random(0)
    base = {(f"t{i}", s): float(rng.random() < 0.3) for i in range(40) for s in range(5)}
    better = {k: 1.0 if v else float(rng.random() < 0.5) for k, v in base.items()}  # +~35 pp, paired
    r = paired_difference(base, better)
    assert r["pairs"] == 200 and r["tasks"] == 40
    assert 0 < r["ci95"][0] < r["mean"] < r["ci95"][1]
    same = {k: float(rng.random() < 0.3) for k in base}  # an independent rerun of the same arm: no effect
    n = paired_difference(base, same)
    assert n["ci95"][0] < 0 < n["ci95"][1]
    # only shared episodes count, and the difference is clipped to [-1, 1]
    part = paired_difference({("t0", 0): 0.0, ("t1", 0): 0.0}, {("t0", 0): 1.0, ("t2", 0): 1.0})
    assert part["pairs"] == 1 and part["mean"] == 1.0 and part["ci95"] == [1.0, 1.0]
    assert paired_difference({}, {})["ci95"] is None


def test_ratio_ci_is_a_geometric_interval() -> None:
    r = ratio_ci([2.0, 2.0, 2.0])
    assert r["mean"] == pytest.approx(2.0) and r["ci95"] == pytest.approx([2.0, 2.0])
    spread = ratio_ci([1.0, 4.0])
    assert spread["mean"] == pytest.approx(2.0) and 0 < spread["ci95"][0] < 1.0 < 4.0 < spread["ci95"][1]
    inv = ratio_ci([1.0, 0.25])  # the same rounds, the other side on top: the reciprocal interval
    assert inv["ci95"] == pytest.approx([1 / spread["ci95"][1], 1 / spread["ci95"][0]])
    assert ratio_ci([3.0])["ci95"] is None
    with pytest.raises(ValueError):
        ratio_ci([1.0, -1.0])

"""pass@k, confidence intervals."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from agentgym.eval.stats import mean_ci, pass_at_k, t_quantile_975, wilson_interval


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

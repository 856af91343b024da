"""Statistics for evaluation summaries: t-based confidence intervals, Wilson intervals, pass@k."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["mean_ci", "pass_at_k", "t_quantile_975", "wilson_interval"]

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30 (then the normal value).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]


def t_quantile_975(df: int) -> float:
    """``t_{0.975}`` with ``df`` degrees of freedom (1.96 beyond 30; 120+ differs by < 1%)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if df <= 30:
        return _T975[df - 1]
    if df <= 60:
        return 2.042 + (2.000 - 2.042) * (df - 30) / 30
    if df <= 120:
        return 2.000 + (1.980 - 2.000) * (df - 60) / 60
    return 1.96


def mean_ci(values: Sequence[float]) -> dict[str, Any]:
    """Mean and 95% CI (Student t over the values, e.g. one value per seed).

    Returns ``{"mean", "std", "n", "ci95"}``; ``ci95`` is ``[lo, hi]``, or ``None`` for fewer than
    two values. ``mean`` is ``None`` for no values.
    """
    n = len(values)
    if n == 0:
        return {"mean": None, "std": None, "n": 0, "ci95": None}
    m = sum(values) / n
    if n < 2:
        return {"mean": m, "std": None, "n": 1, "ci95": None}
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    h = t_quantile_975(n - 1) * sd / math.sqrt(n)
    return {"mean": m, "std": sd, "n": n, "ci95": [m - h, m + h]}


def wilson_interval(successes: int, n: int, z: float = 1.96) -> list[float] | None:
    """Wilson score interval for a binomial proportion (``None`` if ``n == 0``)."""
    if n == 0:
        return None
    p = successes / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return [max(0.0, centre - half), min(1.0, centre + half)]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): ``1 - C(n-c, k) / C(n, k)``.

    Args:
        n: Samples drawn for the task.
        c: Samples that succeeded.
        k: The k of pass@k (``k <= n``).
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod

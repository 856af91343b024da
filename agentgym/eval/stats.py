"""Statistics for evaluation summaries and benchmarks: intervals for success rates, pass@k.

Success rates from agent evals are clustered: the episodes of one task (its seeds and samples) are
correlated, since a task is easy or hard for a model whatever the seed. An interval over seeds with
the tasks held fixed ignores the variation between tasks and is far too narrow (it is ``[25.0, 25.0]``
when every seed scores the same). The intervals here resample *tasks*:

* :func:`success_interval`: one arm's rate with a 95% bootstrap interval over tasks (clustered: a
  resampled task brings all its episodes); where the tasks cannot show any spread (one task, or every
  task with the same rate) a Wilson interval over the pooled episodes instead (binary outcomes), never a
  zero-width one.
* :func:`paired_difference`: two arms that ran the same (task, seed) episodes: the mean difference with
  a paired bootstrap over tasks (each resampled task brings its episodes' differences).
* :func:`wilson_interval`: the binomial score interval (Newcombe 1998, method 3).

Every interval is clipped to the range its statistic can take. :func:`mean_ci` (Student t over a few
values, e.g. wall-clock per training seed) stays for quantities that are not per-episode outcomes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

__all__ = ["bootstrap_over_tasks", "clip", "mean_ci", "paired_difference", "pass_at_k", "ratio_ci", "success_interval",
           "t_quantile_975", "wilson_interval"]

N_BOOT = 10_000

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


def ratio_ci(ratios: Sequence[float]) -> dict[str, Any]:
    """Geometric mean of positive per-round ratios (e.g. time of A / time of B in paired rounds) with a 95%
    Student-t interval over the rounds' logs: never negative, symmetric in which side is on top.

    Returns ``{"mean", "ci95", "per_round"}`` (``ci95`` ``None`` for fewer than two rounds).
    """
    if any(r <= 0 for r in ratios):
        raise ValueError("ratios must be positive")
    r = mean_ci([math.log(x) for x in ratios])
    if r["mean"] is None:
        return {"mean": None, "ci95": None, "per_round": []}
    return {"mean": math.exp(r["mean"]), "ci95": [math.exp(x) for x in r["ci95"]] if r["ci95"] else None,
            "per_round": list(ratios)}


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


def clip(interval: Sequence[float] | None, lo: float = -math.inf, hi: float = math.inf) -> list[float] | None:
    """``interval`` clipped to ``[lo, hi]`` (``None`` stays ``None``)."""
    if interval is None:
        return None
    return [min(max(float(interval[0]), lo), hi), min(max(float(interval[1]), lo), hi)]


def bootstrap_over_tasks(clusters: Sequence[Sequence[float]], *, n_boot: int = N_BOOT, seed: int = 0,
                         level: float = 0.95) -> list[float] | None:
    """Percentile bootstrap interval of the pooled mean, resampling whole clusters (tasks) with replacement.

    Each resample draws ``len(clusters)`` tasks; the statistic is the mean over all their episodes (the same
    estimator as the point estimate). ``None`` without at least one non-empty cluster.
    """
    import numpy as np

    cl = [c for c in clusters if len(c)]
    if not cl:
        return None
    sums = np.array([float(sum(c)) for c in cl])
    counts = np.array([len(c) for c in cl], dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(cl), size=(n_boot, len(cl)))
    stats = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    a = (1 - level) / 2
    lo, hi = np.quantile(stats, [a, 1 - a])
    return [float(lo), float(hi)]


def _by_task(outcomes: Mapping[Hashable, Sequence[float]] | Sequence[tuple[Hashable, float]]) -> dict[Hashable, list[float]]:
    if isinstance(outcomes, Mapping):
        return {k: [float(x) for x in v] for k, v in outcomes.items()}
    out: dict[Hashable, list[float]] = {}
    for task, value in outcomes:
        out.setdefault(task, []).append(float(value))
    return out


def success_interval(outcomes: Mapping[Hashable, Sequence[float]] | Sequence[tuple[Hashable, float]], *,
                     binary: bool = True, bounds: tuple[float, float] = (0.0, 1.0), n_boot: int = N_BOOT,
                     seed: int = 0) -> dict[str, Any]:
    """One arm's mean outcome and its 95% interval, clustered by task.

    Args:
        outcomes: ``{task: [outcome of each of its episodes]}`` or ``[(task, outcome), ...]``; a task's seeds
            and samples stay together.
        binary: Outcomes are 0/1 successes: a Wilson interval replaces a bootstrap that cannot show spread.
        bounds: The statistic's possible range; the interval is clipped to it.

    Returns:
        ``{"mean", "ci95", "method", "episodes", "tasks"}``; ``method`` is ``"bootstrap over tasks"`` or
        ``"wilson"``; ``mean`` and ``ci95`` are ``None`` without episodes.
    """
    tasks = _by_task(outcomes)
    values = [x for v in tasks.values() for x in v]
    n = len(values)
    if n == 0:
        return {"mean": None, "ci95": None, "method": None, "episodes": 0, "tasks": 0}
    mean = sum(values) / n
    rates = {round(sum(v) / len(v), 12) for v in tasks.values() if v}
    if binary and (len(rates) <= 1 or len(tasks) < 2):
        if any(x not in (0.0, 1.0) for x in values):
            raise ValueError("binary=True needs 0/1 outcomes")
        ci, method = wilson_interval(int(sum(values)), n), "wilson"
    else:
        ci, method = bootstrap_over_tasks(list(tasks.values()), n_boot=n_boot, seed=seed), "bootstrap over tasks"
    return {"mean": mean, "ci95": clip(ci, *bounds), "method": method, "episodes": n, "tasks": len(tasks)}


def paired_difference(a: Mapping[tuple[Hashable, Hashable], float], b: Mapping[tuple[Hashable, Hashable], float], *,
                      bounds: tuple[float, float] = (-1.0, 1.0), n_boot: int = N_BOOT, seed: int = 0) -> dict[str, Any]:
    """``b - a`` over the episodes both arms ran, with a paired bootstrap over tasks.

    Args:
        a, b: ``{(task, episode key): outcome}``; the episode key is whatever identifies an episode of a task in
            both arms (seed, sample). Only keys present in both count.
        bounds: The difference's possible range (``[-1, 1]`` for success rates); the interval is clipped to it.

    Returns:
        ``{"mean", "ci95", "pairs", "tasks", "method"}`` (``mean``/``ci95`` ``None`` without shared episodes).
    """
    diffs: dict[Hashable, list[float]] = {}
    for key in sorted(set(a) & set(b), key=repr):
        diffs.setdefault(key[0], []).append(float(b[key]) - float(a[key]))
    values = [x for v in diffs.values() for x in v]
    if not values:
        return {"mean": None, "ci95": None, "pairs": 0, "tasks": 0, "method": "paired bootstrap over tasks"}
    ci = bootstrap_over_tasks(list(diffs.values()), n_boot=n_boot, seed=seed)
    return {"mean": sum(values) / len(values), "ci95": clip(ci, *bounds), "pairs": len(values), "tasks": len(diffs),
            "method": "paired bootstrap over tasks"}

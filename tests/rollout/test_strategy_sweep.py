"""The strategies benchmark's offline K/d sweep replays the gate's decision rule over logged groups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench(bench_loader: Any) -> Any:
    return bench_loader("bench_strategies")


def _group(calls: list[list[str]], rewards: list[float], tokens: int = 10) -> dict[str, Any]:
    return {"calls": calls, "rewards": rewards, "turn_tokens": [[tokens] * len(c) for c in calls], "early_stopped": False}


def test_sweep_counts_decisions_precision_recall_and_savings(bench: Any, tmp_path: Path) -> None:
    same = ["a", "b", "c"]
    groups = [
        _group([same, same, same], [0.0, 0.0, 0.0]),                       # alike, zero-variance: a correct stop
        _group([same, same, same], [0.0, 1.0, 0.0]),                       # alike but informative: a wrong stop
        _group([["a", "x", "c"], ["b", "y", "c"], ["c", "z"]], [1.0, 1.0, 1.0]),  # diverse, zero-variance: missed
        _group([["a"], ["a"], ["a"]], [0.0, 0.0, 0.0]),                    # ended by step 1: no decision at K >= 1
    ]
    p = tmp_path / "groups.jsonl"
    p.write_text("".join(json.dumps(g) + "\n" for g in groups))
    rows = {(r["k"], r["d"]): r for r in bench.sweep([p])}
    r = rows[(1, 0.12)]
    # K=1: the first three groups reach a decision; the first two are identical at step 1, the third is not
    assert (r["decisions"], r["stops"]) == (3, 2)
    assert r["precision"] == 0.5 and r["recall"] == 0.5
    # zero-variance groups: 3 in all (one never reached a decision), 1 stopped correctly
    assert r["recall_of_all_zero_variance"] == round(1 / 3, 4)
    # saved: turns 2-3 of the two stopped groups (3 members x 2 turns x 10 tokens each) over all tokens (90+90+80+30)
    assert r["tokens_saved_frac"] == round(120 / 290, 4)
    # K=3: no member has more than 3 turns, so no group reaches a decision
    assert rows[(3, 0.12)]["decisions"] == 0 and rows[(3, 0.12)]["precision"] is None
    # a looser threshold stops the diverse group at K=2 only when its distance is below d
    assert rows[(2, 0.4)]["stops"] == 2 and rows[(2, 0.05)]["stops"] == 2


def test_t_interval(bench: Any) -> None:
    r = bench.t_ci([0.2, 0.4, 0.6])
    assert r["mean"] == pytest.approx(0.4)
    assert r["ci95"][0] == pytest.approx(0.4 - 4.303 * 0.2 / 3 ** 0.5)
    assert bench.t_ci([0.5])["ci95"] is None


def test_pilot_replay(bench: Any, tmp_path: Path) -> None:
    groups = [
        _group([["a"]] * 4, [0.0, 0.0, 0.0, 0.0]),  # pilot alike, group zero-variance: a correct drop
        _group([["a"]] * 4, [0.0, 0.0, 1.0, 0.0]),  # pilot alike, group informative: a wrong drop at size 2
        _group([["a"]] * 4, [1.0, 0.0, 1.0, 1.0]),  # pilot differs: committed
    ]
    p = tmp_path / "groups.jsonl"
    p.write_text("".join(json.dumps(g) + "\n" for g in groups))
    rows = {r["size"]: r for r in bench.pilot_replay([p])}
    assert (rows[2]["drops"], rows[2]["precision"], rows[2]["recall"]) == (2, 0.5, 1.0)
    assert rows[2]["tokens_saved_frac"] == round(40 / 120, 4)
    assert (rows[3]["drops"], rows[3]["precision"]) == (1, 1.0)

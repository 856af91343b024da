"""The ALFWorld gate experiment's training arms: each arm's overrides make a valid run of the one GRPO recipe that
differs from the baseline only in its strategy, and the summary pairs every strategy arm with its seed's baseline."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from trainers.config import flow_params, load_train_config

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "train" / "alfworld" / "grpo.toml"
PICK = {"view": "action/step", "k": 2, "d": 0.25}


@pytest.fixture(scope="module")
def bench(bench_loader: Any) -> Any:
    return bench_loader("bench_gate_alfworld")


def _config(bench: Any, arm: str) -> Any:
    return load_train_config(RECIPE, bench.arm_sets(arm, PICK))


def test_each_arm_is_the_recipe_with_its_strategy(bench: Any) -> None:
    cfgs = {arm: _config(bench, arm) for arm in bench.ARMS}
    base = cfgs["baseline"]
    assert base.gate.mode == "audit" and (base.gate.k, base.gate.threshold, base.gate.view, base.gate.level) == (
        2, 0.25, "action", "step")
    assert not base.filter.dynamic_sampling and base.pilot.mode == "off"
    assert cfgs["gate"].gate.mode == "enforce" and cfgs["gate"].gate.k == 2
    dapo = cfgs["dapo"]
    assert dapo.filter.dynamic_sampling and dapo.filter.refill and dapo.filter.max_refill_rounds == 2
    assert dapo.gate.mode == "audit"  # the gate's would-be stops are still logged beside DAPO
    assert flow_params(dapo, ("policy",)).filter_zero_variance
    assert not flow_params(base, ("policy",)).filter_zero_variance
    pilot = cfgs["pilot"]
    assert pilot.pilot.mode == "enforce" and pilot.pilot.size == 2 and pilot.gate.mode == "off"
    assert not pilot.filter.refill and not pilot.filter.dynamic_sampling
    # Only the strategy differs: the rest of every arm's config is the baseline's.
    strategy = {"gate", "filter", "pilot"}
    for arm, cfg in cfgs.items():
        other = {k: v for k, v in cfg.to_dict().items() if k not in strategy}
        assert other == {k: v for k, v in base.to_dict().items() if k not in strategy}, arm
    with pytest.raises(ValueError, match="unknown training arm 'grpo'"):
        bench.arm_sets("grpo", PICK)


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def _outcomes(successes: list[int]) -> list[dict[str, Any]]:
    return [{"task_id": f"t{i // 2}", "seed": i % 2, "sample": 0, "success": s} for i, s in enumerate(successes)]


def test_summary_pairs_each_strategy_arm_with_its_seeds_baseline(bench: Any, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "EPISODES", tmp_path)
    exp = tmp_path / bench.EXP
    _write(exp / "baseline-seed0.jsonl.gz", _outcomes([0, 0, 1, 0, 1, 0, 0, 0]))
    _write(exp / "dapo-seed0.jsonl.gz", _outcomes([1, 0, 1, 1, 1, 0, 1, 0]))
    _write(exp / "pilot-seed0.jsonl.gz", _outcomes([0, 0, 0, 0, 1, 0, 0, 0]))
    _write(exp / "dapo-seed1.jsonl.gz", _outcomes([1] * 8))  # no baseline for seed 1: nothing to pair with
    groups = exp / "training-groups"
    for name, tokens in (("baseline-seed0", 100), ("dapo-seed0", 150), ("pilot-seed0", 40)):
        _write(groups / f"{name}.jsonl.gz", [{"step": s, "turn_tokens": [[tokens]]} for s in (1, 2)])
        _write(groups / f"{name}-metrics.jsonl.gz",
               [{"step": s, "time/step_s": tokens / 10, "time/rollout_s": tokens / 20} for s in (1, 2)])
    runs = {"baseline-seed0": {"generated_tokens": 200, "train_wall_s": 20.0},
            "dapo-seed0": {"generated_tokens": 300, "train_wall_s": 30.0, "groups_cut": 0},
            "pilot-seed0": {"generated_tokens": 80, "train_wall_s": 8.0, "groups_cut": 3}}
    out = bench.summarize_training({"training": runs}, None)
    assert set(out["paired"]) == {"dapo-seed0 - baseline-seed0", "pilot-seed0 - baseline-seed0"}
    dapo = out["paired"]["dapo-seed0 - baseline-seed0"]
    assert dapo["mean"] == pytest.approx(3 / 8) and (dapo["b_wins"], dapo["a_wins"]) == (3, 0)
    assert out["paired"]["pilot-seed0 - baseline-seed0"]["mean"] == pytest.approx(-1 / 8)
    assert set(out["cost"]) == {"dapo-seed0 vs baseline-seed0", "pilot-seed0 vs baseline-seed0"}
    pilot = out["cost"]["pilot-seed0 vs baseline-seed0"]
    assert pilot["generated_tokens"]["saved_frac"] == pytest.approx(0.6) and pilot["groups_cut"] == 3
    assert pilot["per_step"]["generated_tokens"]["saved_frac"] == pytest.approx(0.6)
    assert out["cost"]["dapo-seed0 vs baseline-seed0"]["per_step"]["step_s"]["saved_frac"] == pytest.approx(-0.5)


def test_against_pairs_each_baseline_seed_with_the_other_experiments(bench: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "EPISODES", tmp_path)
    here, other = tmp_path / bench.EXP, tmp_path / "gate_alfworld-other"
    _write(here / "baseline-seed0.jsonl.gz", _outcomes([1, 1, 1, 0, 1, 0, 0, 0]))
    _write(here / "baseline-seed1.jsonl.gz", _outcomes([1, 0, 0, 0, 0, 0, 0, 0]))
    _write(other / "baseline-seed0.jsonl.gz", _outcomes([0, 0, 1, 0, 1, 0, 0, 0]))
    _write(other / "baseline-seed1.jsonl.gz", _outcomes([0, 0, 0, 0, 0, 0, 0, 1]))
    _write(other / "baseline-seed2.jsonl.gz", _outcomes([1] * 8))  # no seed 2 here: left out
    out = bench.summarize_training({"training": {}}, None, "other")["against"]["other"]
    assert out["seeds"] == [0, 1]
    s0, s1, pooled = out["baseline-seed0"], out["baseline-seed1"], out["pooled"]
    assert s0["mean"] == pytest.approx(2 / 8) and (s0["b_wins"], s0["a_wins"]) == (2, 0)
    assert s1["mean"] == pytest.approx(0.0) and (s1["b_wins"], s1["a_wins"]) == (1, 1)
    assert pooled["episodes"] == 16 and pooled["mean"] == pytest.approx(2 / 16) and pooled["b_wins"] == 3
    with pytest.raises(SystemExit, match="no baseline seed"):
        bench.summarize_training({"training": {}}, None, "missing")


def test_a_restarted_driver_keeps_the_wall_clock_of_the_stages_it_skips(bench: Any) -> None:
    """A driver restarted after a seed's eval is complete skips that eval and measures no wall-clock for it
    (``stage_wall_s`` None): the record keeps what the run that did the work measured, with the load after it."""
    old = {"seed": 0, "eval": {"stage_wall_s": 2674.5, "load_avg_after": [1.9, 1.7, 1.7], "episodes": 268}}
    skipped = {"seed": 0, "eval": {"stage_wall_s": None, "load_avg_after": [0.6, 1.7, 2.9], "episodes": 268}}
    kept = bench.keep_walls(old, skipped)
    assert kept["eval"] == {"stage_wall_s": 2674.5, "load_avg_after": [1.9, 1.7, 1.7], "episodes": 268}
    # A stage that ran again measures its own wall-clock and load: those replace the old ones.
    rerun = {"seed": 0, "eval": {"stage_wall_s": 2500.0, "load_avg_after": [2.0, 2.0, 2.0], "episodes": 268}}
    assert bench.keep_walls(old, rerun)["eval"] == rerun["eval"]
    # Nothing to keep on a first run.
    first = {"seed": 1, "eval": {"stage_wall_s": None, "load_avg_after": [0.1, 0.1, 0.1]}}
    assert bench.keep_walls(None, first)["eval"]["stage_wall_s"] is None


def _group(step: int, task: str, rewards: list[float], stop: bool | None) -> dict[str, Any]:
    rec = [] if stop is None else [{"action": "stop" if stop else "continue", "enforced": stop,
                                    "final_zero_variance": None if stop else len(set(rewards)) == 1,
                                    "tokens_at_decision": 10, "final_tokens": 10 * len(rewards)}]
    return {"step": step, "task_id": task, "rewards": rewards, "turn_tokens": [[10]] * len(rewards),
            "gate_records": rec}


def test_a_pilot_arms_cuts_are_scored_against_its_baseline_twin(bench: Any, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An enforced cut never sees its group's final variance: the baseline of the same seed ran that task at that
    step whole, and its outcome scores the cut (precision over the cuts, recall over the twin's zero-variance
    groups). The pilot's groups are named like any strategy arm's, not only the gate's."""
    monkeypatch.setattr(bench, "EPISODES", tmp_path)
    groups = tmp_path / bench.EXP / "training-groups"
    zero, mixed = [0.0] * 8, [1.0] + [0.0] * 7
    _write(groups / "baseline-seed0.jsonl.gz", [_group(0, "a", zero, None), _group(0, "b", mixed, None),
                                                _group(1, "a", zero, None), _group(1, "c", zero, None)])
    _write(groups / "pilot-seed0.jsonl.gz", [
        _group(0, "a", [0.0, 0.0], True),   # cut, and its twin was zero-variance: right
        _group(0, "b", [0.0, 0.0], True),   # cut, but its twin was informative: wrong
        _group(1, "a", mixed, False),       # ran whole; its twin was zero-variance: missed
        _group(1, "c", [1.0, 1.0], True)])  # right
    row = bench.live_gate()["pilot-seed0"]
    assert row["enforced"] and row["stops"] == 3 and row["twin"] == "baseline-seed0"
    assert (row["twin_matched"], row["twin_correct"], row["twin_precision"]) == (3, 2, 0.6667)
    assert row["twin_zero_variance"] == 3 and row["twin_recall"] == 0.6667
    assert "twin" not in bench.live_gate()["baseline-seed0"]

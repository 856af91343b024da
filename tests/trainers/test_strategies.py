"""Rollout-saving strategies from a training config: the replay weight in the loss, the gate metrics,
the [gate]/[pilot]/[dataflow] switches, the shipped strategy configs, and one short run per strategy
showing that its switch changes what the recipe does (the tiny model, a few seconds each)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agentgym.recipes import run_training
from agentgym.trainers.batching import collate, samples_from_groups
from agentgym.trainers.config import TrainConfig, load_train_config, validate_config
from agentgym.trainers.metrics import flow_counters, gate_metrics

from agentgym.errors import ConfigurationError
from agentgym.registration import env_entry
from agentgym.types import Trajectory, TrajectoryGroup, Turn

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = sorted((ROOT / "configs" / "train" / "strategies").glob("*.toml"))


# ----------------------------------------------------------------------------- IS weight in the loss
def _traj(reward: float, member: int) -> Trajectory:
    turns = [Turn("a", prompt_token_ids=[1, 2], completion_token_ids=[10, 11], completion_logprobs=[-0.1, -0.2],
                  weight_version=0, new_session=True)]
    return Trajectory("t", "env", group_id="g", member=member, turns=turns, reward=reward)


def test_replayed_group_weight_scales_its_tokens_in_the_loss() -> None:
    fresh = TrajectoryGroup("fresh", "t", "env", [_traj(1.0, 0), _traj(0.0, 1)])
    replayed = TrajectoryGroup("old", "t", "env", [_traj(1.0, 0), _traj(0.0, 1)])
    samples, _ = samples_from_groups([fresh, replayed], "a", group_weights=[1.0, 0.25])
    assert [s.weight for s in samples] == [1.0, 1.0, 0.25, 0.25]
    mb = collate(samples, [0, 2], [0.5] * 4)
    # the same tokens and advantage; the replayed row's per-token loss weight is 0.25 x the fresh one's
    assert mb.weights[0].tolist() == pytest.approx([0.0, 0.5, 0.5])
    assert mb.weights[1].tolist() == pytest.approx([0.0, 0.125, 0.125])
    with pytest.raises(ValueError, match="group weights"):
        samples_from_groups([fresh], "a", group_weights=[1.0, 1.0])
    with pytest.raises(ValueError, match="finite"):
        samples_from_groups([fresh], "a", group_weights=[float("nan")])


# ----------------------------------------------------------------------------- metrics
def test_gate_metrics_precision_recall_and_token_share() -> None:
    m = gate_metrics({"decisions": 10, "stops": 4, "audited": 10, "audited_stops": 4, "audited_correct_stops": 3,
                      "audited_zero_variance": 6, "stop_tokens_at_decision": 100, "stop_final_tokens": 400})
    assert m["stop_rate"] == 0.4 and m["precision"] == 0.75 and m["recall"] == 0.5 and m["stop_token_share"] == 0.25
    enforced = gate_metrics({"decisions": 3, "stops": 3, "enforced_stops": 3})
    assert enforced["precision"] is None and enforced["recall"] is None and enforced["stop_rate"] == 1.0
    fc = flow_counters({"groups": {"finished": 2}, "gates": {"g": {"decisions": 1, "stops": 0}}})
    assert fc["groups_finished"] == 2 and fc["gates"]["g"]["stop_rate"] == 0.0


# ----------------------------------------------------------------------------- config
def _base(**sections: dict[str, Any]) -> dict[str, Any]:
    d: dict[str, Any] = {"model": {"path": "x"}, "rollout": {"env": "agentgym/Demo-v0", "group_size": 4}}
    d.update(sections)
    return d


def test_strategy_switches_default_off_and_cross_checks() -> None:
    cfg = validate_config(_base())
    assert cfg.gate.mode == "off" and cfg.pilot.mode == "off" and not cfg.dataflow.skip_zero_variance
    assert cfg.dataflow.replay_priority == "latest" and not cfg.dataflow.replay_fill and cfg.filter.refill
    with pytest.raises(ConfigurationError) as e:
        validate_config(_base(pilot={"mode": "enforce", "size": 4}, gate={"mode": "audit"},
                              dataflow={"replay_fill": True}, filter={"dynamic_sampling": False}))
    msg = str(e.value)
    assert "pilot.size" in msg and "do not combine" in msg and "replay_fill" in msg
    with pytest.raises(ConfigurationError) as e:
        validate_config(_base(gate={"mode": "on", "view": "text", "k": 0}, dataflow={"replay_beta": 2}))
    assert all(w in str(e.value) for w in ("gate.mode", "gate.view", "gate.k", "replay_beta"))


def test_there_is_a_config_per_strategy() -> None:
    assert {p.stem for p in STRATEGIES} >= {"baseline", "gate", "dapo", "greso", "pilot", "replay"}


@pytest.mark.parametrize("path", STRATEGIES, ids=lambda p: p.stem)
def test_strategy_config_switches_on_its_strategy_only(path: Path) -> None:
    cfg = load_train_config(path)
    env_entry(cfg.rollout.env)
    assert cfg.run.out_dir.startswith("runs/strategies/")
    on = {"gate": cfg.gate.mode != "off", "dapo": cfg.filter.dynamic_sampling and not cfg.dataflow.replay_fill,
          "greso": cfg.dataflow.skip_zero_variance, "pilot": cfg.pilot.mode != "off",
          "replay": cfg.dataflow.replay_fill}
    assert [k for k, v in on.items() if v] == ([] if path.stem == "baseline" else [path.stem])
    base = load_train_config(ROOT / "configs" / "train" / "strategies" / "baseline.toml")
    # same model, env, group size, steps and eval: only the strategy differs
    for a, b in ((cfg.rollout, base.rollout), (cfg.model, base.model), (cfg.eval, base.eval)):
        assert a == b
    assert cfg.run.steps == base.run.steps


# ----------------------------------------------------------------------------- one short run per strategy
def _cfg(model: str, out: Path, steps: int = 2, **sections: dict[str, Any]) -> TrainConfig:
    import tiny_lookup  # noqa: F401  (registers the env)

    d: dict[str, Any] = {
        "run": {"out_dir": str(out), "steps": steps, "seed": 3, "checkpoint_every": 1000, "threads": 1},
        "model": {"path": model},
        "filter": {"dynamic_sampling": False, "max_refill_rounds": 1},
        "rollout": {"env": "agentgym/TinyLookup-v0", "group_size": 4, "groups_per_step": 2, "max_tokens": 6,
                    "max_turns": 3, "sampling_seeds": True, "concurrency": 8, "tasks": 2},
        "eval": {"before": False, "after": False},
        "log": {"progress": False, "plot": False},
    }
    for k, v in sections.items():
        d.setdefault(k, {}).update(v)
    return validate_config(d)


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def baseline(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # the untrained tiny model never succeeds: every group has zero reward variance
    res = run_training(_cfg(tiny_model, tmp_path_factory.mktemp("baseline")))
    df = res["dataflow"]
    assert df["groups"]["outcomes"]["policy"] == {"kept": 4} and df["gates"] == {}
    assert df["task_stream"]["skipped"] == 0
    return res


def test_gate_audit_logs_precision_and_recall_and_changes_no_rollout(tiny_model: str, tmp_path: Path,
                                                                      baseline: dict[str, Any]) -> None:
    # the tiny model's free text differs member to member, but none of it parses to a tool call: on the
    # tool-call view every group looks alike at step 1, on the text view none does
    calls = run_training(_cfg(tiny_model, tmp_path / "calls", gate={"mode": "audit", "k": 1, "threshold": 0.5,
                                                                    "view": "tool_calls"}, log={"groups": True}))
    text = run_training(_cfg(tiny_model, tmp_path / "text", gate={"mode": "audit", "k": 1, "threshold": 0.5}))
    g = calls["dataflow"]["gates"]["selective_rollout"]
    assert g["decisions"] == 4 and g["stops"] == 4 and g["enforced_stops"] == 0
    assert g["precision"] == 1.0 and g["recall"] == 1.0  # every group really ended zero-variance
    assert 0 < g["stop_token_share"] < 1  # stopping at step 1 would have saved the rest of the tokens
    assert text["dataflow"]["gates"]["selective_rollout"]["stops"] == 0
    # audit changes nothing about the rollouts themselves
    assert calls["dataflow"]["groups"] == baseline["dataflow"]["groups"]
    # log.groups: one line per finished group, with the gate's record and the tool-call view it judged
    lines = [json.loads(x) for x in (tmp_path / "calls" / "groups.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(x["outcome"] == {"policy": None} for x in lines)
    assert all(x["gate_records"][0]["action"] == "stop" and x["gate_records"][0]["final_zero_variance"] for x in lines)
    assert all(len(x["calls"]) == 4 and x["calls"][0][0] == "<no_call>" for x in lines)
    last = _rows(tmp_path / "calls")[-1]
    assert last["flow/gates/selective_rollout/precision"] == 1.0 and last["flow/gates/selective_rollout/recall"] == 1.0


def test_a_resumed_run_logs_each_steps_groups_once(tiny_model: str, tmp_path: Path) -> None:
    """An attempt killed after its rollouts but before its update (and its checkpoint) has written that step's
    groups; the resumed run redoes the step, so those lines must go (a seed of the ALFWorld runs logged a step's
    groups twice this way)."""
    out = tmp_path / "run"
    run_training(_cfg(tiny_model, out, steps=1, log={"groups": True}, run={"checkpoint_every": 1}))
    log = out / "groups.jsonl"
    first = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["step"] for x in first] == [0, 0]
    with log.open("a") as f:  # the killed attempt at step 1: its two groups, then a torn line
        f.writelines(json.dumps({**x, "step": 1}) + "\n" for x in first)
        f.write('{"group_id": "torn')
    res = run_training(_cfg(tiny_model, out, steps=2, log={"groups": True}, run={"checkpoint_every": 1}))
    assert res["steps"] == 2
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 0, 1, 1]
    assert lines[:2] == first


def test_gate_enforce_stops_groups_early_and_keeps_them_out_of_the_loss(tiny_model: str, tmp_path: Path,
                                                                         baseline: dict[str, Any]) -> None:
    res = run_training(_cfg(tiny_model, tmp_path, gate={"mode": "enforce", "k": 1, "threshold": 0.5,
                                                        "view": "tool_calls"}, filter={"refill": False}))
    df = res["dataflow"]
    assert df["groups"]["outcomes"]["policy"] == {"filtered:early_stopped": 4}
    assert df["gates"]["selective_rollout"]["enforced_stops"] == 4
    # same seeds and groups, each cut at step 1 of up to 3: fewer tokens generated
    assert df["groups"]["finished"] == baseline["dataflow"]["groups"]["finished"]
    assert df["groups"]["generated_tokens"] < baseline["dataflow"]["groups"]["generated_tokens"]
    assert all(r["train/skipped"] == "all groups filtered" for r in _rows(tmp_path))


def test_dapo_filters_zero_variance_groups_and_refills(tiny_model: str, tmp_path: Path,
                                                       baseline: dict[str, Any]) -> None:
    res = run_training(_cfg(tiny_model, tmp_path, filter={"dynamic_sampling": True}))
    df = res["dataflow"]
    assert df["groups"]["outcomes"]["policy"] == {"filtered:zero_variance": df["groups"]["finished"]}
    assert df["groups"]["finished"] == 2 * baseline["dataflow"]["groups"]["finished"]  # one refill round each


def test_greso_skips_tasks_that_keep_giving_zero_variance(tiny_model: str, tmp_path: Path,
                                                          baseline: dict[str, Any]) -> None:
    res = run_training(_cfg(tiny_model, tmp_path, steps=3,
                            dataflow={"skip_zero_variance": True, "skip_patience": 1, "skip_explore": 0.2}))
    assert res["dataflow"]["task_stream"]["skipped"] > 0
    assert _rows(tmp_path)[-1]["flow/tasks_skipped"] == res["dataflow"]["task_stream"]["skipped"]


def test_pilot_runs_the_pilot_only_where_it_shows_no_variance(tiny_model: str, tmp_path: Path,
                                                              baseline: dict[str, Any]) -> None:
    res = run_training(_cfg(tiny_model, tmp_path, pilot={"mode": "enforce", "size": 2}, filter={"refill": False}))
    df = res["dataflow"]
    assert df["groups"]["outcomes"]["policy"] == {"filtered:pilot": 4}
    assert df["groups"]["episodes"] == 4 * 2 == baseline["dataflow"]["groups"]["episodes"] // 2
    assert df["gates"]["pilot_commit"]["enforced_stops"] == 4
    audit = run_training(_cfg(tiny_model, tmp_path / "audit", pilot={"mode": "audit", "size": 2}))
    a = audit["dataflow"]
    assert a["groups"]["episodes"] == baseline["dataflow"]["groups"]["episodes"]
    assert a["gates"]["pilot_commit"]["precision"] == 1.0


def test_prioritized_replay_weights_reach_the_loss(tiny_sft_model: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import agentgym.recipes.rl as recipe

    seen: list[tuple[list[str], list[float]]] = []
    real = recipe.samples_from_groups

    def spy(groups: list[TrajectoryGroup], pid: str, **kw: Any) -> Any:
        seen.append(([g.group_id for g in groups], list(kw["group_weights"])))
        return real(groups, pid, **kw)

    monkeypatch.setattr(recipe, "samples_from_groups", spy)
    res = run_training(_cfg(tiny_sft_model, tmp_path, steps=8,
                            rollout={"groups_per_step": 4, "tasks": 8},
                            dataflow={"replay_ratio": 0.5, "replay_priority": "recency", "replay_half_life": 1.0}))
    rows = _rows(tmp_path)
    replayed = [r.get("dataflow/replayed", 0) for r in rows]
    assert res["dataflow"]["replay"]["policy"]["added"] >= 1, "no informative group to replay: change the seed"
    assert sum(replayed) > 0
    # each batch: fresh groups at weight 1, replayed ones at their importance weight, some below 1
    ws = [w for _, wl in seen for w in wl]
    assert len(ws) == sum(r["dataflow/groups"] + r["dataflow/replayed"] for r in rows)
    assert all(0 < w <= 1 for w in ws) and any(w < 1 for w in ws)

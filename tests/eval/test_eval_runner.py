"""The eval Python API: expert success, summary contents, resumption, interruption, error isolation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from agentgym.policies.scripted import ExpertPolicy
from rollout_fakes import FailingPolicy, TickPolicy

from agentgym.errors import ConfigurationError, UnknownEnvError
from agentgym.eval import EvalConfig, arun_eval, load_episodes, select_tasks, write_report
from agentgym.rollout import read_jsonl
from agentgym.types import TaskSpec

ENV = "agentgym/TestCounter-v0"


def lines(out: Path) -> int:
    return len((out / "episodes.jsonl").read_text().splitlines())


async def test_demo_expert_is_perfect_and_summary_is_complete(tmp_path: Path) -> None:
    cfg = EvalConfig(["agentgym/Demo-v0"], split="test", tasks=4, samples=3, seeds=[0, 1, 2])
    s = await arun_eval(ExpertPolicy(), cfg, tmp_path)
    b = s["envs"]["agentgym/Demo-v0"]
    assert s["complete"] and s["finished_episodes"] == s["expected_episodes"] == 36 == lines(tmp_path)
    assert b["success"]["mean"] == 1.0 and b["success"]["per_seed"] == [1.0] * 3
    assert b["success"]["method"] == "wilson" and 0.85 < b["success"]["ci95"][0] < 1.0 == b["success"]["ci95"][1]
    assert b["reward"]["mean"] == 1.0 and b["errors"] == 0 and b["truncated"] == 0
    assert set(b["pass_at_k"]) == {"pass@1", "pass@2", "pass@3"}
    assert 1 <= b["turns"]["mean"] <= 6 and b["parse_errors"]["total"] == 0
    p = s["protocol"]
    assert p["envs"]["agentgym/Demo-v0"]["parser"] == "hermes" and p["envs"]["agentgym/Demo-v0"]["version"] == "0"
    assert p["envs"]["agentgym/Demo-v0"]["task_ids"] == ["guess-1", "guess-17", "guess-33", "guess-49"]
    assert p["policy"]["policy_id"] == "expert" and p["seeds"] == [0, 1, 2] and p["history"] == "full"
    assert p["max_turns"] == {"agentgym/Demo-v0": 12} and p["token_mode"] == "messages"
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["envs"]["agentgym/Demo-v0"]["success"]["mean"] == 1.0
    keys = {t.info["eval_key"] for t in read_jsonl(tmp_path / "episodes.jsonl")}
    assert len(keys) == 36


async def test_success_rate_and_ci_over_seeds_are_computed_not_assumed(tmp_path: Path) -> None:
    cfg = EvalConfig([ENV], split="test", tasks=4, samples=2, seeds=[0, 1])
    s = await arun_eval(FailingPolicy({"ok-3"}), cfg, tmp_path)
    b = s["envs"][ENV]
    # 4 of 9 test tasks spread: ok-1, ok-3, ok-5, ok-7 -> one task lost to errors in every seed
    assert s["protocol"]["envs"][ENV]["task_ids"] == ["ok-1", "ok-3", "ok-5", "ok-7"]
    assert b["success"]["per_seed"] == [0.75, 0.75] and b["success"]["method"] == "bootstrap over tasks"
    assert b["success"]["ci95"][0] < 0.75 < b["success"]["ci95"][1]  # the seeds tie, the tasks do not
    assert b["errors"] == 4 and b["error_examples"] == ["PolicyError: backend exploded"]
    assert b["pass_at_k"]["pass@2"]["mean"] == 0.75
    assert b["by_task_type"] == {"odd": {"episodes": 16, "success": 0.75}}


async def test_resume_skips_finished_and_extends(tmp_path: Path) -> None:
    pol = TickPolicy()
    await arun_eval(pol, EvalConfig([ENV], tasks=2, seeds=[0]), tmp_path)
    first_calls = len(pol.requests)
    assert lines(tmp_path) == 2
    s = await arun_eval(pol, EvalConfig([ENV], tasks=2, seeds=[0]), tmp_path)
    assert len(pol.requests) == first_calls and lines(tmp_path) == 2 and s["finished_episodes"] == 2  # nothing rerun
    s = await arun_eval(pol, EvalConfig([ENV], tasks=2, seeds=[0, 1]), tmp_path)  # add a seed
    assert lines(tmp_path) == 4 and s["finished_episodes"] == 4 and s["envs"][ENV]["success"]["n"] == 2


async def test_errors_are_retried_on_resume(tmp_path: Path) -> None:
    cfg = EvalConfig([ENV], tasks=3, seeds=[0])
    s = await arun_eval(FailingPolicy({"ok-1"}), cfg, tmp_path)
    assert s["envs"][ENV]["errors"] == 1
    s = await arun_eval(TickPolicy(), cfg, tmp_path)
    assert s["envs"][ENV]["errors"] == 0 and s["envs"][ENV]["success"]["mean"] == 1.0
    assert lines(tmp_path) == 4  # the error record stays in the log; the last record wins
    assert len(load_episodes(tmp_path)) == 3


async def test_cancel_leaves_resumable_output(tmp_path: Path) -> None:
    cfg = EvalConfig([ENV], tasks=8, samples=2, seeds=[0], concurrency=2)
    task = asyncio.ensure_future(arun_eval(TickPolicy(latency=0.05), cfg, tmp_path))
    while not (tmp_path / "episodes.jsonl").exists() or lines(tmp_path) < 3:
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    partial = json.loads((tmp_path / "summary.json").read_text())
    assert partial["complete"] is False and 3 <= partial["finished_episodes"] < 16
    done_before = load_episodes(tmp_path)
    assert len(done_before) == partial["finished_episodes"]
    pol = TickPolicy()
    s = await arun_eval(pol, cfg, tmp_path)
    assert s["complete"] and s["finished_episodes"] == 16
    assert len(load_episodes(tmp_path)) == 16 and lines(tmp_path) == 16  # no episode run twice
    # the rerun made exactly the policy calls of the missing episodes (ok-N takes N+1 turns)
    missing = [t for t in load_episodes(tmp_path).values() if t.info["eval_key"] not in done_before]
    assert len(pol.requests) == sum(int(t.task_id.split("-")[1]) + 1 for t in missing) > 0


async def test_protocol_mismatch_refuses_to_resume(tmp_path: Path) -> None:
    await arun_eval(TickPolicy(), EvalConfig([ENV], tasks=1), tmp_path)
    with pytest.raises(ConfigurationError, match="max_turns"):
        await arun_eval(TickPolicy(), EvalConfig([ENV], tasks=1, max_turns=3), tmp_path)


@pytest.mark.parametrize(("kw", "match"), [
    ({"samples": 0}, "samples: Input should be greater than or equal to 1"), ({"tasks": 0}, "tasks: "),
    ({"seeds": []}, "seed"),
    ({"seeds": [1, 1]}, "distinct"), ({"parser": "xml"}, "unknown parser"), ({"split": "nope"}, "no split 'nope'"),
    ({"temperature": -1.0}, "temperature"),
])
async def test_invalid_config(tmp_path: Path, kw: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        await arun_eval(TickPolicy(), EvalConfig([ENV], **kw), tmp_path)


async def test_unknown_env_suggests(tmp_path: Path) -> None:
    with pytest.raises(UnknownEnvError, match="Did you mean 'agentgym/Demo-v0'"):
        await arun_eval(TickPolicy(), EvalConfig(["agentgym/Demo-v9"]), tmp_path)


async def test_max_turns_is_recorded_and_applied(tmp_path: Path) -> None:
    s = await arun_eval(TickPolicy(), EvalConfig([ENV], tasks=9, max_turns=4), tmp_path)
    b = s["envs"][ENV]
    # ok-N needs N+1 turns: ok-1..ok-3 fit in 4 turns; ok-4.. are cut; boom is an env error
    assert b["success"]["mean"] == pytest.approx(3 / 9) and b["truncated_reasons"] == {"max_turns": 5}
    assert b["errors"] == 1 and s["protocol"]["max_turns"] == {ENV: 4}
    assert b["turns"]["max"] == 4


def test_select_tasks_spreads() -> None:
    pool = [TaskSpec(str(i), "test") for i in range(10)]
    assert [t.task_id for t in select_tasks(pool, 3)] == ["0", "3", "6"]
    assert len(select_tasks(pool, None)) == 10 and len(select_tasks(pool, 50)) == 10


async def test_report_compares_runs(tmp_path: Path) -> None:
    a, b = tmp_path / "expert", tmp_path / "flaky"
    await arun_eval(ExpertPolicy(), EvalConfig([ENV, "agentgym/Demo-v0"], tasks=4, seeds=[0, 1]), a)
    await arun_eval(FailingPolicy({"ok-5"}), EvalConfig([ENV], tasks=4, seeds=[0, 1]), b)
    path = write_report([a, b], tmp_path / "rep")
    md = path.read_text()
    assert "| agentgym/TestCounter-v0 | 100.0% [" in md and "| 75.0% [" in md
    assert "| agentgym/Demo-v0 | 100.0% [" in md and "] | – |" in md
    assert "| agentgym/TestCounter-v0 | odd | 100.0% (n=8) | 75.0% (n=8) |" in md
    for png in ("success_by_env.png", "success_by_task_type.png", "success_by_turns.png"):
        data = (tmp_path / "rep" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    with pytest.raises(ConfigurationError, match=r"summary\.json"):
        write_report([tmp_path], tmp_path / "rep2")


async def test_split_fallback_and_overrides(tmp_path: Path) -> None:
    from rollout_fakes import CounterEnv

    from agentgym.registration import register_env

    class NoTestSplit(CounterEnv):
        splits = ("train", "valid_seen", "valid_unseen")

    register_env("agentgym/TestNoTest-v0", NoTestSplit, family="test", max_episode_steps=20)
    s = await arun_eval(TickPolicy(), EvalConfig(["agentgym/TestNoTest-v0", ENV], tasks=1), tmp_path / "a")
    assert s["protocol"]["splits_used"] == {"agentgym/TestNoTest-v0": "valid_unseen", ENV: "test"}
    cfg = EvalConfig(["agentgym/TestNoTest-v0"], tasks=1, split_overrides={"agentgym/TestNoTest-v0": "valid_seen"})
    s = await arun_eval(TickPolicy(), cfg, tmp_path / "b")
    assert s["protocol"]["envs"]["agentgym/TestNoTest-v0"]["split"] == "valid_seen"
    with pytest.raises(ConfigurationError, match="has no split 'dev'"):
        await arun_eval(TickPolicy(), EvalConfig(["agentgym/TestNoTest-v0"], split="dev"), tmp_path / "c")

"""Code-v0: tools, rewards, task sources, harness integrity, checker."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import pytest
from agentgym.envs.code import tasks as T
from agentgym.envs.code.env import CodeEnv, evaluate_submission

import agentgym
from agentgym.errors import ConfigurationError, ValidationError
from agentgym.sandbox import get_sandbox

pytestmark = pytest.mark.timeout(300)


def call(name: str, **args: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


@pytest.fixture(scope="module")
def env() -> Iterator[CodeEnv]:
    e = CodeEnv()
    yield e
    e.close()


def _reset(env: CodeEnv, task_id: str) -> None:
    env.reset(options={"task_id": task_id})


@pytest.mark.parametrize("parser", ["hermes", "react", "json"])
def test_check_env_code(parser: str) -> None:
    e = agentgym.make("agentgym/Code-v0", parser=parser)
    try:
        report = agentgym.check_env(e, expert_episodes=3)
        assert not report.skipped, report
    finally:
        e.close()


def test_generated_splits_are_disjoint_and_solutions_pass(env: CodeEnv) -> None:
    train, test = env.tasks("train"), env.tasks("test")
    assert len(train) == 96 and len(test) == 24
    assert not {t.task_id for t in train} & {t.task_id for t in test}
    kinds = {t.data["kind"] for t in train}
    assert kinds == {"function", "stdio"}
    for task in [*train, *test]:
        o = evaluate_submission(env.sandbox, task, task.data["solution"])
        assert o.total > 0 and o.passed == o.total, (task.task_id, o)


def test_run_python_shows_output_and_errors(env: CodeEnv) -> None:
    _reset(env, "gen/caesar/0")
    obs, reward, term, trunc, info = env.step(call("run_python", code="print(sum(range(5)))"))
    assert obs[0]["role"] == "tool" and obs[0]["content"].strip() == "10"
    assert (reward, term, trunc) == (0.0, False, False)
    obs, *_ = env.step(call("run_python", code="print(input()[::-1])", stdin="abc\n"))
    assert obs[0]["content"].strip() == "cba"
    obs, *_ = env.step(call("run_python", code="1/0"))
    assert "ZeroDivisionError" in obs[0]["content"] and "exit code 1" in obs[0]["content"]
    env.run_timeout_s = 1.0
    try:
        obs, *_ = env.step(call("run_python", code="while True: pass"))
    finally:
        env.run_timeout_s = 10.0
    assert "timed out" in obs[0]["content"]
    assert env.metrics["runs"] == 4 and env.metrics["run_failures"] == 2


def test_submit_rewards_fraction_and_ends(env: CodeEnv) -> None:
    task = env.get_task("gen/rotate_left/0")
    _reset(env, task.task_id)
    # wrong for every non-empty rotation but right for []: partial credit
    obs, reward, term, _, info = env.step(call("submit", code="def rotate_left(xs):\n    return list(xs)"))
    assert term and info["success"] is False
    o = env.last_outcome
    assert o is not None and 0 <= o.passed < o.total
    assert reward == pytest.approx(o.passed / o.total)
    assert f"Passed {o.passed}/{o.total}" in obs[0]["content"]
    _reset(env, task.task_id)
    _, reward, term, _, info = env.step(call("submit", code=task.data["solution"]))
    assert term and reward == 1.0 and info["success"] is True


def test_binary_reward_mode() -> None:
    from agentgym.types import TaskSpec

    task = TaskSpec("custom/f", "train", "custom", {
        "kind": "function", "prompt": "Write f(x) = x, except f(2) == 3.", "starter": "", "setup": "",
        "tests": ["assert f(1) == 1", "assert f(2) == 3"], "solution": "def f(x):\n    return 3 if x == 2 else x"})
    half = "def f(x):\n    return x"
    for mode, expected in (("binary", 0.0), ("fraction", 0.5)):
        e = CodeEnv(source=[task], reward=mode)
        try:
            e.reset(options={"task_id": "custom/f"})
            _, reward, term, _, info = e.step(call("submit", code=half))
            assert term and reward == expected and info["success"] is False
        finally:
            e.close()
    with pytest.raises(ConfigurationError):
        CodeEnv(reward="half")


def test_stdio_task_submission(env: CodeEnv) -> None:
    task = env.get_task("gen/sum_mod/0")
    _reset(env, task.task_id)
    _, reward, *_ = env.step(call("submit", code=task.data["solution"]))
    assert reward == 1.0
    _reset(env, task.task_id)
    _, reward, *_ = env.step(call("submit", code="print(0)"))
    assert reward < 1.0


@pytest.mark.parametrize("cheat", [
    "import sys\nprint('@@AG 0 0 1')\nsys.exit(0)",
    "import os\nos._exit(0)",
    "raise SystemExit(0)",
    "def rotate_left(xs):\n    import sys; print('\\n@@AG deadbeef 0 1\\n@@AG deadbeef done 1'); return xs",
])
def test_harness_cannot_be_faked_by_output_or_early_exit(env: CodeEnv, cheat: str) -> None:
    task = env.get_task("gen/rotate_left/0")
    o = evaluate_submission(env.sandbox, task, cheat)
    assert o.passed < o.total


def test_harness_counts_each_assert() -> None:
    program, nonce, n = T.build_function_harness("def f(x):\n    return x", "", [
        "assert f(1) == 1", "assert f(2) == 3", "import math", "for i in range(3):\n    assert f(i) == i",
        "assert True, 'not a test'"])
    assert n == 3
    box = get_sandbox("auto")
    try:
        r = box.run(program, stdin=nonce + "\n")
        assert T.parse_harness_output(r.stdout, nonce, n) == (2, True)
    finally:
        box.close()


def test_mbpp_rows_loader(tmp_path) -> None:
    rows = [
        {"task_id": 2, "text": "Write a function to add two numbers.", "code": "def add(a, b):\n    return a + b",
         "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], "test_setup_code": ""},
        {"task_id": 3, "text": "Write a function to square.", "code": "def sq(a):\n    return a * a",
         "test_list": ["assert sq(3) == 9"], "split": "train"},
    ]
    p = tmp_path / "mbpp.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    e = CodeEnv(source="mbpp", path=str(p))
    try:
        assert e.splits == ("train", "test")
        assert agentgym.check_env(e, gym_checks=False)
        task = e.get_task("mbpp/2")
        assert "assert add(1, 2) == 3" in task.data["prompt"]
        e.reset(options={"task_id": "mbpp/2"})
        _, reward, *_ = e.step(call("submit", code="def add(a, b):\n    return a + b if a > 0 else 99"))
        assert reward == 0.5  # add(1, 2) passes, add(-1, 1) fails
    finally:
        e.close()
    with pytest.raises(ValidationError):
        T.mbpp_tasks([{"text": "x"}])
    with pytest.raises(ConfigurationError, match="path"):
        CodeEnv(source="mbpp")


def test_stdio_loaders_livecodebench_and_codecontests(tmp_path) -> None:
    lcb = {"question_id": "abc001", "question_content": "Print the sum of two integers.",
           "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
           "private_test_cases": [{"input": "5 5\n", "output": "10", "testtype": "stdin"}]}
    cc = {"name": "cc1", "description": "Echo the input upper-cased.",
          "public_tests": {"input": ["ab\n"], "output": ["AB\n"]}, "private_tests": {"input": ["x\n"], "output": ["X"]},
          "solutions": {"language": [2, 3], "solution": ["int main(){}", "print(input().upper())"]}}
    p = tmp_path / "stdio.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write(json.dumps(lcb) + "\n" + json.dumps(cc) + "\n")
    e = CodeEnv(source="stdio", path=str(p))
    try:
        t1, t2 = e.get_task("stdio/abc001"), e.get_task("stdio/cc1")
        assert len(t1.data["cases"]) == 2 and len(t2.data["cases"]) == 2
        assert t2.data["solution"] == "print(input().upper())"
        assert evaluate_submission(e.sandbox, t1, "a, b = map(int, input().split())\nprint(a + b)").fraction == 1.0
        assert evaluate_submission(e.sandbox, t2, t2.data["solution"]).fraction == 1.0
        assert evaluate_submission(e.sandbox, t2, "print(input())").fraction == 0.0
    finally:
        e.close()


def test_humaneval_source_and_expert() -> None:
    e = agentgym.make("agentgym/Code-v0", source="humaneval")
    try:
        base = e.unwrapped
        assert base.splits == ("test",) and len(base.tasks("test")) == 164
        obs, info = e.reset(options={"task_id": "HumanEval/0"})
        assert "def has_close_elements" in obs[-1]["content"]
        _, reward, term, _, info = e.step(base.expert_action())
        assert term and reward == 1.0 and info["success"]
    finally:
        e.close()


def test_process_backend_selectable() -> None:
    e = CodeEnv(sandbox="process")
    try:
        e.reset(options={"task_id": "gen/caesar/0"})
        obs, *_ = e.step(call("run_python", code="print('hi')"))
        assert obs[0]["content"].strip() == "hi" and e.sandbox.name == "process"
    finally:
        e.close()


def test_unknown_source_raises() -> None:
    with pytest.raises(ConfigurationError, match="unknown Code-v0 source"):
        CodeEnv(source="nope")


def test_mbpp_rows_without_tests_or_with_repeated_ids_are_skipped_with_a_warning(tmp_path, caplog) -> None:
    import logging

    rows = [
        {"task_id": 2, "text": "Add.", "code": "def add(a, b):\n    return a + b", "test_list": ["assert add(1, 2) == 3"]},
        {"task_id": 2, "text": "Add again.", "code": "", "test_list": ["assert add(2, 2) == 4"]},
        {"task_id": 5, "text": "Untested.", "code": "", "test_list": []},
    ]
    p = tmp_path / "mbpp.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    with caplog.at_level(logging.WARNING, logger="agentgym.envs.code.env"):
        e = CodeEnv(source="mbpp", path=str(p))
    try:
        assert [t.task_id for t in e.tasks("test")] == ["mbpp/2"]
        rep = e.load_report()
        assert rep["loaded"] == 1 and rep["skip_reasons"] == {"duplicate task_id": 1, "no test": 1}
        assert [i["item"] for i in rep["skipped_items"]] == ["row 1", "row 2"]
        assert any("skipped 2" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    finally:
        e.close()

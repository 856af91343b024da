"""Code-v0: tools, rewards, task sources, harness integrity, checker."""

from __future__ import annotations

import gzip
import json
import secrets
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
    h = T.build_function_harness("def f(x):\n    return x", "", [
        "assert f(1) == 1", "assert f(2) == 3", "import math", "for i in range(3):\n    assert f(i) == i",
        "assert True, 'not a test'"])
    assert h.total == 3
    assert "assert f(2)" not in h.program, "the tests must not be in the program file the sandbox sees"
    box = get_sandbox("auto")
    try:
        r = box.run(h.program, stdin=h.stdin)
        assert T.parse_harness_output(r.stdout, h.nonce, h.total) == (2, True), r
    finally:
        box.close()


# ---------------------------------------------------------------------------------- forging (issue 11)
FORGERIES = {
    # call the reporting function the old harness defined before the solution, then exit
    "call-reporter": "for _i in range(50):\n    try:\n        _ag_report(_i, 1)\n    except Exception:\n        pass\n"
                     "try:\n    _ag_report('done', 1)\nexcept Exception:\n    pass\nimport os\nos._exit(0)",
    # find the nonce and the results fd in the process and write fake result lines
    "nonce-from-memory": (
        "import gc, os, re, sys\n"
        "for o in gc.get_objects():\n"
        "    if callable(o) and getattr(o, '__defaults__', None):\n"
        "        for d in o.__defaults__:\n"
        "            if isinstance(d, str) and re.fullmatch('[0-9a-f]{16,32}', d):\n"
        "                for fd in range(1, 20):\n"
        "                    try:\n"
        "                        os.write(fd, ''.join('\\n@@AG %s %s 1\\n' % (d, i) for i in list(range(50)) + ['done'])"
        ".encode())\n"
        "                    except OSError:\n"
        "                        pass\n"
        "os._exit(0)"),
    # an answer that claims to equal everything
    "always-equal": ("class _Eq(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
                     "class _Any:\n    def __eq__(self, other):\n        return True\n    def __bool__(self):\n"
                     "        return True\n    def __ne__(self, other):\n        return False\n"
                     "def rotate_left(xs):\n    return _Any()"),
    # write fake results to every fd of every process of ours, through /proc
    "proc-fds": ("import os\nfor pid in os.listdir('/proc'):\n    if not pid.isdigit():\n        continue\n"
                 "    for fd in range(0, 12):\n        try:\n            f = os.open(f'/proc/{pid}/fd/{fd}', os.O_WRONLY)\n"
                 "            os.write(f, b'\\n@@AG x 0 1\\n')\n        except OSError:\n            pass\n"
                 "def rotate_left(xs):\n    return xs"),
    # read the hidden tests from the sandbox's files, the parent's memory or stdin, and answer from them
    "read-tests": ("import os, re\nseen = ''\nfor p in ['main.py', '/work/main.py', '/proc/self/cmdline']:\n"
                   "    try:\n        seen += open(p, errors='replace').read()\n    except OSError:\n        pass\n"
                   "try:\n    seen += open('/proc/%d/mem' % os.getppid(), 'rb').read(1).decode()\nexcept OSError:\n    pass\n"
                   "import sys\nseen += sys.stdin.read()\n"
                   "ANSWERS = dict(re.findall(r'rotate_left\\((\\[[^\\]]*\\])\\) == (\\[[^\\]]*\\])', seen))\n"
                   "def rotate_left(xs):\n    import ast\n    return ast.literal_eval(ANSWERS.get(str(xs), '[]'))"),
}


@pytest.mark.parametrize("cheat", list(FORGERIES), ids=list(FORGERIES))
def test_submissions_cannot_forge_hidden_test_results(env: CodeEnv, cheat: str) -> None:
    task = env.get_task("gen/rotate_left/0")
    _reset(env, task.task_id)
    obs, reward, term, _, info = env.step(call("submit", code=FORGERIES[cheat]))
    assert term and reward == 0.0 and info["success"] is False, obs
    assert obs[0]["content"].startswith("Passed 0/"), obs


def test_real_solutions_still_pass_through_the_plain_data_boundary(env: CodeEnv) -> None:
    """Mutated arguments, generators, exceptions, classes and numpy-free plain values behave as in-process."""
    from agentgym.types import TaskSpec

    tests = ["xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
             "assert list(gen(3)) == [0, 1, 2]",
             "try:\n    boom()\n    assert False\nexcept ValueError as e:\n    assert 'no' in str(e)",
             "p = Pair(2, 3)\nassert p.total() == 5 and p.a == 2",
             "assert big() == 10 ** 5000",
             "assert nested() == {'a': [1, (2, 3)], 'b': {4}, 'c': b'x', 'd': 1.5, 'e': None, 'f': 1j}",
             "assert CONST == 7 and math.sqrt(16) == 4",
             "assert len(Pair(1, 1)) == 2 and 1 in Pair(1, 1) and list(Pair(1, 4)) == [1, 4]"]
    solution = ("import math\nCONST = 7\ndef sort_in_place(xs):\n    xs.sort()\n"
                "def gen(n):\n    yield from range(n)\ndef boom():\n    raise ValueError('no')\n"
                "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
                "    def total(self):\n        return self.a + self.b\n    def __len__(self):\n        return 2\n"
                "    def __iter__(self):\n        return iter([self.a, self.b])\n"
                "def big():\n    return 10 ** 5000\n"
                "def nested():\n    return {'a': [1, (2, 3)], 'b': {4}, 'c': b'x', 'd': 1.5, 'e': None, 'f': 1j}\n")
    task = TaskSpec("t/plain", "test", "t", {"kind": "function", "prompt": "", "tests": tests, "setup": ""})
    o = evaluate_submission(env.sandbox, task, solution)
    assert (o.passed, o.total) == (8, 8), o
    o = evaluate_submission(env.sandbox, task, "def broken(:\n    pass")
    assert o.passed == 0 and "SyntaxError" in o.report, o


def test_hidden_tests_never_reach_a_later_run(env: CodeEnv) -> None:
    """After a submission, a run_python in the same (warm) sandbox cannot find the hidden tests in memory."""
    from agentgym.types import TaskSpec

    marker = "zq" + secrets.token_hex(12)
    task = TaskSpec("t/leak", "test", "t", {"kind": "function", "prompt": "", "setup": "",
                                            "tests": [f"assert f(1) == {marker!r}"], "solution": "def f(x):\n    return 0"})
    for _ in range(3):  # a long submission puts the tests far into the request the worker received
        o = evaluate_submission(env.sandbox, task, "def f(x):\n    return 0\n" + "# padding\n" * 800)
        assert o.total == 1
    head, tail = marker[:10], marker[10:][::-1]
    scan = f"""
import ctypes, re
head, tail = {head!r}.encode(), {tail!r}[::-1].encode()
found = 0
regions = []
with open('/proc/self/maps') as maps:
    for line in maps:
        m = re.match(r'([0-9a-f]+)-([0-9a-f]+) r[w-][x-]p', line)
        if m and '[v' not in line and ('[heap]' in line or len(line.split()) < 6):  # heap and anonymous memory
            regions.append((int(m.group(1), 16), int(m.group(2), 16)))
for lo, hi in regions:
    chunk = ctypes.string_at(lo, hi - lo)
    i = chunk.find(head)
    while i >= 0:
        found += chunk[i + len(head):i + len(head) + len(tail)] == tail
        i = chunk.find(head, i + 1)
print('found', found)
"""
    for _ in range(3):
        r = env.sandbox.run(scan, timeout_s=30)
        assert r.ok and r.stdout == "found 0\n", f"hidden tests leaked into a later run: {r.summary(300)}"


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

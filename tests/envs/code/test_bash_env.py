"""Bash-v0: checkers, per-episode state, isolation between episodes, expert, checker."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from agentgym.envs.code.bash import BashEnv, builtin_bash_tasks, check_answer

import agentgym
from agentgym.errors import ConfigurationError
from agentgym.types import TaskSpec

pytestmark = pytest.mark.timeout(300)


def call(name: str, **args: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


@pytest.fixture(scope="module")
def env() -> Iterator[BashEnv]:
    e = BashEnv()
    yield e
    e.close()


@pytest.mark.parametrize("parser", ["hermes", "react", "json"])
def test_check_env_bash(parser: str) -> None:
    e = agentgym.make("agentgym/Bash-v0", parser=parser)
    try:
        report = agentgym.check_env(e, expert_episodes=2)
        assert not report.skipped, report
    finally:
        e.close()


def test_builtin_tasks_and_splits() -> None:
    tasks = builtin_bash_tasks()
    assert len(tasks) == 60
    assert {t.split for t in tasks} == {"train", "test"}
    assert {t.data["check"]["type"] for t in tasks} == {"int", "string", "script"}


@pytest.mark.parametrize("backend", ["auto", "process"])
def test_expert_solves_every_task(backend: str) -> None:
    e = BashEnv(sandbox=backend)
    try:
        for split in e.splits:
            for t in e.tasks(split):
                e.reset(options={"task_id": t.task_id})
                for _ in range(4):
                    _, reward, term, trunc, info = e.step(e.expert_action())
                    if term or trunc:
                        break
                assert term and reward == 1.0 and info["success"], t.task_id
    finally:
        e.close()


def test_files_persist_within_an_episode_not_across(env: BashEnv) -> None:
    env.reset(options={"task_id": "bash/sum_numbers/0"})
    obs, *_ = env.step(call("bash", cmd="echo 41 > mine.txt; cd /; echo moved"))
    assert obs[0]["content"].strip() == "moved"
    obs, *_ = env.step(call("bash", cmd="cat mine.txt; ls numbers.txt"))
    assert obs[0]["content"].split() == ["41", "numbers.txt"]
    env.reset(options={"task_id": "bash/sum_numbers/0"})
    obs, *_ = env.step(call("bash", cmd="ls"))
    assert "mine.txt" not in obs[0]["content"] and "numbers.txt" in obs[0]["content"]


def test_bash_errors_and_timeouts_are_observations(env: BashEnv) -> None:
    env.reset(options={"task_id": "bash/grep_count/0"})
    obs, reward, term, *_ = env.step(call("bash", cmd="no-such-command-xyz"))
    assert "exit code 127" in obs[0]["content"] and not term
    env.timeout_s = 1.0
    try:
        obs, *_ = env.step(call("bash", cmd="sleep 30"))
        assert "timed out" in obs[0]["content"]
    finally:
        env.timeout_s = 10.0


def test_wrong_answer_and_script_checker(env: BashEnv) -> None:
    env.reset(options={"task_id": "bash/line_count_file/0"})
    _, reward, term, _, info = env.step(call("answer", text="done"))  # result.txt was never written
    assert term and reward == 0.0 and info["success"] is False
    env.reset(options={"task_id": "bash/line_count_file/0"})
    env.step(call("bash", cmd="wc -l < data.txt > result.txt"))
    _, reward, *_ = env.step(call("answer", text="done"))
    assert reward == 1.0


def test_check_answer_kinds() -> None:
    assert check_answer({"type": "int", "answer": 1234}, "The answer is 1,234.")
    assert not check_answer({"type": "int", "answer": 12}, "13")
    assert not check_answer({"type": "int", "answer": 12}, "none")
    assert check_answer({"type": "string", "answer": "bob"}, " 'bob'. ")
    assert not check_answer({"type": "string", "answer": "bob"}, "bobby")
    # leading dots are part of the answer (AgentBench's ".plain.log" task); quotes and a final period are not
    assert check_answer({"type": "string", "answer": ".plain.log"}, ".plain.log")
    assert check_answer({"type": "string", "answer": ".plain.log"}, "`.plain.log`.")
    assert not check_answer({"type": "string", "answer": ".plain.log"}, "plain.log")
    assert not check_answer({"type": "string", "answer": "plain.log"}, ".plain.log")
    assert check_answer({"type": "string", "answer": "v1.2."}, "v1.2.")
    assert check_answer({"type": "script", "script": 'test "$1" = hi'}, "hi", lambda s: 0 if "set -- hi" in s else 1)
    with pytest.raises(ConfigurationError):
        check_answer({"type": "regex"}, "x")


def test_custom_tasks_and_broken_init_raises() -> None:
    ok = TaskSpec("t1", "train", "x", {"init": "echo 7 > n", "question": "n?", "check": {"type": "int", "answer": 7},
                                       "expert": "cat n"})
    bad = TaskSpec("t2", "test", "x", {"init": "exit 3", "question": "?", "check": {"type": "int", "answer": 0},
                                       "expert": "true"})
    e = BashEnv(tasks=[ok, bad])
    try:
        e.reset(options={"task_id": "t1"})
        e.step(e.expert_action())
        _, reward, *_ = e.step(e.expert_action())
        assert reward == 1.0
        from agentgym.errors import EnvError

        with pytest.raises(EnvError, match="init script"):
            e.reset(options={"task_id": "t2"})
    finally:
        e.close()


# ------------------------------------------------------------------------------ leftovers (issue 11)
LEAVE_OPEN = """
import gc, sys
from agentgym.envs.code.bash import BashEnv
env = BashEnv(sandbox=sys.argv[1])
env.reset(seed=0)
env.step('<tool_call>{"name": "bash", "arguments": {"cmd": "touch x"}}</tool_call>')
kept = env
if sys.argv[2] == "drop":
    del env, kept
    gc.collect()
    import os
    # the one per-process copy of the bwrap worker script stays until exit (the "exit" case checks it goes)
    print("left", len([n for n in os.listdir(sys.argv[3]) if not n.startswith("agentgym-sandbox-")]))
# else: exit without close()
"""


@pytest.mark.parametrize("backend", ["auto", "process"])
@pytest.mark.parametrize("how", ["drop", "exit"])
def test_bash_env_without_close_leaves_no_temp_dirs(backend: str, how: str) -> None:
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    tmp = tempfile.mkdtemp(prefix="agentgym-leak-test-", dir="/tmp")
    os.chmod(tmp, 0o755)  # the sandbox uid must reach a session dir bound from here
    try:
        r = subprocess.run([sys.executable, "-c", LEAVE_OPEN, backend, how, tmp], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "TMPDIR": tmp})
        assert r.returncode == 0, r.stderr
        if how == "drop":
            assert r.stdout.split() == ["left", "0"], (r.stdout, r.stderr)
        assert os.listdir(tmp) == [], f"left behind: {os.listdir(tmp)}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_an_episode_cannot_fill_the_host_disk() -> None:
    """One command writing 720 MB: the episode's files live in a tmpfs of the sandbox's ``file_mb``
    (64 MB), not in a directory on the host's disk (which held all 720 MB before)."""
    import shutil

    env = BashEnv(tasks=[TaskSpec("t", "train", "x", {"init": "true", "question": "q", "expert": "true",
                                                    "check": {"type": "int", "answer": 1}})])
    try:
        env.reset()
        before = shutil.disk_usage("/tmp").used
        obs, *_ = env.step('<tool_call>{"name": "bash", "arguments": {"cmd": '
                           '"for i in $(seq 1 12); do head -c 60M /dev/zero > f$i || echo FAIL$i; done; '
                           'du -sm . | cut -f1"}}</tool_call>')
        grown = shutil.disk_usage("/tmp").used - before
        text = obs[0]["content"]
        assert "No space left on device" in text and "FAIL12" in text, text
        assert grown < 300 << 20, f"the host's disk use grew by {grown >> 20} MB"  # other tests may write too
    finally:
        env.close()


def test_a_script_check_cannot_be_forged_from_the_session() -> None:
    """Bash-v0's script checks run as one more sandbox run in the episode's session: the agent cannot
    replace the programs they call (read-only system), change their environment (every run starts
    clean; rc files are not read), or leave a process that acts during them (none survives a run).
    Each attempt below leaves the task undone, so the check must fail."""
    task = TaskSpec("t", "train", "x", {"init": "echo 3 > data.txt", "question": "q", "expert": "true",
                                        "check": {"type": "script", "script": 'test "$(cat result.txt)" = 3'}})
    env = BashEnv(tasks=[task])
    try:
        env.reset()
        for cmd in ["printf '#!/bin/sh\\nexit 0\\n' > /usr/bin/test; printf 'exit 0\\n' > /usr/bin/cat",
                    "export BASH_ENV=/work/rc; echo 'exit 0' > rc; echo 'exit 0' > .bashrc; echo 'exit 0' > .profile",
                    "mkdir -p bin && printf '#!/bin/sh\\necho 3\\n' > bin/cat && chmod +x bin/cat && export PATH=/work/bin:$PATH",
                    "(while :; do echo 3 > result.txt.tmp; sleep 0.05; done) & disown; echo started"]:
            env.step('<tool_call>' + json.dumps({"name": "bash", "arguments": {"cmd": cmd}}) + '</tool_call>')
        _, reward, *_ = env.step('<tool_call>{"name": "answer", "arguments": {"text": "done"}}</tool_call>')
        assert reward == 0.0
        env.reset()  # control: doing the task passes the same check
        env.step('<tool_call>{"name": "bash", "arguments": {"cmd": "cp data.txt result.txt"}}</tool_call>')
        _, reward, *_ = env.step('<tool_call>{"name": "answer", "arguments": {"text": "done"}}</tool_call>')
        assert reward == 1.0
    finally:
        env.close()

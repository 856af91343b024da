"""agentgym/OS-v0: AgentBench's OS-interaction format, run in per-episode root containers.

The task files below are written here in AgentBench's exact shape (``description``, ``create.init``
as code / file / python, ``start``, ``evaluation.match`` or ``evaluation.check`` with an ``example``)
and laid out as AgentBench lays them out (``data/<N>/*.json`` with scripts in ``scripts/<N>/``); the
scripts are our own. Loader and scoring tests need no Docker; the episode tests (slow, docker)
start real containers from the locally built image.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium
import pytest
from agentgym.envs.code.os_env import OSEnv, judge, load_os_tasks, parse_agentbench_text

import agentgym
from agentgym.errors import ConfigurationError, EnvError
from agentgym.loading import LoadReport

TASKS: list[dict[str, Any]] = [
    {   # 0: init code, exact match
        "description": "How many hidden files are in /srv/data? (not including subdirectories)",
        "create": {"local": "default", "init": {"code": "mkdir -p /srv/data/sub && cd /srv/data && "
                                                         "touch .a .b .c visible sub/.d"}},
        "evaluation": {"match": "3"}, "labels": ["file"],
    },
    {   # 1: init from a file and from python; check = [example, our integer matcher]
        "description": "How many lines of /var/log/app.log contain ERROR?",
        "create": {"local": "default", "init": [
            {"file": "init/app-log.sh"},
            {"language": "python", "code": "open('/var/log/app.log', 'a').write('ERROR disk full\\nINFO ok\\n')"},
        ]},
        "evaluation": {"check": [None, {"language": "python", "file": "check/integer-match.py"}],
                       "example": {"code": "grep -c ERROR /var/log/app.log"}},
    },
    {   # 2: a background process started in the agent's shell
        "description": "A program writes into a file under /root every second. Tell me the file's name (without its "
                       "directory).",
        "create": {"local": "default", "init": {"code": "mkdir -p /root/r1 /root/r2 && touch /root/a.log /root/log "
                                                         "/root/r1/.plain.log"}},
        "start": "python3 -c 'import time\nwhile True:\n\twith open(\"/root/r1/.plain.log\", \"a+\") as f:\n"
                 "\t\tf.write(\"succeed\")\n\ttime.sleep(1)' &",
        "evaluation": {"match": ".plain.log"},
    },
    {   # 3: a bash check file that inspects the container's state (answer ignored)
        "description": "Create a user named alice with a home directory, in the group sudo.",
        "evaluation": {"check": {"file": "check/alice.sh"}, "example": {"code": "useradd -m -G sudo alice"}},
    },
    {   # 4: a regex match and no example: the expert cannot know it
        "description": "How much space does /srv use? Answer like 12K.",
        "evaluation": {"match": {"regex": "^[0-9.]+[KMG]$", "strip": True}},
    },
    # 5-7: left out, with the reason
    {"description": "Compile me.", "evaluation": {"check": [{"language": "c++", "code": "int main(){}"}]}},
    {"description": "Missing script.", "create": {"init": {"file": "init/nope.sh"}}, "evaluation": {"match": "x"}},
    {"description": "No evaluation."},
]
SCRIPTS = {
    "init/app-log.sh": "#!/bin/bash\nprintf 'INFO start\\nERROR bad\\nWARN x\\nERROR worse\\n' > /var/log/app.log\n",
    "check/integer-match.py": "import sys\nsys.exit(0 if int(sys.argv[1]) == int(sys.argv[2]) else 1)\n",
    "check/alice.sh": "#!/bin/bash\ngetent passwd alice >/dev/null && id -nG alice | grep -qw sudo && [ -d /home/alice ]\n",
}


@pytest.fixture
def os_data(tmp_path: Path) -> Path:
    data = tmp_path / "os_interaction" / "data"
    (data / "1").mkdir(parents=True)
    (data / "1" / "tasks.json").write_text(json.dumps(TASKS, indent=1))
    (data / "2").mkdir()
    (data / "2" / "more.jsonl").write_text(json.dumps(
        {"description": "Say hi.", "create": [None, {"file": "ignored"}], "evaluation": {"match": "hi"}}) + "\n")
    for rel, text in SCRIPTS.items():
        f = tmp_path / "os_interaction" / "scripts" / "1" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return data


# ---------------------------------------------------------------------------- no Docker needed
def test_loads_agentbench_layout_and_counts_left_out_tasks(os_data: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="agentgym.envs.code.os_env"):
        env = OSEnv(path=os_data)  # no container until reset
    tasks = env.tasks("test")
    assert [t.task_id for t in tasks] == ["1/tasks/0", "1/tasks/1", "1/tasks/2", "1/tasks/3", "1/tasks/4", "2/more/0"]
    assert [t.task_type for t in tasks] == ["match", "check", "match", "check", "match", "match"]
    t1 = tasks[1].data
    assert t1["init"] == [["bash", SCRIPTS["init/app-log.sh"]],
                          ["python", "open('/var/log/app.log', 'a').write('ERROR disk full\\nINFO ok\\n')"]]
    assert t1["evaluation"]["check"] == [None, ["python", SCRIPTS["check/integer-match.py"]]]
    assert t1["evaluation"]["example"] == ["bash", "grep -c ERROR /var/log/app.log"]
    assert tasks[2].data["start"][0] == "bash" and tasks[2].data["evaluation"] == {"match": {"answer": ".plain.log", "strip": True}}
    assert tasks[5].data["init"] == []  # a "create" that is not an object is ignored, as in AgentBench
    rep = env.load_report()
    assert rep["loaded"] == 6 and rep["skipped"] == 3
    assert rep["skip_reasons"] == {"c++ scripts are not supported (no compiler in the image)": 1,
                                   "script file not found": 1, "no evaluation": 1}
    assert [i["item"] for i in rep["skipped_items"]] == ["1/tasks #5", "1/tasks #6", "1/tasks #7"]
    assert any("OS-v0: loaded 6 task(s)" in r.getMessage() and "skipped 3" in r.getMessage() for r in caplog.records)
    assert env.tools.names == ["bash_action", "answer_action", "finish_action"]
    assert gymnasium.spec("agentgym/OS-v0").max_episode_steps == 8  # AgentBench's round limit
    env.close()


def test_single_file_explicit_script_dir_and_bad_paths(os_data: Path, tmp_path: Path) -> None:
    rep = LoadReport("OS-v0")
    tasks = load_os_tasks(os_data / "1" / "tasks.json", script_dir=os_data.parent / "scripts" / "1", report=rep)
    assert len(tasks) == 5 and tasks[0].task_id == "tasks/0" and rep.n_skipped == 3
    tasks = load_os_tasks(os_data / "1" / "tasks.json", script_dir=tmp_path)  # scripts not there
    assert [t.task_id for t in tasks] == ["tasks/0", "tasks/2", "tasks/4"]  # the tasks reading script files are out
    globbed = load_os_tasks(str(os_data / "[12]" / "*.json*"))  # AgentBench names its files with globs
    assert [t.task_id for t in globbed] == ["1/tasks/0", "1/tasks/1", "1/tasks/2", "1/tasks/3", "1/tasks/4", "2/more/0"]
    assert globbed[1].data["init"][0] == ["bash", SCRIPTS["init/app-log.sh"]]  # scripts/1/ found for data/1/
    with pytest.raises(ConfigurationError, match="path="):
        OSEnv()
    with pytest.raises(ConfigurationError, match="does not exist"):
        OSEnv(path=tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigurationError, match=r"no \.json"):
        OSEnv(path=empty)


def test_judge_follows_agentbench() -> None:
    assert judge({"match": {"answer": "3", "strip": True}}, " 3\n")[0]
    assert not judge({"match": {"answer": "3"}}, " 3")[0]  # no strip unless asked
    assert not judge({"match": {"answer": "3", "strip": True}}, None)[0]  # finish_action answers None
    assert judge({"match": {"regex": "^[0-9]+K$"}}, "12K")[0] and not judge({"match": {"regex": "K"}}, None)[0]
    calls: list[tuple[str, str, list[str]]] = []

    def run(lang: str, code: str, params: list[str]) -> SimpleNamespace:
        calls.append((lang, code, params))
        if code == "example":
            return SimpleNamespace(exit_code=0, stdout="5\n")
        return SimpleNamespace(exit_code=0 if int(params[0]) == int(params[1]) else 1, stdout="")

    ev = {"check": [None, ["python", "cmp"]], "example": ["bash", "example"]}
    ok, steps = judge(ev, "5", run)
    assert ok and calls == [("bash", "example", ["5"]), ("python", "cmp", ["5", "5\n"])]
    assert [s["example"] for s in steps] == [True, False]
    assert not judge(ev, "6", run)[0]
    ok, _ = judge({"check": [["bash", "state"]], "example": None}, None,
                  lambda lang, code, params: SimpleNamespace(exit_code=0 if params == ["None"] else 1, stdout=""))
    assert ok  # finish_action's None reaches a checker as the text "None"


def test_agentbench_text_protocol() -> None:
    assert parse_agentbench_text("Think: list it.\n\nAct: bash\n\n```bash\nls -a\n```") == ("bash", "ls -a")
    assert parse_agentbench_text("Think: done.\n\nAct: answer(220)") == ("answer", "220")
    assert parse_agentbench_text("Act: finish") == ("finish", None)
    assert parse_agentbench_text("Act: answer 220") is None and parse_agentbench_text("no action") is None


# ---------------------------------------------------------------------------- real containers


def bash(script: str) -> str:
    return "<tool_call>" + json.dumps({"name": "bash_action", "arguments": {"script": script}}) + "</tool_call>"


def answer(text: str) -> str:
    return "<tool_call>" + json.dumps({"name": "answer_action", "arguments": {"answer": text}}) + "</tool_call>"


FINISH = '<tool_call>{"name": "finish_action", "arguments": {}}</tool_call>'


def run_expert(env: OSEnv, task_id: str) -> float:
    env.reset(options={"task_id": task_id})
    reward = 0.0
    while not env.done:
        _, reward, *_ = env.step(env.expert_action())
    return reward


@pytest.mark.slow
@pytest.mark.docker
def test_episodes_in_root_containers(os_data: Path, docker_ok: None) -> None:
    env = OSEnv(path=os_data, command_timeout_s=3, memory_mb=256)
    try:
        # the expert: init code, file + python init, a checker with the example script, a state checker
        assert [run_expert(env, t) for t in ("1/tasks/0", "1/tasks/1", "1/tasks/3", "2/more/0")] == [1.0] * 4
        assert env.last_check["passed"] and env.last_check["answer"] == "hi"
        run_expert(env, "1/tasks/1")
        assert env.last_check["steps"][0] == {"exit_code": 0, "stdout": "3\n", "example": True}
        # wrong answers
        env.reset(options={"task_id": "1/tasks/1"})
        assert env.step(answer("2"))[1] == 0.0
        env.reset(options={"task_id": "1/tasks/3"})
        assert env.step(FINISH)[1] == 0.0  # nothing created: the checker fails
        # the background `start` process, found through the persistent shell; a leading dot is kept
        env.reset(options={"task_id": "1/tasks/2"})
        obs, *_ = env.step(bash("sleep 1.5; cd /root && find . -newermt '-1 seconds' -type f"))
        assert obs[0]["content"] == "The output of the OS:\n\n./r1/.plain.log\n"
        obs, *_ = env.step(bash("pwd; ps -eo args | grep -c '^python3 -c'"))
        assert obs[0]["content"] == "The output of the OS:\n\n/root\n1\n"
        assert env.step(answer(".plain.log "))[1] == 1.0
        # one shell per episode: cd, variables, jobs persist; root; no network; time limit; truncation
        env.reset(options={"task_id": "1/tasks/0"})
        env.step(bash("cd /srv/data && N=$(ls -A | wc -l) && sleep 300 &"))
        env.step(bash("cd /srv/data; export N=5; sleep 300 &"))
        obs, *_ = env.step(bash("pwd; echo $N; jobs | wc -l; id -u; touch /etc/written && echo rootfs-writable"))
        assert obs[0]["content"] == "The output of the OS:\n\n/srv/data\n5\n2\n0\nrootfs-writable\n"
        obs, *_ = env.step(bash("python3 -c \"import socket; socket.create_connection(('10.1.2.3', 53), timeout=3)\""))
        assert "Network is unreachable" in obs[0]["content"]
        obs, *_ = env.step(bash("sleep 60"))
        assert "[the command ran past 3 s: it got Ctrl-C]" in obs[0]["content"]
        obs, *_ = env.step(bash("seq 1 1000"))
        text = obs[0]["content"]
        assert text.endswith("\n[truncated because the output is too long]") and len(text) == len("The output of the OS:\n\n") + 780 + 43
        obs, *_ = env.step(bash("python3 -c 'x = bytearray(600 * 1024 * 1024); print(len(x))'; echo rc=$?"))
        assert "rc=0" not in obs[0]["content"]  # 600 MiB does not fit in the 256 MiB container
        obs, *_ = env.step(bash("exit"))
        assert "a new one was started" in obs[0]["content"]
        # AgentBench's own text protocol
        obs, *_ = env.step("Think: count them.\n\nAct: bash\n\n```bash\nls -A /srv/data | grep '^\\.' | wc -l\n```")
        assert obs[0]["content"] == "The output of the OS:\n\n3\n"
        assert env.step("Think: it is 3.\n\nAct: answer(3)")[1] == 1.0
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.docker
def test_failing_init_raises_and_containers_are_removed(tmp_path: Path, docker_ok: None) -> None:
    from agentgym.envs.code.os_shell import LABEL, docker_client

    p = tmp_path / "bad.json"
    p.write_text(json.dumps([{"description": "x", "create": {"init": "exit 3"}, "evaluation": {"match": "x"}}]))
    env = OSEnv(path=p)
    with pytest.raises(EnvError, match=r"init script 1 .* failed \(exit 3"):
        env.reset()
    env.close()
    client = docker_client()
    mine = [c for c in client.containers.list(all=True, filters={"label": LABEL})
            if c.labels.get(f"{LABEL}.owner") == str(__import__("os").getpid())]
    assert mine == []
    client.close()


@pytest.mark.slow
@pytest.mark.docker
def test_concurrent_episodes_match_sequential_ones(os_data: Path, docker_ok: None) -> None:
    ids = ["1/tasks/0", "1/tasks/1", "1/tasks/3", "2/more/0"]
    results: dict[str, float] = {}

    def worker(task_id: str) -> None:
        env = OSEnv(path=os_data)
        try:
            results[task_id] = run_expert(env, task_id)
        finally:
            env.close()

    threads = [threading.Thread(target=worker, args=(t,)) for t in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == dict.fromkeys(ids, 1.0)


@pytest.mark.slow
@pytest.mark.docker
def test_checker(os_data: Path, docker_ok: None) -> None:
    env = agentgym.make("agentgym/OS-v0", path=str(os_data / "2"))
    try:
        agentgym.check_env(env)
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.docker
def test_scripts_end_at_their_deadline_whatever_they_leave_running(docker_ok: None) -> None:
    """An init or check script that backgrounds a child holding its output, or never ends, returns by its
    deadline (docker-py's exec_run itself has none); the background child an init script starts survives."""
    from agentgym.envs.code.os_image import ensure_os_image
    from agentgym.envs.code.os_shell import OSContainer, docker_client

    client = docker_client()
    box = OSContainer(client, ensure_os_image(client), memory_mb=256)
    try:
        t0 = time.monotonic()
        res = box.run_script("bash", "sleep 1000 & echo started; echo oops >&2")
        assert time.monotonic() - t0 < 5
        assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (0, "started\n", "oops\n", False)
        assert box.run_script("bash", "pgrep -x sleep >/dev/null && echo alive").stdout == "alive\n"
        t0 = time.monotonic()
        res = box.run_script("python", "import os, time\nos.close(1); os.close(2)\ntime.sleep(1000)", timeout_s=1)
        assert time.monotonic() - t0 < 5 and res.timed_out
        res = box.run_script("bash", 'echo "$1-$2"; exit 3', ["a b", "c"])
        assert (res.exit_code, res.stdout) == (3, "a b-c\n")
    finally:
        box.close()
        client.close()

"""OS-v0 under attack: an agent that forges its check, leaves processes behind, or fills the disk.

Every attack here gave a wrong answer reward 1.0 (or wrote to the host's disk) before the guard
(``envs/code/_os_guard.py``): the checks ran as root in the container the agent controlled, with
the programs, libraries, loader and configuration the agent could overwrite, beside whatever
processes it left, and the container's writes went to the host. Each test plays the attack as an
agent would (through ``bash_action``), answers wrongly, and expects reward 0; a control answers
rightly after the same kind of tampering with nothing forged and expects 1. The two attacks that
need a compiled ELF (a preloaded library, a fake dynamic loader) build it with the host's ``gcc``
and type it in as base64, as an agent could; they skip without a compiler.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from agentgym.envs.code.os_env import OSEnv

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.timeout(900)]

INT_MATCH = "import sys\nsys.exit(0 if int(sys.argv[1]) == int(sys.argv[2]) else 1)\n"
JSON_MATCH = "import json, sys\nsys.exit(0 if json.loads(sys.argv[1]) == json.loads(sys.argv[2]) else 1)\n"
TASKS: dict[str, dict[str, Any]] = {
    "count": {  # the truth is 6; every attack answers 7
        "description": "How many files are in /srv/q?",
        "create": {"init": {"code": "mkdir -p /srv/q && cd /srv/q && touch a b c d e f"}},
        "evaluation": {"check": [None, {"language": "python", "code": INT_MATCH}],
                       "example": {"code": "ls -A /srv/q | wc -l"}},
    },
    "awk": {
        "description": "How many lines does /srv/list have?",
        "create": {"init": {"code": "seq 1 6 > /srv/list"}},
        "evaluation": {"check": [None, {"language": "python", "code": INT_MATCH}],
                       "example": {"code": "awk 'END {print NR}' /srv/list"}},
    },
    "json": {
        "description": "What number is in /srv/n.json?",
        "create": {"init": {"code": "echo 6 > /srv/n.json"}},
        "evaluation": {"check": [None, {"language": "python", "code": JSON_MATCH}],
                       "example": {"code": "cat /srv/n.json"}},
    },
    "state": {  # a state check: the agent must create alice; every attack creates nobody
        "description": "Create the user alice.",
        "evaluation": {"check": {"code": "getent passwd alice >/dev/null"}},
    },
    "honest": {  # what a check may legitimately use of the agent's work
        "description": "Install the commands hello1 (in /usr/local/bin) and hello2 (in /usr/bin), write notes.",
        "evaluation": {"check": {"code": 'test "$(hello1)$(hello2)" = 12 && grep -qx hello /usr/notes.txt && '
                                         'grep -qx done /srv/out && getent passwd bob >/dev/null && '
                                         'echo check-was-here > /root/scratch'}},
    },
}
FAKE = "printf '#!/bin/sh\\nexit 0\\n'"
ECHO7 = "printf '#!/bin/sh\\necho 7\\n'"
EXIT0_PY = "import os; os._exit(0)"
ATTACKS: dict[str, tuple[str, list[str]]] = {
    # the attack: the wrapper's timeout says every check passed
    "timeout": ("count", [f'{FAKE} > "$(command -v timeout)"']),
    "timeout-state": ("state", [f'{FAKE} > "$(command -v timeout)"']),
    # the interpreter of python checks
    "python3": ("count", [f"{FAKE} > /usr/bin/python3.11"]),
    # a python3 earlier on PATH
    "path-shadow": ("count", [f"mkdir -p /usr/local/bin && {FAKE} > /usr/local/bin/python3 && "
                              "chmod +x /usr/local/bin/python3"]),
    # /bin/sh, which runs every check's wrapper
    "sh": ("count", ["printf '#!/usr/bin/bash\\nexit 0\\n' > /usr/bin/dash"]),
    # bash, which runs the example script: it prints the forged answer (the running shell's binary is
    # busy, so it is replaced, not rewritten)
    "bash": ("count", [f"rm /usr/bin/bash && {ECHO7} > /usr/bin/bash && chmod +x /usr/bin/bash"]),
    "bash-state": ("state", [f"rm /usr/bin/bash && {FAKE} > /usr/bin/bash && chmod +x /usr/bin/bash"]),
    # a program the example calls, redirected through /etc/alternatives
    "alternatives": ("awk", [f"{ECHO7} > /root/fakeawk && chmod +x /root/fakeawk && ln -sfn /root/fakeawk "
                             "/etc/alternatives/awk"]),
    # Python's startup hooks: sitecustomize, user site-packages, system site-packages
    "sitecustomize": ("count", [f"printf '{EXIT0_PY}\\n' > /etc/python3.11/sitecustomize.py"]),
    "user-site": ("count", ["mkdir -p /root/.local/lib/python3.11/site-packages && "
                            f"echo '{EXIT0_PY}' > /root/.local/lib/python3.11/site-packages/x.pth"]),
    "site-packages": ("count", ["mkdir -p /usr/local/lib/python3.11/dist-packages && "
                                f"echo '{EXIT0_PY}' > /usr/local/lib/python3.11/dist-packages/x.pth"]),
    # a module of the same name in the check's working directory, or in a zip on sys.path
    "cwd-module": ("json", [f"printf '{EXIT0_PY}\\n' > /root/json.py"]),
    "stdlib-zip": ("json", ["python3 -c \"import zipfile; z = zipfile.ZipFile('/usr/lib/python311.zip', 'w'); "
                            f"z.writestr('json/__init__.py', '{EXIT0_PY}'); z.close()\""]),
    # a process left behind that replaces python3 once the check has started
    "background": ("count", ["nohup sh -c 'while :; do for d in /tmp/tmp.*; do if [ -d \"$d\" ]; then "
                             "printf \"#!/bin/sh\\nexit 0\\n\" > /usr/bin/python3.11; exit; fi; done; done' "
                             ">/dev/null 2>&1 &"]),
}
ELF_ATTACKS = ("ld-preload", "loader")
ELF_SOURCES = {
    # exit_group(0) as soon as it is loaded
    "ld-preload": ("__attribute__((constructor)) static void forge(void) "
                   "{ __asm__ volatile(\"mov $231, %eax\\n xor %edi, %edi\\n syscall\"); }\n",
                   ["-nostdlib", "-shared", "-fPIC", "-s"]),
    "loader": ("void _start(void) { __asm__ volatile(\"mov $231, %eax\\n xor %edi, %edi\\n syscall\"); }\n",
               ["-nostdlib", "-static-pie", "-fPIE", "-s"]),
}


def bash(script: str) -> str:
    return "<tool_call>" + json.dumps({"name": "bash_action", "arguments": {"script": script}}) + "</tool_call>"


def answer(text: str) -> str:
    return "<tool_call>" + json.dumps({"name": "answer_action", "arguments": {"answer": text}}) + "</tool_call>"


FINISH = '<tool_call>{"name": "finish_action", "arguments": {}}</tool_call>'


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, docker_ok: None) -> Any:
    p = tmp_path_factory.mktemp("os-sec") / "tasks.json"
    p.write_text(json.dumps(list(TASKS.values())))
    e = OSEnv(path=p, command_timeout_s=20, script_timeout_s=20)
    yield e
    e.close()


def task_id(name: str) -> str:
    return f"tasks/{list(TASKS).index(name)}"


def play(env: OSEnv, task: str, scripts: list[str], final: str) -> tuple[float, list[str]]:
    env.reset(options={"task_id": task_id(task)})
    outputs = []
    for s in scripts:
        obs, *_ = env.step(bash(s))
        outputs.append(obs[0]["content"])
    _, reward, *_ = env.step(final)
    return reward, outputs


def wrong(task: str) -> str:
    return FINISH if task == "state" else answer("7")


def elf_script(name: str, tmp_path: Path) -> str:
    """Compile the attack's ELF on the host and return the bash that types it in (base64 of gzip)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc on the host to build the attack's ELF")
    src, flags = ELF_SOURCES[name]
    c, out = tmp_path / f"{name}.c", tmp_path / name
    c.write_text(src)
    subprocess.run(["gcc", *flags, "-o", str(out), str(c)], check=True, capture_output=True, timeout=120)
    b64 = base64.encodebytes(gzip.compress(out.read_bytes())).decode()
    if name == "ld-preload":
        return (f"base64 -d <<'EOF' | gunzip > /root/evil.so\n{b64}EOF\n"
                "echo /root/evil.so > /etc/ld.so.preload")
    return (f"mkdir -p /root/l64 && base64 -d <<'EOF' | gunzip > /root/l64/ld-linux-x86-64.so.2\n{b64}EOF\n"
            "chmod +x /root/l64/ld-linux-x86-64.so.2 && ln -sfn /root/l64 /lib64")


@pytest.mark.parametrize("attack", [*ATTACKS, *ELF_ATTACKS])
def test_a_forged_check_does_not_pay(env: OSEnv, attack: str, tmp_path: Path) -> None:
    if attack in ELF_ATTACKS:
        task, scripts = "count", [elf_script(attack, tmp_path)]
    else:
        task, scripts = ATTACKS[attack]
    reward, outputs = play(env, task, scripts, wrong(task))
    assert reward == 0.0, f"{attack}: a wrong answer was rewarded after {scripts!r} (outputs {outputs!r}); " \
                          f"check: {env.last_check!r}"
    assert env.last_check["passed"] is False


@pytest.mark.parametrize("task", ["count", "awk", "json", "state"])
def test_the_same_tasks_pay_a_right_answer_after_tampering(env: OSEnv, task: str) -> None:
    """Control: the tampering itself (planted files and links, a background writer) does not fail an
    honest answer, so the zeros above are the forgeries failing, not a broken checker."""
    tamper = [f"{FAKE} > /usr/bin/timeout; mkdir -p /usr/local/bin; {FAKE} > /usr/local/bin/python3; "
              f"chmod +x /usr/local/bin/python3; printf '{EXIT0_PY}\\n' > /root/json.py; "
              "nohup sh -c 'while :; do sleep 0.05; done' >/dev/null 2>&1 &"]
    right = {"count": answer("6"), "awk": answer("6"), "json": answer("6"), "state": FINISH}[task]
    if task == "state":
        tamper.append("useradd -m alice")
    reward, outputs = play(env, task, tamper, right)
    assert reward == 1.0, (outputs, env.last_check)


def test_checks_still_see_the_agents_legitimate_work(env: OSEnv) -> None:
    """Commands the agent installed (new names, in /usr/local/bin and /usr/bin), files it wrote in /usr
    and elsewhere, accounts it made: all visible to the check, which may also write its own files."""
    work = ["mkdir -p /usr/local/bin && printf '#!/bin/sh\\necho 1\\n' > /usr/local/bin/hello1 && "
            "printf '#!/bin/sh\\necho 2\\n' > /usr/bin/hello2 && chmod +x /usr/local/bin/hello1 /usr/bin/hello2",
            "echo hello > /usr/notes.txt && echo done > /srv/out && useradd -m bob"]
    reward, outputs = play(env, "honest", work, FINISH)
    assert reward == 1.0, (outputs, env.last_check)
    assert env.last_check["guard"]["usr_additions"] >= 3


def test_processes_the_agent_leaves_are_killed_before_the_check(env: OSEnv) -> None:
    env.reset(options={"task_id": task_id("count")})
    env.step(bash("setsid nohup sleep 1001 >/dev/null 2>&1 & (sleep 1002 &); nohup sleep 1003 >/dev/null 2>&1 &"))
    # the backgrounded shells exec `sleep` a moment later (setsid forks first): wait for all three, at most 10 s
    count = "ps -eo args | grep -c '^sleep 100'"
    obs, *_ = env.step(bash(f'for i in $(seq 100); do [ "$({count})" = 3 ] && break; sleep 0.1; done; {count}'))
    assert obs[0]["content"].startswith("The output of the OS:\n\n3\n"), obs
    box = env._box
    assert box is not None
    _, reward, *_ = env.step(answer("6"))
    assert reward == 1.0, env.last_check
    procs = box._client.api.top(box.id, ps_args="-eo pid,args")["Processes"]
    assert not [p for p in procs if "sleep 100" in " ".join(p)], procs


def test_the_guard_is_out_of_the_agents_reach(env: OSEnv) -> None:
    """The pristine root under the agent's overlay and the overlay's upper layer are reachable only
    through PID 1, which the agent can neither trace, signal nor inspect."""
    env.reset(options={"task_id": task_id("count")})
    obs, *_ = env.step(bash("ls /proc/1/root/ 2>&1 | head -1; cat /proc/1/environ 2>&1 | head -c 80; echo; "
                            "kill -9 1; kill -STOP 1; ps -o stat= -p 1; touch /mnt/x && ls /mnt; "
                            "python3 -c \"import ctypes; print('ptrace', ctypes.CDLL(None).ptrace(16, 1, 0, 0))\"; "
                            "df -h / | tail -1"))
    text = obs[0]["content"]
    assert "ls: cannot access '/proc/1/root/': Permission denied" in text, text
    assert "cat: /proc/1/environ: Permission denied" in text, text
    assert "ptrace -1" in text, text
    assert "\nS" in text, f"PID 1 was stopped or killed: {text}"
    assert "upper" not in text and "work" not in text, text  # /mnt is the image's empty one
    assert env.step(answer("6"))[1] == 1.0, env.last_check


def _host_footprint(client: Any, cid: str) -> int:
    """Bytes the container holds on the host: its writable layer and its log file."""
    [row] = client.api.containers(all=True, size=True, filters={"id": cid})
    log_path = client.api.inspect_container(cid).get("LogPath") or ""
    log = Path(log_path).stat().st_size if log_path and Path(log_path).exists() else 0
    return int(row.get("SizeRw") or 0) + log


def test_writes_are_capped_in_total_and_never_reach_the_host_disk(env: OSEnv) -> None:
    """Five 150 MiB files (750 MiB) against the default 512 MiB cap; the files Docker bind-mounts from
    the host (/etc/hosts...) and PID 1's output (the container log) take nothing either."""
    env.reset(options={"task_id": task_id("count")})
    box = env._box
    assert box is not None
    docker_root = box._client.info().get("DockerRootDir") or "/var/lib/docker"
    before = shutil.disk_usage(docker_root).used
    obs, *_ = env.step(bash("for i in 1 2 3 4 5; do fallocate -l 150M /root/f$i || echo FAIL$i; done 2>&1; "
                            "for f in /etc/hosts /etc/hostname /etc/resolv.conf; do "
                            "head -c 50M /dev/zero >> $f || echo RO:$f; done 2>&1; "
                            "head -c 50M /dev/zero > /proc/1/fd/1 2>&1 || echo NOLOG; du -sm /root | cut -f1"))
    text = obs[0]["content"]
    footprint = _host_footprint(box._client, box.id)
    grown = shutil.disk_usage(docker_root).used - before
    assert "No space left on device" in text and "FAIL4" in text and "FAIL5" in text, text
    assert "FAIL1" not in text and "FAIL3" not in text, text
    assert text.count("RO:") == 3, text
    assert footprint < 1 << 20, f"the container holds {footprint} bytes on the host"
    # other tests on this machine may write too: 750 MiB would have landed here without the cap
    assert grown < 300 << 20, f"the host's disk use grew by {grown >> 20} MiB"
    # a full disk does not stop the checker
    assert env.step(answer("6"))[1] == 1.0, env.last_check


def test_a_guard_failure_is_a_zero_with_its_reason(env: OSEnv) -> None:
    """When the guard cannot make a trustworthy view (a state it cannot repair in time, processes
    that will not die), the answer scores 0 with the reason recorded, and the env stays usable.
    The guard's failure is simulated here; the states that cause one are not practical to build."""
    from agentgym.errors import SandboxError

    env.reset(options={"task_id": task_id("count")})
    box = env._box
    assert box is not None
    real = box._guard

    def failing(*args: str, timeout_s: float = 120.0) -> dict[str, Any]:
        if args[0] == "seal":
            raise SandboxError("the OS-v0 guard (seal) failed: simulated")
        return real(*args, timeout_s=timeout_s)

    box._guard = failing  # type: ignore[method-assign]
    _, reward, terminated, *_ = env.step(answer("6"))
    assert (reward, terminated) == (0.0, True)
    assert "simulated" in env.last_check["error"]
    env.reset(options={"task_id": task_id("count")})
    assert env.step(answer("6"))[1] == 1.0

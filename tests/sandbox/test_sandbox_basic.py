"""Functional behaviour of every backend: I/O, files, exit codes, languages, sessions, errors."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from agentgym.errors import SandboxUnavailable
from agentgym.sandbox import ExecResult, Sandbox, get_sandbox

pytestmark = pytest.mark.timeout(120)


def test_stdout_stderr_exit_code(box: Sandbox) -> None:
    r = box.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 3)
    assert not r.ok and not r.timed_out and not r.truncated and not r.oom
    assert r.backend == box.name and r.duration_s > 0


def test_stdin_and_files(box: Sandbox) -> None:
    prog = "import sys\nn = int(sys.stdin.readline())\nprint(n * 2, open('data/in.txt').read().strip(), open('b.bin','rb').read())"
    r = box.run(prog, stdin="21\n", files={"data/in.txt": "hello ünïcode", "b.bin": b"\x00\x01"})
    assert r.ok, r
    assert r.stdout == "42 hello ünïcode b'\\x00\\x01'\n"


def test_exception_gives_traceback_and_exit_1(box: Sandbox) -> None:
    r = box.run("def f():\n    raise ValueError('boom')\nf()")
    assert r.exit_code == 1 and "ValueError: boom" in r.stderr and "Traceback" in r.stderr
    r = box.run("def broken(:\n    pass")
    assert r.exit_code == 1 and "SyntaxError" in r.stderr


def test_main_guard_and_bash(box: Sandbox) -> None:
    r = box.run("if __name__ == '__main__':\n    print('main')")
    assert r.stdout == "main\n"
    r = box.run("echo $((6*7)); cd /work 2>/dev/null || true; pwd >/dev/null; exit 5", language="bash")
    assert r.stdout == "42\n" and r.exit_code == 5


def test_non_utf8_output_is_replaced(box: Sandbox) -> None:
    r = box.run("import sys\nsys.stdout.buffer.write(b'\\xff\\xfeok')")
    assert r.ok and r.stdout.endswith("ok") and "\ufffd" in r.stdout


def test_bad_arguments_raise(box: Sandbox) -> None:
    with pytest.raises(ValueError):
        box.run("print(1)", files={"../evil": "x"})
    with pytest.raises(ValueError):
        box.run("print(1)", language="ruby")  # type: ignore[arg-type]


def test_session_keeps_files_not_processes(box: Sandbox) -> None:
    s = box.session()
    try:
        r = s.run("mkdir -p d && echo hi > d/f.txt && (sleep 300 &) && echo ok", language="bash")
        assert r.stdout == "ok\n", r
        r = s.run("cat d/f.txt; ls", language="bash")
        assert r.stdout.startswith("hi\n"), r
    finally:
        s.close()
    other = box.session()
    try:
        r = other.run("ls d 2>&1 || echo missing", language="bash")
        assert "missing" in r.stdout, "a new session must not see another session's files"
    finally:
        other.close()


def test_summary_mentions_limits() -> None:
    r = ExecResult(stdout="a\n", stderr="b\n", exit_code=-9, timed_out=True)
    text = r.summary()
    assert "a" in text and "[stderr]" in text and "timed out" in text
    assert ExecResult(exit_code=0).summary() == "(no output)"
    long = ExecResult(stdout="x" * 10_000, exit_code=0).summary(max_chars=100)
    assert len(long) < 200 and "cut" in long


def test_unknown_backend_and_missing_bwrap_raise_clearly() -> None:
    with pytest.raises(SandboxUnavailable, match="unknown sandbox backend"):
        get_sandbox("nope")
    with pytest.raises(SandboxUnavailable, match="apt install bubblewrap"):
        get_sandbox("bwrap", bwrap="/nonexistent/bwrap")


def test_unreachable_docker_raises_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    with pytest.raises(SandboxUnavailable, match=r"dockerd-start\.sh"):
        get_sandbox("docker")


def test_auto_prefers_bwrap() -> None:
    from agentgym.sandbox.bwrap import bwrap_available

    box = get_sandbox("auto")
    try:
        assert box.name == ("bwrap" if bwrap_available() else "process")
    finally:
        box.close()


def test_warm_pool_runs_concurrently_and_recovers() -> None:
    from agentgym.sandbox.bwrap import BwrapSandbox, bwrap_available

    if not bwrap_available():
        pytest.skip("bubblewrap missing")
    box = BwrapSandbox(warm=True, workers=2)
    results: list[ExecResult] = []
    try:
        threads = [threading.Thread(target=lambda i=i: results.append(box.run(f"print({i})"))) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(r.stdout for r in results) == [f"{i}\n" for i in range(6)]
        # kill a worker from outside: the next run transparently starts a new one
        for w in list(box._all):
            w.kill()
        assert box.run("print('back')").stdout == "back\n"
    finally:
        box.close()


def test_warm_fresh_interpreter_mode() -> None:
    from agentgym.sandbox.bwrap import BwrapSandbox, bwrap_available

    if not bwrap_available():
        pytest.skip("bubblewrap missing")
    with BwrapSandbox(warm=True, fresh_interpreter=True) as box:
        r = box.run("import sys\nprint(sys.flags.isolated, len(sys.modules) < 200)")
        assert r.ok and r.stdout == "1 True\n", r


@pytest.mark.docker
@pytest.mark.slow
def test_docker_removes_stale_containers() -> None:
    from agentgym.sandbox.docker import DEFAULT_IMAGE, LABEL, docker_available, ensure_empty_image

    if not docker_available():
        pytest.skip("Docker engine not reachable (start it with scripts/dockerd-start.sh)")
    import docker

    client = docker.from_env(timeout=30)
    try:
        ensure_empty_image(client)
        stale = client.containers.create(DEFAULT_IMAGE, ["/usr/bin/true"], labels={LABEL: "1", f"{LABEL}.owner": "999999999"},
                                          network_mode="none")
        box = get_sandbox("docker", pool_size=1)  # sweeps containers whose owner process is gone
        try:
            assert stale.id not in [c.id for c in client.containers.list(all=True)]
        finally:
            box.close()
    finally:
        client.close()


def test_worker_script_is_reachable_by_unprivileged_uids() -> None:
    """The package may live under a 0700 directory (a fresh clone in mktemp -d, /root): the warm worker,
    which starts as an unprivileged uid, must bind a copy every user can reach."""
    import os
    import stat

    from agentgym.sandbox.bwrap import WORKER_PATH, _worker_file

    path = _worker_file()
    from pathlib import Path

    assert Path(path).read_text() == WORKER_PATH.read_text()
    assert os.stat(path).st_mode & stat.S_IROTH
    d = os.path.dirname(path)
    while d != "/":
        assert os.stat(d).st_mode & stat.S_IXOTH, d
        d = os.path.dirname(d)


# ------------------------------------------------------------------------------ concurrency (issue 11)
VICTIM = "import time\ntime.sleep(0.6)\nprint('alive')"
KILLERS = [("import sys\nsys.exit(3)", 10.0), ("import time\ntime.sleep(5)", 0.2), ("raise MemoryError", 10.0)]


@pytest.mark.parametrize("name", [
    pytest.param("bwrap", id="bwrap"),
    pytest.param("bwrap-warm", id="bwrap-warm"),
    pytest.param("process", id="process"),
    pytest.param("docker", id="docker", marks=[pytest.mark.docker, pytest.mark.slow]),
])
def test_sandbox_instances_never_kill_each_others_runs(name: str, box_factory: Callable[[str], Sandbox]) -> None:
    """Many instances at once (as in a concurrent eval, one per env): one instance's failed, timed-out
    or closed runs must never touch another instance's live run or session."""
    n = 2 if name == "docker" else 4
    boxes = [box_factory(name) for _ in range(2 * n)]
    errors: list[str] = []
    stop = threading.Event()

    def victim(box: Sandbox, session: bool) -> None:
        for _ in range(3):
            if session:
                s = box.session()
                try:
                    r = s.run(VICTIM, timeout_s=20)
                finally:
                    s.close()
            else:
                r = box.run(VICTIM, timeout_s=20)
            if not (r.ok and r.stdout == "alive\n"):
                errors.append(f"{box.name}: {r.summary(300)}")

    def killer(box: Sandbox) -> None:
        i = 0
        while not stop.is_set():
            prog, timeout = KILLERS[i % len(KILLERS)]
            i += 1
            if i % 4 == 0:
                s = box.session()
                s.run(prog, timeout_s=timeout)
                s.close()
            else:
                box.run(prog, timeout_s=timeout)

    try:
        victims = [threading.Thread(target=victim, args=(b, i % 2 == 1)) for i, b in enumerate(boxes[:n])]
        killers = [threading.Thread(target=killer, args=(b,)) for b in boxes[n:]]
        for t in killers + victims:
            t.start()
        for t in victims:
            t.join(120)
        stop.set()
        for t in killers:
            t.join(60)
    finally:
        stop.set()
    assert errors == [], f"runs were killed by another sandbox instance: {errors[:3]}"


HOLD_LEASES = """
import sys, time
from agentgym.sandbox._posix import UidPool
pool = UidPool()
leases = [pool.lease() for _ in range(40)]
print(" ".join(str(l.uid) for l in leases), flush=True)
sys.stdin.readline()  # hold them until told
"""


def test_uid_leases_are_unique_across_processes() -> None:
    """Two processes and this one lease uids at once: no uid is ever held twice (flock), and a
    process that dies without releasing gives its uids back, marked for cleanup."""
    import os
    import subprocess
    import sys

    if os.geteuid() != 0:
        pytest.skip("uid leases are only used as root")
    from agentgym.sandbox._posix import UidPool

    procs = [subprocess.Popen([sys.executable, "-c", HOLD_LEASES], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        held = [set(map(int, p.stdout.readline().split())) for p in procs]  # type: ignore[union-attr]
        mine = [UidPool().lease() for _ in range(40)]
        ours = {lease.uid for lease in mine}
        assert len(held[0]) == len(held[1]) == len(ours) == 40
        assert not (held[0] & held[1]) and not (ours & (held[0] | held[1])), "a uid was leased twice"
        procs[0].kill()  # dies holding its leases: the kernel drops the locks
        procs[0].wait(10)
        for lease in mine:
            lease.release(clean=True)
        import fcntl

        from agentgym.sandbox._posix import _lock_dir

        for uid, free in [(u, True) for u in held[0]] + [(u, False) for u in held[1]]:
            fd = os.open(os.path.join(_lock_dir(), f"uid-{uid}"), os.O_RDWR)
            try:
                if free:  # the dead holder's lock is gone; its "in use" mark makes the next holder clean up
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    assert os.pread(fd, 1, 0) == b"1"
                    fcntl.flock(fd, fcntl.LOCK_UN)
                else:
                    with pytest.raises(BlockingIOError):
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
            for f in (p.stdin, p.stdout):
                if f is not None:
                    f.close()


def test_a_run_killed_by_its_cpu_time_limit_counts_as_timed_out() -> None:
    # The CPU-time limit is derived from timeout_s; a busy loop can hit it a moment before the
    # wall-clock deadline fires (seen on CI with bwrap-warm), and that is still a timeout.
    import signal

    from agentgym.sandbox.base import ExecResult

    r = ExecResult(exit_code=-signal.SIGXCPU, backend="x")
    assert r.timed_out and not r.ok and not r.oom
    assert not ExecResult(exit_code=-signal.SIGKILL).timed_out

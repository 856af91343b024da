"""Security tests, run on every available backend: each attack is contained, reported in the
ExecResult, and leaves the host and the sandbox working."""

from __future__ import annotations

import os
import resource
import socket
import time
import uuid

import pytest

from agentgym.sandbox import ExecResult, Sandbox

pytestmark = pytest.mark.timeout(120)


def _isolates_fs(box: Sandbox) -> bool:
    """bwrap and docker hide the host filesystem; the process backend does not (documented)."""
    return box.name != "process"


def _isolates_net(box: Sandbox) -> bool:
    return bool(getattr(box, "isolates_network", True))


def _still_works(box: Sandbox) -> None:
    r = box.run("print(6 * 7)", timeout_s=10)
    assert r.ok and r.stdout == "42\n", r


def _host_procs_with(marker: str) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(name))
        except OSError:
            continue
    return pids


def test_network_is_blocked(box: Sandbox) -> None:
    if not _isolates_net(box):
        pytest.skip("process backend without root cannot isolate the network (documented)")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.setblocking(False)
    port = srv.getsockname()[1]
    prog = f"""
import socket
for host, port in [("127.0.0.1", {port}), ("1.1.1.1", 80), ("8.8.8.8", 53)]:
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((host, port)); print("CONNECTED", host)
    except OSError as e:
        print("blocked", host, type(e).__name__)
try:
    socket.getaddrinfo("pypi.org", 443); print("RESOLVED")
except OSError:
    print("no dns")
"""
    try:
        r = box.run(prog, timeout_s=15)
        assert r.exit_code == 0, r
        assert "CONNECTED" not in r.stdout and "RESOLVED" not in r.stdout, r.stdout
        assert r.stdout.count("blocked") == 3
        with pytest.raises(BlockingIOError):
            srv.accept()  # nothing ever reached the host's loopback listener
    finally:
        srv.close()
    _still_works(box)


def test_fork_bomb_is_contained(box: Sandbox) -> None:
    prog = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
    t0 = time.monotonic()
    r = box.run(prog, timeout_s=3)
    assert time.monotonic() - t0 < 20
    assert r.timed_out and r.exit_code != 0, r
    time.sleep(0.3)
    _still_works(box)


def test_memory_hog_is_reported_as_oom(box: Sandbox) -> None:
    r = box.run("x = bytearray(8 * 1024**3)\nprint('allocated')", memory_mb=256, timeout_s=10)
    assert r.oom and not r.ok and "allocated" not in r.stdout, r
    r = box.run("l = []\nwhile True:\n    l.append(bytearray(10**7))", memory_mb=256, timeout_s=20)
    assert r.oom and not r.timed_out, r
    _still_works(box)


def test_infinite_loop_times_out(box: Sandbox) -> None:
    r = box.run("while True:\n    pass", timeout_s=1)
    assert r.timed_out and not r.ok and r.exit_code != 0, r
    assert 0.9 <= r.duration_s < 5
    r = box.run("sleep 1000", language="bash", timeout_s=1)
    assert r.timed_out and r.duration_s < 5
    _still_works(box)


def test_writes_outside_workdir_do_not_reach_host(box: Sandbox, tmp_path) -> None:
    marker = f"agentgym-escape-{uuid.uuid4().hex}"
    host_tmp = f"/tmp/{marker}"
    targets = ["/usr/" + marker, "/etc/" + marker, str(tmp_path / marker), "../" + marker, "/" + marker, host_tmp]
    prog = "import os\n" + "\n".join(
        f"try:\n    open({t!r}, 'w').write('x'); print('wrote', {t!r})\nexcept OSError as e:\n    print('denied', {t!r})"
        for t in targets
    )
    r = box.run(prog, timeout_s=10)
    assert r.exit_code == 0, r
    for t in [*targets[:3], "/" + marker]:
        assert not os.path.exists(t), f"{box.name}: the program created {t} on the host"
    assert f"wrote {'/usr/' + marker!r}" not in r.stdout
    if _isolates_fs(box):
        assert not os.path.exists(host_tmp), f"{box.name}: /tmp write reached the host"
    elif os.path.exists(host_tmp):
        os.unlink(host_tmp)  # the process backend shares /tmp (documented weakness)
    _still_works(box)


def test_host_secrets_and_root_are_not_readable(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("AGENTGYM_FAKE_SECRET", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    host_root = sorted(os.listdir("/root"))
    prog = """
import os
print(dict(os.environ))
try:
    print("ROOT", sorted(os.listdir("/root")))
except OSError as e:
    print("no /root", type(e).__name__)
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            print(open(f"/proc/{pid}/environ", "rb").read())
        except OSError:
            pass
"""
    r = box.run(prog, timeout_s=20, max_output_bytes=4 << 20)
    assert r.exit_code == 0, r
    assert secret not in r.stdout + r.stderr
    assert "AGENTGYM_FAKE_SECRET" not in r.stdout
    root_line = next((ln for ln in r.stdout.splitlines() if ln.startswith("ROOT")), "")
    for name in host_root:
        assert repr(name) not in root_line, f"{box.name}: host /root entry {name!r} is visible"
    _still_works(box)


def test_printing_a_gigabyte_is_capped(box: Sandbox) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    prog = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n"
    t0 = time.monotonic()
    r = box.run(prog, timeout_s=60, max_output_bytes=1 << 20)
    assert r.truncated and not r.ok, r.summary(200)
    assert len(r.stdout) <= 1 << 20
    assert time.monotonic() - t0 < 30
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 200, f"host memory grew by {grown_mb:.0f} MB"
    r = box.run("yes", language="bash", timeout_s=30, max_output_bytes=100_000)
    assert r.truncated and len(r.stdout) <= 100_000
    _still_works(box)


def test_killing_the_parent_does_not_hurt_the_host(box: Sandbox) -> None:
    prog = """
import os, signal
for target in (os.getppid(), 1, -1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError as e:
        print("kill", target, type(e).__name__)
print("still here")
"""
    r = box.run(prog, timeout_s=10)
    assert isinstance(r, ExecResult)
    assert r.exit_code != 0 or "still here" in r.stdout
    r = box.run("kill -9 $PPID; kill -9 1; kill -9 -1; echo done", language="bash", timeout_s=10)
    assert isinstance(r, ExecResult)
    _still_works(box)
    _still_works(box)


def test_no_background_processes_survive(box: Sandbox) -> None:
    tag = f"{time.time_ns() % 10**6}.{os.getpid() % 1000}"
    prog = f"""
import os, subprocess, time
subprocess.Popen(["sleep", "{tag}1"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "{tag}2"])
    os._exit(0)
time.sleep(0.2)
print("spawned")
"""
    r = box.run(prog, timeout_s=10)
    assert "spawned" in r.stdout, r
    assert not r.timed_out and r.duration_s < 5, "leftovers holding stdout must not stall the run"
    r = box.run(f"nohup sleep {tag}3 >/dev/null 2>&1 &\nsetsid sleep {tag}4 &\necho ok", language="bash", timeout_s=10)
    assert r.stdout.strip() == "ok" and not r.timed_out, r
    deadline = time.monotonic() + 3
    while _host_procs_with(f"sleep\x00{tag}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _host_procs_with(f"sleep\x00{tag}") == [], f"{box.name}: background processes survived the run"
    _still_works(box)


def test_no_state_survives_between_runs(box: Sandbox) -> None:
    tmp_file = "/tmp/left.txt" if _isolates_fs(box) else "left2.txt"  # process backend shares host /tmp
    r = box.run(f"open('left.txt', 'w').write('x')\nopen({tmp_file!r}, 'w').write('x')\nimport json\nGLOBAL = 1")
    assert r.ok, r
    r = box.run(f"import os\nprint(os.path.exists('left.txt'), os.path.exists({tmp_file!r}), 'GLOBAL' in globals())")
    assert r.ok and r.stdout == "False False False\n", r

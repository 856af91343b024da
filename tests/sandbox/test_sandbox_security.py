"""Security tests, run on every available backend: each attack is contained, reported in the
ExecResult, and leaves the host and the sandbox working."""

from __future__ import annotations

import os
import resource
import socket
import time
import uuid
from collections.abc import Callable

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


# ------------------------------------------------------------------------------ hardening (issue 11)
def _is_root() -> bool:
    return os.geteuid() == 0


def _shares_host_ipc(box: Sandbox) -> bool:
    """Only the process backend without root shares /dev/shm, /tmp and System V IPC with the host."""
    return box.name == "process" and not _is_root()


def test_host_writes_never_follow_links_planted_in_a_session(box: Sandbox, tmp_path) -> None:
    """A program plants symlinks named like files the host writes next (a long bash script, main.py,
    a ``files=`` entry, a directory of one): the host must replace the link, never write through it."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.chmod(victim, 0o644)
    vdir = tmp_path / "vdir"
    vdir.mkdir()
    owners = (os.stat(victim).st_uid, os.stat(vdir).st_uid, os.stat(tmp_path).st_uid)
    s = box.session()
    try:
        r = s.run(f"for f in main.sh main.py data.txt; do ln -s {victim} $f; done; ln -s {vdir} d; ln -s {tmp_path} up; "
                  "echo planted", language="bash")
        assert r.stdout == "planted\n", r
        r = s.run("echo long # " + "x" * 150_000, language="bash")  # too long for argv: the host writes a script
        assert r.stdout == "long\n", r
        r = s.run("print(open('data.txt').read(), open('d/new.txt').read(), open('up/x.txt').read())",
                  files={"data.txt": "fresh", "d/new.txt": "n", "up/x.txt": "u"})
        assert r.stdout == "fresh n u\n", r
    finally:
        s.close()
    assert victim.read_text() == "precious\n", f"{box.name}: the host wrote through a planted symlink"
    assert list(vdir.iterdir()) == [] and not (tmp_path / "x.txt").exists()
    assert (os.stat(victim).st_uid, os.stat(vdir).st_uid, os.stat(tmp_path).st_uid) == owners, "owner changed"
    _still_works(box)


def test_programs_never_run_privileged(box: Sandbox) -> None:
    """Never root when the host is root; no_new_privs (setuid binaries are inert) and a seccomp filter."""
    prog = ("import os\nst = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)\n"
            "print(os.getuid(), os.geteuid(), st['NoNewPrivs'].strip(), st['Seccomp'].strip())")
    for r in (box.run(prog), box.run(prog.replace("print(", "import subprocess\nsubprocess.run(['true'])\nprint("))):
        assert r.ok, r
        uid, euid, nnp, seccomp = r.stdout.split()
        if _is_root():
            assert uid != "0" and euid != "0", f"{box.name}: the program ran as root"
        assert nnp == "1", f"{box.name}: no_new_privs is not set"
        assert seccomp == "2", f"{box.name}: no seccomp filter"


PTRACE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for pid in (1, os.getppid()):
    rc = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
    print("attach", pid, rc, ctypes.get_errno())
"""


def test_ptrace_is_denied_and_a_finished_run_is_not_a_timeout(box: Sandbox) -> None:
    r = box.run(PTRACE, timeout_s=5)
    assert r.exit_code == 0 and not r.timed_out, r
    assert r.duration_s < 4, r
    for line in r.stdout.splitlines():
        assert line.split()[2] == "-1", f"{box.name}: ptrace attach succeeded: {line}"
    _still_works(box)


@pytest.mark.parametrize("prog,language", [
    ("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)", "python"),
    ("import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass", "python"),
    ("exec >&- 2>&-; sleep 60", "bash"),
    ("import os, signal, time\nos.kill(os.getppid(), signal.SIGSTOP)\ntime.sleep(60)", "python"),
    ("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)", "python"),
    ("kill -STOP $PPID; sleep 60", "bash"),
], ids=["close-out-sleep", "close-out-spin", "bash-close-out", "stop-parent-sleep", "stop-parent-exit", "bash-stop-parent"])
def test_every_run_ends_within_its_timeout(box: Sandbox, prog: str, language: str) -> None:
    t0 = time.monotonic()
    r = box.run(prog, language=language, timeout_s=1)  # type: ignore[arg-type]
    took = time.monotonic() - t0
    assert took < 1 + 3, f"{box.name}: the run took {took:.1f} s under a 1 s timeout"
    if "sleep 60" in prog or "while True" in prog:
        assert r.timed_out and not r.ok, r
    _still_works(box)


SHM_WRITE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
open('/dev/shm/agentgym-leak', 'w').write('x')
shm = libc.shmget(0x41474d31, 4096, 0o1600)  # IPC_CREAT | 0600
print('made', shm >= 0)
"""
SHM_READ = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print('file', os.path.exists('/dev/shm/agentgym-leak'), 'shm', libc.shmget(0x41474d31, 0, 0) >= 0)
"""
SHM_FILL = """
import os
total = 0
try:
    for i in range(64):
        with open(f'/dev/shm/fill{i}', 'wb') as f:
            for _ in range(8):
                f.write(b'x' * (1 << 20))
                total += 1 << 20
except OSError as e:
    print('stopped', type(e).__name__)
print('wrote', total >> 20)
"""


def test_shm_and_sysv_ipc_do_not_survive_a_run(box: Sandbox) -> None:
    if _shares_host_ipc(box):
        pytest.skip("the process backend without root shares /dev/shm and IPC with the host (documented)")
    for runner in (box, box.session()):
        try:
            r = runner.run(SHM_WRITE)
            assert r.ok and r.stdout == "made True\n", r
            r = runner.run(SHM_READ)
            assert r.ok and r.stdout == "file False shm False\n", f"{box.name}: IPC state survived a run: {r}"
        finally:
            if runner is not box:
                runner.close()  # type: ignore[union-attr]
    r = box.run(SHM_FILL, timeout_s=30, memory_mb=512)
    wrote = int(r.stdout.split()[-1])
    assert "stopped" in r.stdout and wrote <= 80, f"{box.name}: /dev/shm took {wrote} MB (cap is the file_mb tmpfs size)"
    r = box.run("import os\nprint(sorted(os.listdir('/dev/shm')))")
    assert r.stdout == "[]\n", r
    _still_works(box)


def test_session_processes_do_not_survive_into_the_next_run(box: Sandbox) -> None:
    tag = f"{time.time_ns() % 10**6}.{os.getpid() % 1000}"
    s = box.session()
    try:
        r = s.run(f"setsid sleep {tag}1 >/dev/null 2>&1 & nohup sleep {tag}2 >/dev/null 2>&1 & "
                  f"(exec >&- 2>&-; sleep {tag}3) & echo started", language="bash", timeout_s=10)
        assert r.stdout == "started\n" and not r.timed_out, r
        deadline = time.monotonic() + 3
        while _host_procs_with(f"sleep\x00{tag}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _host_procs_with(f"sleep\x00{tag}") == [], f"{box.name}: a session's background process survived"
        if box.name != "process":  # the others have their own PID namespace: nothing may be left in it
            r = s.run("ps -eo comm 2>/dev/null | grep -c sleep || true", language="bash")
            assert r.stdout.strip() in ("0", ""), r
    finally:
        s.close()


AS_USER = r"""
import json, os, sys, time
from agentgym.sandbox import get_sandbox
tag = sys.argv[1]
box = get_sandbox("process")
out = {"drop": box.drop_privileges}
r = box.run("import os\nst = open('/proc/self/status').read()\nprint(os.getuid(), 'NoNewPrivs:\\t1' in st, 'Seccomp:\\t2' in st)")
out["run"] = r.stdout.split()
s = box.session()
r = s.run(f"setsid sleep {tag}1 >/dev/null 2>&1 & (exec >&- 2>&-; sleep {tag}2) & echo started", language="bash")
out["session"] = r.stdout.strip()
r = s.run("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(30)", timeout_s=1.5)
out["closed_out"] = [r.timed_out, round(r.duration_s, 1)]
s.close()
box.close()
print(json.dumps(out))
"""


def test_process_backend_as_an_ordinary_user() -> None:
    """The process backend's non-root path (a supervisor, no namespaces): still sweeps every leftover,
    still ends runs at their deadline, still sets no_new_privs and seccomp."""
    import json
    import shutil
    import subprocess
    import sys

    if not _is_root() or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the test as an ordinary user")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    probe = subprocess.run([*as_nobody, "-c", "import agentgym"], capture_output=True, text=True, timeout=120, cwd="/",
                           env={"PATH": "/usr/bin:/bin"})
    if probe.returncode != 0:  # e.g. a checkout in a 0700 temp dir: the ordinary user cannot import the project
        pytest.skip(f"an ordinary user cannot import agentgym from this checkout: {probe.stderr.strip()[-200:]}")
    tag = f"{time.time_ns() % 10**6}.{os.getpid() % 1000}"
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", AS_USER,
                        tag], capture_output=True, text=True, timeout=120, cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["drop"] is False and out["run"] == ["65534", "True", "True"], out
    assert out["session"] == "started"
    assert out["closed_out"][0] is True and out["closed_out"][1] < 4, out
    assert _host_procs_with(f"sleep\x00{tag}") == [], "a background process of an ordinary user's session survived"


def test_process_backend_refuses_to_run_programs_as_root() -> None:
    from agentgym.errors import SandboxError
    from agentgym.sandbox.process import ProcessSandbox

    if not _is_root():
        with pytest.raises(SandboxError, match="needs the host to run as root"):
            ProcessSandbox(drop_privileges=True)
        return
    with pytest.raises(SandboxError, match="refusing to run untrusted programs as root"):
        ProcessSandbox(drop_privileges=False)
    box = ProcessSandbox()
    try:
        assert box.drop_privileges and box.run("import os\nprint(os.geteuid())").stdout.strip() != "0"
    finally:
        box.close()


@pytest.mark.docker
@pytest.mark.slow
def test_docker_runs_cannot_grow_a_log_file_on_the_host(box_factory: Callable[[str], Sandbox]) -> None:
    """A run can write to PID 1's stdout (same uid): Docker would keep all of it in a JSON log on the
    host's disk (10 MB written became 60 MB of log). The containers keep no log at all."""
    box = box_factory("docker")
    r = box.run("head -c 20000000 /dev/zero > /proc/1/fd/1; head -c 20000000 /dev/zero > /proc/1/fd/2; echo wrote",
                language="bash", timeout_s=30)
    assert "wrote" in r.stdout, r.summary(300)
    api = box._client.api  # type: ignore[attr-defined]
    for cid in list(box._live):  # type: ignore[attr-defined]
        info = api.inspect_container(cid)
        assert info["HostConfig"]["LogConfig"]["Type"] == "none"
        path = info.get("LogPath") or ""
        grown = os.path.getsize(path) if path and os.path.exists(path) else 0
        assert grown < 1 << 20, f"the container's log on the host holds {grown} bytes"
    _still_works(box)


def test_a_sessions_files_are_capped_in_total_and_never_reach_the_host_disk(box: Sandbox) -> None:
    """Twelve 60 MB files (720 MB) in one session run: a session's directory is a tmpfs of ``file_mb``
    (64 MB) on every backend, so writes past it fail; bwrap and root process sessions used to be a
    directory on the host's disk, capped per file only. Not for the process backend as an ordinary
    user (its session directory is the host's; documented)."""
    import shutil

    if box.name == "process" and not _is_root():
        pytest.skip("the process backend as an ordinary user keeps sessions on the host's disk (documented)")
    s = box.session()
    try:
        before = shutil.disk_usage("/tmp").used
        r = s.run("for i in $(seq 1 12); do head -c 60M /dev/zero > f$i 2>/dev/null || echo FAIL$i; done; "
                  "du -sm . | cut -f1", language="bash", timeout_s=60)
        grown = shutil.disk_usage("/tmp").used - before
        lines = r.stdout.split()
        assert "FAIL1" not in lines and "FAIL12" in lines, r.summary(500)
        assert int(lines[-1]) <= 64, r.summary(500)
        # other tests on this machine may write too; 720 MB would have landed here
        assert grown < 300 << 20, f"{box.name}: the host's disk use grew by {grown >> 20} MB"
        r = s.run("rm f*; echo more > g; cat g", language="bash")  # freed space is usable again; files persist
        assert r.stdout == "more\n", r.summary(300)
        assert s.run("cat g", language="bash").stdout == "more\n"
    finally:
        s.close()
    _still_works(box)

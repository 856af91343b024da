"""Warm bwrap worker. Runs *inside* the bubblewrap sandbox (stdlib only, never imported by the host).

Protocol on fds 0/1 (moved away at start-up): frames of a 4-byte big-endian length + JSON.
The worker answers ``{"ready": true}`` once, then one response per request.

Each request runs in a fresh child that is PID 1 of a new PID namespace with its own mount
namespace and fresh tmpfs ``/work`` and ``/tmp``; the user's program runs in a grandchild with
every capability dropped and ``no_new_privs`` set. When the child exits the kernel kills whatever
the program left running, and the tmpfs mounts vanish, so no process and no file survives a run.
"""

import base64
import builtins
import contextlib
import ctypes
import json
import math
import os
import resource
import select
import signal
import struct
import sys
import time
import traceback
import types

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_SET_DUMPABLE, PR_SET_PDEATHSIG = 38, 24, 47, 4, 1
libc = ctypes.CDLL(None, use_errno=True)


def _read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _read_frame(fd):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


def _write_frame(fd, obj):
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        n = os.write(fd, data)
        data = data[n:]


_SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(os.uname().machine)


def _clone_newpid():
    """fork() into a new PID namespace in one step (raw clone); -1 where unsupported.

    Safe here because the worker is single-threaded and ctypes releases the GIL around the call;
    the child never returns to the request loop.
    """
    if _SYS_CLONE is None:
        return -1
    pid = libc.syscall(_SYS_CLONE, CLONE_NEWPID | signal.SIGCHLD, None, None, None, None)
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone(NEWPID): {os.strerror(err)}")
    return pid


def _inline(req):
    """Small bash scripts run with ``bash -c`` so that no script file appears in the work dir."""
    return req["language"] == "bash" and len(req["program"]) < 100_000


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _drop_bounding_set():
    """Empty the capability bounding set (inherited by every run; done once per worker)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


def _close_fds_from(lowest):
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd >= lowest:
            with contextlib.suppress(OSError):
                os.close(fd)


def _drop_caps():
    libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(hdr, data), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _set_limits(req, base_procs):
    cpu = math.ceil(req["timeout_s"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    mem = int(req["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    nproc = int(req["nproc"]) + base_procs
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    fs = int(req["file_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fs, fs))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _run_python_inline(src, workdir="/work"):
    """Run ``src`` as ``__main__`` in this (forked, pristine) interpreter, like ``python main.py``."""
    sys.stdin = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)  # noqa: SIM115
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
    main_py = os.path.join(workdir, "main.py")
    sys.argv = [main_py]
    sys.path[0] = workdir
    mod = types.ModuleType("__main__")
    mod.__dict__.update({"__file__": main_py, "__builtins__": builtins, "__cached__": None})
    sys.modules["__main__"] = mod
    code = 0
    try:
        exec(compile(src, main_py, "exec"), mod.__dict__)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        traceback.print_exception(type(e), e, tb)
        code = 1
    try:
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        code = code or 120
    os._exit(code)


def _grandchild(req, fds, base_procs):
    out_w, err_w, in_r = fds
    os.dup2(in_r, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    _close_fds_from(3)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    os.setsid()
    _set_limits(req, base_procs)
    _drop_caps()
    lang = req["language"]
    if _inline(req):
        os.execv("/bin/bash", ["bash", "-c", req["program"], "bash"])
    if lang == "bash":
        os.execv("/bin/bash", ["bash", "/work/main.sh"])
    if req.get("fresh_interpreter"):
        os.execv(sys.executable, [sys.executable, "-I", "/work/main.py"])
    _run_python_inline(req["program"])


def _child(req, fds, status_w):
    """PID 1 of a fresh PID namespace: fresh mounts, spawn the program, report its wait status."""
    try:
        _check(libc.unshare(CLONE_NEWNS), "unshare(NEWNS)")
        _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
        size = f"size={int(req['file_mb'])}m,mode=0755".encode()
        for mnt in (b"/work", b"/tmp"):
            _check(libc.mount(b"tmpfs", mnt, b"tmpfs", MS_NOSUID | MS_NODEV, size), f"mount {mnt!r}")
        _check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        name = "main.sh" if req["language"] == "bash" else "main.py"
        files = dict(req.get("files") or {})
        if not _inline(req):
            files[name] = base64.b64encode(req["program"].encode()).decode()
        for rel, b64 in files.items():
            path = os.path.join("/work", str(rel))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(base64.b64decode(b64))
        os.chdir("/work")
        pid = os.fork()
        if pid == 0:
            try:
                _grandchild(req, fds, 4)
            finally:
                os._exit(127)
        for fd in fds:
            os.close(fd)
        status = None
        while True:  # reap everything; remember the program's own status
            try:
                p, st = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if p == pid:
                status = st
                break
        os.write(status_w, struct.pack(">i", -1 if status is None else status))
    except BaseException as e:
        os.write(status_w, struct.pack(">i", -2) + repr(e).encode()[:500])
    os._exit(0)


def _collect(kill, out_r, err_r, in_w, stdin, deadline, cap, poll=None):
    """Feed stdin, read stdout/stderr up to ``cap`` bytes together, kill on deadline or overflow.

    ``poll()`` (optional) is called every 50 ms; once it returns True the program has exited and
    its leftovers were killed, so the pipes reach EOF promptly.
    """
    if stdin:
        os.set_blocking(in_w, False)
    else:
        os.close(in_w)
        in_w = -1
    bufs = {out_r: bytearray(), err_r: bytearray()}
    open_fds = [out_r, err_r]
    timed_out = truncated = killed = False
    while open_fds:
        now = time.monotonic()
        if now >= deadline:
            if killed:
                break
            timed_out = True
            kill()
            killed = True
            deadline = now + 1.0
        wl = [in_w] if in_w >= 0 else []
        wait = max(0.0, deadline - now)
        if poll is not None:
            if poll():
                poll = None
            else:
                wait = min(wait, 0.05)
        r, w, _ = select.select(open_fds, wl, [], wait)
        for fd in w:
            try:
                n = os.write(fd, stdin[:65536])
                stdin = stdin[n:]
            except OSError:
                stdin = b""
            if not stdin:
                os.close(in_w)
                in_w = -1
        for fd in r:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
                os.close(fd)
                continue
            room = cap - len(bufs[out_r]) - len(bufs[err_r])
            if len(chunk) > room:
                bufs[fd] += chunk[: max(room, 0)]
                if not truncated:
                    truncated = True
                    if not killed:
                        kill()
                        killed = True
                        deadline = time.monotonic() + 1.0
            else:
                bufs[fd] += chunk
    for fd in open_fds:
        os.close(fd)
    if in_w >= 0:
        os.close(in_w)
    return bytes(bufs[out_r]), bytes(bufs[err_r]), timed_out, truncated, killed


PENDING: list[int] = []  # intermediates of earlier runs, reaped before the next fork


def run(req):
    while PENDING:
        os.waitpid(PENDING.pop(), 0)
    t0 = time.monotonic()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
    st_r, st_w = os.pipe()
    pid = _clone_newpid()
    if pid == 0:  # PID 1 of a fresh PID namespace
        try:
            for fd in (out_r, err_r, in_w, st_r, CTL_IN, CTL_OUT):
                os.close(fd)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            _child(req, (out_w, err_w, in_r), st_w)
        finally:
            os._exit(0)
    if pid < 0:  # no raw clone on this architecture: an intermediate process does unshare + fork
        pid = os.fork()
        if pid == 0:
            try:
                for fd in (out_r, err_r, in_w, st_r, CTL_IN, CTL_OUT):
                    os.close(fd)
                _check(libc.unshare(CLONE_NEWPID), "unshare(NEWPID)")
                b = os.fork()
                if b == 0:
                    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                    _child(req, (out_w, err_w, in_r), st_w)
                for fd in (out_w, err_w, in_r, st_w):
                    os.close(fd)
                os.waitpid(b, 0)
            except BaseException as e:
                os.write(st_w, struct.pack(">i", -2) + repr(e).encode()[:500])
            finally:
                os._exit(0)
    for fd in (out_w, err_w, in_r, st_w):
        os.close(fd)
    stdin = base64.b64decode(req["stdin"]) if req.get("stdin") else b""
    out, err, timed_out, truncated, killed = _collect(
        lambda: os.kill(pid, signal.SIGKILL), out_r, err_r, in_w, stdin, t0 + float(req["timeout_s"]),
        int(req["max_output_bytes"]))
    # The namespace's init reports the program's wait status as soon as the program exits, then
    # exits itself, which kills any leftovers. Answer right away; reap the intermediate later.
    deadline = t0 + float(req["timeout_s"]) + 1.0
    raw = b""
    while True:
        r, _, _ = select.select([st_r], [], [], max(0.0, deadline - time.monotonic()))
        if not r:  # the program closed its output but kept running past the deadline
            os.kill(pid, signal.SIGKILL)
            timed_out = killed = True
            deadline = time.monotonic() + 5.0
            continue
        chunk = os.read(st_r, 4096)
        if not chunk:
            break
        raw += chunk
        if len(raw) >= 4 and struct.unpack(">i", raw[:4])[0] != -2:
            break
    os.close(st_r)
    PENDING.append(pid)
    exit_code = None
    error = None
    if len(raw) >= 4:
        st = struct.unpack(">i", raw[:4])[0]
        if st == -2:
            error = raw[4:].decode(errors="replace")
        elif st >= 0:
            exit_code = os.waitstatus_to_exitcode(st)
    elif killed:
        exit_code = -signal.SIGKILL
    return {
        "stdout": out.decode("utf-8", errors="replace"),
        "stderr": err.decode("utf-8", errors="replace"),
        "exit_code": exit_code,
        "timed_out": timed_out,
        "truncated": truncated,
        "duration_s": time.monotonic() - t0,
        "error": error,
    }


CTL_IN = CTL_OUT = -1


# Imported once in the worker so each forked run finds them ready (runs still get pristine copies).
PRELOAD = ("typing", "math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string")


def main():
    global CTL_IN, CTL_OUT
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _drop_bounding_set()  # keeps this process's own capabilities (needed for namespaces and mounts)
    import gc

    gc.collect()
    gc.freeze()  # forked runs never scan (and so never copy-on-write) the worker's objects
    CTL_IN = os.dup(0)
    CTL_OUT = os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    _write_frame(CTL_OUT, {"ready": True, "pid": os.getpid()})
    while True:
        req = _read_frame(CTL_IN)
        if req is None:
            return
        try:
            resp = run(req)
        except BaseException as e:
            resp = {"error": f"{type(e).__name__}: {e}"}
        _write_frame(CTL_OUT, resp)


def _oom_kills():
    """The container cgroup's OOM-kill counter (cgroup v2 or v1), or -1 if unreadable."""
    for path, key in (("/sys/fs/cgroup/memory.events", "oom_kill"),
                      ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")):
        try:
            with open(path) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == key:
                        return int(v)
        except (OSError, ValueError):
            continue
    return -1


def boot(req):
    """Docker mode: one run inside a warm container, as the container's exec'd command.

    Runs the program in a fresh dir under /work (or the session dir), kills every other process
    in the container afterwards (``kill(-1)`` spares only PID 1 and us), and wipes /tmp.
    """
    t0 = time.monotonic()
    session_dir = req.get("workdir")
    workdir = session_dir or os.path.join("/work", "run-%d-%d" % (os.getpid(), int(t0 * 1e6)))
    os.makedirs(workdir, exist_ok=True)
    name = "main.sh" if req["language"] == "bash" else "main.py"
    files = dict(req.get("files") or {})
    if not _inline(req):
        files[name] = base64.b64encode(req["program"].encode()).decode()
    for rel, b64 in files.items():
        path = os.path.join(workdir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(b64))
    oom_before = _oom_kills()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.chdir(workdir)
            os.environ["HOME"] = workdir
            req = dict(req, program=req["program"])
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            _close_fds_from(3)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()
            _set_limits(req, 4)
            if _inline(req):
                os.execv("/bin/bash", ["bash", "-c", req["program"], "bash"])
            if req["language"] == "bash":
                os.execv("/bin/bash", ["bash", os.path.join(workdir, name)])
            if req.get("fresh_interpreter"):
                os.execv(sys.executable, [sys.executable, "-I", os.path.join(workdir, name)])
            _run_python_inline(req["program"], workdir)
        finally:
            os._exit(127)
    for fd in (out_w, err_w, in_r):
        os.close(fd)
    stdin = base64.b64decode(req["stdin"]) if req.get("stdin") else b""

    def kill():
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            os.kill(pid, signal.SIGKILL)

    state: dict = {"status": None, "t": 0.0}

    def kill_leftovers():
        for _ in range(20):  # every other process in the container (PID 1 and this one are spared)
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                break
            while True:
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        break
                except ChildProcessError:
                    break

    def poll():
        # once the program has exited, give its output 20 ms to drain, then kill what it left behind
        if state["status"] is None:
            p, st = os.waitpid(pid, os.WNOHANG)
            if p == 0:
                return False
            state["status"], state["t"] = st, time.monotonic()
            return False
        if time.monotonic() - state["t"] < 0.02:
            return False
        kill_leftovers()
        return True

    out, err, timed_out, truncated, killed = _collect(
        kill, out_r, err_r, in_w, stdin, t0 + float(req["timeout_s"]), int(req["max_output_bytes"]), poll)
    status = state["status"]
    if status is None:
        _, status = os.waitpid(pid, 0)
    kill_leftovers()
    oom = oom_before >= 0 and _oom_kills() > oom_before
    for root in ([] if session_dir else [workdir]) + ["/tmp"]:
        _wipe(root, keep_root=root == "/tmp")
    return {
        "stdout": out.decode("utf-8", errors="replace"),
        "stderr": err.decode("utf-8", errors="replace"),
        "exit_code": os.waitstatus_to_exitcode(status),
        "timed_out": timed_out,
        "truncated": truncated,
        "oom": oom,
        "duration_s": time.monotonic() - t0,
        "error": None,
    }


def _wipe(root, keep_root):
    import shutil

    if not keep_root:
        shutil.rmtree(root, ignore_errors=True)
        return
    try:
        names = os.listdir(root)
    except OSError:
        return
    for n in names:
        p = os.path.join(root, n)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(p)


def boot_main(chunks):
    req = json.loads(base64.b64decode("".join(chunks)))
    try:
        resp = boot(req)
    except BaseException as e:
        resp = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.write("\n@@AGENTGYM@@" + json.dumps(resp))
    sys.stdout.flush()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "boot":
        boot_main(sys.argv[2:])
    else:
        main()

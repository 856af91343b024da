"""Sandbox-side code (stdlib only): the warm bwrap worker, the docker bootstrap and the process
backend's supervisor, plus helpers the host also uses (seccomp filter, link-safe file writes).

Three entry points (``python3 -I -S _worker.py MODE``):

* *(no mode)* **warm bwrap worker**, inside bubblewrap. Protocol on fds 0/1 (moved away at
  start-up): frames of a 4-byte big-endian length + JSON. The worker answers ``{"ready": true}``
  once, then one response per request. The worker itself never reads a request: for each one it
  forks a *collector* that reads it, runs it and answers, so no program, stdin or output of one
  run is ever in the memory that later runs are forked from. Each run is PID 1 of a new PID
  namespace with its own mount and IPC namespaces and fresh size-capped tmpfs ``/work``, ``/tmp``
  and ``/dev/shm`` (a session's runs, ``"session": true``, keep the worker's own ``/work``, so its
  files persist, capped in total); the program runs in a grandchild with every capability dropped,
  ``no_new_privs`` and a seccomp filter. When the run's init exits the kernel kills whatever the
  program left running and the mounts and IPC objects vanish, so nothing survives a run.
* ``boot``: one docker run (see :func:`boot`); ``kill``: clean a container whose run hung.
* ``zygote``: the process backend's zygote, which forks a supervisor per run (see :func:`supervise`).
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
import stat
import struct
import sys
import time
import traceback
import types

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_SET_DUMPABLE, PR_SET_PDEATHSIG = 38, 24, 47, 4, 1
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_CHILD_SUBREAPER = 22, 2, 36
CLONE_NEWIPC, CLONE_NEWNET = 0x08000000, 0x40000000
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


# ------------------------------------------------------------------------------------ seccomp
# Classic BPF for seccomp: deny ptrace and cross-process memory access (and every syscall of a
# foreign ABI, such as int 0x80 on x86_64, through which they could be reached), allow the rest.
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_DENIED_SYSCALLS = {"x86_64": (101, 310, 311), "aarch64": (117, 270, 271)}  # ptrace, process_vm_{readv,writev}
_X32_SYSCALL_BIT = 0x40000000


def seccomp_program(machine=None):
    """The filter as raw ``struct sock_filter`` bytes (what ``bwrap --seccomp FD`` reads), or b"" if
    this architecture is not supported."""
    machine = machine or os.uname().machine
    arch = _AUDIT_ARCH.get(machine)
    if arch is None:
        return b""
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    denied = _DENIED_SYSCALLS[machine]
    checks = [(jge, _X32_SYSCALL_BIT)] if machine == "x86_64" else []
    checks += [(jeq, nr) for nr in denied]
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, deny), (ld_abs, 0, 0, 0)]
    n = len(checks)
    for i, (op, k) in enumerate(checks):
        prog.append((op, n - i, 0, k))  # jump over the remaining checks and the ALLOW to the DENY
    prog += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_SECCOMP: list = []  # [(buffer, struct sock_fprog)], built once (before the warm worker forks its runs)


def _seccomp_fprog():
    if not _SECCOMP:
        code = seccomp_program()
        buf = ctypes.create_string_buffer(code, max(len(code), 1))
        _SECCOMP.append((buf, _Fprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p)) if code else None))
    return _SECCOMP[0][1]


def install_seccomp():
    """Apply :func:`seccomp_program` to this process (needs ``no_new_privs`` or CAP_SYS_ADMIN)."""
    fprog = _seccomp_fprog()
    if fprog is None:
        return
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


# ------------------------------------------------------------------------------ safe writes
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _clear(name, dfd):
    """Remove whatever ``name`` is in ``dfd`` (a link, a file, a directory tree) without following links."""
    try:
        st = os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        import shutil

        shutil.rmtree("/proc/self/fd/%d/%s" % (dfd, name))  # rmtree never follows links inside
    else:
        os.unlink(name, dir_fd=dfd)


def write_files(root, files, owner=None):
    """Write ``{relative path: bytes}`` under the directory ``root`` without ever following a link.

    Each directory on the way is opened with ``O_NOFOLLOW`` (a symlink or file in the way is
    replaced by a real directory); an existing entry at a file's name is removed first and the file
    is created with ``O_EXCL | O_NOFOLLOW``, so a link (or a hard link) planted by an earlier run of
    a session can never redirect the write. ``owner``: chown what is created (by fd) to this uid.
    """
    rootfd = os.open(root, _DIR_FLAGS)
    try:
        for rel, data in files.items():
            parts = [p for p in str(rel).split("/") if p not in ("", ".")]
            if not parts or ".." in parts:
                raise ValueError("bad file path %r" % (rel,))
            dfd = os.dup(rootfd)
            try:
                for part in parts[:-1]:
                    try:
                        nfd = os.open(part, _DIR_FLAGS, dir_fd=dfd)
                    except FileNotFoundError:
                        nfd = -1
                    except OSError:  # ELOOP (a symlink) or ENOTDIR (a file): replace it
                        _clear(part, dfd)
                        nfd = -1
                    if nfd < 0:
                        os.mkdir(part, 0o755, dir_fd=dfd)
                        nfd = os.open(part, _DIR_FLAGS, dir_fd=dfd)
                        if owner is not None:
                            os.fchown(nfd, owner, owner)
                    os.close(dfd)
                    dfd = nfd
                _clear(parts[-1], dfd)
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                             dir_fd=dfd)
                try:
                    if owner is not None:
                        os.fchown(fd, owner, owner)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
            finally:
                os.close(dfd)
    finally:
        os.close(rootfd)


# -------------------------------------------------------------------------- process sweeping
def _ppids():
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                out[int(name)] = (int(fields[1]), fields[0])
            except (OSError, IndexError, ValueError):
                continue
    return out


def descendants(root_pid):
    """Live (non-zombie) descendants of ``root_pid``."""
    table = _ppids()
    kids: dict = {}
    for pid, (ppid, state) in table.items():
        kids.setdefault(ppid, []).append((pid, state))
    out, todo = [], [root_pid]
    while todo:
        for pid, state in kids.get(todo.pop(), ()):
            todo.append(pid)
            if state not in (b"Z", b"X"):
                out.append(pid)
    return out


def reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def sweep(wait_s=2.0):
    """SIGKILL every descendant of this process (a child subreaper) until none is left."""
    deadline = time.monotonic() + wait_s
    while True:
        found = descendants(os.getpid())
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        reap()
        if not found or time.monotonic() > deadline:
            return not found
        time.sleep(0.005)


def _drop_caps():
    libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(hdr, data), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _limit(which, soft, hard):
    cur = resource.getrlimit(which)[1]
    if cur != resource.RLIM_INFINITY:  # never try to raise a hard limit we were given
        soft, hard = min(soft, cur), min(hard, cur)
    resource.setrlimit(which, (soft, hard))


def _set_limits(req, base_procs):
    cpu = math.ceil(req["timeout_s"]) + 1
    _limit(resource.RLIMIT_CPU, cpu, cpu + 1)
    mem = int(req["memory_mb"]) * 1024 * 1024
    _limit(resource.RLIMIT_AS, mem, mem)
    nproc = int(req["nproc"]) + base_procs
    _limit(resource.RLIMIT_NPROC, nproc, nproc)
    fs = int(req["file_mb"]) * 1024 * 1024
    _limit(resource.RLIMIT_FSIZE, fs, fs)
    _limit(resource.RLIMIT_CORE, 0, 0)


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
    install_seccomp()
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
        _check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare(NEWNS|NEWIPC)")
        _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
        size = f"size={int(req['file_mb'])}m,mode=0755".encode()
        # a session's runs share the worker's own /work (a tmpfs of file_mb that lives as long as the worker)
        for mnt in (b"/tmp",) if req.get("session") else (b"/work", b"/tmp"):
            _check(libc.mount(b"tmpfs", mnt, b"tmpfs", MS_NOSUID | MS_NODEV, size), f"mount {mnt!r}")
        shm = f"size={int(req['file_mb'])}m,mode=1777".encode()
        _check(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, shm), "mount /dev/shm")
        _check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        name = "main.sh" if req["language"] == "bash" else "main.py"
        files = dict(req.get("files") or {})
        if not _inline(req):
            files[name] = base64.b64encode(req["program"].encode()).decode()
        write_files("/work", {rel: base64.b64decode(b64) for rel, b64 in files.items()})
        os.chdir("/work")
        pid = os.fork()
        if pid == 0:
            try:
                _grandchild(req, fds, 6)
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


PENDING: list[int] = []  # the run's namespace init, reaped once the answer is sent


def run(req):
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
    # exits itself, which kills any leftovers. Answer right away; the collector reaps it after.
    deadline = t0 + float(req["timeout_s"]) + 0.25
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
    _seccomp_fprog()
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
        select.select([CTL_IN], [], [])  # a request (or EOF) is waiting; a collector reads it, not us
        pid = os.fork()
        if pid == 0:
            os._exit(_collector())
        _, st = os.waitpid(pid, 0)
        if st != 0:  # the control pipe closed (host gone), or the stream is out of step: stop
            return


def _collector():
    """Read one request, run it, answer, wait for the run's namespace to go; returns an exit code."""
    try:
        req = _read_frame(CTL_IN)
        if req is None:
            return 3
        try:
            resp = run(req)
        except BaseException as e:
            resp = {"error": f"{type(e).__name__}: {e}"}
        _write_frame(CTL_OUT, resp)
        while PENDING:
            os.waitpid(PENDING.pop(), 0)
        return 0
    except BaseException:
        return 4


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

    Runs the program in a fresh dir under /work (or the session dir) until it exits or the
    deadline passes (whatever it does with its output), then kills every other process in the
    container (``kill(-1)`` spares only PID 1 and us) and wipes ``/tmp``, ``/dev/shm`` and System V
    IPC objects, so only a session's own directory outlives a run.
    """
    t0 = time.monotonic()
    deadline = t0 + float(req["timeout_s"])
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the program (same uid) may not reach our fds or memory
    session_dir = req.get("workdir")
    workdir = session_dir or os.path.join("/work", "run-%d-%d" % (os.getpid(), int(t0 * 1e6)))
    _ensure_dir(workdir)
    name = "main.sh" if req["language"] == "bash" else "main.py"
    files = dict(req.get("files") or {})
    if not _inline(req):
        files[name] = base64.b64encode(req["program"].encode()).decode()
    write_files(workdir, {rel: base64.b64decode(b64) for rel, b64 in files.items()})
    oom_before = _oom_kills()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            os.chdir(workdir)
            os.environ["HOME"] = workdir
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            _close_fds_from(3)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()
            _set_limits(req, 4)
            install_seccomp()
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
        _kill_all_others()
        return True

    out, err, timed_out, truncated, killed = _collect(
        kill, out_r, err_r, in_w, stdin, deadline, int(req["max_output_bytes"]), poll)
    status = state["status"]
    while status is None:  # the output is closed; the program may still run: wait for it, up to the deadline
        p, st = os.waitpid(pid, os.WNOHANG)
        if p:
            status = st
        elif time.monotonic() >= deadline:
            timed_out = True
            kill()
            _, status = os.waitpid(pid, 0)
        else:
            time.sleep(0.01)
    _kill_all_others()
    oom = oom_before >= 0 and _oom_kills() > oom_before
    for root in ([] if session_dir else [workdir]) + ["/tmp", "/dev/shm"]:
        _wipe(root, keep_root=root != workdir)
    _remove_sysv_ipc()
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


def _kill_all_others():
    """SIGKILL every process this one may signal, except itself and PID 1 (docker mode)."""
    for _ in range(50):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            break
        reap()
        time.sleep(0.001)
    reap()


def _ensure_dir(path):
    """``path`` as a real directory (a link or file an earlier run put there is replaced)."""
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            return
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.makedirs(path, exist_ok=True)


def _remove_sysv_ipc():
    """Remove every System V shared memory segment, semaphore set and message queue we can see
    (docker mode: the container has its own IPC namespace, and everything in it is ours)."""
    for table in ("shm", "sem", "msg"):
        try:
            with open("/proc/sysvipc/" + table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            parts = row.split()
            if len(parts) < 2 or not parts[1].isdigit():
                continue
            ipc_id = int(parts[1])
            if table == "sem":
                libc.semctl(ipc_id, 0, 0)  # IPC_RMID
            else:
                getattr(libc, table + "ctl")(ipc_id, 0, None)


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


def kill_all_main(wipe_work):
    """Docker mode, run by the host when a run hangs: kill every process of ours, wipe scratch space
    (and ``/work`` too for a pooled container, whose runs keep nothing)."""
    _kill_all_others()
    for root in ("/tmp", "/dev/shm") + (("/work",) if wipe_work else ()):
        _wipe(root, keep_root=True)
    _remove_sysv_ipc()
    sys.stdout.write("\n@@AGENTGYM@@{}")
    sys.stdout.flush()


# ------------------------------------------------------------------------------- process mode
MS_BIND = 4096


class _Stop(Exception):
    """The host asked (SIGUSR1) to end the run now."""


def _stop(*_args):
    raise _Stop


def zygote_main():
    """Process-backend mode: fork a :func:`supervise` per run (``_worker.py zygote SOCKET_FD``).

    Saves each run an interpreter start. A request on the Unix socket is one byte plus five file
    descriptors (request memfd, status pipe, and the program's stdin, stdout and stderr); the answer
    is the supervisor's pid (4 bytes) plus a pidfd for it, so the host can signal it without racing
    pid reuse. Exits when the socket closes.
    """
    import socket

    sock = socket.socket(fileno=int(sys.argv[2]))
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped as they exit
    _seccomp_fprog()
    gc_freeze()
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 16, 5)
        except OSError:
            return
        if not msg:
            return
        if len(fds) != 5:
            for fd in fds:
                os.close(fd)
            sock.sendall(struct.pack(">i", -1))
            continue
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                req_fd, status_fd, in_r, out_w, err_w = fds
                for target, fd in ((0, in_r), (1, out_w), (2, err_w)):
                    os.dup2(fd, target)
                for fd in (in_r, out_w, err_w):
                    os.close(fd)
                os.setsid()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                supervise(req_fd, status_fd)
            finally:
                os._exit(1)
        try:
            pidfd = [os.pidfd_open(pid)]
        except (AttributeError, OSError):
            pidfd = []
        for fd in fds:
            os.close(fd)
        socket.send_fds(sock, [struct.pack(">i", pid)], pidfd)
        for fd in pidfd:
            os.close(fd)


def gc_freeze():
    import gc

    gc.collect()
    gc.freeze()


def supervise(req_fd, status_fd):
    """Process-backend mode: the supervisor of one run (forked by :func:`zygote_main`).

    Runs as the host's user. As root it first gives the run its own network, IPC and mount
    namespaces with fresh size-capped tmpfs ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (the work dir is
    bound back at its path). It becomes a child subreaper, forks the program (which drops to the
    run's uid, writes its files itself, sets rlimits, ``no_new_privs`` and the seccomp filter, then
    execs), waits for it, and then kills every process the program left behind: they are all its
    descendants, so none escapes. Status records on STATUS_FD: ``P`` + pid, then ``S`` + wait status
    + ``C`` (nothing left) or ``D``; ``E`` + message if the run could not be set up. SIGUSR1 ends the run.
    """
    with os.fdopen(req_fd, "rb") as f:
        req = json.loads(f.read())
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the program may not read our memory or reach our fds
    try:
        if req.get("namespaces"):
            _isolate(req)
        _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "PR_SET_CHILD_SUBREAPER")
    except BaseException as e:
        os.write(status_fd, b"E" + ("%s: %s" % (type(e).__name__, e)).encode()[:500])
        os._exit(1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = -1
    status = None
    try:
        signal.signal(signal.SIGUSR1, _stop)
        pid = os.fork()
        if pid == 0:
            try:
                _program(req, status_fd)
            finally:
                os._exit(127)
        os.write(status_fd, b"P" + struct.pack(">i", pid))
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)  # only the program holds the pipes: they close when it is done
        os.close(null)
        while status is None:
            p, st = os.waitpid(-1, 0)  # we are a subreaper: reap orphans as they come
            if p == pid:
                status = st
    except _Stop:
        status = None
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if status is None and pid > 0:  # never kill(-1): that would be every process we may signal
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            status = os.waitpid(pid, 0)[1]
    clean = sweep()
    os.write(status_fd, b"S" + struct.pack(">i", -1 if status is None else status) + (b"C" if clean else b"D"))
    os._exit(0)


def _isolate(req):
    """Root only: fresh network, IPC and mount namespaces, private size-capped scratch dirs."""
    _check(libc.unshare(CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS), "unshare(NET|IPC|NS)")
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    workdir = req["workdir"]
    wfd = os.open(workdir, _DIR_FLAGS)
    size = ("size=%dm,mode=1777" % int(req["file_mb"])).encode()
    for mnt in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(mnt) and not os.path.islink(mnt):
            _check(libc.mount(b"tmpfs", mnt.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, size), "mount " + mnt)
    if not os.path.isdir(workdir):  # the work dir was under one of them: bind it back at its path
        os.makedirs(workdir, 0o711)
        _check(libc.mount(("/proc/self/fd/%d" % wfd).encode(), workdir.encode(), None, MS_BIND, None),
               "bind the work dir")
    os.close(wfd)


def _program(req, status_fd):
    """The forked program: drop privileges, write its files, limit itself, exec."""
    os.close(status_fd)
    os.setsid()
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    uid = req.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    workdir = req["workdir"]
    name = "main.sh" if req["language"] == "bash" else "main.py"
    files = {rel: base64.b64decode(b64) for rel, b64 in (req.get("files") or {}).items()}
    if not _inline(req):
        files[name] = req["program"].encode()
    try:
        write_files(workdir, files)  # as the run's uid, and never through a link
        os.chdir(workdir)
    except OSError as e:
        os.write(2, ("sandbox: could not write the program's files: %s\n" % e).encode())
        os._exit(126)
    _set_limits(req, 0)
    install_seccomp()
    _close_fds_from(3)
    env = dict(req["env"])
    if _inline(req):
        argv = ["/bin/bash", "-c", req["program"], "bash"]
    elif req["language"] == "bash":
        argv = ["/bin/bash", name]
    else:
        argv = [req["python"], "-I", name]
    os.execve(argv[0], argv, env)


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
    elif len(sys.argv) > 1 and sys.argv[1] == "kill":
        kill_all_main(sys.argv[2:] == ["work"])
    elif len(sys.argv) > 1 and sys.argv[1] == "zygote":
        zygote_main()
    else:
        main()

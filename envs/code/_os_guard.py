"""The OS-v0 guard: runs inside a short-lived helper container, never on the host, never imported.

The helper is started from the clean OS-v0 image (read-only root), shares the task container's
PID namespace, and holds ``CAP_SYS_ADMIN`` / ``CAP_SYS_PTRACE`` that the task container lacks.
It enters the task container's mount namespace (``/proc/1/ns/mnt``) and acts there. Two commands:

``setup SIZE``
    Before the agent's first command: stacks an overlay on the container's root whose upper
    layer is a tmpfs of ``SIZE`` bytes, so everything the agent (and the task's init scripts)
    write is capped in total and never reaches the host's disk. The container's own root stays
    read-only and pristine underneath; PID 1 (a non-dumpable sleeper) keeps it as its root, so
    ``/proc/1/root`` reaches it from a helper and from nothing the agent runs.

``seal``
    After the agent's last command, before the check scripts: kills every process but PID 1,
    then makes the view the checks run in: ``/bin /sbin /lib /lib64`` restored to the image's
    links; ``/usr`` read-only, every file of the image as the image has it, plus only the
    agent's additions a check may legitimately call or read (new files directly in ``/usr``,
    ``/usr/local`` but its Python packages, new commands in ``/usr/bin``/``/usr/sbin`` whose
    names the image does not use); the loader's, NSS's, PAM's and Python's configuration in
    ``/etc`` pinned read-only to the image's; ``/`` read-only so links at the top cannot be
    replaced while checks run; every other directory the agent's, writable.

It prints one JSON line (``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``). Everything it
imports is imported before it enters the task container's namespace, and the import system is
disabled after that, so no file the agent wrote is ever loaded into this privileged process.
"""

import ctypes
import json
import os
import shutil
import signal
import stat
import sys
import time

LIBC = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = 1, 2, 4, 32, 4096, 8192, 16384
CLONE_NEWNS = 0x00020000
PRISTINE = "/proc/1/root"  # PID 1's root: the image, read-only, under the overlay the agent sees
HIDDEN = "/mnt"  # on the pristine root: the tmpfs holding the overlay's upper layer (covered for the agent)
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib64")
KEEP_TOP = ("usr", "etc", "proc", "sys", "dev", *SYSTEM_LINKS)
ETC_FILE_PINS = ("ld.so.preload", "ld.so.cache", "ld.so.conf", "nsswitch.conf", "environment", "sudo.conf",
                 "pam.conf", "host.conf", "gai.conf")
ETC_DIR_PINS = ("ld.so.conf.d", "alternatives", "pam.d", "security", "python3", "python3.11")
DEADLINE_S = 30.0


class GuardError(Exception):
    """A step of the guard failed; the message says which."""


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise GuardError(f"{what}: {os.strerror(err)}")


def mount(src: str | None, tgt: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(LIBC.mount(src.encode() if src else None, tgt.encode(), fstype.encode() if fstype else None,
                      ctypes.c_ulong(flags), data.encode() if data else None), f"mount {tgt}")


def bind_ro(src: str, tgt: str) -> None:
    mount(src, tgt, None, MS_BIND)
    mount(None, tgt, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def enter_task_namespace() -> None:
    fd = os.open("/proc/1/ns/mnt", os.O_RDONLY)
    _check(LIBC.setns(fd, CLONE_NEWNS), "setns")
    os.close(fd)
    os.chdir("/")
    # from here on every path is the task container's: never import anything again
    sys.path[:] = []
    sys.meta_path[:] = []
    sys.path_hooks[:] = []


def remove_any(path: str) -> None:
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def lexists(path: str) -> bool:
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def unescape(field: str) -> str:
    """A mountinfo path: octal escapes (``\\040`` for a space) decoded."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


# ------------------------------------------------------------------------------------ setup
def setup(size: int) -> dict[str, object]:
    enter_task_namespace()
    mount("tmpfs", HIDDEN, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=0700")
    for d in ("upper", "work", "root"):
        os.mkdir(f"{HIDDEN}/{d}", 0o755)
    mount("overlay", f"{HIDDEN}/root", "overlay", 0, f"lowerdir=/,upperdir={HIDDEN}/upper,workdir={HIDDEN}/work")
    with open("/proc/self/mountinfo", "rb") as f:
        rows = [line.split() for line in f.read().decode().splitlines()]
    root_ids = [r[0] for r in rows if r[4] == "/"]
    moved = []
    for r in rows:
        if r[1] in root_ids and r[4] not in ("/", HIDDEN) and not r[4].startswith(HIDDEN + "/"):
            point = unescape(r[4])
            mount(point, f"{HIDDEN}/root{point}", None, MS_MOVE)
            moved.append(point)
    mount(f"{HIDDEN}/root", "/", None, MS_MOVE)
    return {"moved": moved}


# ------------------------------------------------------------------------------------ seal
def kill_all(deadline: float) -> int:
    """SIGKILL every process in the PID namespace but PID 1 and this one, until none is left."""
    me = os.getpid()
    killed = 0
    while True:
        alive = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in (1, me):
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except OSError:
                continue
            if state in (b"Z", b"X"):
                continue  # dead; PID 1 reaps it
            alive.append(int(name))
        if not alive:
            return killed
        if time.monotonic() > deadline:
            raise GuardError(f"{len(alive)} process(es) did not die")
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def repair_links() -> None:
    for name in SYSTEM_LINKS:
        want = os.readlink(f"{PRISTINE}/{name}")
        path = "/" + name
        if os.path.islink(path) and os.readlink(path) == want:
            continue
        if lexists(path):
            remove_any(path)
        os.symlink(want, path)


def ensure_dir(path: str, mode: int = 0o755) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        return
    if lexists(path):
        remove_any(path)
    os.mkdir(path, mode)


def ensure_file(path: str) -> None:
    if os.path.isfile(path) and not os.path.islink(path):
        return
    if lexists(path):
        remove_any(path)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))


def _allowed_child(rel: tuple[str, ...], is_dir: bool, image_top: set[str], image_cmds: set[str]) -> bool:
    """Whether the agent's ``/usr/<rel>`` is shown to the checks (see the module docstring)."""
    top = rel[0]
    if len(rel) == 1:
        if not is_dir:
            return True  # a file of the agent's (or an init script's) directly in /usr
        return top in ("local", "bin", "sbin") or top not in image_top
    if top == "local":
        return not (len(rel) >= 3 and rel[1] == "lib" and rel[2].startswith("python"))
    if top in ("bin", "sbin"):
        return len(rel) > 2 or rel[1] not in image_cmds
    return top not in image_top


def filtered_usr(src: str, dst: str, deadline: float) -> int:
    """Hard-link the agent's allowed additions to ``/usr`` (its overlay upper, ``src``) into ``dst``."""
    image_top = set(os.listdir(f"{PRISTINE}/usr"))
    image_cmds = set()
    for d in ("bin", "sbin", "local/bin", "local/sbin"):
        if os.path.isdir(f"{PRISTINE}/usr/{d}"):
            image_cmds.update(os.listdir(f"{PRISTINE}/usr/{d}"))
    count = 0
    stack: list[tuple[str, str, tuple[str, ...]]] = [(src, dst, ())]
    os.mkdir(dst, 0o755)
    while stack:
        s, t, rel = stack.pop()
        with os.scandir(s) as it:
            entries = list(it)
        for e in entries:
            if time.monotonic() > deadline:
                raise GuardError("too many files under /usr to build the checker's view in time")
            r = (*rel, e.name)
            st = e.stat(follow_symlinks=False)
            is_dir = stat.S_ISDIR(st.st_mode)
            if not _allowed_child(r, is_dir, image_top, image_cmds):
                continue
            target = f"{t}/{e.name}"
            if is_dir:
                os.mkdir(target, 0o700)
                stack.append((e.path, target, r))
                os.chown(target, st.st_uid, st.st_gid)
                os.chmod(target, stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode):
                os.link(e.path, target, follow_symlinks=False)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(e.path), target)
                os.lchown(target, st.st_uid, st.st_gid)
            elif stat.S_ISFIFO(st.st_mode):
                os.mkfifo(target, stat.S_IMODE(st.st_mode))
            else:
                continue  # whiteouts, sockets, devices: nothing a check reads
            count += 1
    return count


def seal() -> dict[str, object]:
    deadline = time.monotonic() + DEADLINE_S
    killed = kill_all(deadline)
    enter_task_namespace()
    repair_links()
    # /usr: the image's, plus the agent's allowed additions; read-only
    view = f"{PRISTINE}{HIDDEN}/checkview"
    if lexists(view):
        remove_any(view)
    os.mkdir(view, 0o700)
    pins = f"{view}/pins"
    os.mkdir(pins, 0o755)
    os.mkdir(f"{pins}/empty-dir", 0o755)
    os.close(os.open(f"{pins}/empty-file", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    upper_usr = f"{PRISTINE}{HIDDEN}/upper/usr"
    added = 0
    ensure_dir("/usr")
    if os.path.isdir(upper_usr) and not os.path.islink(upper_usr):
        added = filtered_usr(upper_usr, f"{view}/usr", deadline)
    if added:
        mount("overlay", "/usr", "overlay", MS_RDONLY | MS_NODEV,
              f"lowerdir={PRISTINE}/usr:{view}/usr")
    else:
        bind_ro(f"{PRISTINE}/usr", "/usr")
    # /etc: the agent's, with the files and directories that load code pinned to the image's
    ensure_dir("/etc")
    mount("/etc", "/etc", None, MS_BIND)  # a mount point now: it cannot be renamed away while checks run
    for names, is_kind, ensure, empty in ((ETC_FILE_PINS, os.path.isfile, ensure_file, "empty-file"),
                                          (ETC_DIR_PINS, os.path.isdir, ensure_dir, "empty-dir")):
        for name in names:
            src = f"{PRISTINE}/etc/{name}"
            if not (is_kind(src) and not os.path.islink(src)):
                src = f"{pins}/{empty}"  # the image has none: pinned empty, so the agent cannot add one
            ensure(f"/etc/{name}")
            bind_ro(src, f"/etc/{name}")
    # every other top-level directory stays writable; the top level itself becomes read-only
    for name in sorted(os.listdir("/")):
        path = "/" + name
        if name in KEEP_TOP or os.path.islink(path) or not os.path.isdir(path) or os.path.ismount(path):
            continue
        mount(path, path, None, MS_BIND | MS_REC)
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    return {"killed": killed, "usr_additions": added}


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["setup"] and len(argv) == 2:
            out = setup(int(argv[1]))
        elif argv == ["seal"]:
            out = seal()
        else:
            raise GuardError(f"usage: setup SIZE | seal (got {argv!r})")
        out["ok"] = True
    except Exception as e:  # a separate process: every failure becomes its JSON answer
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    os.write(1, (json.dumps(out) + "\n").encode())
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))

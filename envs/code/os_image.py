"""The local image ``agentgym/OS-v0`` runs its tasks in, built offline from the host's own binaries.

AgentBench runs each OS task in an Ubuntu container as root. Without a registry, this module
builds an equivalent Debian-style root filesystem from the host's installed Debian packages
(``dpkg -L``): bash, coreutils, findutils, grep, sed, awk, procps, psmisc, util-linux (``su``),
passwd (``useradd``, ``usermod``, ``groupadd``, ``chpasswd``), adduser, libc-bin (``getent``),
tar/gzip/bzip2/xz/zip/unzip, diffutils, file, less, bc, curl/wget, python3 and perl-base, plus the
shared libraries their programs load (``ldd``) and PAM's modules. ``/etc`` is written fresh:
Debian's default accounts and groups (``base-passwd``), shadow files with locked passwords,
``nsswitch.conf``, ``login.defs``, ``default/useradd``, ``skel``, PAM's configuration. Nothing of
the host's own accounts or secrets goes in.

The image is imported with ``docker import`` (no registry, no network) and tagged
``agentgym-os:<hash of the host's package database>``, so it is built once (about 10 s) and
rebuilt only when the host's packages change. ``scripts/os-image.sh`` builds it ahead of time.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentgym.errors import DependencyNotInstalled, SandboxUnavailable

__all__ = ["IMAGE_REPO", "PACKAGES", "build_os_image", "default_tag", "ensure_os_image", "image_files"]

log = logging.getLogger(__name__)
IMAGE_REPO = "agentgym-os"
BUILDER_VERSION = "1"
PACKAGES: tuple[str, ...] = (
    "base-files", "bash", "dash", "coreutils", "findutils", "grep", "sed", "gawk", "mawk", "diffutils", "tar", "gzip",
    "bzip2", "xz-utils", "zip", "unzip", "file", "libmagic-mgc", "procps", "psmisc", "passwd", "login",
    "util-linux", "libc-bin", "libc6", "debianutils", "hostname", "sensible-utils", "ncurses-bin", "ncurses-base",
    "less", "tree", "bc", "vim-tiny", "nano", "curl", "wget", "python3-minimal", "python3.11-minimal",
    "libpython3.11-minimal", "libpython3.11-stdlib", "python3", "perl-base", "adduser", "libpam-modules",
    "libpam-modules-bin", "libpam-runtime", "sudo", "cron", "iproute2", "iputils-ping", "net-tools",
)
_SKIP_PREFIXES = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/",
                  "/usr/share/lintian/", "/usr/share/bug/", "/usr/lib/python3.11/test/",
                  "/usr/lib/python3.11/idlelib/", "/usr/lib/python3.11/tkinter/", "/usr/lib/python3.11/ensurepip/")
_MERGED_USR = {"/bin": "usr/bin", "/sbin": "usr/sbin", "/lib": "usr/lib", "/lib64": "usr/lib64"}
_ETC_COPY = ("/etc/login.defs", "/etc/default/useradd", "/etc/adduser.conf", "/etc/profile", "/etc/bash.bashrc",
             "/etc/shells", "/etc/environment", "/etc/debian_version", "/etc/os-release", "/etc/issue",
             "/etc/inputrc", "/etc/ld.so.conf", "/etc/securetty", "/etc/mime.types", "/etc/magic", "/etc/wgetrc")
_ETC_TREES = ("/etc/skel", "/etc/pam.d", "/etc/security", "/etc/profile.d", "/etc/ld.so.conf.d", "/etc/alternatives")
NSSWITCH = """passwd:         files
group:          files
shadow:         files
gshadow:        files
hosts:          files dns
networks:       files
protocols:      files
services:       files
ethers:         files
rpc:            files
"""


def _installed(pkg: str) -> bool:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True, check=False)
    return r.returncode == 0 and "install ok installed" in r.stdout


def _real(path: str) -> str:
    """``path`` with its directories resolved (``/bin/ls`` -> ``/usr/bin/ls``), the last part kept."""
    d, base = os.path.split(path)
    return os.path.join(os.path.realpath(d), base)


def _package_files(pkg: str) -> list[str]:
    r = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True, check=False)
    out = []
    for line in r.stdout.splitlines():
        if not line.startswith("/") or line.startswith(_SKIP_PREFIXES):
            continue
        p = _real(line)
        if p.startswith(_SKIP_PREFIXES) or p.startswith(("/etc/", "/var/", "/run/", "/home/", "/root/", "/tmp/")):
            continue  # /etc is written fresh; state directories are created empty
        if os.path.lexists(p) and not os.path.isdir(p):
            out.append(p)
    return out


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _shared_libs(paths: Iterable[str]) -> set[str]:
    """The shared libraries (and loader) the ELF files among ``paths`` need, by ``ldd``."""
    elfs = [p for p in paths if not os.path.islink(p) and _is_elf(p)]
    libs: set[str] = set()
    for i in range(0, len(elfs), 200):
        r = subprocess.run(["ldd", *elfs[i:i + 200]], capture_output=True, text=True, check=False)
        for line in r.stdout.splitlines():
            parts = line.strip().split()
            for tok in parts:
                if tok.startswith("/") and not tok.endswith(":") and os.path.exists(tok):
                    libs.add(tok)
    return libs


def _with_link_targets(paths: set[str]) -> set[str]:
    """Add every file a symlink in ``paths`` leads to (chains included)."""
    out = set(paths)
    todo = list(paths)
    while todo:
        p = todo.pop()
        if os.path.islink(p):
            target = os.readlink(p)
            t = _real(target if target.startswith("/") else os.path.join(os.path.dirname(p), target))
            if t not in out and os.path.lexists(t) and not os.path.isdir(t):
                out.add(t)
                todo.append(t)
        for alias in (_real(p), os.path.realpath(p)):
            if alias not in out and os.path.lexists(alias) and not os.path.isdir(alias):
                out.add(alias)
                todo.append(alias)
    return out


def image_files(packages: Iterable[str] = PACKAGES) -> tuple[list[str], list[str]]:
    """``(files, missing packages)``: every host file the image holds (``/etc`` aside), sorted."""
    if shutil.which("dpkg") is None or shutil.which("ldd") is None:
        raise DependencyNotInstalled("agentgym/OS-v0's image", "dpkg and ldd (a Debian-based host)",
                                     "(the image is built from the host's Debian packages)")
    files: set[str] = set()
    missing = []
    for pkg in packages:
        if not _installed(pkg):
            missing.append(pkg)
            continue
        files.update(_package_files(pkg))
    pam = Path("/usr/lib/x86_64-linux-gnu/security")  # PAM modules are loaded with dlopen, not ldd-visible
    if pam.is_dir():
        files.update(str(p) for p in pam.iterdir() if p.is_file())
    files = _with_link_targets(files)
    files |= _with_link_targets(_shared_libs(files))
    alternatives = Path("/etc/alternatives")
    if alternatives.is_dir():  # /usr/bin/awk -> /etc/alternatives/awk -> /usr/bin/mawk
        for link in alternatives.iterdir():
            tgt = os.path.realpath(link)
            if tgt in files:
                for d in ("/usr/bin", "/usr/sbin"):
                    cand = os.path.join(d, link.name)
                    if os.path.islink(cand) and os.readlink(cand) == str(link):
                        files.add(cand)
    return sorted(files), missing


def _add_file(tar: tarfile.TarFile, path: str, arcname: str | None = None) -> None:
    info = tar.gettarinfo(path, arcname=(arcname or path).lstrip("/"))
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    if info.isreg():
        with open(path, "rb") as f:
            tar.addfile(info, f)
    else:
        tar.addfile(info)


def _add_text(tar: tarfile.TarFile, path: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    info = tarfile.TarInfo(path.lstrip("/"))
    info.size, info.mode, info.mtime = len(data), mode, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, path: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
    tar.addfile(info)


def _accounts() -> dict[str, str]:
    """``/etc/passwd``, ``group``, ``shadow``, ``gshadow`` from Debian's defaults, passwords locked."""
    base = Path("/usr/share/base-passwd")
    if (base / "passwd.master").exists():
        pw = [ln.split(":") for ln in (base / "passwd.master").read_text().splitlines() if ln]
        gr = [ln.split(":") for ln in (base / "group.master").read_text().splitlines() if ln]
    else:  # the minimum useradd, su and getent need
        pw = [["root", "*", "0", "0", "root", "/root", "/bin/bash"],
              ["nobody", "*", "65534", "65534", "nobody", "/nonexistent", "/usr/sbin/nologin"]]
        gr = [["root", "*", "0", ""], ["sudo", "*", "27", ""], ["users", "*", "100", ""], ["nogroup", "*", "65534", ""]]
    days = int(time.time() // 86400)
    return {
        "/etc/passwd": "".join(":".join([p[0], "x", *p[2:]]) + "\n" for p in pw),
        "/etc/group": "".join(":".join([g[0], "x", *g[2:]]) + "\n" for g in gr),
        "/etc/shadow": "".join(f"{p[0]}:*:{days}:0:99999:7:::\n" for p in pw),
        "/etc/gshadow": "".join(f"{g[0]}:*::{g[3] if len(g) > 3 else ''}\n" for g in gr),
    }


class _UniqueTar(tarfile.TarFile):
    """A tar writer that keeps the first entry of a path (docker import refuses duplicates)."""

    def addfile(self, tarinfo: tarfile.TarInfo, fileobj: Any = None, **kwargs: Any) -> None:
        seen: set[str] = self.__dict__.setdefault("_agentgym_seen", set())
        name = tarinfo.name.rstrip("/")
        if name in seen:
            return
        seen.add(name)
        super().addfile(tarinfo, fileobj, **kwargs)


def build_rootfs_tar(out: str | Path, files: list[str]) -> None:
    """Write the image's root filesystem as a tar archive."""
    with _UniqueTar.open(out, "w") as tar:
        for d, mode in (("/usr", 0o755), ("/usr/bin", 0o755), ("/usr/sbin", 0o755), ("/usr/lib", 0o755),
                        ("/usr/lib64", 0o755), ("/usr/local", 0o755), ("/usr/local/bin", 0o755),
                        ("/usr/local/sbin", 0o755), ("/etc", 0o755), ("/etc/default", 0o755), ("/root", 0o700),
                        ("/home", 0o755), ("/tmp", 0o1777), ("/var", 0o755), ("/var/tmp", 0o1777),
                        ("/var/log", 0o755), ("/var/mail", 0o2775), ("/var/spool", 0o755), ("/var/lib", 0o755),
                        ("/run", 0o755), ("/opt", 0o755), ("/srv", 0o755), ("/mnt", 0o755), ("/media", 0o755),
                        ("/proc", 0o555), ("/sys", 0o555), ("/dev", 0o755)):
            _add_dir(tar, d, mode)
        for link, target in _MERGED_USR.items():
            info = tarfile.TarInfo(link.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        dirs_done = {"usr", "usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc"}
        for f in files:
            parts = f.lstrip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs_done:
                    dirs_done.add(d)
                    src = "/" + d
                    _add_dir(tar, d, stat.S_IMODE(os.stat(src).st_mode) if os.path.isdir(src) else 0o755)
            _add_file(tar, f)
        for f in _ETC_COPY:
            if os.path.isfile(f):
                _add_file(tar, os.path.realpath(f), f)
        for tree in _ETC_TREES:
            if not os.path.isdir(tree):
                continue
            for root, dirnames, filenames in os.walk(tree):
                _add_dir(tar, root, stat.S_IMODE(os.stat(root).st_mode))
                for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(root, d))]:
                    p = os.path.join(root, name)
                    if os.path.islink(p) or os.path.isfile(p):
                        _add_file(tar, p)
        for path, text in _accounts().items():
            _add_text(tar, path, text, 0o640 if "shadow" in path else 0o644)
        _add_text(tar, "/etc/nsswitch.conf", NSSWITCH)
        _add_text(tar, "/etc/hostname", "agentgym-os\n")
        for name in (".bashrc", ".profile"):
            if os.path.isfile(f"/etc/skel/{name}"):
                _add_file(tar, f"/etc/skel/{name}", f"/root/{name}")


def default_tag() -> str:
    """``agentgym-os:<hash>`` of this builder and the host's package database: a new tag (so a new
    image) whenever an installed package changes."""
    h = hashlib.sha1(f"{BUILDER_VERSION}\0{','.join(PACKAGES)}\0".encode())
    status = Path("/var/lib/dpkg/status")
    if status.exists():
        h.update(status.read_bytes())
    return f"{IMAGE_REPO}:{h.hexdigest()[:12]}"


def build_os_image(client: Any, tag: str | None = None) -> str:
    """Build (``docker import``) the image and return its tag; reuses it if that tag exists."""
    import docker.errors

    tag = tag or default_tag()
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    files, missing = image_files()
    if missing:
        log.info("agentgym/OS-v0 image: host packages not installed, left out: %s", ", ".join(missing))
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="agentgym-os-") as tmp:
        archive = os.path.join(tmp, "rootfs.tar")
        build_rootfs_tar(archive, files)
        repo, _, ver = tag.partition(":")
        changes = ['ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', "ENV LANG=C.UTF-8",
                   "ENV HOME=/root", "WORKDIR /root", 'CMD ["/usr/bin/sleep", "infinity"]']
        try:
            client.api.import_image_from_file(archive, repository=repo, tag=ver or "latest", changes=changes)
        except Exception as e:
            raise SandboxUnavailable(f"could not import the OS-v0 image {tag}: {e}") from e
    log.info("built %s from %d host files in %.1f s", tag, len(files), time.monotonic() - t0)
    return tag


def ensure_os_image(client: Any, tag: str | None = None) -> str:
    """The tag of the OS-v0 image, building it first if needed."""
    return build_os_image(client, tag)


if __name__ == "__main__":  # python -m agentgym.envs.code.os_image: build the image, print its tag
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from .os_shell import docker_client

    print(ensure_os_image(docker_client()))

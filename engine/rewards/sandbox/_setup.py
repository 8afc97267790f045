"""First stage inside the sandbox's namespaces (the `namespaces` backend), still holding the
capabilities `unshare` gave it: build the candidate's view on a fresh tmpfs, `pivot_root` into
it, then exec the privilege drop (`setpriv ... -- python -I -B /runner.py`).

Usage: python -I -B _setup.py SPEC_JSON -- COMMAND...
Standard library only. Mount calls go straight to mount(2) through ctypes: no shell, so no quoting
of odd paths, and no extra processes. Any failure exits non-zero before the candidate exists.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import platform
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
MNT_DETACH = 2
# A user namespace may not clear these on a mount it inherited, so a remount must keep them.
KEPT_FLAGS = {
    "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME,
}
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        path = path.replace(code, chr(int(code[1:], 8)))
    return path


def _kept_flags(target: str) -> int:
    """The flags a read-only remount of the mount at `target` must keep (the last mount there)."""
    flags = 0
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if _unescape(fields[4]) == target:
                flags = sum(KEPT_FLAGS.get(opt, 0) for opt in fields[5].split(","))
    return flags


def _bind_read_only(source: str, target: str, extra: int = MS_NOSUID | MS_NODEV) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()  # noqa: SIM115 - a mount point, closed at once
    _mount(source, target, None, MS_BIND)
    _mount(None, target, None,
           MS_REMOUNT | MS_BIND | MS_RDONLY | extra | _kept_flags(target))


def _inside(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _pivot_root(root: str) -> None:
    """Make `root` the file system root and detach the old one entirely."""
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"pivot_root: unknown system call number on {platform.machine()}")
    os.chdir(root)
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


def build(spec: dict) -> None:  # type: ignore[type-arg]
    root = spec["newroot"]
    _mount("conductor-root", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for source, dest in spec["binds"]:
        _bind_read_only(source, _inside(root, dest))
    for target, dest in spec["symlinks"]:
        os.symlink(target, _inside(root, dest))
    dev = _inside(root, "/dev")
    os.makedirs(dev)
    _mount("conductor-dev", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in spec["devices"]:
        _bind_read_only(f"/dev/{name}", os.path.join(dev, name), extra=MS_NOSUID | MS_NOEXEC)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join(dev, name))
    _mount(None, dev, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    proc = _inside(root, "/proc")
    os.makedirs(proc)
    _mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    sandbox = _inside(root, spec["sandbox"])
    os.makedirs(sandbox)
    uid, gid = spec["owner"]
    _mount("conductor-sandbox", sandbox, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={int(spec['scratch_mb'])}m,mode=0700,uid={int(uid)},gid={int(gid)}")
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _pivot_root(root)
    os.chdir(spec["sandbox"])


def main() -> None:
    spec = json.loads(sys.argv[1])
    command = sys.argv[sys.argv.index("--") + 1:]
    build(spec)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()

"""First stage inside the sandbox's namespaces, still holding the capabilities `unshare` gave it:
mount a size-limited tmpfs on the scratch directory, make every other mount read-only, then drop
every capability (`setpriv`) and exec the runner.

Usage: python -I _sandbox_setup.py SCRATCH SIZE_MB SETPRIV -- COMMAND...
Executed by path with `python -I`; standard library only. Mount calls go straight to mount(2)
through ctypes: no shell, so no quoting of odd mount points, and no extra processes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
# A user namespace may not clear these on a mount it inherited, so a remount must keep them.
KEPT_FLAGS = {
    "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME,
}

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    if _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)):
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        path = path.replace(code, chr(int(code[1:], 8)))
    return path


def _mounts() -> list[tuple[str, int]]:
    """Each mount point with the flags a read-only remount of it must keep."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            options = fields[5].split(",")
            flags = sum(KEPT_FLAGS.get(opt, 0) for opt in options)
            found.append((_unescape(fields[4]), flags))
    return found


def main() -> None:
    scratch, size_mb, setpriv = sys.argv[1], sys.argv[2], sys.argv[3]
    command = sys.argv[sys.argv.index("--") + 1:]
    _mount("conductor-scratch", scratch, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={int(size_mb)}m,mode=0700")
    for target, flags in _mounts():
        if target != scratch:
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, None)
    os.chdir(scratch)
    os.execv(setpriv, [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs",
                       "--", *command])


if __name__ == "__main__":
    main()

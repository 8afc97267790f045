"""What the candidate sees, and the command lines that build it.

One view, two builders. The candidate's file system is a read-only tmpfs holding only:
- `/usr` (and the host's `/bin`, `/lib`, ... as the same symlinks or read-only binds),
  `/etc/ld.so.cache`, and the Python runtime (`sys.base_prefix`) read-only, at their own paths;
- a minimal `/dev` (null, zero, full, random, urandom), a fresh `/proc` of its own PID namespace;
- `/sandbox`, its working directory and `$HOME`: a size-limited tmpfs, nosuid and nodev.
Not `$HOME`, not the data directory, not `/tmp`, not `/run`: no host Unix socket is reachable by
path, and the network namespace (no device but a loopback that is down) hides abstract ones.
Every process the candidate starts inherits all of it: namespaces, mounts, limits, uid, and the
seccomp filter the runner loads. The runner itself goes in as `python -c SOURCE`, not a bind of
its file: nothing in the sandbox's mount table names a host path it does not also see at that
path, and a cgroup namespace shows the run's cgroups as `/`.

- `bwrap` (bubblewrap, Flatpak's maintained sandbox tool) when the worker is not root and
  bubblewrap is installed: it builds the view itself, inside a user namespace.
- `namespaces`: `unshare` and our own setup stage (`_setup.py`), which mounts the view and
  `pivot_root`s into it, then `setpriv` drops every capability and sets no_new_privs. A root
  worker always takes this path: it mounts as real root and then becomes the sandbox uid
  (65534 by default), an unprivileged uid on the host. bubblewrap cannot do that for root
  (Debian's is not setuid: run as root it maps the sandbox to host uid 0, and run as the sandbox
  uid it cannot reach a Python runtime installed in a private home).
- `unconfined`: only the limits, the timeout and the audit hook. Never chosen on its own: a
  user opts in explicitly (settings `code_sandbox = "unconfined"`).
"""

from __future__ import annotations

import json
import os
import sys
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

Backend = Literal["bwrap", "namespaces", "unconfined"]
RUNNER = Path(__file__).with_name("_runner.py")
SETUP = Path(__file__).with_name("_setup.py")
REAPER = Path(__file__).with_name("_reaper.py")
SANDBOX_DIR = "/sandbox"
RUNNER_MARK = "# conductor code sandbox runner"
DEVICES = ("null", "zero", "full", "random", "urandom")
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


class View(BaseModel):
    """The candidate's file system, as data both builders render."""

    binds: list[tuple[str, str]] = Field(description="(host path, sandbox path), read-only")
    symlinks: list[tuple[str, str]] = Field(description="(target, sandbox path)")
    python: str = Field(description="the interpreter, by its path inside the sandbox")


def _runtime() -> tuple[str, str]:
    """The Python runtime to expose (the base installation, not a virtual environment: the
    candidate gets the standard library, never the project's packages) and its interpreter."""
    prefix = os.path.realpath(sys.base_prefix)
    base = getattr(sys, "_base_executable", sys.executable)
    python = os.path.realpath(base)
    if not python.startswith(prefix + os.sep) and not python.startswith("/usr/"):
        python = os.path.join(prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    return prefix, python


@cache
def view() -> View:
    binds: list[tuple[str, str]] = [("/usr", "/usr")]
    symlinks: list[tuple[str, str]] = []
    for name in _TOP_LEVEL:
        path = Path("/", name)
        if path.is_symlink():
            symlinks.append((os.readlink(path), str(path)))
        elif path.is_dir():
            binds.append((str(path), str(path)))
    if Path("/etc/ld.so.cache").is_file():
        binds.append(("/etc/ld.so.cache", "/etc/ld.so.cache"))
    prefix, python = _runtime()
    if not prefix.startswith("/usr/") and prefix != "/usr":
        binds.append((prefix, prefix))
    return View(binds=binds, symlinks=symlinks, python=python)


@cache
def _runner_source() -> str:
    return f"{RUNNER_MARK}\n{RUNNER.read_text(encoding='utf-8')}"


def runner_command(v: View) -> list[str]:
    """The standard library only (`-S`: no site-packages), no environment (`-I`)."""
    return [v.python, "-I", "-S", "-B", "-c", _runner_source()]


def bwrap_command(bwrap: str, scratch_mb: int) -> list[str]:
    """bubblewrap, unprivileged: every namespace, no nested user namespaces, no capabilities,
    a new session (no TIOCSTI into a terminal), killed with its parent; started by `_reaper.py`,
    which reaps the init bwrap's monitor leaves behind."""
    v = view()
    _, python = _runtime()
    argv = [python, "-I", "-S", "-B", str(REAPER), bwrap, "--unshare-all", "--unshare-user",
            "--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for source, dest in v.binds:
        argv += ["--ro-bind", source, dest]
    for target, dest in v.symlinks:
        argv += ["--symlink", target, dest]
    argv += ["--dev", "/dev", "--remount-ro", "/dev", "--proc", "/proc",
             "--size", str(scratch_mb << 20), "--perms", "0700", "--tmpfs", SANDBOX_DIR,
             "--remount-ro", "/", "--chdir", SANDBOX_DIR, "--", *runner_command(v)]
    return argv


def namespaces_command(tools: dict[str, str], root: bool, uid: int, gid: int,
                       newroot: str, scratch_mb: int) -> list[str]:
    """unshare + `_setup.py` + setpriv. A non-root worker gets a user namespace (its own uid
    becomes root inside, for the mounts, and the candidate keeps the worker's unprivileged uid on
    the host); a root worker needs none, and ends as `uid`."""
    v = view()
    unshare = [tools["unshare"]]
    if not root:
        unshare += ["--user", "--map-root-user"]
    unshare += ["--net", "--pid", "--fork", "--kill-child", "--mount", "--ipc", "--uts",
                "--cgroup", "--propagation", "private"]
    owner = (uid, gid) if root else (0, 0)
    spec = {"newroot": newroot, "binds": v.binds, "symlinks": v.symlinks, "devices": DEVICES,
            "sandbox": SANDBOX_DIR, "scratch_mb": scratch_mb, "owner": owner}
    drop = [tools["setpriv"]]
    if root:
        drop += [f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    drop += ["--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"]
    return [*unshare, v.python, "-I", "-S", "-B", str(SETUP), json.dumps(spec), "--", *drop,
            *runner_command(v)]


def unconfined_command() -> list[str]:
    _, python = _runtime()
    return [python, "-I", "-S", "-B", "-c", _runner_source()]

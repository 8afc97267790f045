"""Run a Python module as an unprivileged user (uid 65534), the way a non-root worker runs.

Usage (as root): python -m tests.security.unprivileged [--break TOOL ...] [--no-cgroup] --
MODULE ARGS...

It enters a private mount namespace, makes the interpreter, the virtual environment and the
project reachable by that uid without touching the host's permissions (each is bound into a
fresh tmpfs laid over the first ancestor the uid cannot traverse), optionally replaces sandbox
tools by /bin/false (`--break unshare` simulates a host where user namespaces are forbidden),
delegates a pids and a memory cgroup to the uid (as systemd's `Delegate=yes` or a container
runtime would; `--no-cgroup` leaves it without) and moves into it, then drops to the uid with
setpriv, runs the module, and removes the delegated cgroups.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from conductor_engine.engine.rewards.sandbox.host import cgroup_parents

UID = 65534


def _traversable(path: Path) -> bool:
    st = path.stat()
    return bool(st.st_mode & 0o001)


def _blocking_ancestor(path: Path) -> Path | None:
    for parent in reversed(path.parents):
        if parent != Path("/") and not _traversable(parent):
            return parent
    return None


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def expose(paths: list[Path], under: Path | None = None) -> Path | None:
    """Make each path reachable by any uid, in this mount namespace only. Returns the staging
    directory it made on the host (in `under`, or the system's temporary directory; None when
    no path needed one): `unexpose`, or removing `under`, takes it away again, or every run
    would leave one behind."""
    staged: list[tuple[Path, Path]] = []
    covers: set[Path] = set()
    stage_root: Path | None = None  # made only when a path needs it: a dir on the host
    for i, path in enumerate(paths):
        blocker = _blocking_ancestor(path)
        if blocker is None:
            continue
        stage_root = stage_root or Path(tempfile.mkdtemp(prefix="conductor-expose-", dir=under))
        stage = stage_root / str(i)
        stage.mkdir()
        _mount("--bind", str(path), str(stage))
        staged.append((path, stage))
        covers.add(blocker)
    for blocker in sorted(covers, key=lambda p: len(p.parts)):
        _mount("-t", "tmpfs", "-o", "mode=0755,size=1m", "conductor-expose", str(blocker))
    for path, stage in staged:
        path.mkdir(parents=True, exist_ok=True)
        _mount("--bind", str(stage), str(path))
    return stage_root


def unexpose(stage_root: Path | None) -> None:
    """Remove `expose`'s staging directory: each stage unmounted here (the binds made from it
    stay), then the empty directories."""
    if stage_root is None:
        return
    for stage in stage_root.iterdir():
        subprocess.run(["umount", "--lazy", str(stage)], check=False)
        with contextlib.suppress(OSError):
            stage.rmdir()
    with contextlib.suppress(OSError):
        stage_root.rmdir()


def delegate(uid: int) -> list[tuple[Path, Path]]:
    """(delegated cgroup, where this process was) per hierarchy: a cgroup owned by `uid` that
    this process joins. v1: the cgroup itself; v2: a leaf `worker` below a cgroup that hands
    its controllers down."""
    made: list[tuple[Path, Path]] = []
    name = f"conductor-delegated-{uuid.uuid4().hex[:8]}"
    for parent in sorted({Path(p) for p in cgroup_parents().values()}):
        group = parent / name
        group.mkdir()
        leaf = group
        if (parent / "cgroup.subtree_control").exists():  # v2
            leaf = group / "worker"
            leaf.mkdir()
        for path in {group, leaf}:
            os.chown(path, uid, uid)
            for control in ("cgroup.procs", "tasks", "cgroup.subtree_control", "cgroup.threads"):
                if (path / control).exists():
                    os.chown(path / control, uid, uid)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        if leaf != group:
            (group / "cgroup.subtree_control").write_text("+pids +memory")
        made.append((group, parent))
    return made


def undelegate(made: list[tuple[Path, Path]]) -> None:
    for group, parent in made:
        with contextlib.suppress(OSError):
            (parent / "cgroup.procs").write_text(str(os.getpid()))
        for path in sorted(group.rglob("*"), key=lambda p: -len(p.parts)) + [group]:
            if path.is_dir():
                with contextlib.suppress(OSError):
                    path.rmdir()


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    options, command = args[:split], args[split + 1:]
    if os.environ.get("CONDUCTOR_EXPOSED") != "1":  # first pass: re-run in a mount namespace
        env = {**os.environ, "CONDUCTOR_EXPOSED": "1"}
        os.execvpe("unshare", ["unshare", "--mount", "--propagation", "private", sys.executable,
                               "-m", "tests.security.unprivileged", *args], env)
    project = Path(__file__).resolve().parents[2]
    stage_root = expose([Path(os.path.realpath(sys.base_prefix)), Path(sys.prefix), project])
    for i, opt in enumerate(options):
        # a tool this host lacks is broken already (bwrap where bubblewrap is not installed)
        if opt == "--break" and (tool := shutil.which(options[i + 1])) is not None:
            _mount("--bind", "/bin/false", tool)
    os.chdir(project)
    made = [] if "--no-cgroup" in options else delegate(UID)
    try:
        code = subprocess.run([
            "/usr/bin/setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--", sys.executable, "-m", *command,
        ]).returncode
    finally:
        undelegate(made)
        unexpose(stage_root)
    sys.exit(code)


if __name__ == "__main__":
    main()

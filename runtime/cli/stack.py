"""`conductor up`, `down` and `worker`: the embedded stack's lifecycle and the worker process.

Workflows and activities are imported only when a worker is built, so commands that only talk
to Temporal stay light.
"""

from __future__ import annotations

import asyncio
import signal

from rich.markup import escape
from rich.text import Text

from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.codec import CodecError
from conductor_engine.engine.storage.database import DatabaseError, EmbeddedPostgres
from conductor_engine.runtime.cli.app import (
    PoolOpt,
    app,
    err,
    fail,
    load_pool,
    load_settings,
    out,
    run_async,
)
from conductor_engine.runtime.client import ConductorClient, task_queue_of
from conductor_engine.runtime.embedded import EmbeddedError, EmbeddedTemporal
from conductor_engine.runtime.logging import announce_json


async def _serve(settings: Settings, pool: Pool, *, start_embedded: bool) -> None:
    """Poll the task queue until SIGINT or SIGTERM."""
    from conductor_engine.engine.contracts.search_attributes import ensure_registered
    from conductor_engine.engine.storage.shared_store import close_shared_stores
    from conductor_engine.runtime.worker import build_worker

    conductor = await ConductorClient.connect(settings, start_embedded=start_embedded,
                                             wait_s=settings.temporal_connect_timeout)
    await ensure_registered(conductor.client, settings.temporal_namespace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    queue = task_queue_of(settings, pool)  # the pool's own queue (engine/contracts/names.py)
    async with build_worker(conductor.client, settings, pool):
        if not announce_json("worker polling", task_queue=queue,
                             address=settings.address,
                             namespace=settings.temporal_namespace,
                             metrics=settings.metrics_bind):
            err.print(f"worker polling [bold]{escape(queue)}[/] on "
                      f"{escape(settings.address)} "
                      f"(namespace {escape(settings.temporal_namespace)}){_metrics(settings)}; "
                      "Ctrl-C stops")
        await stop.wait()
    await close_shared_stores()
    if not announce_json("worker stopped", task_queue=queue):
        err.print("worker stopped")


def _metrics(settings: Settings) -> str:
    """Where /metrics is served, for the start-up line."""
    return f" · metrics http://{escape(settings.metrics_bind)}/metrics" \
        if settings.metrics_bind else ""


@app.command()
def worker(pool: PoolOpt = None) -> None:
    """Run a worker against the configured Temporal (address, namespace, TLS from settings)."""
    settings = load_settings(pool)
    run_async(_serve(settings, load_pool(settings), start_embedded=False))


@app.command()
def up(pool: PoolOpt = None) -> None:
    """Run the embedded Temporal server and a worker in the foreground; Ctrl-C stops both."""
    settings = load_settings(pool)
    agents = load_pool(settings)
    try:
        server = EmbeddedTemporal.from_settings(settings)
        started = server.start(detached=False)
    except (EmbeddedError, CodecError) as e:
        raise fail(str(e)) from None
    codec = f" · codec {server.codec_endpoint}" if server.codec_endpoint else ""
    err.print(Text(f"Temporal {'started' if started else 'already running'} on "
                   f"{settings.address} · UI {settings.ui_base()}{codec}"))
    postgres = EmbeddedPostgres(settings.data_dir) if settings.database_url is None else None
    pg_started = False
    try:
        if postgres is not None:
            pg_started = postgres.url() is None
            postgres.start()
            err.print(Text(f"PostgreSQL (traces) "
                           f"{'started' if pg_started else 'already running'} in "
                           f"{postgres.pgdata}"))
        run_async(_serve(settings, agents, start_embedded=False))
    except (EmbeddedError, DatabaseError) as e:
        raise fail(str(e)) from None
    finally:
        if started:
            server.stop()
            err.print("Temporal stopped")
        if postgres is not None and pg_started:
            postgres.stop()
            err.print("PostgreSQL stopped")


@app.command()
def down() -> None:
    """Stop the embedded Temporal server and PostgreSQL that `conductor run` left running."""
    settings = load_settings()
    server = EmbeddedTemporal(settings.data_dir, settings.embedded_port, settings.embedded_ui_port)
    try:
        stopped = [name for name, stop in (("Temporal", server.stop),
                                           ("PostgreSQL", EmbeddedPostgres(settings.data_dir).stop))
                   if stop()]
    except DatabaseError as e:
        raise fail(str(e)) from None
    out.print(Text(f"stopped {' and '.join(stopped)}" if stopped else
                   f"no embedded server was started from {settings.data_dir}"))

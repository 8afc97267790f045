"""The process's shared trace store: one connection pool per database per event loop.

The record activity and the trainer service both write through it, however many workers a process
runs; it is opened on first use so a worker starts even while PostgreSQL is still coming up.
"""

from __future__ import annotations

import asyncio

from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.blobs import blob_store
from conductor_engine.engine.storage.database import database_url
from conductor_engine.engine.storage.trace_store import TraceStore

# One connection pool per database per event loop, however many workers the process runs.
_STORES: dict[tuple[object, ...], asyncio.Future[TraceStore]] = {}


async def _open(settings: Settings) -> TraceStore:
    url = await asyncio.to_thread(database_url, settings)
    return await TraceStore.open(
        url, blob_store(settings), blob_threshold=settings.trace_blob_threshold, max_size=4
    )


async def shared_store(settings: Settings) -> TraceStore:
    """The trace store for these settings, opened (and migrated) once, on first use; an open
    that failed is tried again by the next caller."""
    key = (id(asyncio.get_running_loop()), settings.database_url, str(settings.data_dir),
           str(settings.blobs_path), settings.s3_bucket, settings.s3_prefix,
           settings.s3_endpoint_url)
    opening = _STORES.get(key)
    if opening is None:
        opening = _STORES[key] = asyncio.ensure_future(_open(settings))
    try:
        return await asyncio.shield(opening)
    except Exception:
        _STORES.pop(key, None)
        raise


async def close_shared_stores() -> None:
    """Close this event loop's trace stores (a worker process calls this as it stops)."""
    loop = id(asyncio.get_running_loop())
    for key in [k for k in _STORES if k[0] == loop]:
        opening = _STORES.pop(key)
        if opening.done() and not opening.exception():
            await opening.result().close()

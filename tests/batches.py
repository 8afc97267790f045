"""Waiting for a batch as tests do: until it no longer runs, with a generous safety net."""

from __future__ import annotations

import asyncio
import time

from temporalio.service import RPCError

from conductor_engine.runtime.client import ConductorClient


async def wait_done(conductor: ConductorClient, name: str, timeout: float = 900) -> None:
    """Until batch `name` is no longer running. `timeout` only catches a hung batch; a server
    that is briefly unreachable (a fault test restarting it: RPCError) is asked again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, _ = await conductor.batch_progress(name)
        except RPCError:
            status = "running"
        if status != "running":
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"batch {name} did not finish in {timeout}s")

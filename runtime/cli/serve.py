"""`conductor serve`: the conductor as an OpenAI-compatible model (runtime/serve/).

The server is one process: uvicorn on the command's event loop, a ConductorClient, the policy
registry (for `MODEL@vN` names), and on the embedded stack a worker too, as `conductor run`
has. Starlette and uvicorn come with the `serve` extra and are imported only here.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import socket
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.runtime.cli.app import (
    PoolOpt,
    app,
    err,
    fail,
    in_process_worker,
    load_pool,
    load_settings,
    open_trace_store,
    run_async,
)
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.runtime.serve.access import API_KEYS_ENV, api_keys, bind_error


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so a taken port is one clear line, not a traceback."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise fail(f"cannot listen on {host}:{port}: {e.strerror}; pass an address of this "
                   "machine with --host") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise fail(f"cannot listen on {host}:{port}: {e.strerror}; pick a free port with "
                   "--port") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, stopped by the command's own signal handlers (a stop is a normal
        end, not an interruption); a second Ctrl-C stops at once."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        def stop(self) -> None:
            self.force_exit = self.should_exit
            self.should_exit = True

    return Server


async def _serve(settings: Settings, pool: Pool, sock: socket.socket, keys: list[str],
                 in_process: bool, run_timeout_s: float) -> None:
    from conductor_engine.engine.storage.policies import PolicyRegistry
    from conductor_engine.runtime.serve.app import create_app
    from conductor_engine.runtime.serve.catalog import ModelCatalog
    from conductor_engine.runtime.serve.guard import (
        ServeLimits,
        connection_cap,
        quiet_noisy_logs,
        uvicorn_config,
    )

    conductor = await ConductorClient.connect(settings)
    async with open_trace_store(settings) as store, \
            in_process_worker(conductor, pool, in_process):
        catalog = ModelCatalog(pool.conductor.id, PolicyRegistry(store.pool).latest_version)
        web = create_app(conductor, catalog, keys, run_timeout_s=run_timeout_s)
        host, port = sock.getsockname()[:2]
        where = f"[{host}]" if ":" in host else host
        access = f"{len(keys)} key(s) from {API_KEYS_ENV}" if keys else "no key (loopback only)"
        err.print(f"serving model [bold]{escape(pool.conductor.id)}[/] at "
                  f"http://{escape(where)}:{port}/v1 · {access} · Ctrl-C stops", soft_wrap=True)
        limits = ServeLimits.of(settings)
        cap, note = connection_cap(limits.max_connections)
        if note:
            err.print(Text(f"warning: {note}"), highlight=False, soft_wrap=True)
        quiet_noisy_logs()
        server = _server_class()(uvicorn_config(
            web, revised(limits, max_connections=cap), log_level="warning",
            lifespan="off", timeout_graceful_shutdown=10))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, server.stop)
        # Everything loaded so far lives as long as the server: out of the collector's sight, a
        # full collection (which holds every client up) walks only what requests made.
        gc.freeze()
        await server.serve(sockets=[sock])
    err.print("server stopped")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to listen on (any but loopback needs "
                                      f"{API_KEYS_ENV})")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on", min=1, max=65535)] = 8000,
    pool: PoolOpt = None,
    worker: Annotated[bool | None, typer.Option(
        help="serve the runs from this process (default: yes on the embedded stack)")] = None,
    timeout: Annotated[float, typer.Option(
        help="seconds a request waits for its run; past it the answer is a 504 and the run "
        "goes on", min=1, max=7 * 86400)] = 1800.0,
) -> None:
    """Serve the conductor as an OpenAI-compatible model: /v1/models, /v1/chat/completions."""
    settings = load_settings(pool)
    agents = load_pool(settings)
    keys = api_keys()
    problem = bind_error(host, keys)
    if problem:
        raise fail(problem, 2)
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise fail("conductor serve needs the serve extra: pip install "
                   "'conductor-engine[serve]'") from None
    sock = _listen(host, port)
    in_process = settings.embedded if worker is None else worker
    run_async(_serve(settings, agents, sock, keys, in_process, timeout))

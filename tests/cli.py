"""The `conductor` command's errors as tests expect them."""

from __future__ import annotations

import subprocess


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The command failed with exit status 1 and a single `error: ...` line on stderr: that
    line."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    return lines[0]

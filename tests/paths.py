"""The repository's root and the tests' own folders, for a test module at any depth under tests/
(tests/unit mirrors the source tree, so `Path(__file__).parents[N]` would differ file by file)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
DATA = TESTS / "data"

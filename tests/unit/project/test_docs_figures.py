"""Figures that drift stay out of the docs: no page outside docs/results/ (the dated measurements)
quotes how many tests there are or passed. Such a count is wrong after the next test is added,
and a newcomer who reads "1,141 tests" and sees 1,247 wonders what broke."""

from __future__ import annotations

import re
import subprocess

from tests.paths import ROOT

RESULTS = "docs/results/"
TEST_COUNT = re.compile(
    r"(?<![\d.])\d[\d,]*\s+(?:slow\s+|unit\s+|integration\s+)?(?:tests?|passed|failed)\b",
    re.IGNORECASE)
"""`1,141 tests`, `21 passed`, `18 slow tests`; not `tests/unit/` or `test 3`."""


def _pages() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                             "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in listed.stdout.splitlines()
            if not p.startswith(RESULTS) and (ROOT / p).is_file()]


def test_the_pattern_finds_a_count_of_tests_and_nothing_else() -> None:
    for quoted in ("`pytest`, 1,141 tests in 10 min", "slow 21 passed in 14 m", "18 slow tests"):
        assert TEST_COUNT.search(quoted), quoted
    for prose in ("tests/unit/ needs no service", "the 0.5 test", "step 3 tested it"):
        assert not TEST_COUNT.search(prose), prose


def test_no_page_outside_the_results_quotes_a_count_of_tests() -> None:
    quoted = [f"{page}:{n}: {m.group(0)}" for page in _pages()
              for n, line in enumerate((ROOT / page).read_text(encoding="utf-8").splitlines(), 1)
              for m in TEST_COUNT.finditer(line)]
    assert not quoted, ("a count of tests goes stale with the next test; keep it, dated, in "
                        f"{RESULTS} or leave it out: {quoted}")

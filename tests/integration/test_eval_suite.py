"""`conductor eval --suite FILE --limit 2` end to end: the paper's suite with each benchmark
pointed at rows in its published format (tests/data/shapes/), scripted agents on the agent
server, the real Temporal dev server, PostgreSQL and code sandbox, and the paper-shaped table:
a column per benchmark, their unweighted average, tokens and cost per task, the published row."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
import tomli_w
from temporalio.client import Client

from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceFilter, TraceStore
from conductor_engine.engine.tasks.sources import load_tasks
from conductor_engine.engine.tasks.suite import Suite, load_suite
from tests.cli import CONDUCTOR, stack_env
from tests.conftest import running_worker, write_pool
from tests.plans import plan_json

ROOT = Path(__file__).resolve().parents[2]
ROWS = {"gpqa-diamond": "gpqa_diamond.jsonl", "livecodebench": "livecodebench.jsonl",
        "math500": "math500.jsonl", "aime-2025": "aime.jsonl"}
STDIN_SUM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
TWO_SUM = ("```python\nclass Solution:\n    def twoSum(self, nums: List[int], target: int) -> "
           "List[int]:\n        seen = {}\n        for i, n in enumerate(nums):\n"
           "            if target - n in seen:\n                return [seen[target - n], i]\n"
           "            seen[n] = i\n```")
MISSED = "aime-2025/2025-I-2"
"""The one task the solver gets wrong: AIME is then 1 of 2, and the average of the columns
(1 + 1 + 1 + 0.5) / 4 = 0.875 differs from the share of tasks right (5 / 6)."""


def paper_suite_on_local_rows(tmp_path: Path) -> tuple[Path, Suite]:
    """The shipped paper suite, each benchmark's source a file of its published rows."""
    suite = load_suite("paper")
    benchmarks = [b.model_copy(update={"source": str(ROOT / "tests/data/shapes" / ROWS[b.key])})
                  for b in suite.benchmarks]
    local = suite.model_copy(update={"benchmarks": benchmarks})
    path = tmp_path / "suite.toml"
    path.write_text(tomli_w.dumps(local.model_dump(exclude_none=True)))
    return path, load_suite(str(path))


def right_answers(suite: Suite) -> dict[str, tuple[str, str]]:
    """{question: (suite task id, a right answer)} for the first two tasks of each benchmark."""
    answers = {}
    for benchmark, source in suite.sources():
        for task in load_tasks(source, limit=2).tasks:
            t = suite.task(benchmark, task)
            if benchmark.shape == "code":
                answer = TWO_SUM if "twoSum" in t.question else STDIN_SUM
            elif t.verifier == "choice":
                answer = f"Answer: {t.reference}"
            else:
                answer = f"The answer is \\boxed{{{t.reference}}}."
            answers[t.question] = (t.id, answer)
    return answers


@pytest.mark.slow  # about 50 s on 2 shared cores: 18 runs, 6 of them in the code sandbox
async def test_the_paper_suite_runs_end_to_end_and_writes_the_paper_shaped_table(
    agent_server, client: Client, settings: Settings, trace_store: TraceStore, tmp_path: Path,
) -> None:
    suite_file, suite = paper_suite_on_local_rows(tmp_path)
    answers = right_answers(suite)
    assert len(answers) == 6, "GPQA 1 row, LiveCodeBench 2 (of 3: one bad), MATH500 1, AIME 2"

    def solver(prompt: str) -> str:
        task_id, answer = next(v for q, v in answers.items() if q in prompt)
        return "The answer is \\boxed{41}." if task_id == MISSED else answer

    agent_server.set_responder("conductor", lambda _: plan_json(("solver", "Solve it.", [])))
    agent_server.set_responder("solver", solver)
    agent_server.set_responder("guesser", lambda _: "Answer: D. \\boxed{-1}")
    base = {"provider": "openai-compatible", "base_url": agent_server.openai_base_url,
            "price_input_per_mtok": 1.0, "price_output_per_mtok": 2.0}
    pool = Pool.model_validate({
        "offer_conductor_as_agent": False,
        "conductor": {"id": "conductor", "model": "conductor", **base},
        "agents": [{"id": "solver", "model": "solver", **base},
                   {"id": "guesser", "model": "guesser", **base}]})
    name = f"suite-{uuid.uuid4().hex[:6]}"
    env = {**stack_env(settings, write_pool(pool, tmp_path / "pool.toml")), "COLUMNS": "200"}
    async with running_worker(client, settings, pool):
        proc = await asyncio.create_subprocess_exec(
            *CONDUCTOR, "eval", "--suite", str(suite_file), "--limit", "2", "--name", name,
            "--baselines", "single", env=env, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert "LiveCodeBench: 2 task(s)\n" in err.decode(), "--limit 2: its bad third " \
        "row is never read"
    report = tmp_path / "evals" / name
    rows = {r["system"]: r for r in json.loads((report / "suite.json").read_text())}
    keys = ["gpqa-diamond", "livecodebench", "math500", "aime-2025"]
    assert list(rows["conductor"]["accuracy"]) == keys
    assert rows["conductor"]["accuracy"] == {"gpqa-diamond": 1.0, "livecodebench": 1.0,
                                             "math500": 1.0, "aime-2025": 0.5}
    assert rows["conductor"]["average"] == 0.875
    assert rows["single solver"]["average"] == 0.875
    assert rows["single guesser"]["average"] == 0.0
    assert rows["best single (solver)"]["accuracy"] == rows["single solver"]["accuracy"]
    for system in ("conductor", "single solver", "single guesser"):
        assert rows[system]["tasks"] == 6
        assert rows[system]["tokens_per_task"] > 0 and rows[system]["cost_per_task"] > 0
    published = rows["paper: 7B Conductor"]
    assert published["accuracy"] == {"gpqa-diamond": 0.875, "livecodebench": 0.839,
                                     "math500": None, "aime-2025": None}
    assert published["average"] is None and published["published"]
    table = (report / "suite.md").read_text()
    assert ("| system | GPQA-Diamond | LiveCodeBench | MATH500 | AIME 2025 | average | "
            "tokens / task | $ / task |") in table
    assert "| conductor | 100.0 | 100.0 | 100.0 | 50.0 | 87.5 |" in table
    assert "| paper: 7B Conductor | 87.5 | 83.9 | — | — | — | — | — |" in table
    text = out.decode()
    assert "suite paper: accuracy (%) per benchmark" in text and "87.5" in text
    assert (report / "table.md").exists(), "the eval's own report is written as always"
    assert await trace_store.count(TraceFilter(batch=name)) == 6 * 3

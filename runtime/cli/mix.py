"""Training mixes on the command line: `conductor train start MIX.toml` draws the manifest's
tasks (engine/tasks/mix.py) and refuses a mix that holds a held-out benchmark's problem."""

from __future__ import annotations

from rich.text import Text

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.tasks.files import TaskFileError
from conductor_engine.engine.tasks.mix import draw, load_mix, overlap, overlap_error
from conductor_engine.engine.tasks.sources import load_tasks
from conductor_engine.engine.tasks.suite import SuiteError, load_suite
from conductor_engine.runtime.cli.app import err, fail


def mix_tasks(path: str) -> list[Task]:
    """The mix's tasks: each source loaded (its bad rows listed and left out before the draw:
    a published dataset's malformed row must not stop a mix drawn from thousands), drawn, then
    checked against every held-out suite. Any failure is one `error:` line, nothing started."""
    try:
        mix = load_mix(path)
    except SuiteError as e:
        raise fail(str(e), 2) from None
    tasks: list[Task] = []
    for source, where in mix.source_strings():
        loaded = _valid_tasks(where)
        try:
            drawn = draw(source, loaded, mix.seed)
        except SuiteError as e:
            raise fail(str(e)) from None
        err.print(f"{source.name}: {len(drawn)} of {len(loaded)} task(s) from {where}",
                  markup=False, highlight=False)
        tasks += drawn
    _check_heldout(mix.heldout_paths(), tasks)
    return tasks


def _valid_tasks(where: str) -> list[Task]:
    """A source's valid tasks; its bad rows listed (the first MAX_LISTED, then a count) and a
    warning saying how many were left out of the draw."""
    try:
        loaded = load_tasks(where)
    except TaskFileError as e:
        raise fail(str(e)) from None
    for line in loaded.error_lines():
        err.print(Text(line), highlight=False, soft_wrap=True)
    if loaded.errors:
        err.print(Text(f"warning: {len(loaded.errors)} bad row(s) in {loaded.path} left out of "
                       f"the draw; {len(loaded.tasks)} valid"), highlight=False, soft_wrap=True)
    return list(loaded.tasks)


def _check_heldout(suites: list[str], tasks: list[Task]) -> None:
    """Refuse the mix when a held-out suite's problem is in it. A suite that cannot be read is
    refused too: an unchecked mix could hold the benchmark it is later scored on."""
    heldout: list[Task] = []
    for name in suites:
        try:
            suite = load_suite(name)
            for benchmark, where in suite.sources():
                heldout += [benchmark.task(t) for t in load_tasks(where).tasks]
        except (SuiteError, TaskFileError) as e:
            raise fail(f"cannot check the mix against held-out suite {name!r}: {e}; make its "
                       "data readable here, or remove it from the manifest's heldout") from None
    found = overlap(tasks, heldout)
    if found:
        raise fail(overlap_error(found, suites))
    if suites:
        err.print(f"held out: none of {len(heldout)} task(s) of {', '.join(suites)} is in the "
                  "mix", markup=False, highlight=False)

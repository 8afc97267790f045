"""`conductor sim pool`: a rehearsal pool nobody tuned to (engine/providers/sim_pool.py), so
learning can be tried on pools other than the shipped example."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from conductor_engine.engine.providers.sim_pool import (
    NAMES,
    TAGS,
    SimPoolSpec,
    SkillLayout,
    pool_toml,
    tasks,
)
from conductor_engine.engine.providers.sim_structure import (
    MAX_TASKS_PER_KIND,
    StructuredPoolSpec,
    structured_pool_toml,
    structured_tasks,
)
from conductor_engine.runtime.cli.app import app, fail, field_range, out

sim_app = typer.Typer(help="Rehearsals with simulated agents.", no_args_is_help=True,
                      rich_markup_mode=None)
app.add_typer(sim_app, name="sim")


@sim_app.command("pool")
def sim_pool(
    agents: Annotated[int, typer.Option(**field_range(SimPoolSpec, "agents"),
                                        help=f"agents in the pool (1..{len(NAMES)})")] = 4,
    tags: Annotated[int, typer.Option(**field_range(SimPoolSpec, "tags"),
                                      help=f"task kinds (1..{len(TAGS)}: "
                                      f"{', '.join(TAGS)})")] = 4,
    seed: Annotated[int, typer.Option(**field_range(SimPoolSpec, "seed"),
                                      help="picks the tags, questions, names and skills")] = 0,
    tasks_per_tag: Annotated[int, typer.Option(**field_range(SimPoolSpec, "tasks_per_tag"),
                                               help="questions of each tag")] = 8,
    skills: Annotated[str, typer.Option(
        help="one: one competent agent per tag; random: a random skill matrix whose best "
             "agent per tag is competent")] = "one",
    max_steps: Annotated[int, typer.Option(**field_range(SimPoolSpec, "max_steps"),
                                           help="steps a plan may have")] = 1,
    out_dir: Annotated[Path, typer.Option("--out", help="where pool.toml and tasks.jsonl go "
                                          "(default sim-pools/SEED)")] = Path(""),
    structure: Annotated[bool, typer.Option(
        "--structure", help="a pool where the plan's shape matters (one step, draft + review, "
        "a split across two specialists, a dear generalist), with each task's oracle plan in "
        "oracle.jsonl; only --seed, --tasks-per-tag (per kind, at most 8) and --out apply "
        "(docs/how-to/rehearse-plans.md)")] = False,
) -> None:
    """Write a sim pool of look-alike agents and a task file for it: train and evaluate on it
    (`conductor train start DIR/tasks.jsonl --pool DIR/pool.toml --holdout 0.25`)."""
    target = out_dir if str(out_dir) else Path("sim-pools") / str(seed)
    if structure:
        _structured(seed, tasks_per_tag, target)
        return
    if skills not in ("one", "random"):
        raise fail(f"--skills {skills!r}: write one or random", 2)
    layout: SkillLayout = "one" if skills == "one" else "random"
    try:
        spec = SimPoolSpec(agents=agents, tags=tags, seed=seed, tasks_per_tag=tasks_per_tag,
                           skills=layout, max_steps=max_steps)
    except ValidationError as e:
        raise fail(e.errors()[0]["msg"], 2) from None
    target.mkdir(parents=True, exist_ok=True)
    (target / "pool.toml").write_text(pool_toml(spec))
    rows = tasks(spec)
    (target / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    matrix = spec.skill_matrix()
    for agent, row in matrix.items():
        best = [t for t, p in row.items() if p == spec.high]
        out.print(f"{agent}: competent at {', '.join(best) or 'nothing'}", markup=False,
                  highlight=False)
    out.print(f"wrote {target / 'pool.toml'} and {target / 'tasks.jsonl'} ({len(rows)} tasks)",
              markup=False, highlight=False)


def _structured(seed: int, tasks_per_kind: int, target: Path) -> None:
    """`--structure`: pool.toml, tasks.jsonl and oracle.jsonl (each task's best plan, its shape
    and expected reward), and the oracle's plan per task kind on the screen."""
    try:
        spec = StructuredPoolSpec(seed=seed, tasks_per_kind=tasks_per_tag_limit(tasks_per_kind))
    except ValidationError as e:
        raise fail(e.errors()[0]["msg"], 2) from None
    target.mkdir(parents=True, exist_ok=True)
    rows = structured_tasks(spec)
    (target / "pool.toml").write_text(structured_pool_toml(spec))
    (target / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r, _ in rows))
    (target / "oracle.jsonl").write_text("".join(o.model_dump_json() + "\n" for _, o in rows))
    seen: set[str] = set()
    for _, o in rows:
        if o.kind not in seen:
            seen.add(o.kind)
            steps = " -> ".join(s.agent for s in o.plan)
            out.print(f"{o.kind}: {o.shape} ({steps}), expected reward {o.expected_reward:.3f}",
                      markup=False, highlight=False)
    out.print(f"wrote {target / 'pool.toml'}, {target / 'tasks.jsonl'} ({len(rows)} tasks) and "
              f"{target / 'oracle.jsonl'}", markup=False, highlight=False)


def tasks_per_tag_limit(n: int) -> int:
    """--tasks-per-tag for a structured pool: a kind has at most MAX_TASKS_PER_KIND tasks."""
    if n > MAX_TASKS_PER_KIND:
        raise fail(f"--tasks-per-tag {n}: a structured pool has at most "
                   f"{MAX_TASKS_PER_KIND} tasks per kind", 2)
    return n

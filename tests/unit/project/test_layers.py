"""The layers hold: runtime -> workflows -> activities -> engine, runtime -> trainer -> engine. The
runtime (runtime/: CLI, client, serve, worker), the edge where processes are assembled, is the top
layer; nothing imports it, and no layer is excepted. No import cycles.
Inside the engine its folders are stacked too (ENGINE_LAYERS): each imports only those below it,
so no two folders import each other and the contracts, at the bottom, import none of them.

Read from the source with `ast`, so every import counts: module level, inside functions (the
lazy imports that keep torch out of light processes) and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.paths import ROOT

NAMESPACE = "conductor_engine"
FOLDERS = ("engine", "activities", "workflows", "trainer", "runtime")
RUNTIME = f"{NAMESPACE}.runtime"
# Within the edge, only what assembles processes (worker, client, CLI) reaches the layers above;
# the audit tools (history, resume) read the contracts like everyone else.
ASSEMBLY = tuple(f"{RUNTIME}.{m}" for m in ("worker", "client", "cli"))
ABOVE = tuple(f"{NAMESPACE}.{f}" for f in ("activities", "workflows", "trainer"))

# What each layer must never import (by module prefix).
FORBIDDEN = {
    f"{NAMESPACE}.engine": (f"{NAMESPACE}.activities", f"{NAMESPACE}.workflows",
                            f"{NAMESPACE}.trainer", RUNTIME),
    f"{NAMESPACE}.activities": (f"{NAMESPACE}.workflows", f"{NAMESPACE}.trainer", RUNTIME),
    f"{NAMESPACE}.workflows": (f"{NAMESPACE}.trainer", RUNTIME),
    f"{NAMESPACE}.trainer": (f"{NAMESPACE}.activities", f"{NAMESPACE}.workflows", RUNTIME),
}

# The engine's parts, bottom first: a part imports only parts listed before it. The contracts
# hold the values every layer shares (plans, tasks, rewards, agent calls), so they come first
# after the leaf helpers.
ENGINE_LAYERS = (
    ("text", "redaction", "toml_errors", "observability", "heartbeat"),
    ("contracts",),
    ("settings",),
    ("rewards",),
    ("tasks",),
    ("storage",),
    ("providers",),
    ("plan",),
    ("eval", "training"),
    ("",),
)
ENGINE = f"{NAMESPACE}.engine"


def _engine_part(module: str) -> str | None:
    """The engine folder (or top-level module) `module` belongs to; None outside the engine."""
    if module != ENGINE and not module.startswith(ENGINE + "."):
        return None
    return module[len(ENGINE) + 1:].split(".")[0]


def _rank(part: str) -> int:
    return next(i for i, parts in enumerate(ENGINE_LAYERS) if part in parts)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([NAMESPACE, *parts])


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))}


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """Every module `name` imports, resolved to a module of ours where it names one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in MODULES else base), node.lineno


def _graph() -> dict[str, set[str]]:
    return {name: {m for m, _ in _imports(name, path) if m in MODULES}
            for name, path in MODULES.items()}


def test_the_import_reader_sees_the_whole_package() -> None:
    # A guard on the test itself: were the walk to find nothing, every check below would pass.
    assert f"{NAMESPACE}.workflows.conduct" in MODULES and len(MODULES) > 40
    assert f"{NAMESPACE}.activities.plan" in _graph()[f"{NAMESPACE}.runtime.worker"]


def test_no_code_imports_the_folders_by_their_generic_top_level_names() -> None:
    files = [*MODULES.values(), *sorted((ROOT / "tests").rglob("*.py"))]
    bad = [f"{p.relative_to(ROOT)}:{line} imports {m}"
           for p in files for m, line in _imports(_module_name(p) if p in MODULES.values()
                                                 else "tests", p)
           if m.split(".")[0] in FOLDERS]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_only_what_is_below_it(layer: str) -> None:
    bad = []
    for name, path in MODULES.items():
        if not name.startswith(layer):
            continue
        for target, line in _imports(name, path):
            if any(target == f or target.startswith(f + ".") for f in FORBIDDEN[layer]):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_within_the_runtime_only_process_assembly_imports_the_layers_above() -> None:
    bad = [f"{path.relative_to(ROOT)}:{line} imports {target}"
           for name, path in MODULES.items()
           if name.startswith(RUNTIME) and not name.startswith(ASSEMBLY)
           for target, line in _imports(name, path) if target.startswith(ABOVE)]
    assert not bad, "\n".join(bad)


def test_there_is_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _engine_arrows() -> Iterator[tuple[str, str, str, int]]:
    """Every import from one engine part into another: (importer part, imported part, where)."""
    for name, path in MODULES.items():
        here = _engine_part(name)
        if here is None:
            continue
        for target, line in _imports(name, path):
            there = _engine_part(target) if target in MODULES else None
            if there is not None and there != here:
                yield here, there, f"{path.relative_to(ROOT)}:{line} imports {target}", line


def test_every_engine_part_has_its_place_in_the_stack() -> None:
    placed = {p for parts in ENGINE_LAYERS for p in parts}
    parts = {_engine_part(name) for name in MODULES} - {None}
    assert parts <= placed, f"place these in ENGINE_LAYERS: {sorted(parts - placed)}"


def test_no_engine_import_runs_back_up_the_stack() -> None:
    bad = sorted({f"{where} ({there} sits above {here})"
                  for here, there, where, _ in _engine_arrows() if _rank(there) > _rank(here)})
    assert not bad, "\n".join(bad)


def test_the_contracts_import_nothing_of_the_domain_folders() -> None:
    domain = {"plan", "providers", "rewards", "storage", "tasks"}
    bad = sorted({where for here, there, where, _ in _engine_arrows()
                  if here == "contracts" and there in domain})
    assert not bad, "\n".join(bad)


def test_the_engine_folders_form_no_cycle() -> None:
    # Independent of the ranking above: two folders that import each other (directly or round a
    # longer loop) are one idea split in two, whatever order ENGINE_LAYERS claims.
    graph: dict[str, set[str]] = {}
    for here, there, _, _ in _engine_arrows():
        graph.setdefault(here, set()).add(there)
    cycles = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    cycles.append(" -> ".join([*path, nxt]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert not cycles, "\n".join(sorted(set(cycles)))

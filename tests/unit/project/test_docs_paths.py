"""The documentation names only files that exist, and its generated pages match the code.

What counts as a repository path: a word that starts with one of the repository's top-level
folders and a slash and names a folder (ends with `/`), a file (ends with a file extension:
`.py`, `.md`, `.toml`, ...) or a glob: `engine/contracts/traces.py`, `tests/faults/`,
`docs/limits.md#anchor`, `engine/storage/migrations/*.sql`. Words like `engine/bare` (a ratio's
name) or `trainer/rollouts.group_samples` (a function) are not paths. Such paths are found

- in Markdown (every tracked `*.md`: docs/, README.md, ARCHITECTURE.md, ...) inside code, inline
  or fenced, where paths are written;
- in the CLI's help (every command and option, as `conductor ... --help` prints it) and in the
  docstrings of every module, class and function, anywhere in the text: prose there names files
  without backticks.

It exists when the path, without a trailing `#anchor`, `:LINE` or punctuation, is a file or
folder of the working tree, or a glob that matches one. A Markdown link to a relative target must
resolve inside the repository and exist (`../shared/DESIGN.md`, outside it, fails).
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import docs_reference
from tests.paths import ROOT


def _tracked() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in listed.splitlines() if (ROOT / line).exists()]


def _top_folders() -> list[str]:
    return sorted({p.relative_to(ROOT).parts[0] for p in _tracked()
                   if len(p.relative_to(ROOT).parts) > 1})


def path_pattern(tops: list[str]) -> re.Pattern[str]:
    names = "|".join(re.escape(t) for t in sorted(tops, key=len, reverse=True))
    return re.compile(rf"(?<![\w./~-])(?:{names})/[\w.*/-]*")


EXTENSIONS = {"py", "md", "toml", "json", "jsonl", "sql", "sh", "yml", "yaml", "txt", "cfg",
              "ini", "csv", "png", "html", "pem", "conf"}


def _clean(path: str) -> str:
    """A path as written: anchors, line numbers and sentence punctuation are not part of it."""
    return re.sub(r"(#.*|:\d+.*)$", "", path).rstrip(".,;:)")


def is_path(word: str) -> bool:
    path = _clean(word)
    last = path.rsplit("/", 1)[-1]
    return (path.endswith("/") or any(c in path for c in "*?[")
            or ("." in last and last.rsplit(".", 1)[1] in EXTENSIONS))


def paths_in(text: str, pattern: re.Pattern[str]) -> list[str]:
    return [word for word in pattern.findall(text) if is_path(word)]


def exists(path: str, root: Path = ROOT) -> bool:
    path = _clean(path)
    if any(c in path for c in "*?["):
        return any(root.glob(path))
    return (root / path).exists()


def _code_of_markdown(text: str) -> Iterator[tuple[int, str]]:
    """(line number, code) for every inline code span and every line of a fenced block."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            yield number, line
        else:
            for span in re.findall(r"`([^`]+)`", line):
                yield number, span


def markdown_problems(file: Path, pattern: re.Pattern[str], root: Path = ROOT,
                      text: str | None = None) -> list[str]:
    """Every missing path in the file's code, and every relative link that leaves the
    repository or names nothing (`text`: the file's content, when it is not on disk)."""
    if text is None:
        text = file.read_text(encoding="utf-8")
    where = file.relative_to(root) if file.is_relative_to(root) else file
    found = [f"{where}:{n}: {path}" for n, code in _code_of_markdown(text)
             for path in paths_in(code, pattern) if not exists(path, root)]
    for number, line in enumerate(text.splitlines(), start=1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"^[a-z]+:|^#|^<", target):
                continue
            resolved = (file.parent / target.split("#")[0]).resolve()
            if not resolved.is_relative_to(root.resolve()) or not resolved.exists():
                found.append(f"{where}:{number}: link {target}")
    return found


def _docstrings(file: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(file.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield (node.body[0].lineno if node.body else 1), doc


def _missing_in(text: str, pattern: re.Pattern[str]) -> list[str]:
    return [path for path in paths_in(text, pattern) if not exists(path)]


@pytest.fixture(scope="module")
def pattern() -> re.Pattern[str]:
    return path_pattern(_top_folders())


def test_every_repository_path_written_in_the_markdown_exists(pattern: re.Pattern[str]) -> None:
    pages = [p for p in _tracked() if p.suffix == ".md"]
    assert any(p.name == "README.md" for p in pages) and any(p.parts[-2] == "docs" for p in pages)
    problems = [line for page in pages for line in markdown_problems(page, pattern)]
    assert not problems, "paths that do not exist:\n" + "\n".join(problems)


def test_every_repository_path_in_docstrings_exists(pattern: re.Pattern[str]) -> None:
    problems = [f"{file.relative_to(ROOT)}:{line}: {path}"
                for file in _tracked() if file.suffix == ".py"
                for line, doc in _docstrings(file) for path in _missing_in(doc, pattern)]
    assert not problems, "docstrings naming paths that do not exist:\n" + "\n".join(problems)


def test_every_repository_path_in_the_cli_help_exists(pattern: re.Pattern[str]) -> None:
    missing = _missing_in(docs_reference.cli_page(), pattern)
    assert not missing, f"`conductor --help` names paths that do not exist: {missing}"


def test_a_broken_path_or_a_link_out_of_the_repository_is_caught(
        pattern: re.Pattern[str]) -> None:
    """A page in docs/ (never written: its text is given) that names a moved file, a missing
    benchmark, and the design document outside the repository."""
    page = ROOT / "docs" / "broken.md"
    text = ("See `engine/providers/nowhere.py`, `tests/unit/project/test_docs_paths.py`,\n"
            "[the design](../../shared/DESIGN.md) and [limits](limits.md).\n"
            "```\npython tests/benchmarks/no_such_bench.py\n```\n")
    problems = markdown_problems(page, pattern, text=text)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "engine/providers/nowhere.py", "tests/benchmarks/no_such_bench.py",
        "link ../../shared/DESIGN.md"]
    assert _missing_in('"""Built in trainer/config.py, see engine/blobs.py. The engine/bare\n'
                       'ratio; trainer/rollouts.group_samples."""', pattern) == [
        "trainer/config.py", "engine/blobs.py."]


@pytest.mark.parametrize("name", sorted(docs_reference.PAGES))
def test_the_generated_reference_page_matches_the_code(name: str) -> None:
    committed = (docs_reference.REFERENCE / name).read_text(encoding="utf-8")
    assert committed == docs_reference.PAGES[name](), (
        f"docs/reference/{name} is stale: run `python -m tests.docs_reference` and commit it")


def _readme_test_block() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Tests (one command)", 1)[1]
    return section.split("```bash", 1)[1].split("```", 1)[0]


def test_ci_runs_the_test_commands_the_readme_gives() -> None:
    """What a reader runs is what CI runs: each `pytest` command of the README's Tests block is
    a line of .ci/run (up to `-q`), and CI installs every extra the README's install names."""
    block = _readme_test_block()
    commands = [part.split("#", 1)[0].strip() for line in block.splitlines()
                for part in line.split("&&") if part.strip().startswith("pytest")]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci_lines = {" ".join(w for w in line.split() if w != "-q") for line in ci.splitlines()}
    assert commands and all(c in ci_lines for c in commands), (commands, sorted(ci_lines))
    readme_extras = set(re.findall(r"-e '\.\[([\w,]+)\]'", block)[0].split(","))
    ci_extras = set(re.findall(r"-e '\.\[([\w,]+)\]'", ci)[0].split(","))
    assert readme_extras <= ci_extras


# A dotted name of the package written in the docs (`conductor_engine.runtime.client`,
# `trainer.grpo.train_step`): a module, or a module and the attribute it holds.
DOTTED = re.compile(r"(?<![\w./-])((?:conductor_engine\.)?(?:engine|trainer|workflows|activities)"
                    r"(?:\.[A-Za-z_]\w*)+)")
# A root document named by its file name alone (`README.md`, `ARCHITECTURE.md`, `DESIGN.md`).
ROOT_DOC = re.compile(r"(?<![\w./-])([A-Z][A-Z_]+\.md)\b")


def resolves(name: str) -> bool:
    """True when `name` imports, or its longest importable prefix holds the rest as attributes."""
    import importlib

    parts = name.removeprefix("conductor_engine.").split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module("conductor_engine." + ".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def _named_in_docs() -> Iterator[tuple[str, str]]:
    """(where, text) for the code of every Markdown page and every docstring."""
    for file in _tracked():
        if file.suffix == ".md":
            text = file.read_text(encoding="utf-8")
            for number, code in _code_of_markdown(text):
                yield f"{file.relative_to(ROOT)}:{number}", code
            for number, line in enumerate(text.splitlines(), start=1):
                yield f"{file.relative_to(ROOT)}:{number}", " ".join(ROOT_DOC.findall(line))
        elif file.suffix == ".py":
            for number, doc in _docstrings(file):
                yield f"{file.relative_to(ROOT)}:{number}", doc


def test_every_module_the_docs_name_imports() -> None:
    problems = [f"{where}: {name}" for where, text in _named_in_docs()
                for name in DOTTED.findall(text) if not resolves(name.rstrip("."))]
    assert not problems, "dotted names that do not import:\n" + "\n".join(problems)


def test_every_root_document_the_docs_cite_exists() -> None:
    problems = [f"{where}: {name}" for where, text in _named_in_docs()
                for name in ROOT_DOC.findall(text) if not (ROOT / name).exists()]
    assert not problems, "root documents that do not exist:\n" + "\n".join(problems)


def test_a_stale_module_name_or_root_document_is_caught() -> None:
    assert resolves("conductor_engine.runtime.worker.build_worker")
    assert resolves("trainer.grpo.train_step")
    assert not resolves("engine.worker.build_worker")
    assert not resolves("conductor_engine.runtime.worker.no_such_function")
    assert ROOT_DOC.findall("as DESIGN.md says, not ../shared/DESIGN.md") == ["DESIGN.md"]

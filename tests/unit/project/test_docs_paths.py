"""The documentation names only files that exist, and its generated pages match the code.

What counts as a repository path: a word that starts with one of the repository's top-level
folders and a slash and names a folder (ends with `/`), a file (ends with a file extension:
`.py`, `.md`, `.toml`, ...) or a glob: `engine/contracts/traces.py`, `tests/faults/`,
`docs/reference/limits.md#anchor`, `engine/storage/migrations/*.sql`. Words like `engine/bare`
(a ratio's name) or `trainer/rollouts.group_samples` (a function) are not paths. Such paths are
found

- in Markdown (every tracked `*.md`: docs/, README.md, ARCHITECTURE.md, ...), anywhere in the
  text, prose and code alike;
- in the CLI's help (every command and option, as `conductor ... --help` prints it), in the
  docstrings of every module, class and function, and in the comments of code and configuration
  files (`#` comments of `.py`, `.toml`, `.yml`, `.sh`, ...): prose there names files without
  backticks.

It exists when the path, without a trailing `#anchor`, `:LINE` or punctuation, is a file or
folder of the working tree, or a glob that matches one. A Markdown link to a relative target must
resolve inside the repository and exist (`../shared/DESIGN.md`, outside it, fails), and its
`#anchor`, when it points into a Markdown file, must be one of that file's headings.

The layout page (docs/reference/layout.md) lists every folder and only folders that exist, and
pages outside docs/results/ name no issue numbers: they describe what is, not their history.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
import unicodedata
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
    found = [f"{where}:{n}: {path}" for n, line in enumerate(text.splitlines(), start=1)
             for path in paths_in(line, pattern) if not exists(path, root)]
    for number, line in enumerate(text.splitlines(), start=1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"^[a-z]+:|^<", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (file.parent / path).resolve() if path else file
            if path and (not resolved.is_relative_to(root.resolve()) or not resolved.exists()):
                found.append(f"{where}:{number}: link {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(
                    text if resolved == file else resolved.read_text(encoding="utf-8")):
                found.append(f"{where}:{number}: anchor {target}")
    return found


def anchors(text: str) -> set[str]:
    """The anchors a Markdown page's headings get: MkDocs' (`toc`) and GitHub's slugs, with the
    `_1`/`-1` suffixes of repeated headings, and any explicit `id="..."`."""
    found = set(re.findall(r'id="([^"]+)"', text))
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*$", line)
        if fenced or not heading:
            continue
        words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "")
        plain = unicodedata.normalize("NFKD", words).encode("ascii", "ignore").decode()
        mkdocs = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", plain).strip().lower())
        github = re.sub(r"[^\w\- ]", "", words.lower()).replace(" ", "-")
        for slug in (mkdocs, github):
            found |= {slug} | {f"{slug}_{n}" for n in range(1, 10)} | {
                f"{slug}-{n}" for n in range(1, 10)}
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
    """A page in docs/ (never written: its text is given) that names a moved file in code and in
    prose, a missing benchmark, the design document outside the repository, and a section that
    its page does not have."""
    page = ROOT / "docs" / "broken.md"
    text = ("See `engine/providers/nowhere.py`, `tests/unit/project/test_docs_paths.py`,\n"
            "engine/rewards/x.py,\n"
            "[the design](../../shared/DESIGN.md), [limits](reference/limits.md#the-bounds),\n"
            "[the README's Learning section](../README.md#learning) and [here](#see).\n"
            "# See\n```\npython tests/benchmarks/no_such_bench.py\n# Not a heading\n```\n")
    problems = markdown_problems(page, pattern, text=text)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "engine/providers/nowhere.py", "engine/rewards/x.py", "tests/benchmarks/no_such_bench.py",
        "link ../../shared/DESIGN.md", "anchor ../README.md#learning"]
    assert "not-a-heading" not in anchors(text) and "quick-start-one-command" in anchors(
        (ROOT / "README.md").read_text(encoding="utf-8"))
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
# A root document named by its file name alone (`README.md`, `ARCHITECTURE.md`, ...).
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


# Files whose `#` comments are prose that may name files: code, configuration and scripts.
COMMENTED = {".py", ".toml", ".yml", ".yaml", ".sh", ".cfg", ".ini"}


def _comments(file: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every `#` comment: Python's by its tokenizer (a `#` inside a
    string is not one), other files' from the first `#` of a line."""
    text = file.read_text(encoding="utf-8", errors="replace")
    if file.suffix == ".py":
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if "#" in line:
            yield number, line[line.index("#"):]


def comment_problems(where: str, comments: Iterator[tuple[int, str]],
                     pattern: re.Pattern[str]) -> list[str]:
    """What the comments cite that is not there: a repository path, a root document, a module."""
    return [f"{where}:{number}: {name}" for number, text in comments
            for name in [*_missing_in(text, pattern),
                         *(d for d in ROOT_DOC.findall(text) if not (ROOT / d).exists()),
                         *(m for m in DOTTED.findall(text) if not resolves(m.rstrip(".")))]]


def test_every_file_document_and_module_a_code_comment_names_exists(
        pattern: re.Pattern[str]) -> None:
    files = [f for f in _tracked() if f.suffix in COMMENTED or f.parent.name == ".ci"]
    problems = [line for file in files
                for line in comment_problems(str(file.relative_to(ROOT)), _comments(file),
                                             pattern)]
    assert not problems, "comments naming what does not exist:\n" + "\n".join(problems)


def test_a_stale_citation_in_a_comment_is_caught(pattern: re.Pattern[str]) -> None:
    comments = iter([(1, "# the rule is in DESIGN.md, as docs/rollouts.md says"),
                     (2, "# engine.policies.served_name: NAME-vK; see README.md")])
    assert comment_problems("x.py", comments, pattern) == [
        "x.py:1: docs/rollouts.md", "x.py:1: DESIGN.md", "x.py:2: engine.policies.served_name"]


# The layout page: a table whose rows each name one folder, in backticks, in the first column.
LAYOUT = ROOT / "docs" / "reference" / "layout.md"


def layout_folders(text: str) -> list[str]:
    return re.findall(r"^\| `([^`]+/)` \|", text, flags=re.MULTILINE)


def tree_folders(files: list[Path]) -> set[str]:
    """The folders a description of the layout must name: every folder holding tracked files
    two levels deep (`engine/plan/`, `tests/faults/`), and every Python package deeper outside
    tests/ (`engine/providers/local/`); data folders below those are the row's business."""
    folders = set()
    for file in files:
        parts = file.relative_to(ROOT).parts[:-1]
        folders |= {"/".join(parts[:depth]) + "/" for depth in (1, 2) if len(parts) >= depth}
        if file.name == "__init__.py" and len(parts) > 2 and parts[0] != "tests":
            folders.add("/".join(parts) + "/")
    return folders


def test_the_layout_page_names_every_folder_and_only_folders_that_exist() -> None:
    named = layout_folders(LAYOUT.read_text(encoding="utf-8"))
    assert len(named) == len(set(named)), "a folder has two rows in docs/reference/layout.md"
    missing = sorted(tree_folders(_tracked()) - set(named))
    gone = [folder for folder in named if not (ROOT / folder).is_dir()]
    assert not missing, f"folders without a row in docs/reference/layout.md: {missing}"
    assert not gone, f"docs/reference/layout.md names folders that do not exist: {gone}"


def test_a_folder_missing_from_the_layout_is_caught() -> None:
    files = [ROOT / "engine" / "plan" / "language.py", ROOT / "tests" / "faults" / "gate.py",
             ROOT / "engine" / "providers" / "local" / "__init__.py",
             ROOT / "tests" / "unit" / "engine" / "__init__.py"]
    assert tree_folders(files) == {"engine/", "engine/plan/", "tests/", "tests/faults/",
                                   "engine/providers/", "engine/providers/local/",
                                   "tests/unit/"}
    assert layout_folders("| `engine/` | core |\n| `tests/faults/` | kills |\n| x | `a/` |") == [
        "engine/", "tests/faults/"]


# An issue or pull request cited by number: "(issue 33)", "issue #12", "issues 3 and 4", "PR 7".
ISSUE_NUMBER = re.compile(r"\b(?:issues?|PRs?|pull requests?)\s*#?\d+", re.IGNORECASE)
# A page narrating its own history rather than saying what is.
NARRATION = re.compile(r"\buntil this page\b|\bthis page (?:used to|now)\b", re.IGNORECASE)


def _narration(text: str) -> list[str]:
    return [match.group(0) for line in text.splitlines()
            for match in [*ISSUE_NUMBER.finditer(line), *NARRATION.finditer(line)]]


def test_pages_outside_results_name_no_issue_numbers_and_no_history() -> None:
    """Results pages keep dated measurements; every other page describes what is."""
    results = ROOT / "docs" / "results"
    pages = [p for p in _tracked() if p.suffix == ".md" and not p.is_relative_to(results)]
    problems = [f"{page.relative_to(ROOT)}: {found}" for page in pages
                for found in _narration(page.read_text(encoding="utf-8"))]
    assert not problems, "history in pages that should say what is:\n" + "\n".join(problems)


def test_an_issue_number_or_a_page_history_is_caught() -> None:
    text = ("Until this page, agents answered alone (issue 33); see issue #12 and PR 7.\n"
            "Step #2 and a `#` comment; color: #fff; 3 issues, 2 of them fixed.\n")
    assert _narration(text) == ["issue 33", "issue #12", "PR 7", "Until this page"]


def test_every_snippet_a_page_includes_exists() -> None:
    """A page that includes another file's section (`--8<-- "README.md:quickstart"`, the quick
    start written once in the README) names a section that file marks."""
    problems = []
    for page in (ROOT / "docs").rglob("*.md"):
        for name, section in re.findall(r'--8<-- "([^":]+):?([\w-]*)"',
                                        page.read_text(encoding="utf-8")):
            source = (ROOT / name).read_text(encoding="utf-8") if (ROOT / name).exists() else ""
            if not source or (section and f"[start:{section}]" not in source):
                problems.append(f"{page.relative_to(ROOT)}: {name}:{section}")
    assert not problems, "snippets that include nothing:\n" + "\n".join(problems)


def imported_engine_parts(folder: Path) -> set[str]:
    """The engine's sub-packages and modules (`contracts`, `text`, ...) a layer's code imports."""
    parts = set()
    for file in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            parts |= {name.split(".")[2] for name in names
                      if name.startswith("conductor_engine.engine.")}
    return parts


def test_the_architecture_names_what_the_workflows_import_from_the_engine() -> None:
    """ARCHITECTURE.md's layer picture lists the engine parts the workflows import
    (`workflows/ ──▶ engine/ (pure code: contracts, tasks, ...; activities by name)`): the list
    is what the code imports, no more and no less."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    written = re.search(r"workflows/\s+──▶ engine/ \(pure code: ([^;)]+)", text)
    assert written, "ARCHITECTURE.md's layer picture no longer says what workflows/ imports"
    named = {word.strip() for word in written.group(1).split(",")}
    imported = imported_engine_parts(ROOT / "workflows")
    assert named == imported, (
        f"ARCHITECTURE.md says workflows/ imports {sorted(named)} from engine/; the code imports "
        f"{sorted(imported)}: correct the picture")


# A section of a root document cited by its title in prose: `the README's "Learning" section`,
# `ARCHITECTURE.md's "Layers"`.
SECTION_CITED = re.compile(r"\b(README|ARCHITECTURE)(?:\.md)?'s \"([^\"]+)\"")


def cited_sections_missing(text: str) -> list[str]:
    missing = []
    for doc, title in SECTION_CITED.findall(text):
        headings = re.findall(r"^#{1,6}\s+(.*?)\s*$", (ROOT / f"{doc}.md").read_text(
            encoding="utf-8"), flags=re.MULTILINE)
        if not any(h.lower().startswith(title.lower()) for h in headings):
            missing.append(f'{doc}.md "{title}"')
    return missing


def test_every_section_of_a_root_document_cited_by_title_exists() -> None:
    problems = [f"{where}: {name}" for where, text in _named_in_docs()
                for name in cited_sections_missing(text)]
    problems += [f"{page.relative_to(ROOT)}: {name}" for page in _tracked() if page.suffix == ".md"
                 for name in cited_sections_missing(page.read_text(encoding="utf-8"))]
    assert not problems, "sections cited that do not exist:\n" + "\n".join(problems)


def test_a_cited_section_that_is_gone_is_caught() -> None:
    assert cited_sections_missing('as the README\'s "Learning" section says; ARCHITECTURE.md\'s '
                                  '"Layers" and the README\'s "Quick start"') == [
        'README.md "Learning"']

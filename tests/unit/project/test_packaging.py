"""What `pip install` puts into site-packages: one distinctive namespace, nothing generic.

The repository's folders are called engine/, activities/, workflows/ and trainer/; installed
under those names they would collide with other packages (`workflows` is llama-index-workflows'
import name, `trainer` Coqui's). The wheel built here is the one pip would install.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.paths import ROOT

FOLDERS = ("engine", "activities", "workflows", "trainer", "runtime")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # A copy of the tree, so the build's scratch folders never land in the checkout.
    src = out / "src"
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others",
                            "--exclude-standard"], check=True, capture_output=True,
                           text=True).stdout.splitlines()
    for name in files:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes((ROOT / name).read_bytes())
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True, capture_output=True)
    (built,) = out.glob("conductor_engine-*.whl")
    return built


def test_the_wheel_installs_one_namespace_and_no_generic_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"conductor_engine"}
    # every source file and the data files the engine reads at run time are in it
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            assert f"conductor_engine/{path.relative_to(ROOT).as_posix()}" in names, path
    assert "conductor_engine/__init__.py" in names  # the public face
    assert "conductor_engine/engine/providers/pools/default.toml" in names
    assert "conductor_engine/engine/tasks/suites/paper.toml" in names
    assert "conductor_engine/engine/storage/migrations/001_traces.sql" in names


def test_the_installed_project_imports_beside_modules_named_like_its_folders(
    wheel: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(site), str(wheel)], check=True, capture_output=True)
    others = tmp_path / "others"
    others.mkdir()
    for folder in FOLDERS:  # someone else's packages with the generic names
        (others / f"{folder}.py").write_text(f"OWNER = 'not the conductor engine: {folder}'\n")
    probe = (
        "import conductor_engine.runtime.worker, conductor_engine.trainer.service\n"
        "import conductor_engine.engine as e, engine, workflows, activities, trainer\n"
        f"assert e.__file__.startswith({str(site)!r}), e.__file__\n"
        "assert all(m.OWNER.startswith('not the') for m in (engine, workflows, activities,"
        " trainer))\n"
        "from conductor_engine.engine.providers.pool import Pool\n"
        "assert Pool.load().conductor.id\n"  # the shipped pool file came along
        "from conductor_engine import ConductorClient, RunOptions, RunResult, Settings, Task\n"
        "assert Task(question='q', options=RunOptions()).question == 'q'\n"  # the public face
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": f"{site}:{others}"})
    assert proc.returncode == 0, proc.stderr


def test_the_public_face_names_what_a_user_imports_and_loads_it_on_first_use() -> None:
    """`from conductor_engine import ConductorClient, Task, ...` gives the defining modules'
    objects, and importing the package alone loads none of them (the workflow sandbox imports
    it as the parent of conductor_engine.workflows)."""
    probe = (
        "import sys, conductor_engine\n"
        "assert not [m for m in sys.modules if m.startswith('conductor_engine.')], sys.modules\n"
        "from conductor_engine import ConductorClient, RunFailed, RunOptions, RunResult, Settings,"
        " Task\n"
        "from conductor_engine.runtime.client import ConductorClient as C\n"
        "from conductor_engine.engine.contracts.tasks import Task as T\n"
        "assert ConductorClient is C and Task is T\n"
        "assert sorted(conductor_engine.__all__) == sorted(['ConductorClient', 'RunFailed',"
        " 'RunOptions', 'RunResult', 'Settings', 'Task'])\n"
        "try:\n    conductor_engine.Nothing\nexcept AttributeError as e:\n    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT.parent)
    assert proc.returncode == 0, proc.stderr
    assert "has no attribute 'Nothing'" in proc.stdout

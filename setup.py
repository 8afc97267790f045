"""Installs the repository's five folders under one package, `conductor_engine`.

The folders keep the names the project card gives them (engine/, activities/, workflows/,
trainer/; and runtime/, the edge where processes are assembled: CLI, client, serve, worker),
but those are generic import names other packages own (`workflows` is llama-index-workflows',
`trainer` Coqui's). So nothing installs at the top level: engine/ becomes
`conductor_engine.engine`, activities/ `conductor_engine.activities`, and so on, subpackages found
here so a new one needs no edit. The package itself is the folder conductor_engine/: its
`__init__.py` is the public face (`from conductor_engine import ConductorClient, Task, ...`).
Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = ("engine", "activities", "workflows", "trainer", "runtime")
NAMESPACE = "conductor_engine"

setup(
    packages=[NAMESPACE,
              *(f"{NAMESPACE}.{p}" for p in find_packages(include=[f"{f}*" for f in FOLDERS]))],
    package_dir={f"{NAMESPACE}.{f}": f for f in FOLDERS},
    package_data={
        f"{NAMESPACE}.engine.providers.pools": ["*.toml"],
        f"{NAMESPACE}.engine.tasks.suites": ["*.toml"],
        f"{NAMESPACE}.engine.storage": ["migrations/*.sql"],
    },
)

"""What this machine offers for isolation, and which backend runs candidates.

The choice is made by a probe: a trivial job run through each backend in turn, end to end. A
probe that works is kept for the life of the process; one that fails is not cached: the next
run probes again (a tool may have been installed, a transient failure may have passed). With no
backend working, runs are refused (a verifier error that says what to do) unless the user opted
into `unconfined` explicitly: fail closed.

Processes and memory of a whole run: each run gets cgroups of its own, a `pids` one (RLIMIT_NPROC
is not enforced for root) and a `memory` one (RLIMIT_AS is per process: six children of 400 MB
would hold 2.4 GB under a 512 MB limit), v1 hierarchies or cgroup v2. They are made where this
process may write: under its own cgroup (a container's, or one delegated to a non-root worker),
else at the hierarchy's root. A sandbox backend without both is refused (fail closed): a run's
`memory_mb` that cannot be enforced is not silently weakened to a per-process limit. Non-root
workers also run the candidate in a user namespace, where RLIMIT_NPROC counts only the sandbox's
own processes.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from conductor_engine.engine.rewards.sandbox.backends import SYSTEM_PATH, Backend

Choice = Literal["auto", "bwrap", "namespaces", "unconfined"]


class SandboxConfig(BaseModel):
    """How candidates are isolated (settings `code_sandbox`, `code_sandbox_uid`)."""

    backend: Choice = Field(
        default="auto",
        description="auto: bwrap (non-root, when installed), else namespaces; unconfined: "
        "limits only, an explicit opt-out for code you trust")
    uid: int = Field(default=65534, ge=1, description="the candidate's uid when the worker is root")
    gid: int = Field(default=65534, ge=1)


class Isolation(BaseModel):
    """The probe's answer: the backend in force, or why none is."""

    backend: Backend | None = None
    root: bool = False
    tools: dict[str, str] = Field(default_factory=dict)
    cgroups: dict[str, str] = Field(
        default_factory=dict, description="controller (pids, memory) → where a run's cgroup goes")
    problems: dict[str, str] = Field(default_factory=dict, description="backend → why not")

    @property
    def refusal(self) -> str:
        tried = "; ".join(f"{b}: {why}" for b, why in self.problems.items()) or "none found"
        return (f"no code sandbox is available ({tried}). Install bubblewrap (Debian: "
                "`apt-get install bubblewrap`) or allow user namespaces (unshare), and give the "
                "worker cgroups it may write (run it as root, or delegate it one), and "
                "libseccomp2; to run model-written code without isolation anyway, set "
                "code_sandbox = \"unconfined\" (never for training: the policy can forge "
                "rewards and read the host)")


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), SYSTEM_PATH]))


CONTROLLERS = ("pids", "memory")


def _own_cgroups() -> dict[str, str]:
    """hierarchy ('' for v2, else its controllers) → this process's cgroup path in it."""
    own: dict[str, str] = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            for name in names.split(",") if names else [""]:
                own[name] = path
    except (OSError, ValueError):
        pass
    return own


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def cgroup_parents() -> dict[str, str]:
    """controller → a directory where this process may make a child cgroup that has it: its own
    cgroup first (limits above it keep holding), then its parent (a delegated cgroup v2 keeps the
    worker in a leaf below it), then the hierarchy's root."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return {}
    own, found = _own_cgroups(), {}
    for line in mounts:
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("cgroup", "cgroup2"):
            continue
        target, options = Path(fields[1]), fields[3].split(",")
        for controller in CONTROLLERS:
            if controller in found:
                continue
            if fields[2] == "cgroup" and controller not in options:
                continue
            mine = target / own.get(controller if fields[2] == "cgroup" else "", "/").lstrip("/")
            places = [mine, mine.parent, target] if mine != target else [target]
            for place in places:
                control = place / "cgroup.subtree_control"
                if fields[2] == "cgroup2" and not (
                        control.exists() and controller in control.read_text().split()):
                    continue
                if _writable(place):
                    found[controller] = str(place)
                    break
    return found


def cgroup_problem(iso: Isolation) -> str:
    """'' when runs can get both cgroups, else what is missing and what to do."""
    if missing := [c for c in CONTROLLERS if c not in iso.cgroups]:
        who = "root" if iso.root else f"uid {os.getuid()}"
        return (f"no writable {' and '.join(missing)} cgroup for {who}: a run's processes and "
                "memory (memory_mb) cannot be bounded; run the worker as root with /sys/fs/cgroup "
                "writable, or in a cgroup delegated to its uid")
    return ""


def candidates(config: SandboxConfig, root: bool) -> list[Backend]:
    if config.backend == "auto":
        return ["namespaces"] if root else ["bwrap", "namespaces"]
    return [config.backend]


def survey() -> Isolation:
    """Tools and cgroups, before any probe."""
    root = os.geteuid() == 0 if hasattr(os, "geteuid") else False
    tools = {n: p for n in ("bwrap", "unshare", "setpriv", "sh") if (p := _which(n))}
    return Isolation(root=root, tools=tools, cgroups=cgroup_parents())


class _State:
    """The working backend once a probe succeeded (kept), and a lock so concurrent runs probe
    once."""

    def __init__(self) -> None:
        self.config = SandboxConfig()
        self.found: Isolation | None = None
        self.lock = threading.Lock()


STATE = _State()


def configure(config: SandboxConfig) -> None:
    """Set how candidates are isolated (the worker calls this at start from its settings)."""
    with STATE.lock:
        STATE.config = config
        STATE.found = None

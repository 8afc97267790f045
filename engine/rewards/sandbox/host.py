"""What this machine offers for isolation, and which backend runs candidates.

The choice is made by a probe: a trivial job run through each backend in turn, end to end. A
probe that works is kept for the life of the process; one that fails is not cached: the next
run probes again (a tool may have been installed, a transient failure may have passed). With no
backend working, runs are refused (a verifier error that says what to do) unless the user opted
into `unconfined` explicitly: fail closed.

Process count (fork bombs): RLIMIT_NPROC is not enforced for root, so a root worker puts each
run in a pids cgroup of its own (v1 `pids` hierarchy or cgroup v2 with the pids controller) and
refuses to run code without one. Non-root workers run the candidate in a user namespace, where
RLIMIT_NPROC counts only the sandbox's own processes.
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
    pids_cgroup: str | None = None
    problems: dict[str, str] = Field(default_factory=dict, description="backend → why not")

    @property
    def refusal(self) -> str:
        tried = "; ".join(f"{b}: {why}" for b, why in self.problems.items()) or "none found"
        return (f"no code sandbox is available ({tried}). Install bubblewrap (Debian: "
                "`apt-get install bubblewrap`) or allow user namespaces (unshare), or run the "
                "worker as root; to run model-written code without isolation anyway, set "
                "code_sandbox = \"unconfined\" (never for training: the policy can forge "
                "rewards and read the host)")


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), SYSTEM_PATH]))


def pids_cgroup_root() -> str | None:
    """Where this root process may make a pids cgroup: the v1 `pids` hierarchy or a cgroup v2
    root that hands the pids controller to its children."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) < 4:
            continue
        target, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype == "cgroup" and "pids" in options and os.access(target, os.W_OK):
            return target
        if fstype == "cgroup2":
            control = Path(target, "cgroup.subtree_control")
            if control.exists() and "pids" in control.read_text().split() \
                    and os.access(target, os.W_OK):
                return target
    return None


def candidates(config: SandboxConfig, root: bool) -> list[Backend]:
    if config.backend == "auto":
        return ["namespaces"] if root else ["bwrap", "namespaces"]
    return [config.backend]


def survey() -> Isolation:
    """Tools and cgroups, before any probe."""
    root = os.geteuid() == 0 if hasattr(os, "geteuid") else False
    tools = {n: p for n in ("bwrap", "unshare", "setpriv", "sh") if (p := _which(n))}
    return Isolation(root=root, tools=tools, pids_cgroup=pids_cgroup_root() if root else None)


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

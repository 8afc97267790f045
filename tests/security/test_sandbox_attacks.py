"""The attack suite: every attack in tests/security/attacks.py scores 0 or is refused, leaves no
process behind and no trace on the host, as root and as an unprivileged user, through each
backend this machine has, and with no sandbox at all (which must refuse)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conductor_engine.engine.rewards import sandbox
from conductor_engine.engine.rewards.sandbox.backends import RUNNER_MARK
from tests.security.attacks import ATTACKS, run_all

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="switching users needs root")
PROJECT = Path(__file__).resolve().parents[2]


class Host:
    """What an attack would reach on this host, and how to tell whether it did."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="conductor-attack-", dir="/tmp"))
        self.dir.chmod(0o777)
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(str(self.dir / "host.sock"))
        (self.dir / "host.sock").chmod(0o777)
        self.abstract_name = f"conductor-attack-{uuid.uuid4().hex}"
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + self.abstract_name)
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        for s in (self.unix, self.abstract, self.tcp):
            s.listen()
            s.setblocking(False)
        home = Path(os.path.expanduser("~"))
        self.home_files = [str(p) for p in sorted(home.iterdir())[:20]
                           if not str(Path(sys.base_prefix).resolve()).startswith(str(p))]

    def context(self) -> dict[str, Any]:
        return {"unix": str(self.dir / "host.sock"), "abstract": self.abstract_name,
                "port": self.tcp.getsockname()[1], "writable": str(self.dir),
                "home_files": self.home_files, "disk_budget": 80 << 20}

    def untouched(self) -> list[str]:
        """What the attacks did to the host ([] when nothing)."""
        found = []
        for name, s in (("unix", self.unix), ("abstract", self.abstract), ("tcp", self.tcp)):
            try:
                conn, _ = s.accept()
                conn.close()
                found.append(f"a connection to the {name} socket")
            except BlockingIOError:
                pass
        for d in (self.dir, Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")):
            if (d / "conductor-attack").exists():
                found.append(f"a file written in {d}")
        return found

    def close(self) -> None:
        for s in (self.unix, self.abstract, self.tcp):
            s.close()
        for p in self.dir.iterdir():
            p.unlink()
        self.dir.rmdir()


@pytest.fixture
def host() -> Iterator[Host]:
    h = Host()
    yield h
    h.close()


OWN_TOOLS = str(PROJECT / "engine" / "rewards" / "sandbox")  # _setup.py, _reaper.py


def leftovers() -> list[str]:
    """Sandbox processes of this checkout still alive (runner, candidate, setup), after a short
    grace for reaping."""
    deadline = time.monotonic() + 5
    while True:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if RUNNER_MARK in text or OWN_TOOLS in text:
                found.append(text)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def assert_contained(results: dict[str, dict[str, Any]], host: Host, configuration: str,
                capsys: pytest.CaptureFixture[str]) -> None:
    """Every attack scored 0 as the candidate's own failure (a verifier error would take the
    answer out of its group: a way to escape a bad score), and the suite counts those contained."""
    assert set(results) == set(ATTACKS)
    won = {name: r["reason"] for name, r in results.items()
           if r["score"] != 0.0 or r["correct"] is not False}
    excluded = {name: r["reason"] for name, r in results.items()
                if r["reason"].startswith("verifier error")}
    with capsys.disabled():
        print(f"\nattack suite, {configuration}: {len(results)} tried, "
              f"{len(results) - len(won) - len(excluded)} contained")
    assert won == {}, f"attacks that scored: {won}"
    assert excluded == {}, f"attacks that turned their failure into a verifier error: {excluded}"
    for name, r in results.items():
        assert "$blob" not in json.dumps(r["details"]), name
    assert host.untouched() == []
    assert leftovers() == []


def as_unprivileged(backend: str, host: Host, *broken: str, cgroup: bool = True) -> dict[str, Any]:
    options = [a for tool in broken for a in ("--break", tool)]
    options += [] if cgroup else ["--no-cgroup"]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.security.unprivileged", *options, "--",
         "tests.security.attacks", backend, json.dumps(host.context())],
        cwd=PROJECT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TEST_ATTACK_KEY": "sk-in-the-workers-environment"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@needs_root
def test_attacks_fail_as_root_through_our_namespaces(
        host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    iso = sandbox.isolation()
    assert iso.backend == "namespaces", iso.problems
    results = run_all(host.context())
    assert results["host home"]["details"]["isolation"]["user"] == "uid 65534"
    assert_contained(results, host, "root, namespaces", capsys)


@needs_root
@pytest.mark.parametrize("backend", ["bwrap", "namespaces"])
def test_attacks_fail_as_an_unprivileged_user(
        backend: str, host: Host, capsys: pytest.CaptureFixture[str]) -> None:
    if backend == "bwrap" and not sandbox.isolation().tools.get("bwrap"):
        pytest.skip("bubblewrap is not installed")
    out = as_unprivileged(backend, host)
    assert out["isolation"]["backend"] == backend, out["isolation"]
    assert_contained(out["results"], host, f"uid 65534, {backend}", capsys)


@needs_root
def test_with_no_sandbox_every_attack_is_refused(host: Host) -> None:
    """unshare and bwrap fail (as where user namespaces are forbidden): the verifier refuses."""
    out = as_unprivileged("auto", host, "unshare", "bwrap")
    assert out["isolation"]["backend"] is None
    for name, r in out["results"].items():
        assert r["score"] == 0.0 and r["correct"] is False, name
        assert r["reason"].startswith("verifier error: no code sandbox is available"), name
    assert host.untouched() == []


@needs_root
def test_a_failed_probe_is_retried_not_cached() -> None:
    script = (
        "import subprocess\n"
        "from conductor_engine.engine.rewards import sandbox\n"
        "first = sandbox.isolation().backend\n"
        "subprocess.run(['umount', '/usr/bin/unshare'], check=True)\n"
        "print(first, sandbox.isolation().backend)\n"
    )
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount --bind /bin/false /usr/bin/unshare && exec "$0" -c "$1"', sys.executable,
         script], cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["None", "namespaces"], proc.stderr[-2000:]


@needs_root
def test_without_a_cgroup_an_unprivileged_worker_refuses_to_run_code(host: Host) -> None:
    """No cgroup it may write: a run's memory (memory_mb) and processes cannot be bounded, so
    the sandbox is refused, with what to do, rather than weakened to a per-process limit."""
    out = as_unprivileged("namespaces", host, cgroup=False)
    assert out["isolation"]["backend"] is None
    assert "no writable pids and memory cgroup for uid 65534" in out["isolation"]["problems"][
        "namespaces"]
    for name, r in out["results"].items():
        assert r["score"] == 0.0 and r["correct"] is False, name
        assert r["reason"].startswith("verifier error: no code sandbox is available"), name
    assert host.untouched() == []


@needs_root
@pytest.mark.parametrize(("unprivileged", "backend"), [
    (False, "namespaces"), (True, "namespaces"), (True, "bwrap")])
def test_timed_out_runs_leave_no_zombie(unprivileged: bool, backend: str) -> None:
    """Where the worker is PID 1 (a container without an init), every orphan becomes its child:
    the test process plays that part (a child subreaper) through three timed-out runs."""
    if backend == "bwrap" and not sandbox.isolation().tools.get("bwrap"):
        pytest.skip("bubblewrap is not installed")
    module = ["tests.security.attacks", "--zombies", backend, "3"]
    argv = ([sys.executable, "-m", "tests.security.unprivileged", "--", *module] if unprivileged
            else [sys.executable, "-m", *module])
    proc = subprocess.run(argv, cwd=PROJECT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"zombies": 0}


@pytest.fixture
def unconfined() -> Iterator[None]:
    sandbox.configure(sandbox.SandboxConfig(backend="unconfined"))
    yield
    sandbox.configure(sandbox.SandboxConfig())


def test_a_run_killed_by_a_real_time_signal_is_the_candidate_s_failure(unconfined: None) -> None:
    """Signal 35 has no name in Python's signal.Signals: still the candidate's doing, scored."""
    res = sandbox.run_call_cases("import os\nos.kill(os.getpid(), 35)\n", [("f", [], {})])
    assert res.error is None
    assert res.failure == "killed by signal 35"


def test_without_libseccomp_no_candidate_code_runs() -> None:
    """Fail closed: no filter, no sandbox; the refusal says what to install."""
    script = ("import sys; sys.modules['pyseccomp'] = None\n"
              "from conductor_engine.engine.rewards import sandbox\n"
              "iso = sandbox.isolation()\n"
              "print(iso.backend, iso.problems)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=PROJECT, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.startswith("None "), proc.stderr[-2000:]
    assert "install libseccomp2" in proc.stdout


def test_a_filter_the_kernel_refuses_stops_the_run_before_the_candidate(
        host: Host, unconfined: None) -> None:
    """The runner loads the filter before any candidate code: a broken one is a verifier error
    at setup, and the candidate (which would write a file on the host) never ran."""
    from conductor_engine.engine.rewards.sandbox import run

    iso = sandbox.isolation()
    marker = Path(host.context()["writable"], "conductor-attack")
    job = {"mode": "call", "solution": f"open({str(marker)!r}, 'w').close()\ndef f():\n  pass\n",
           "cases": [{"function": "f", "args": [], "kwargs": {}}]}
    res = run.execute(iso, "unconfined", job, sandbox.SandboxLimits(), program=b"\0" * 3)
    assert res.error is not None and res.error.startswith("sandbox failed to start")
    assert "prctl" in res.error
    assert not marker.exists()

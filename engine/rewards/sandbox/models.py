"""The data of the sandbox: what a run may use, what the runner may say, and what happened.

Every line the runner writes is validated against `Event` (strict types, no extra keys, bounded
sizes) before anything reads it: the runner shares a process, or at least a uid, with the
candidate, so its channel carries hostile input. Nothing from it is stored but plain strings,
numbers and booleans copied out of validated events.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

MAX_TEXT = 1 << 20  # one case's stdout, one return value, as sent by the runner
SHORT = 4000

Short = Annotated[str, StringConstraints(max_length=SHORT)]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
Index = Annotated[int, Field(ge=0, lt=100_000, strict=True)]


class SandboxLimits(BaseModel):
    """What one run may use. Defaults suit a unit test of a small function."""

    timeout_s: float = Field(default=10.0, gt=0, description="wall clock, start-up included")
    case_timeout_s: float | None = Field(
        default=None, gt=0, description="io cases: one case's process (default: timeout_s)")
    memory_mb: int = Field(default=512, ge=64,
                           description="the whole run's memory, all its processes together (a "
                           "memory cgroup, no swap), and each process's address space (RLIMIT_AS)")
    max_processes: int = Field(default=32, ge=4,
                               description="processes and threads, the runner's own included")
    max_file_mb: int = Field(default=16, ge=1, description="largest file written (RLIMIT_FSIZE)")
    scratch_mb: int = Field(default=64, ge=1, description="the /sandbox tmpfs")
    open_files: int = Field(default=256, ge=16)
    output_kb: int = Field(default=256, ge=1, le=MAX_TEXT >> 10,
                           description="io cases: stdout kept per case")
    block_sockets: bool = Field(default=True, description="the in-interpreter audit hook")


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Ready(_Event):
    event: Literal["ready"]


class Failed(_Event):
    event: Literal["failed"]
    stage: Literal["solution", "tests"]
    error: Short


class Collected(_Event):
    event: Literal["collected"]
    tests: list[Annotated[str, StringConstraints(max_length=200)]] = Field(max_length=1000)


class TestEvent(_Event):
    event: Literal["test"]
    name: Annotated[str, StringConstraints(max_length=200)]
    passed: bool
    error: Short


class CallEvent(_Event):
    event: Literal["call"]
    index: Index
    value: Text | None
    error: Short | None


class IoEvent(_Event):
    event: Literal["io"]
    index: Index
    stdout: Text
    truncated: bool
    exit_code: int | None
    timed_out: bool
    stderr: Short


class Done(_Event):
    event: Literal["done"]
    output: Short


Event = Annotated[Ready | Failed | Collected | TestEvent | CallEvent | IoEvent | Done,
                  Field(discriminator="event")]


class Outcome(BaseModel):
    """One assert-style test."""

    name: str
    passed: bool
    error: str = ""


class SandboxResult(BaseModel):
    """What happened to one run. `error` is set only when the sandbox itself failed or refused
    (a verifier error); everything the candidate did, malformed runner output included, shows
    as its own failure."""

    tests: list[Outcome] = Field(default_factory=list)
    calls: list[CallEvent | None] = Field(default_factory=list, description="by case index")
    io: list[IoEvent | None] = Field(default_factory=list, description="by case index")
    failure: str = Field(default="", description="why the run stopped early (import, timeout)")
    timed_out: bool = False
    exit_code: int | None = None
    error: str | None = None
    output_tail: str = ""
    isolation: dict[str, str] = Field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def total(self) -> int:
        return len(self.tests)

    @property
    def passed(self) -> int:
        return sum(t.passed for t in self.tests)

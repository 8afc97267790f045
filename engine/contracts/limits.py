"""Temporal's per-workflow limits, and the bounds that keep the batch and training workflows
under them by construction.

A limit that a workflow crosses is not a slow-down: the server rejects the whole workflow task
that would cross it (none of its commands is accepted), the SDK retries that task, and it fails
the same way forever. So every count that the engine lets a user choose, and that turns into
open children, pending activities or bytes in one history, is bounded here, and the client, the
CLI and the workflows' input models all check against these constants.
"""

from __future__ import annotations

from pydantic import ValidationInfo

MAX_CONCURRENCY = 2000
"""The most runs a BatchWorkflow or TrainingWorkflow keeps in flight (`concurrency`).

Each run in flight is one pending child workflow of the batch or training workflow. Temporal
refuses a workflow more than `limit.numPendingChildExecutions.error` pending children (dynamic
config; 2,000 by default, in the open-source server and in Temporal Cloud alike), and likewise
more than `limit.numPendingActivities.error` (2,000) pending activities. A workflow task that
would start the 2,001st child is failed whole and retried forever: the run is stuck. The batch
workflow starts a child only while fewer than `concurrency` are open, and the training workflow
only inside a semaphore of `concurrency` slots, so neither ever has more pending children than
this; each has at most one pending activity of its own (reading tasks, the report, the update).
A server configured with a higher limit still gets at most this many."""

MAX_REHEARSAL_RUNS = 4000
"""The most fixed-plan runs a training run's rehearsal starts before its warm-up (candidate
plans x `[warmup] rehearse`). Every one is a child of the training workflow's first run, a
handful of events each in its history (Temporal fails a history past 50,000 events), and the
candidate plans come back to the workflow in one activity result. The trainer refuses a larger
rehearsal before it returns a plan (trainer/service.py `rehearsal_plans`)."""

TRAINING_PLAN_DEADLINE_S = 86400.0
"""How long a plan of a training run's own runs (rollouts, warm-up samples, held-out runs) may
take, its wait for a conductor slot included (RunOptions.plan_deadline_s). The run starts up to
`concurrency` of them at once and a local conductor plans a batch at a time, so on a busy CPU
the last of a fan-out waits many plan times; a step's 15 minutes (step_deadline_s) lost 3 of
192 warm-up samples that way with three benchmarks on two cores. Like its updates, which wait
for the trainer, the run waits for its conductor; a day marks a conductor that is gone, not
slow."""

MAX_WARMUP_SAMPLES = 4000
"""The most exploring runs one warm-up round starts (training tasks x `[warmup] samples`): each
is a child of the training workflow's run for that round (every round continues as new), so
with the round's rehearsal (MAX_REHEARSAL_RUNS) its history stays far under 50,000 events. The
training workflow refuses a larger round before it starts a run."""

START_BYTES_PER_WORKFLOW_TASK = 2 * 1024 * 1024
"""The most bytes of child-start commands (each carries its child's task) one workflow task of
the batch or training workflow sends; the next wave starts once these children have started.

A workflow task's commands reach the server in one gRPC message, which may not exceed 4 MiB
(`grpc: received message after decompression larger than max 4194304`). Past it the SDK fails
the workflow task (cause GRPC_MESSAGE_TOO_LARGE) and the server terminates the workflow:
measured on the dev server, 2,000 children of 2 KB tasks started in one workflow task do exactly
that. Half the limit leaves room for what the estimate (workflows/children.py) misses."""

CHILD_SUMMARY_TEXT_CHARS = 500
"""How much of a run's answer and error a batch or training child returns to its parent (its
result is a summary: engine/contracts/records.py, RunResult.summary). The whole run is in its
trace; this keeps a child's completion event in the parent's history to a few KB, so that the
parent's history stays far below Temporal's 10 MB warning (50 MB limit, 51,200 events) however
long the answers."""

TASKS_PER_CHUNK = 500
"""Most tasks per chunk of a task list in the blob store (engine/storage/task_list_chunks.py)."""

CHUNK_BYTES = 4 * 1024 * 1024
"""Most bytes per chunk of a task list (a single larger task makes a chunk of its own). A chunk is
what one `read_tasks` activity returns at most, so it stays far below the payload codec's 50 MiB
cap on one payload (payloads over `payload_threshold` go to the blob store, and history keeps a
reference)."""


def concurrency_error(concurrency: int) -> str | None:
    """One line saying why `concurrency` cannot be used, or None when it can."""
    if concurrency < 1:
        return f"concurrency must be at least 1 (got {concurrency})"
    if concurrency > MAX_CONCURRENCY:
        return (f"concurrency {concurrency} is over {MAX_CONCURRENCY}: every run in flight is a "
                f"child workflow, and Temporal allows a workflow at most {MAX_CONCURRENCY} "
                f"pending children (limit.numPendingChildExecutions.error); past it the batch or "
                f"training run would be stuck. Use --concurrency {MAX_CONCURRENCY} or less")
    return None


def recorded_concurrency(value: object, info: ValidationInfo) -> object:
    """A `concurrency` over MAX_CONCURRENCY read back as JSON: MAX_CONCURRENCY. Workflow inputs
    are decoded from JSON, and those of runs started before the bound (a batch allowed 10,000, a
    training run any number) are still in their histories: such a run decodes, and goes on at
    the bound, rather than failing every workflow task. Built in Python (the client, the CLI,
    tests), the value is left to the field's bound, which refuses it."""
    if info.mode == "json" and isinstance(value, int) and value > MAX_CONCURRENCY:
        return MAX_CONCURRENCY
    return value


MAX_TASK_BYTES = 1024 * 1024
"""The most bytes one task may be as JSON (the form it travels in): question, context,
reference, options and tags together. Every client refuses a larger one before anything starts
(engine/tasks/checks.py), and ConductWorkflow fails a larger one at once, non-retryably.

Why a bound, and why this one: a task travels whole in several payloads of one run (the
workflow's input, every plan request, the record request and the result each hold it), and the
SDK's storage driver refuses any payload over 50 MiB. A 30 MB question made the workflow task
that schedules the record activity fail on that cap, and a failed workflow task is retried
forever: the run stayed Running and a cancel could never be processed. 1 MiB keeps the largest
of these payloads a few MiB (far below that cap, and below Temporal's 2 MB limit for the task
alone), and is more text than any conductor model reads (about 250k tokens)."""

MAX_JSON_REQUEST_BYTES = 8 * MAX_TASK_BYTES
"""The most bytes of JSON text that may carry one task: an HTTP request body of `conductor
serve`, a line of a task file. JSON may spell each byte of a task as a six-byte escape
(`\\u0041`), so room for that and the request's own fields; a larger body is refused before it
is read whole."""


def size_label(n: int) -> str:
    """Bytes exactly, and as a person reads them: `31,457,321 bytes (30.0 MiB)`. Exact, so a
    size one byte over a bound never reads the same as the bound."""
    if n >= 1024 * 1024:
        return f"{n:,} bytes ({n / (1024 * 1024):.1f} MiB)"
    if n >= 1024:
        return f"{n:,} bytes ({n / 1024:.1f} KiB)"
    return f"{n:,} bytes"

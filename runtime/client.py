"""The Python API for submitting runs and reading their results; the CLI is built on it.

    async with await ConductorClient.connect() as conductor:   # or: conductor = await ...
        workflow_id = await conductor.submit(Task(question="..."))
        result = await conductor.result(workflow_id)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, get_args

from pydantic import BaseModel, Field
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from conductor_engine.engine.contracts.activities import RecordRequest
from conductor_engine.engine.contracts.limits import concurrency_error
from conductor_engine.engine.contracts.names import (
    BATCH_WORKFLOW,
    CONDUCT_WORKFLOW,
    PROGRESS_QUERY,
    RECORD_ACTIVITY,
    STOP_SIGNAL,
    TRAINING_WORKFLOW,
    batch_workflow_id,
    conduct_workflow_id,
    pool_task_queue,
    training_workflow_id,
)
from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.engine.contracts.search_attributes import (
    BATCH,
    REWARD,
    task_search_attributes,
)
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.task_list_refs import TaskList
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.training import Recipe, interleave_tags, split_heldout
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.registry import ProviderName, capabilities, listed
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.blobs import blob_store
from conductor_engine.engine.storage.policies import PolicyRegistry
from conductor_engine.engine.storage.task_list_chunks import put_task_list
from conductor_engine.engine.tasks.checks import TaskTooLarge, check_size, check_storable
from conductor_engine.engine.text import shorten
from conductor_engine.runtime.connection import ConnectError, connect_temporal

__all__ = ["ConductorClient", "ConnectError", "RunFailed", "TaskTooLarge", "TrainingOptions",
           "TrainingPlan", "connect_temporal", "plan_training"]

if TYPE_CHECKING:
    from conductor_engine.workflows.batch import BatchProgress
    from conductor_engine.workflows.train import TrainInput, TrainProgress

P = TypeVar("P", bound=BaseModel)


class RunFailed(RuntimeError):
    """A run ended in failure (for example a step that exhausted its retries)."""

    def __init__(self, workflow_id: str, message: str) -> None:
        super().__init__(f"run {workflow_id} failed: {message}")
        self.workflow_id = workflow_id
        self.reason = message


@dataclass
class RunStatus:
    workflow_id: str
    run_id: str | None
    status: str
    progress: RunResult | None


@dataclass
class RunInfo:
    workflow_id: str
    run_id: str
    status: str
    started: datetime
    closed: datetime | None
    reward: float | None


def _check_tasks(tasks: Sequence[Task]) -> None:
    """ValueError(`field tasks.N.F: why`) for the first task with text that cannot be stored,
    TaskTooLarge for the first over MAX_TASK_BYTES (engine/tasks/checks.py): a task built in
    Python gets the checks a task file's line gets."""
    for index, task in enumerate(tasks):
        check_storable(task, f"tasks.{index}")
        check_size(task, f"tasks.{index} ({shorten(task.id, 60)!r})")


def task_queue_of(settings: Settings, pool: Pool) -> str:
    """The task queue of `pool` under the settings' queue stem (`pool_task_queue` in
    engine/contracts/names.py): the one a worker serving `pool` polls (runtime/worker.py) and
    a client naming `pool` starts runs on."""
    return pool_task_queue(settings.task_queue, pool.model_dump(mode="json"))


def workflow_id_for(task: Task) -> str:
    """The workflow id a task's run gets unless the caller names one."""
    return conduct_workflow_id(task.id)


class TrainingOptions(BaseModel):
    """What starting (or resuming) training run `name` takes besides its tasks: a recipe and
    the overrides `conductor train start` offers on top of it (None: the recipe's own)."""

    name: str
    recipe: Recipe = Field(default_factory=Recipe)
    recipe_given: bool = Field(default=False, description="the recipe came from a file: its "
                               "base model and staleness are the user's, not defaults")
    base: str | None = Field(default=None, description="the model the conductor serves")
    iterations: int = 20
    group_size: int | None = None
    tasks_per_iteration: int | None = None
    learning_rate: float | None = None
    from_traces: bool = False
    concurrency: int = 64
    holdout: float | None = None
    eval_every: int | None = None
    seed: int = Field(default=0, description="shuffles the task order (the tags taking turns)")


class TrainingPlan(BaseModel):
    """A training run ready to start: its options, the recipe with the overrides applied, and
    the tasks split into those trained on and those held out."""

    options: TrainingOptions
    recipe: Recipe
    tasks: list[Task]
    heldout: list[Task]


def plan_training(opts: TrainingOptions, pool: Pool, tasks: Sequence[Task]) -> TrainingPlan:
    """The recipe with `opts`' overrides and the tasks, interleaved by tag and split into
    trained and held out. ValueError (one line, what to do) for a base model the conductor
    cannot be trained from, or a held-out share that holds nothing out."""
    r = opts.recipe.model_copy(deep=True)
    r.policy.base = trained_base_model(pool, opts.base or (r.policy.base if opts.recipe_given
                                                            else None))
    if opts.group_size is not None:
        r.rollouts.group_size = opts.group_size
    if opts.tasks_per_iteration is not None:
        r.rollouts.groups_per_update = opts.tasks_per_iteration
    if opts.learning_rate is not None:
        r.loss.learning_rate = opts.learning_rate
    if opts.from_traces and not opts.recipe_given:
        r.rollouts.max_staleness = 1_000_000  # every stored version's groups are fair game
    if opts.holdout is not None:
        r.heldout.fraction = opts.holdout
    if opts.eval_every is not None:
        r.heldout.every = opts.eval_every
    if r.rollouts.explore and not opts.from_traces \
            and not capabilities(pool.conductor.provider).explores:
        raise ValueError(f"the recipe's [rollouts] explore = {r.rollouts.explore} needs a local "
                         f"conductor (the sampler explores and records the mixture's "
                         f"log-probs); {pool.conductor.id!r} runs on "
                         f"{pool.conductor.provider}: set explore = 0")
    if r.rollouts.force_shapes and not opts.from_traces \
            and not capabilities(pool.conductor.provider).explores:
        raise ValueError(f"the recipe's [rollouts] force_shapes = {r.rollouts.force_shapes} "
                         f"needs a local conductor (its sampler forces the shape); "
                         f"{pool.conductor.id!r} runs on {pool.conductor.provider}: set "
                         f"force_shapes = 0")
    train, heldout = interleave_tags(tasks, opts.seed), list[Task]()
    if train and r.heldout.fraction > 0 and not opts.from_traces:
        train, heldout = split_heldout(train, r.heldout.fraction, r.heldout.seed)
        if not heldout:
            raise ValueError(f"--holdout {r.heldout.fraction}: no task could be held out of "
                             f"{len(train)} (each tag needs at least two tasks)")
    return TrainingPlan(options=opts, recipe=r, tasks=train, heldout=heldout)


def trained_base_model(pool: Pool, given: str | None) -> str:
    """What the trainer loads: the conductor's own model for a local conductor (the local
    provider applies each version to exactly that), else a Hugging Face id to give.
    ValueError (one line) when that cannot be."""
    conductor = pool.conductor
    serves = capabilities(conductor.provider).trained_versions
    if serves == "checkpoint":
        if given and given != conductor.model:
            raise ValueError(f"--base {given} differs from the conductor's model "
                             f"{conductor.model}; the {conductor.provider} provider applies "
                             f"trained versions to the conductor's model")
        return conductor.model
    if serves == "served":
        if not given:
            raise ValueError(f"the conductor {conductor.id!r} is served by "
                             f"{conductor.base_url}; give --base with the Hugging Face id or "
                             f"directory of the model it serves ({conductor.model}?)")
        return given
    trainable = [p for p in get_args(ProviderName) if capabilities(p).trained_versions]
    raise ValueError(f"the conductor {conductor.id!r} runs on {conductor.provider}, whose "
                     f"weights cannot be trained here; use a {listed(trainable, 'or')} "
                     f"conductor")


class ConductorClient:
    """Starts runs on the task queue of one pool: `pool` when given, else the pool file the
    settings name (`pool_file`; unset: the shipped pool), read when a run is first started. A
    worker serves only its own pool's queue (`conductor up --pool FILE`), so name the same pool
    file here as there."""

    def __init__(self, client: Client, settings: Settings, pool: Pool | None = None) -> None:
        self.client, self.settings, self.pool = client, settings, pool
        self._queues: dict[tuple[str, str | None], str] = {}

    @classmethod
    async def connect(
        cls, settings: Settings | None = None, *, pool: Pool | None = None,
        start_embedded: bool = True, wait_s: float = 0.0,
    ) -> ConductorClient:
        """Connect (connection.connect_temporal: `wait_s` is how long a server that is not up
        yet is waited for)."""
        settings = settings or Settings()
        return cls(await connect_temporal(settings, start_embedded=start_embedded,
                                          wait_s=wait_s), settings, pool)

    @property
    def task_queue(self) -> str:
        """Where this client starts runs: its pool's queue (`task_queue_of`). PoolError (one
        line) when the settings' pool file cannot be read. The settings' pool file is read
        once per path."""
        if self.pool is not None:
            return task_queue_of(self.settings, self.pool)
        path = self.settings.pool_file
        key = (self.settings.task_queue, None if path is None else str(path))
        if key not in self._queues:
            self._queues[key] = task_queue_of(self.settings, Pool.load(path))
        return self._queues[key]

    async def __aenter__(self) -> ConductorClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def submit(self, task: Task, *, workflow_id: str | None = None) -> str:
        """Start a run and return its workflow id at once. ValueError (one line, as a task file
        gets: `field tags.0: holds a NUL character ...`) for a task with text that cannot be
        stored, and TaskTooLarge (a ValueError) for one over MAX_TASK_BYTES as JSON
        (engine/contracts/limits.py), before anything starts."""
        check_storable(task)
        check_size(task, f"task {shorten(task.id, 60)!r}")
        wid = workflow_id or workflow_id_for(task)
        await self.client.start_workflow(
            CONDUCT_WORKFLOW, task, id=wid, task_queue=self.task_queue,
            static_summary=" ".join(task.question.split())[:200],
            search_attributes=task_search_attributes(task),
        )
        return wid

    async def cancel(self, workflow_id: str, reason: str = "cancelled by the user") -> None:
        """Ask a run to stop: running agent calls are cancelled (they heartbeat), the run
        records a cancelled trace and ends as cancelled."""
        try:
            await self.client.get_workflow_handle(workflow_id).cancel(reason=reason)
        except RPCError as e:
            raise LookupError(f"cannot cancel {workflow_id!r}: {e.message}") from e

    async def list(
        self, *, batch: str | None = None, query: str | None = None, limit: int = 100
    ) -> list[RunInfo]:
        """Runs, newest first: every run of a batch, or any visibility query (the UI's
        filter syntax, e.g. `ConductorReward = 0 AND ExecutionStatus = "Completed"`)."""
        clauses = [f'WorkflowType = "{CONDUCT_WORKFLOW}"']
        if batch is not None:
            clauses.append(f'{BATCH.name} = "{batch}"')
        if query:
            clauses.append(f"({query})")
        out: list[RunInfo] = []
        async for wf in self.client.list_workflows(" AND ".join(clauses), limit=limit):
            status = wf.status.name.lower() if wf.status else "unknown"
            reward = wf.typed_search_attributes.get(REWARD)
            out.append(RunInfo(wf.id, wf.run_id, status, wf.start_time, wf.close_time, reward))
        return out

    async def result(self, workflow_id: str) -> RunResult:
        """Wait for a run and return its whole result; raises RunFailed with the reason. A
        batch's or training run's child returns only a summary (RunResult.summary); its whole
        result is read back from the run's own history (the record activity's input)."""
        handle = self.client.get_workflow_handle(workflow_id, result_type=RunResult)
        try:
            res = await handle.result()
        except WorkflowFailureError as e:
            # The workflow's own ApplicationError names the step, the agent and the cause.
            cause = e.cause
            message = getattr(cause, "message", None) or str(cause or e)
            raise RunFailed(workflow_id, message) from e
        return await self._whole(handle, res) if res.summarized else res

    async def _whole(self, handle: WorkflowHandle[Any, RunResult], res: RunResult) -> RunResult:
        """The whole result of a run that returned its summary: the result its last record
        activity was given (the trace it wrote); the summary when there is none."""
        recorded = None
        async for event in handle.fetch_history_events():
            if event.HasField("activity_task_scheduled_event_attributes"):
                attrs = event.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == RECORD_ACTIVITY:
                    recorded = attrs.input.payloads
        if not recorded:
            return res
        [req] = await self.client.data_converter.decode(recorded, [RecordRequest])
        return req.result if isinstance(req, RecordRequest) else res

    async def run(self, task: Task) -> RunResult:
        return await self.result(await self.submit(task))

    async def status(self, workflow_id: str) -> RunStatus:
        handle = self.client.get_workflow_handle(workflow_id, result_type=RunResult)
        try:
            desc = await handle.describe()
        except RPCError as e:
            raise LookupError(f"no run {workflow_id!r} in namespace "
                              f"{self.settings.temporal_namespace}: {e.message}") from e
        progress = None
        if desc.status == WorkflowExecutionStatus.RUNNING:
            try:
                progress = await handle.query(PROGRESS_QUERY, result_type=RunResult,
                                              rpc_timeout=timedelta(seconds=5))
            except RPCError:
                progress = None  # no worker polling right now; the status alone still helps
        elif desc.status == WorkflowExecutionStatus.COMPLETED:
            progress = await handle.result()
            if progress.summarized:
                progress = await self._whole(handle, progress)
        name = desc.status.name.lower() if desc.status else "unknown"
        return RunStatus(workflow_id, desc.run_id, name, progress)


    # --- batches -----------------------------------------------------------------------------

    async def put_tasks(self, tasks: Sequence[Task]) -> TaskList:
        """Write a task list to the blob store, in chunks, for a batch or training run to read
        (the same blob settings as the workers': CONDUCTOR_BLOB_DIR or CONDUCTOR_S3_*)."""
        return await put_task_list(blob_store(self.settings), tasks)

    async def submit_batch(
        self, name: str, tasks: Sequence[Task], *, concurrency: int = 50, report: bool = True,
        children_per_run: int = 500,
    ) -> tuple[str, bool]:
        """Start batch NAME; returns its workflow id and whether this call started it (False:
        it is already running, so watch that one). A finished batch of the same name starts
        again and runs only the tasks that did not complete. The tasks go to the blob store
        first; the workflow's input holds only a reference to them. ValueError (one line) for
        a concurrency over MAX_CONCURRENCY (engine/contracts/limits.py), or for a task with
        text that cannot be stored (`field tasks.3.id: holds a NUL character ...`), before
        anything is written or started."""
        from conductor_engine.workflows.batch import BatchInput

        problem = concurrency_error(concurrency)
        if problem:
            raise ValueError(problem)
        _check_tasks(tasks)
        wid = batch_workflow_id(name)
        listed = await self.put_tasks([revised(t, batch=name) for t in tasks])
        inp = BatchInput(name=name, task_list=listed, concurrency=concurrency, report=report,
                         children_per_run=children_per_run)
        try:
            await self.client.start_workflow(
                BATCH_WORKFLOW, inp, id=wid, task_queue=self.task_queue,
                static_summary=f"batch {name}: {len(tasks)} tasks, {concurrency} at a time",
                search_attributes=TypedSearchAttributes([SearchAttributePair(BATCH, name)]),
            )
        except WorkflowAlreadyStartedError:
            return wid, False
        return wid, True

    async def batch_progress(self, name: str) -> tuple[str, BatchProgress | None]:
        """The batch's status and progress (None when no worker answers the query)."""
        from conductor_engine.workflows.batch import BatchProgress

        return await self._progress(batch_workflow_id(name), BatchProgress, f"batch {name!r}")

    async def _progress(self, workflow_id: str, kind: type[P], what: str) -> tuple[str, P | None]:
        """Status and `progress` of a long workflow: its result once completed, else its
        progress query (None when no worker answers it). LookupError when there is none."""
        handle = self.client.get_workflow_handle(workflow_id, result_type=kind)
        try:
            desc = await handle.describe()
        except RPCError as e:
            raise LookupError(f"no {what}: {e.message}") from e
        status = desc.status.name.lower() if desc.status else "unknown"
        if desc.status == WorkflowExecutionStatus.COMPLETED:
            return status, await handle.result()
        try:
            return status, await handle.query(PROGRESS_QUERY, result_type=kind,
                                              rpc_timeout=timedelta(seconds=5))
        except (RPCError, WorkflowQueryFailedError):
            return status, None

    # --- training ---------------------------------------------------------------------------

    async def start_training(self, inp: TrainInput) -> tuple[str, bool]:
        """Start training run NAME (`train-NAME`); returns its workflow id and whether this
        call started it (False: one is running already). Inline tasks go to the blob store
        first; the workflow's input holds only a reference to them. ValueError (one line) for
        a concurrency over MAX_CONCURRENCY (engine/contracts/limits.py), for an inline task
        with text that cannot be stored, for a recipe that varies the pool with no agents
        to draw from, or for rollouts at another temperature than the recipe's, before anything
        is written or started."""
        problem = concurrency_error(inp.concurrency) or inp.temperature_error()
        if problem:
            raise ValueError(problem)
        if (inp.recipe.rollouts.varies_pool and not inp.from_traces and not inp.agents
                and not all(t.agents for t in inp.tasks)):
            raise ValueError("the recipe varies the pool (pool_subset_min/max, shuffle_pool) "
                             "but no agents to draw from were given: set TrainInput.agents "
                             "to the pool's agent ids (Pool.available)")
        _check_tasks(inp.tasks)
        _check_tasks(inp.heldout_tasks)
        if inp.tasks:
            inp = revised(inp, tasks=[], task_list=await self.put_tasks(inp.tasks))
        if inp.heldout_tasks:
            inp = revised(inp, heldout_tasks=[],
                          heldout_list=await self.put_tasks(inp.heldout_tasks))
        wid = training_workflow_id(inp.name)
        try:
            await self.client.start_workflow(
                TRAINING_WORKFLOW, inp, id=wid, task_queue=self.task_queue,
                static_summary=f"train {inp.policy}: {inp.iterations} iterations",
            )
        except WorkflowAlreadyStartedError:
            return wid, False
        return wid, True

    async def training_input(self, plan: TrainingPlan, pool: Pool, registry: PolicyRegistry
                             ) -> tuple[TrainInput, int | None]:
        """The TrainingWorkflow input for `plan`, from the policy's newest published version
        (the registry's), and the iteration it resumes after when a run of that name stopped
        or failed before (None: a fresh run). Start it with `start_training`."""
        from conductor_engine.workflows.train import TrainInput

        opts, policy = plan.options, pool.conductor.id
        version = await registry.latest_version(policy)
        try:
            status, previous = await self.training_progress(opts.name)
        except LookupError:
            status, previous = "none", None
        progress = None
        if previous is not None and status != "running":
            progress = revised(previous, stop_requested=False, version=version, phase="starting")
        inp = TrainInput(name=opts.name, policy=policy, tasks=plan.tasks,
                         heldout_tasks=plan.heldout,
                         iterations=opts.iterations, from_traces=opts.from_traces,
                         recipe=plan.recipe, concurrency=opts.concurrency,
                         trainer_task_queue=self.settings.trainer_task_queue,
                         agents=[a.id for a in pool.available()],  # random pool subsets
                         **({"progress": progress} if progress is not None else {}))
        if progress is None:
            inp.progress.version = version
        return inp, progress.iteration if progress is not None else None

    async def training_progress(self, name: str) -> tuple[str, TrainProgress | None]:
        """The training run's status and progress (None when no worker answers the query)."""
        from conductor_engine.workflows.train import TrainProgress

        return await self._progress(training_workflow_id(name), TrainProgress,
                                    f"training run {name!r}")

    async def stop_training(self, name: str) -> None:
        """Ask training run NAME to stop after the iteration in flight."""
        handle = self.client.get_workflow_handle(training_workflow_id(name))
        try:
            await handle.signal(STOP_SIGNAL)
        except RPCError as e:
            raise LookupError(f"no running training run {name!r}: {e.message}") from e


async def submit(task: Task, settings: Settings | None = None) -> str:
    return await (await ConductorClient.connect(settings)).submit(task)


async def result(workflow_id: str, settings: Settings | None = None) -> RunResult:
    return await (await ConductorClient.connect(settings)).result(workflow_id)

"""The trainer service: a Temporal worker on the `trainer` task queue running `grpo_update`.

One process holds one policy in memory (model and optimiser state) between updates, so an
update costs the training step, not a reload. Everything durable lives elsewhere: checkpoints
and optimiser state in the blob store, versions and consumed traces in PostgreSQL. A trainer
that dies mid-update therefore loses nothing: Temporal notices the missing heartbeats and runs
the update again on the next trainer, which loads the parent version, selects the same
(still unconsumed) groups and publishes once.

Under `torchrun` (several GPUs, trainer/distributed.py) this process is rank 0: it alone polls
Temporal, and every step that touches the model (load, train, save) is a command it sends to
the other ranks, which run it in step with it (`follow`; `on_ranks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from conductor_engine.engine.contracts.limits import MAX_REHEARSAL_RUNS
from conductor_engine.engine.contracts.names import (
    REHEARSAL_PLANS_ACTIVITY,
    UPDATE_ACTIVITY,
    WARMUP_ACTIVITY,
)
from conductor_engine.engine.contracts.policy_versions import version_label
from conductor_engine.engine.contracts.traces import StoredRun
from conductor_engine.engine.contracts.training import (
    LossConfig,
    PolicyConfig,
    Recipe,
    RehearsalPlans,
    UpdateRequest,
    UpdateResult,
    WarmupRequest,
    WarmupResult,
)
from conductor_engine.engine.heartbeat import heartbeating
from conductor_engine.engine.providers.local.model import give_back_memory
from conductor_engine.engine.providers.local.openmp import wait_passively
from conductor_engine.engine.rewards.rollouts import MIN_GROUP, Group, describe_counts
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.policies import (
    PolicyError,
    PolicyRegistry,
    PolicyVersion,
    StaleParent,
    TraceAlreadyConsumed,
    materialise,
    optimizer_file,
)
from conductor_engine.engine.storage.retention import prune_after_publish
from conductor_engine.engine.storage.shared_store import shared_store
from conductor_engine.engine.storage.task_list_chunks import read_all
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.trainer.plan_means import with_plan_means
from conductor_engine.trainer.reconstruct import (
    needs_reconstruction,
    reconstruct_groups,
    reconstruct_trace,
    vocabulary,
)
from conductor_engine.trainer.rollouts import (
    GroupStats,
    deciding_attempts,
    group_stats,
    select_groups,
    update_samples,
)
from conductor_engine.trainer.tracking import SAMPLE_PLANS, SamplePlan, Trackers, iteration_of
from conductor_engine.trainer.warmup import (
    candidate_plans,
    select_plans,
    stored_traces,
    warmup_samples,
)

T = TypeVar("T")

wait_passively()  # before torch is first imported (the update imports it)

log = structlog.get_logger(__name__)


@dataclass
class _Kept:
    """The policy this process holds: which version, loaded as which policy config."""

    name: str
    version: int
    config: PolicyConfig
    policy: Any  # trainer.policy.Policy
    optimizer: Any
    reference: Any = None  # the KL term's trainer.grpo.Reference, when beta > 0
    reference_version: int | None = None  # which version it is (None: the base)


class Trainer:
    """Runs updates one at a time (one model, one device) and keeps the policy between them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._kept: _Kept | None = None
        self._lock = asyncio.Lock()
        self.loads = 0  # policies loaded from the registry or the base: what holding saves
        self.trackers = Trackers(settings.data_dir)  # the recipe's report_to
        self.ranks = _join_ranks()  # None on one process; torchrun's ranks, as rank 0

    async def update(self, req: UpdateRequest) -> UpdateResult:
        async with self._lock:
            return await self._update(req)

    async def _update(self, req: UpdateRequest) -> UpdateResult:
        started = time.monotonic()
        store = await shared_store(self.settings)
        registry = PolicyRegistry(store.pool)
        done = await registry.by_update(req.update_id)
        if done is not None:  # a retry of an update that was published: report it again
            return _published(done, started)
        newest = await registry.latest_version(req.name)
        if newest != req.parent:
            raise StaleParent(
                f"update {req.update_id} trains {req.name!r} from {version_label(req.parent)}, "
                f"but {version_label(newest)} is the newest; start the update from the newest"
            )
        groups = await select_groups(store, req.name, req.parent, req.recipe.rollouts)
        stats = group_stats(groups)
        if not stats.groups:
            return _nothing_to_train(req, stats, started)
        kept = await self._hold(req, registry, store)
        await self._reference(kept, req, registry, store)
        groups = await asyncio.to_thread(  # a served conductor's records (trainer/reconstruct.py)
            reconstruct_groups, groups, kept.policy.model, kept.policy.tokenizer)
        if req.recipe.rollouts.reward == "plan_mean":
            groups = await _credit_plan_means(store, req, groups)
        stats = group_stats(groups)
        samples = update_samples(groups, kept.policy.tokenizer, req.recipe.rollouts,
                                 req.recipe.loss.temperature)
        self._kept = None  # the weights are about to change: unusable until published
        step = await asyncio.to_thread(on_ranks, self.ranks, "train", kept, req, samples)
        await asyncio.to_thread(give_back_memory)  # the update's activations, freed
        consumed = [run for g, _ in groups for run in g.runs]  # left out ones too: decided
        metrics = {**step.model_dump(), "groups": stats.groups, "rollouts": stats.rollouts,
                   "mean_reward": stats.mean_reward, "valid_plan_rate": stats.valid_plan_rate,
                   "rollout_tokens": stats.tokens, "left_out": stats.left_out}
        if stats.plan_runs is not None:
            metrics["plan_runs"] = stats.plan_runs
        version = await self._save(kept, req, store, metrics)
        try:
            published = await registry.publish(version, consumed, blobs=store.blobs)
        except TraceAlreadyConsumed as e:
            raise ApplicationError(str(e), type="TraceAlreadyConsumed") from e  # retry: reselect
        kept.version = published.version
        self._kept = kept
        await prune_after_publish(registry, store.blobs, req.name, req.recipe.checkpoints,
                                  caches=[self.settings.data_dir / "policies",
                                          self.settings.lora_root])
        if req.recipe.report_to:
            it = iteration_of(req, metrics, sample_plans(groups))
            await asyncio.to_thread(self.trackers.log, req.recipe.report_to, it)
        log.info("policy published", policy=req.name, version=published.label,
                 groups=stats.groups, left_out=stats.left_out, loss=round(step.loss, 5),
                 grad_norm=round(step.grad_norm, 4), seconds=round(time.monotonic() - started, 2))
        result = _published(published, started)
        result.reason = step.skipped
        return result

    @staticmethod
    async def _warmup_runs(store: TraceStore, task_ids: list[str], req: WarmupRequest
                           ) -> list[StoredRun]:
        """The stored runs the warm-up ranks: the newest `recent_runs` of each training task
        (rank plan_mean: right and wrong ones are evidence of a plan's mean), or the best
        `per_task` (rank run)."""
        cfg = req.recipe.warmup
        if cfg.rank == "plan_mean":
            return await store.scored_runs(task_ids, per_task=cfg.recent_runs,
                                           policies=cfg.conductors, batch=req.rehearsal_batch)
        return await store.best_runs(task_ids, per_task=cfg.per_task, min_reward=cfg.min_reward,
                                     correct_only=cfg.correct_only, policies=cfg.conductors)

    async def rehearsal_plans(self, req: WarmupRequest) -> RehearsalPlans:
        """Each training task's best candidate plans to rehearse before the warm-up
        (trainer/warmup.py `candidate_plans`), from the runs the warm-up would rank. Reads the
        store only: no weights are touched, so no update waits for it."""
        store = await shared_store(self.settings)
        task_ids = list(req.task_ids)
        if req.task_list is not None:
            task_ids += [t.id for t in await read_all(store.blobs, req.task_list)]
        traces, _ = stored_traces(await self._warmup_runs(store, task_ids, req))
        cfg = req.recipe.warmup
        plans = candidate_plans(traces, task_ids, cfg, req.rehearsal_batch)
        runs = sum(len(p) for p in plans.values()) * cfg.rehearse
        if runs > MAX_REHEARSAL_RUNS:
            raise RehearsalTooLarge(
                f"the rehearsal would start {runs:,} runs, over the {MAX_REHEARSAL_RUNS:,} one "
                "training run holds: lower [warmup] rehearse or rehearse_plans")
        return RehearsalPlans(plans=plans)

    async def warm_up(self, req: WarmupRequest) -> WarmupResult:
        async with self._lock:
            return await self._warm_up(req)

    async def _warm_up(self, req: WarmupRequest) -> WarmupResult:
        """Fine-tune `req.parent` on the best scored plans of the training tasks and publish
        the next version (trainer/warmup.py); no trace is consumed. Nothing is published when
        no run qualifies, and the result says why."""
        started = time.monotonic()
        store = await shared_store(self.settings)
        registry = PolicyRegistry(store.pool)
        done = await registry.by_update(req.update_id)
        if done is not None:  # a retry of a warm-up that was published: report it again
            return _warmed(done, started)
        newest = await registry.latest_version(req.name)
        if newest != req.parent:
            raise StaleParent(
                f"the warm-up {req.update_id} trains {req.name!r} from "
                f"{version_label(req.parent)}, but {version_label(newest)} is the newest")
        cfg = req.recipe.warmup
        task_ids = list(req.task_ids)
        if req.task_list is not None:
            task_ids += [t.id for t in await read_all(store.blobs, req.task_list)]
        traces, unreadable = stored_traces(await self._warmup_runs(store, task_ids, req))
        selection = select_plans(traces, task_ids, cfg, req.rehearsal_batch)
        as_update = UpdateRequest(name=req.name, parent=req.parent, update_id=req.update_id,
                                  recipe=req.recipe)
        kept = await self._hold(as_update, registry, store) if selection.plans else None
        if kept is not None and any(needs_reconstruction(a, unshape=True)
                                    for t in selection.plans
                                    for r in t.rounds for a in r.attempts[-1:]):
            # served plans' records, and forced shapes' decisions made learnable
            vocab = await asyncio.to_thread(vocabulary, kept.policy.model, kept.policy.tokenizer)
            rebuilt = [reconstruct_trace(t, vocab, unshape=True) for t in selection.plans]
            unreadable["grammar_rejected"] = sum(isinstance(t, str) for t in rebuilt)
            selection.plans = [t for t in rebuilt if not isinstance(t, str)]
        left_out = {**selection.left_out, **{k: v for k, v in unreadable.items() if v}}
        result = WarmupResult(
            name=req.name, version=req.parent, published=False, tasks=len(set(task_ids)),
            tasks_with_plans=selection.tasks, plans=len(selection.plans),
            conductors=selection.conductors(), mean_reward=selection.mean_reward(),
            left_out=left_out, rank=cfg.rank, ranked_plans=selection.ranked_plans,
            counted_runs=selection.counted_runs, mean_plan_reward=selection.mean_plan_reward(),
            shapes=selection.shapes())
        samples = [] if kept is None else warmup_samples(selection.plans,
                                                         kept.policy.tokenizer, cfg)
        if kept is None or not samples:
            self._kept = kept  # unchanged: GRPO's first update from the same version keeps it
            result.reason = (f"no stored run of the {result.tasks} training tasks qualifies "
                             f"(completed, scored{', right' if cfg.correct_only else ''}, "
                             f"reward >= {cfg.min_reward}, a trusted verdict): run a conductor "
                             "over the training tasks with their references first (`conductor "
                             "batch`), or set [warmup] enabled = false")
            result.seconds = time.monotonic() - started
            return result
        self._kept = None  # the weights are about to change: unusable until published
        tuned = await asyncio.to_thread(on_ranks, self.ranks, "warmup", kept, as_update,
                                        samples)
        await asyncio.to_thread(give_back_memory)
        result.step, result.logprob_before, result.logprob_after = (
            tuned.step, tuned.logprob_before, tuned.logprob_after)
        metrics = {**tuned.step.model_dump(), "phase": "warmup",
                   "warmup": result.model_dump(exclude={"step", "version", "published",
                                                        "seconds", "name"})}
        version = await self._save(kept, as_update, store, metrics)
        published = await registry.publish(version, [], blobs=store.blobs)
        kept.version = published.version
        self._kept = kept
        await prune_after_publish(registry, store.blobs, req.name, req.recipe.checkpoints,
                                  caches=[self.settings.data_dir / "policies",
                                          self.settings.lora_root])
        result.version, result.published = published.version, True
        result.seconds = time.monotonic() - started
        log.info("warm-up published", policy=req.name, version=published.label,
                 plans=result.plans, tasks=f"{result.tasks_with_plans}/{result.tasks}",
                 rank=cfg.rank, shapes=result.shapes,
                 logprob=f"{tuned.logprob_before:.3f} -> {tuned.logprob_after:.3f}",
                 steps=tuned.step.steps, trained_tokens=tuned.step.tokens,
                 passed_tokens=tuned.step.passed_tokens,
                 train_seconds=round(tuned.step.seconds, 2), seconds=round(result.seconds, 2))
        return result

    async def _hold(self, req: UpdateRequest, registry: PolicyRegistry,
                    store: TraceStore) -> _Kept:
        """The policy at `req.parent` with its optimiser state: kept from the last update when it
        is that version (`_holds`), else loaded from the registry (or the base model for
        version 0)."""
        if self._kept is not None and _holds(self._kept, req):
            return self._kept
        self._kept = None
        self.loads += 1
        if req.parent == 0:
            return await asyncio.to_thread(on_ranks, self.ranks, "load", None, req, None, None)
        parent = await registry.get(req.name, req.parent)
        checkpoint = await materialise(parent, store.blobs, self.settings.data_dir / "policies")
        # streamed to a file, never held in memory; under the data directory, which every rank
        # of this machine reads
        with self._scratch("conductor-optim-") as tmp:
            state = await optimizer_file(parent, store.blobs, tmp / "optimizer.safetensors")
            return await asyncio.to_thread(on_ranks, self.ranks, "load", None, req, checkpoint,
                                           state)

    async def _reference(self, kept: _Kept, req: UpdateRequest, registry: PolicyRegistry,
                         store: TraceStore) -> None:
        """The KL term's reference for `kept` (beta > 0): the base, or `req.reference` (the
        version GRPO started from: the warm-up's). A reference version is pinned, so retention
        never removes the checkpoint a restarted trainer reads it from again."""
        if req.recipe.loss.beta == 0 or (kept.reference is not None
                                         and kept.reference_version == req.reference):
            return
        checkpoint = None
        if req.reference is not None:
            version = await registry.get(req.name, req.reference)
            if not version.pinned:
                await registry.set_pinned(req.name, req.reference, True)
            checkpoint = await materialise(version, store.blobs,
                                           self.settings.data_dir / "policies")
        await asyncio.to_thread(on_ranks, self.ranks, "reference", kept, req, checkpoint)

    @contextlib.contextmanager
    def _scratch(self, prefix: str) -> Iterator[Path]:
        """A temporary directory under the data directory, not /tmp: an optimiser state can be
        tens of GB, and /tmp is often a small tmpfs."""
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=prefix, dir=self.settings.data_dir) as tmp:
            yield Path(tmp)

    async def _save(self, kept: _Kept, req: UpdateRequest, store: TraceStore,
                    metrics: dict[str, Any]) -> PolicyVersion:
        """Checkpoint and optimiser state into the blob store; the version row to publish."""
        with self._scratch("conductor-ckpt-") as out:
            paths = await asyncio.to_thread(on_ranks, self.ranks, "save", kept, out)
            files = {p.name: await store.blobs.put_file(p) for p in paths}  # streamed
            optimizer = await store.blobs.put_file(out / "optimizer.safetensors")
        return PolicyVersion(
            name=req.name, version=req.parent + 1, parent=req.parent,
            base_model=req.recipe.policy.base, kind=kept.policy.kind, files=files,
            optimizer=optimizer, metrics=metrics, update_id=req.update_id,
        )


async def _credit_plan_means(store: TraceStore, req: UpdateRequest,
                             groups: list[tuple[Group, int]]) -> list[tuple[Group, int]]:
    """The groups with each rollout credited with its plan's mean reward over the training
    run's stored runs of its task (trainer/plan_means.py): the newest `plan_runs` scored runs
    of each task the policy planned, and the training run's rehearsals (`rehearsal_batch`)."""
    cfg = req.recipe.rollouts
    task_ids = sorted({g.task_id for g, _ in groups})
    runs = await store.scored_runs(task_ids, per_task=cfg.plan_runs, policies=[req.name],
                                   batch=req.rehearsal_batch)
    return with_plan_means(groups, [r.trace for r in runs if r.trace is not None])


def sample_plans(groups: list[tuple[Group, int]]) -> list[SamplePlan]:
    """A few plans the update trained on, for the trackers: the first rollout of each of the
    first groups (in the update's fixed order), as its conductor wrote it."""
    out = []
    for group, _ in groups:
        if group.trainable and group.traces:
            trace = group.traces[0]
            attempts = deciding_attempts(trace)
            if attempts:
                reward = trace.reward.value if trace.reward else None
                out.append(SamplePlan(group.task_id, reward, attempts[-1].raw_text))
        if len(out) == SAMPLE_PLANS:
            break
    return out


def seeded(req: UpdateRequest, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` with torch's generator seeded from the recipe's seed and the parent version
    (restored after, so nothing else in the process sees the seed): a LoRA's initialisation and
    any sampling in an update are then the same on every run."""
    import torch

    key = f"update\x1f{req.recipe.seed}\x1f{req.parent}".encode()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % 2**63)
        return fn(*args)


def _holds(kept: _Kept, req: UpdateRequest) -> bool:
    """Whether the kept model and optimiser are exactly what `req` would load: the same policy
    at the same version, built from the same PolicyConfig (base, LoRA shape, device, dtype,
    checkpointing), which alone decides the weights' layout and the optimiser's parameters.

    The rest of the recipe is deliberately not compared. `rollouts` only picks which traces an
    update trains on, and the training workflow changes its `task_ids` every iteration: comparing
    it made every update reload the checkpoint and the optimiser state from the blob store.
    `loss` is read afresh by every step, and its one optimiser setting, the learning rate, is
    set on the optimiser before each step (`_set_learning_rate`)."""
    return (kept.name == req.name and kept.version == req.parent
            and kept.config == req.recipe.policy)


def _set_learning_rate(optimizer: Any, loss: LossConfig) -> None:
    """The recipe's learning rate on every param group, before each update: a kept optimiser
    follows a changed recipe, and a reloaded one does not keep the rate saved with its state
    (load_state_dict restores the param groups as they were)."""
    for group in optimizer.param_groups:
        group["lr"] = loss.learning_rate


def _load(req: UpdateRequest, checkpoint: Path | None, optimizer_state: Path | None) -> _Kept:
    from conductor_engine.trainer.distributed import prepare
    from conductor_engine.trainer.grpo import make_optimizer
    from conductor_engine.trainer.policy import load_optimizer, load_policy

    policy = load_policy(req.recipe.policy, checkpoint_dir=checkpoint)
    policy.trained = prepare(policy.model, lora=policy.kind == "lora")  # for several ranks
    optimizer = make_optimizer(policy.trained, req.recipe.loss)
    if optimizer_state is not None:
        load_optimizer(optimizer, optimizer_state, model=policy.trained)
    log.info("policy loaded", policy=req.name, version=version_label(req.parent),
             kind=policy.kind, device=str(policy.device))
    return _Kept(req.name, req.parent, req.recipe.policy, policy, optimizer)


def _train(kept: _Kept, samples: list[Any], recipe: Recipe) -> Any:
    from conductor_engine.trainer.grpo import train_step

    _set_learning_rate(kept.optimizer, recipe.loss)
    return train_step(kept.policy.trained, kept.optimizer, samples, recipe.loss,
                      ref_model=kept.reference, pad_id=kept.policy.pad_id)


# ------------------------------------------------------------------------- several ranks
# Each command is run by every rank on its own copy of the policy (`_Kept`), rank 0 first
# sending it; its arguments travel pickled (samples, a request, paths: never weights).


def _command_load(_: _Kept | None, req: UpdateRequest, checkpoint: Path | None,
                  optimizer_state: Path | None) -> _Kept:
    return seeded(req, _load, req, checkpoint, optimizer_state)


def _command_train(kept: _Kept, req: UpdateRequest, samples: list[Any]) -> Any:
    return seeded(req, _train, kept, samples, req.recipe)


def _command_reference(kept: _Kept, req: UpdateRequest, checkpoint: Path | None) -> None:
    """The KL term's reference on this rank's copy of the policy: the base, or the version
    whose checkpoint is given (trainer.policy.reference_model)."""
    from conductor_engine.trainer.policy import reference_model

    if kept.policy.trained is not kept.policy.model and kept.policy.kind == "full":
        raise PolicyError("beta > 0 with full fine-tuning on several GPUs is not supported "
                          "yet (no sharded frozen reference): set beta = 0, or lora = true")
    kept.reference = None  # a version's weights replace the old reference's, not beside them
    kept.reference = reference_model(kept.policy, req.recipe.policy, checkpoint)
    kept.reference_version = req.reference


def _command_warmup(kept: _Kept, req: UpdateRequest, samples: list[Any]) -> Any:
    from conductor_engine.trainer.warmup import fine_tune

    return seeded(req, lambda: fine_tune(kept.policy.trained, kept.optimizer, samples,
                                         req.recipe, pad_id=kept.policy.pad_id,
                                         seed=req.recipe.seed))


def _command_save(kept: _Kept, out: Path) -> list[Path]:
    """The checkpoint and optimiser state into `out` (by rank 0, gathered from every rank's
    shards under FSDP2); returns the checkpoint's files."""
    from conductor_engine.trainer.policy import save_checkpoint, save_optimizer

    paths = save_checkpoint(kept.policy, out / "checkpoint")
    save_optimizer(kept.optimizer, out / "optimizer.safetensors", model=kept.policy.trained)
    return paths


_COMMANDS: dict[str, Callable[..., Any]] = {
    "load": _command_load, "train": _command_train, "save": _command_save,
    "warmup": _command_warmup, "reference": _command_reference}


def on_ranks(ranks: Any, command: str, kept: _Kept | None, *args: Any) -> Any:
    """Run `command` here, after sending it to the other ranks when there are any."""
    if ranks is not None:
        ranks.send((command, args))
    return _COMMANDS[command](kept, *args)


def follow() -> None:
    """A rank other than 0 (`conductor trainer` under torchrun): run rank 0's commands on this
    rank's copy of the policy until rank 0 stops."""
    from conductor_engine.trainer.distributed import release, setup

    ranks = setup()
    kept: _Kept | None = None
    log.info("trainer rank following rank 0", rank=ranks.rank, world=ranks.world)
    while (command := ranks.receive()) is not None:
        name, args = command
        try:
            result = _COMMANDS[name](kept, *args)
        except Exception:  # rank 0 met it too (a recipe it cannot train) and reports it
            log.exception("trainer rank command failed", rank=ranks.rank, command=name)
            kept = None  # rank 0 drops its policy after a failure too: it sends a load next
            continue
        if name == "load":
            kept = result
    release()  # leave the group before exiting: a gloo rank that exits in it can abort
    log.info("trainer rank stopped", rank=ranks.rank)


def _join_ranks() -> Any:
    """The ranks torchrun started, as rank 0 (None when there is one process: torch is then
    not imported until the first update)."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return None
    from conductor_engine.trainer.distributed import setup

    return setup()


def release_ranks() -> None:
    """Rank 0, stopping: tell the other ranks to stop too."""
    if int(os.environ.get("WORLD_SIZE", "1")) >= 2:
        from conductor_engine.trainer.distributed import release

        release()


def _nothing_to_train(req: UpdateRequest, stats: GroupStats, started: float) -> UpdateResult:
    """No group with MIN_GROUP rollouts: nothing is published and nothing consumed."""
    cfg = req.recipe.rollouts
    reason = (f"no complete unconsumed group of {cfg.group_size} runs with at least "
              f"{MIN_GROUP} rollouts under {version_label(req.parent)} or up to "
              f"{cfg.max_staleness} versions before it")
    if stats.left_out:
        reason += f"; left out: {describe_counts(stats.left_out)}"
    return UpdateResult(name=req.name, version=req.parent, published=False, reason=reason,
                        left_out=stats.left_out, seconds=time.monotonic() - started)


def _published(version: PolicyVersion, started: float) -> UpdateResult:
    from conductor_engine.engine.contracts.training import StepMetrics

    m = version.metrics
    return UpdateResult(
        name=version.name, version=version.version, published=True,
        groups=m.get("groups", 0), rollouts=m.get("rollouts", 0),
        mean_reward=m.get("mean_reward"), valid_plan_rate=m.get("valid_plan_rate"),
        rollout_tokens=m.get("rollout_tokens", 0), left_out=m.get("left_out", {}),
        step=StepMetrics.model_validate(m), seconds=time.monotonic() - started,
    )


def _warmed(version: PolicyVersion, started: float) -> WarmupResult:
    """The result of a warm-up that was published already (a retry), from its version row."""
    from conductor_engine.engine.contracts.training import StepMetrics

    m = version.metrics
    return WarmupResult.model_validate({
        **m.get("warmup", {}), "name": version.name, "version": version.version,
        "published": True, "step": StepMetrics.model_validate(m),
        "seconds": time.monotonic() - started})


class RehearsalTooLarge(ValueError):
    """More rehearsal runs than one training run holds (limits.py MAX_REHEARSAL_RUNS)."""


class TrainerActivities:
    def __init__(self, settings: Settings) -> None:
        self.trainer = Trainer(settings)

    @activity.defn(name=UPDATE_ACTIVITY)
    async def grpo_update(self, req: UpdateRequest) -> UpdateResult:
        return await _refusing(self.trainer.update(req), StaleParent, PolicyError)

    @activity.defn(name=WARMUP_ACTIVITY)
    async def warmup_update(self, req: WarmupRequest) -> WarmupResult:
        return await _refusing(self.trainer.warm_up(req), StaleParent, PolicyError)

    @activity.defn(name=REHEARSAL_PLANS_ACTIVITY)
    async def rehearsal_plans(self, req: WarmupRequest) -> RehearsalPlans:
        return await _refusing(self.trainer.rehearsal_plans(req), RehearsalTooLarge)


async def _refusing(work: Awaitable[T], *refusals: type[Exception]) -> T:
    """The trainer's work, heartbeating; a refusal (an error a retry would only repeat)
    becomes a non-retryable failure named after it."""
    try:
        return await heartbeating(work)
    except refusals as e:
        raise ApplicationError(str(e), type=type(e).__name__, non_retryable=True) from e


def build_trainer_worker(client: Client, settings: Settings) -> Worker:
    """The trainer service's worker: one update at a time on the settings' trainer queue."""
    activities = TrainerActivities(settings)
    return Worker(client, task_queue=settings.trainer_task_queue,
                  activities=[activities.grpo_update, activities.warmup_update,
                              activities.rehearsal_plans],
                  max_concurrent_activities=1)

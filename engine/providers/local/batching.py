"""The local model's generation queue: every generation of this process, a batch at a time.

All generation runs on one thread (one CPU model cannot run two generations faster than one
after the other), so the event loop of the Temporal worker stays free. Requests that wait
together are generated together as one batch: the weights are read once per token for the whole
batch, so a group of rollouts costs little more than one of them.

`queue` and `sampling.sampling_options` are looked up at each use, so tests and benchmarks can
swap in a queue of their own or another sampler.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import structlog

from conductor_engine.engine.contracts.agent_calls import Usage
from conductor_engine.engine.providers.base import AgentCallError, Completion, CompletionRequest
from conductor_engine.engine.providers.local import decode, sampling
from conductor_engine.engine.providers.local.chat import prompt_ids
from conductor_engine.engine.providers.local.errors import BAD_REQUEST, GENERATION_FAILED
from conductor_engine.engine.providers.local.grammar import (
    GrammarMask,
    compile_grammar,
    text_encoder,
    token_decoder,
)
from conductor_engine.engine.providers.local.model import LoadedModel
from conductor_engine.engine.providers.local.shaping import forced_shapes
from conductor_engine.engine.providers.pool import AgentSpec

MAX_BATCH_ENV = "CONDUCTOR_LOCAL_MAX_BATCH"
"""The most requests generated together (default 16)."""
BATCH_SEEDED_ENV = "CONDUCTOR_LOCAL_BATCH_SEEDED"
"""1: seeded requests share batches on the CPU too (`Job.batch_key`); unset: each runs alone."""
batch_seeded = os.environ.get(BATCH_SEEDED_ENV, "") == "1"

log = structlog.get_logger(__name__)


@dataclass
class Work:
    """What the queue generated for one model version: batches, seconds spent generating
    (the one thread busy), prompt tokens prefilled and tokens sampled. Read by
    tests/benchmarks/bench_iteration.py to split an iteration's time."""

    batches: int = 0
    seconds: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0


@dataclass
class Job:
    """One request waiting for (or in) a batch, with everything checked that can be checked
    before it meets the model, so a bad request fails alone instead of failing its batch."""

    spec: AgentSpec
    loaded: LoadedModel
    request: CompletionRequest
    prompt_ids: list[int]
    max_new_tokens: int
    grammar: Any  # compiled xgrammar grammar, or None
    cancelled: threading.Event
    future: Future[Completion] = field(default_factory=Future)

    def batch_key(self) -> tuple[int, float, float, int | None]:
        """Requests share a batch when they use the same model and the same sampling settings
        (one `generate` call samples every row alike); prompts, schemas and lengths may differ.

        A seeded request (a training rollout's plan) is generated alone on a CPU unless
        `batch_seeded` (CONDUCTOR_LOCAL_BATCH_SEEDED=1). Batched, its row still draws from a
        generator of its own seeded by it (sampling.Sampler; the grammar's exploring draws
        likewise), but its logits are not bitwise those of its lone forward: a matrix product
        over 8 rows sums in another order than over one, and the batch's shared opening runs as
        a pass of its own (decode.shared_prefix). They differ by a few millionths of their size
        (SmolLM2's recorded log-probs by up to 1e-4), enough to flip a sampled token where a
        draw falls that close to a boundary between two tokens (1 SmolLM2 plan in 48), and
        which batch a plan lands in depends on when it arrives: the run is then not the same
        run after run. Alone, a rollout depends on its seed and prompt only, whatever the load
        (tests/benchmarks/bench_local_batching.py --seeded measures both and the gain: about
        2.1x on plans, 2.9x on the rehearsal's plan generation).

        On a GPU seeded requests share batches: a group of rollouts generated one at a time
        would leave the GPU idle, and a bfloat16 row's logits depend on its batch there too."""
        alone = self.request.seed is not None and not self.loaded.on_gpu and not batch_seeded
        return (id(self.loaded), self.request.temperature or 0.0, self.request.top_p or 1.0,
                id(self) if alone else None)


def prepare(
    spec: AgentSpec, loaded: LoadedModel, request: CompletionRequest,
    cancelled: threading.Event | None,
) -> Job:
    """The request as a job for the queue: its prompt tokenized, its length bounded by the
    model's context, its schema compiled. Blocking (tokenizing, compiling)."""
    ids = prompt_ids(loaded.tokenizer, request)
    room = loaded.context_length - len(ids)
    if room <= 0:
        raise AgentCallError(
            f"agent {spec.id}: the prompt is {len(ids)} tokens and {spec.model} reads at "
            f"most {loaded.context_length}; shorten the task or give this step to a larger agent",
            retryable=False,
            kind=BAD_REQUEST,
        )
    return Job(
        spec=spec, loaded=loaded, request=request, prompt_ids=ids,
        max_new_tokens=min(request.max_tokens, room),
        grammar=None if request.json_schema is None else compile_grammar(spec, loaded, request),
        cancelled=cancelled or threading.Event(),
    )


GENERATOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-generate")
"""The one thread that runs every local generation of the process, for its whole life, whatever
queue asks: on a GPU `generate` compiles its decode step into CUDA graphs, which torch keeps in
the state of the thread that captured them (torch._inductor.cudagraph_trees); a batch run on
another thread fails inside the compiled step (an AssertionError, seen on an H200 when each
burst of work started a thread of its own)."""


class GenerationQueue:
    """Every local generation of this process goes through one thread, a batch at a time.

    A CPU model reads all its weights once per generated token whatever the batch size, so eight
    requests that wait together cost little more than one: a batch's many steps on the local
    agent. A seeded request (a training rollout's plan) runs alone on a CPU unless asked: see
    `Job.batch_key`.
    When work arrives the process's one generation thread (`GENERATOR`) waits `window_s` for
    the requests that arrive together to gather, then keeps taking batches (up to `max_batch`,
    oldest first) until nothing waits.
    """

    def __init__(self, max_batch: int = 16, window_s: float = 0.05) -> None:
        self.max_batch, self.window_s = max_batch, window_s
        self._lock = threading.Lock()
        self._waiting: list[Job] = []
        self._running = False
        self.batch_sizes: Counter[int] = Counter()  # how many batches of each size ran
        self.work: dict[str | None, Work] = {}  # by checkpoint (None: the base model)

    def submit(self, job: Job) -> Future[Completion]:
        with self._lock:
            self._waiting.append(job)
            if not self._running:
                self._running = True
                GENERATOR.submit(self._drain)
        return job.future

    def _drain(self) -> None:
        time.sleep(self.window_s)
        while True:
            with self._lock:
                batch = self._take_batch()
                if not batch and not self._waiting:
                    self._running = False
                    return
            if batch:
                self.batch_sizes[len(batch)] += 1
                started = time.perf_counter()
                try:
                    _run_batch(batch)
                except Exception as e:  # never leave a caller waiting on a dead thread
                    for j in batch:
                        if not j.future.done():
                            j.future.set_exception(e)
                self._count(batch, time.perf_counter() - started)

    def _count(self, batch: list[Job], seconds: float) -> None:
        work = self.work.setdefault(batch[0].spec.checkpoint, Work())
        work.batches += 1
        work.seconds += seconds
        width = max(len(j.prompt_ids) for j in batch)
        shared = decode.opening_run_once(batch[0].loaded, [j.prompt_ids for j in batch])
        # the padded prompts are computed too; a shared opening once (on the CPU)
        work.prompt_tokens += shared + (width - shared) * len(batch)
        for j in batch:
            if j.future.done() and not j.future.cancelled() and j.future.exception() is None:
                work.generated_tokens += j.future.result().usage.output_tokens

    def _take_batch(self) -> list[Job]:
        """The oldest waiting job and those waiting that can share its batch; jobs whose caller
        has gone (a cancelled future) are dropped."""
        self._waiting = [j for j in self._waiting if not j.future.cancelled()]
        if not self._waiting:
            return []
        key = self._waiting[0].batch_key()
        batch = [j for j in self._waiting if j.batch_key() == key][: self.max_batch]
        self._waiting = [j for j in self._waiting if j not in batch]
        return [j for j in batch if j.future.set_running_or_notify_cancel()]


queue = GenerationQueue(max_batch=int(os.environ.get(MAX_BATCH_ENV, "16")))
"""The process's generation queue, which `complete` submits to."""


def _run_batch(jobs: list[Job]) -> None:
    """Generate every job's completion in one `generate` call and settle each job's future.

    Prompts are padded to the batch's width so every row's next token sits in the last
    column: on the left, or, the CPU way, when the rows open alike (decode.shared_prefix),
    right after that shared opening, which then runs once. Each row
    stops on its own (end of turn, its own max_tokens, its caller cancelling); `generate` pads
    a stopped row until the longest is done, and those pads are cut off here.
    """
    import torch

    loaded, first = jobs[0].loaded, jobs[0]
    pad = loaded.eos_ids[0]
    width = max(len(j.prompt_ids) for j in jobs)
    device = loaded.device or "cpu"
    shared = decode.opening_run_once(loaded, [j.prompt_ids for j in jobs])
    padding = [width - len(j.prompt_ids) for j in jobs]
    input_ids = torch.tensor(
        [j.prompt_ids[:shared] + [pad] * n + j.prompt_ids[shared:]
         for j, n in zip(jobs, padding, strict=True)], device=device)
    attention = torch.tensor(
        [[1] * shared + [0] * n + [1] * (len(j.prompt_ids) - shared)
         for j, n in zip(jobs, padding, strict=True)], device=device)
    rows = Rows(width, [j.max_new_tokens for j in jobs], [j.cancelled for j in jobs],
                loaded.eos_ids)
    grammars = [j.grammar for j in jobs]
    explore = [j.request.explore for j in jobs]
    mask = GrammarMask(grammars, loaded.vocab_size, rows, text_encoder(loaded), explore,
                       [j.request.seed for j in jobs], token_decoder(loaded),
                       shaping=forced_shapes(jobs, loaded)) if any(grammars) else None
    options, sampler = sampling.sampling_options(first.request, [j.request.seed for j in jobs])
    recorder = sampling.StepLogprobs(first.request.temperature, mask, [
        e if j.request.explore_importance else 0.0 for e, j in zip(explore, jobs, strict=True)])
    try:
        with torch.inference_mode():
            out = decode.generate(  # on a GPU: one prefill per group, a static cache, compiled
                loaded, input_ids, attention, shared=shared,
                max_new_tokens=max(rows.limits),
                eos_token_id=loaded.eos_ids,
                pad_token_id=pad,
                use_cache=True,  # a trainer-saved config may say False (checkpointing)
                logits_processor=[recorder.first, *([mask] if mask else []), *sampler, recorder],
                stopping_criteria=[rows],
                **options,
            )
    except Exception as e:  # a bug here or in a library, not a passing fault: do not retry
        log.exception("local generation failed", model=first.spec.model, rows=len(jobs))
        for j in jobs:
            j.future.set_exception(AgentCallError(
                f"agent {j.spec.id}: local generation with {j.spec.model} failed: {e!r}",
                retryable=False,
                kind=GENERATION_FAILED,
            ))
        return
    sequences = out[:, width:].cpu()  # one copy from the GPU, not one per row
    logprobs = recorder.logprobs(sequences.shape[1]).cpu()
    for r, j in enumerate(jobs):
        try:
            if j.cancelled.is_set():
                raise AgentCallError(f"agent {j.spec.id}: cancelled", retryable=True)
            j.future.set_result(
                _completion(j, sequences[r], mask.forced[r] if mask else [],
                            mask.choices[r] if mask else {}, logprobs[r]))
        except Exception as e:  # settle every future, whatever happens: a caller waits on it
            j.future.set_exception(e if isinstance(e, AgentCallError) else AgentCallError(
                f"agent {j.spec.id}: reading the local generation failed: {e!r}",
                retryable=False, kind=GENERATION_FAILED,
            ))


def _completion(
    job: Job, generated: Any, forced: list[int], choices: dict[int, list[int]], logprobs: Any,
) -> Completion:
    """A row of a batch's output (`generated`, its tokens after the prompt): its tokens up to
    its end of turn or its own limit;
    `forced`, the steps at which the row was given the next token of its grammar's forced text
    (the only token it was allowed); `choices`, the steps at which its grammar allowed only a
    few tokens, and those tokens; `logprobs`, the row of `sampling.StepLogprobs`."""
    eos = job.loaded.eos_ids
    token_ids: list[int] = []
    for t in generated.tolist()[: job.max_new_tokens]:
        token_ids.append(int(t))
        if t in eos:
            break
    finish = "stop" if token_ids and token_ids[-1] in eos else "length"
    return Completion(
        text=job.loaded.tokenizer.decode(token_ids, skip_special_tokens=True),
        usage=Usage(input_tokens=len(job.prompt_ids), output_tokens=len(token_ids)),
        model=job.spec.model,
        finish_reason=finish,
        token_ids=token_ids,
        logprobs=logprobs[: len(token_ids)].tolist(),
        forced_positions=[k for k in forced if k < len(token_ids)] if job.grammar else None,
        choice_tokens={k: v for k, v in choices.items() if k < len(token_ids)}
        if job.grammar else None,
    )


class Rows:
    """Which rows of a batch are finished, as a stopping criterion (duck-typed, so transformers
    is not imported at module import) that the grammar mask also reads.

    A row finishes on an end-of-turn token, at its own max_tokens, or once its caller cancels
    (the activity was cancelled: stop spending the CPU on it). Finished stays finished, which
    `generate` needs: it keeps padding a finished row until the whole batch is done.
    """

    def __init__(
        self, prompt_width: int, limits: list[int], cancelled: list[threading.Event],
        eos_ids: list[int],
    ) -> None:
        self.prompt_width, self.limits, self.cancelled = prompt_width, limits, cancelled
        self.eos_ids = set(eos_ids)
        self.finished = [False] * len(limits)

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        generated = int(input_ids.shape[1]) - self.prompt_width
        for r, last in enumerate(input_ids[:, -1].tolist()):
            self.finished[r] = self.finished[r] or (
                last in self.eos_ids or generated >= self.limits[r] or self.cancelled[r].is_set()
            )
        return torch.tensor(self.finished, dtype=torch.bool, device=input_ids.device)

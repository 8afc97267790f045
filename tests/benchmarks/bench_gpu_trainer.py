"""The paper's training shapes on one GPU: one GRPO update as the trainer service runs it, against
a bare forward+backward of the same tokens.

    python -m tests.benchmarks.bench_gpu_trainer [--shape lora7b|full1.5b|all] [--json OUT]
    python -m tests.benchmarks.bench_gpu_trainer --small        # both shapes shrunk, CPU, ~20 s

Shapes (issue 31), built from transformers configs with random weights (no download):

  lora7b    Qwen2.5-7B's shape, LoRA r=64 on every linear layer, exactly as
            examples/recipes/paper.toml sets policy and loss (only `base` replaced): 256 rollouts,
            4 tasks x 64, each task's prompt ~900 tokens (the first 640 the same for every task:
            the conductor's instructions), completions of 100 to 400 tokens
  full1.5b  Qwen2.5-1.5B's shape, full fine-tuning (paper.toml with lora = false and the paper's
            learning rate 1e-6): 64 rollouts of one task, same lengths

The policy is built and updated through the trainer's own entry points, as trainer/service.py
`_load` and `Trainer._train` call them: the random model and a small tokenizer are saved as a
model directory, then `load_policy(recipe.policy)` (torch seeded first, as the service seeds
it), `make_optimizer(policy.model, recipe.loss)`, and per update the recipe's learning rate on
the optimiser and `train_step(model, optimizer, samples, recipe.loss, pad_id=policy.pad_id)`.
Whatever device, dtype, checkpointing or micro-batch the trainer chooses for itself is what is
timed; the settings in effect are printed (every PolicyConfig and LossConfig field, the weights'
dtypes, checkpointing, TF32, and the dtype a linear layer computed in during the update, read
by a forward hook, so autocast shows up however the trainer turns it on).

Baseline (the same run, the same model object and the same tokens): for each micro-batch of the
samples, grouped by prompt and padded by the trainer's own `collate`, plain
`model(input_ids, attention_mask).logits` -> cross-entropy over the real tokens -> backward; no
GRPO machinery (no log-prob gather, no shared prefix, no clipping, no optimiser step). On CUDA it
runs under `torch.autocast(bfloat16)`, the mixed precision a plain training loop would use, so
the ratio says how far the trainer is from what the GPU gives a simple loop. If a bare
micro-batch runs out of GPU memory it is split in halves (the same tokens; the split is printed;
the timed pass starts at the size the warm-up found).

Each update (ours, bare) runs once to warm up, on the first `--warmup-groups` groups only (the
same micro-batch shapes and kernels, a quarter of the time for lora7b), then once timed on all
the samples. Printed per shape: seconds per update, tokens/s (all real tokens: prompt +
completion; and completion tokens in the loss), peak memory, ours / bare. Peak memory is
torch.cuda.max_memory_allocated (everything the process holds on the GPU, weights included) on
CUDA, and on the CPU the process's peak resident set (VmHWM, reset before each update through
/proc/self/clear_refs), weights and Python included: a rough figure.

The script imports only the trainer (trainer/grpo/, trainer/policy.py and what they import),
torch, transformers, peft and tokenizers, so a GPU machine without the engine's other
dependencies can run it: tests/benchmarks/gpu_device_check.sh is the one command for that.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import platform
import random
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from conductor_engine.engine.contracts.training import Recipe
from conductor_engine.trainer.grpo import (
    Sample,
    StepMetrics,
    collate,
    compute_of,
    make_optimizer,
    train_step,
)
from conductor_engine.trainer.policy import Policy, load_policy

ROOT = Path(__file__).resolve().parents[2]

PAPER_RECIPE = ROOT / "examples" / "recipes" / "paper.toml"
PAD, UNK, EOS = 0, 1, 2  # the saved tokenizer's special ids; sampled token ids start above them
SEED = 0

QWEN25_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                 num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                 max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                 tie_word_embeddings=False)
QWEN25_15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                  num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                  max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
            rope_theta=1000000.0, rms_norm_eps=1e-6)


@dataclass(frozen=True)
class Shape:
    """One benchmark shape: the model's config, LoRA or full, and the rollouts of one update."""

    name: str
    config: dict[str, Any]  # Qwen2Config fields
    lora: bool
    groups: int  # tasks per update
    group_size: int  # rollouts per task
    prompt_len: int  # a prompt is prompt_len +- prompt_spread tokens ...
    prompt_spread: int
    header: int  # ... of which the first `header` are the same for every task
    completion_max: int  # completions of completion_max // 4 .. completion_max tokens
    micro_batch: int | None = None  # None: the recipe's
    loss_overrides: dict[str, Any] = field(default_factory=dict)
    policy_overrides: dict[str, Any] = field(default_factory=dict)  # e.g. checkpointing forced


SHAPES = {
    "lora7b": Shape("lora7b", QWEN25_7B, lora=True, groups=4,
                    group_size=64, prompt_len=900, prompt_spread=40, header=640,
                    completion_max=400),
    # the paper's own setting: full fine-tuning at its learning rate
    "full1.5b": Shape("full1.5b", QWEN25_15B, lora=False, groups=1, group_size=64,
                      prompt_len=900, prompt_spread=40, header=640, completion_max=400,
                      loss_overrides={"learning_rate": 1e-6}),
}
# --small: the same code path on a 2-layer model, in seconds on a CPU (micro-batch 2, so an
# update still accumulates several micro-batches and groups still share their prompt)
SMALL = {
    "lora7b": replace(SHAPES["lora7b"], config={**TINY, "tie_word_embeddings": False}, groups=2,
                      group_size=4, prompt_len=48, prompt_spread=4, header=32, completion_max=24,
                      micro_batch=2),
    "full1.5b": replace(SHAPES["full1.5b"], config={**TINY, "tie_word_embeddings": True},
                        group_size=8, prompt_len=48, prompt_spread=4, header=32,
                        completion_max=24, micro_batch=2),
}


# ------------------------------------------------------------------------------ model and data


def build_model_dir(shape: Shape, out: Path, device: torch.device, seed: int = SEED) -> Path:
    """A randomly initialised model of `shape` (bfloat16, as Qwen2.5 is published) and a small
    tokenizer, saved as a model directory that `PolicyConfig.base` can name. The weights are
    drawn on `device` (a 7B model initialises in seconds on a GPU, minutes on a CPU). An existing
    directory of the same config is reused (a rerun on the same machine skips the build)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**shape.config, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None,
                         use_cache=False)
    stamp = out / "bench-shape.json"
    wanted = json.dumps(shape.config, sort_keys=True)
    if stamp.is_file() and stamp.read_text() == wanted:
        return out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    del model
    _free(device)
    tokenizer().save_pretrained(out)
    stamp.write_text(wanted)
    return out


def tokenizer() -> Any:
    """`load_policy` loads the base model's tokenizer for its pad id; nothing is tokenized here,
    so a word-level tokenizer of three special tokens does (ids below the vocabulary size)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({"<pad>": PAD, "<unk>": UNK, "<eos>": EOS}, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


def paper_recipe(shape: Shape, base: Path) -> Recipe:
    """examples/recipes/paper.toml with only the base replaced; full shapes set lora = false and
    their loss overrides (the paper's learning rate), as the recipe's own comments say to."""
    data = tomllib.loads(PAPER_RECIPE.read_text())
    data["policy"] = {**data["policy"], "base": str(base), "lora": shape.lora,
                      **shape.policy_overrides}
    data["loss"] = {**data["loss"], **shape.loss_overrides}
    if shape.micro_batch is not None:
        data["loss"]["micro_batch_size"] = shape.micro_batch
    return Recipe.model_validate(data)


def make_samples(shape: Shape, seed: int = SEED) -> list[Sample]:
    """An update's rollouts: `groups` tasks of `group_size` completions each. Every prompt opens
    with the same `header` tokens (the conductor's instructions) and a group's completions share
    its whole prompt; completions of completion_max/4 .. completion_max tokens, advantages of both
    signs (never 0) and behaviour log-probs near a random model's (about -ln(vocab)), as a
    vLLM-served conductor records them."""
    rng = random.Random(seed)
    vocab = shape.config["vocab_size"]

    def tokens(n: int) -> list[int]:
        return [rng.randrange(EOS + 1, vocab) for _ in range(n)]

    header = tokens(shape.header)
    out = []
    for _ in range(shape.groups):
        length = rng.randint(shape.prompt_len - shape.prompt_spread,
                             shape.prompt_len + shape.prompt_spread)
        prompt = header + tokens(length - shape.header)
        for _ in range(shape.group_size):
            completion = tokens(rng.randint(shape.completion_max // 4, shape.completion_max))
            out.append(Sample(prompt_ids=prompt, completion_ids=completion,
                              advantage=rng.choice([-1, 1]) * rng.uniform(0.2, 1.5),
                              behaviour_logprobs=[-rng.uniform(11.0, 13.0) for _ in completion]))
    return out


# ------------------------------------------------------------------------------ the two updates


@dataclass
class Bench:
    """One shape, loaded: the policy and optimiser as the trainer service holds them."""

    shape: Shape
    recipe: Recipe
    policy: Policy
    optimizer: torch.optim.Optimizer
    samples: list[Sample]
    # the bare pass's micro-batch that last fit: the timed bare pass starts there, so the
    # warm-up's out-of-memory attempts are not timed again (they would flatter the ratio)
    bare_size: int | None = None

    @property
    def device(self) -> torch.device:
        return self.policy.device

    @property
    def trained(self) -> Any:
        """What train_step runs: the model (a trainer that wraps it for several ranks keeps the
        wrapper in `Policy.trained`; in one process that is the model itself)."""
        return getattr(self.policy, "trained", None) or self.policy.model

    def update(self, samples: Sequence[Sample]) -> StepMetrics:
        """One update as Trainer._train runs it (beta = 0 in the paper recipe: no reference)."""
        for group in self.optimizer.param_groups:  # the service's _set_learning_rate
            group["lr"] = self.recipe.loss.learning_rate
        step = train_step(self.trained, self.optimizer, samples, self.recipe.loss,
                          pad_id=self.policy.pad_id)
        if step.skipped is not None:
            raise RuntimeError(f"train_step took no step: {step.skipped}")
        return step

    def bare(self, samples: Sequence[Sample]) -> int:
        """Forward + cross-entropy + backward of the same tokens, no GRPO: the baseline. Returns
        the micro-batch size it ran at (halved on running out of GPU memory)."""
        size = self.bare_size or micro_batch_size(self.recipe)
        while True:
            try:
                bare_forward_backward(self.policy.model, samples, self.policy.pad_id, size,
                                      self.device)
                self.bare_size = size
                return size
            except torch.cuda.OutOfMemoryError:
                if size == 1:
                    raise
            # outside the except block, so the failed pass's frames and tensors are gone
            self.policy.model.zero_grad(set_to_none=True)
            _free(self.device)
            size //= 2


def load(shape: Shape, model_dir: Path, seed: int = SEED) -> Bench:
    """The policy and optimiser exactly as trainer/service.py `_load` builds them."""
    recipe = paper_recipe(shape, model_dir)
    torch.manual_seed(seed)  # the service seeds torch before load_policy (the LoRA's init)
    policy = load_policy(recipe.policy)
    optimizer = make_optimizer(policy.model, recipe.loss)
    return Bench(shape, recipe, policy, optimizer, make_samples(shape, seed))


def micro_batch_size(recipe: Recipe) -> int:
    """The recipe's micro-batch for the bare baseline (8 where the trainer chooses its own)."""
    size = getattr(recipe.loss, "micro_batch_size", None)
    return size if isinstance(size, int) and size > 0 else 8


def bare_batches(samples: Sequence[Sample], size: int) -> list[list[Sample]]:
    """Micro-batches as the trainer forms them when it shares prompts: a prompt's samples
    together, each group sorted by length, `size` at a time."""
    groups: dict[tuple[int, ...], list[Sample]] = {}
    for s in samples:
        groups.setdefault(tuple(s.prompt_ids), []).append(s)
    out = []
    for group in groups.values():
        rows = sorted(group, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
        out += [rows[i : i + size] for i in range(0, len(rows), size)]
    return out


def bare_forward_backward(model: Any, samples: Sequence[Sample], pad_id: int, size: int,
                          device: torch.device) -> None:
    """model(input_ids, attention_mask).logits -> cross-entropy on every real next token ->
    backward, per micro-batch; the gradients are then dropped (no optimiser step)."""
    model.train()
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                if device.type == "cuda" and torch.cuda.is_bf16_supported()
                else contextlib.nullcontext())
    for rows in bare_batches(samples, size):
        batch = collate(rows, pad_id).to(device)
        targets = batch.input_ids[:, 1:].masked_fill(batch.attention_mask[:, 1:] == 0, -100)
        with autocast:
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                                 targets.flatten(), ignore_index=-100)
        loss.backward()
        del logits, loss
    model.zero_grad(set_to_none=True)


# ------------------------------------------------------------------------------ measuring


@dataclass
class Timed:
    seconds: float
    peak_bytes: int | None


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[Timed, Any]:
    """Run `fn` once: wall seconds (synchronised) and the peak memory while it ran."""
    _free(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        _reset_peak_rss()
    _sync(device)
    started = time.perf_counter()
    result = fn()
    _sync(device)
    seconds = time.perf_counter() - started
    if device.type == "cuda":
        peak: int | None = torch.cuda.max_memory_allocated(device)
    else:
        peak = _status_bytes("VmHWM")
    return Timed(seconds, peak), result


def memory_kind(device: torch.device) -> str:
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated (weights, grads, optimiser state, activations)"
    return "the process's peak resident set (VmHWM), CPU: rough, Python and libraries included"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _reset_peak_rss() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def _status_bytes(name: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@contextlib.contextmanager
def compute_dtype_probe(model: Any) -> Iterator[dict[str, Any]]:
    """What a linear layer of the first decoder layer computed in while the block ran: its output
    dtype and whether autocast was on, however the trainer set precision up; and how many of
    the first decoder layer's passes ran checkpointed (auto checkpointing decides per
    micro-batch, so the model's flag after the update does not say)."""
    seen: dict[str, Any] = {}
    layer = next((m for n, m in model.named_modules() if n.endswith("layers.0")), None)

    def count(module: Any, _: Any) -> None:
        key = "layer0_passes_checkpointed" if getattr(module, "gradient_checkpointing", False) \
            else "layer0_passes_not_checkpointed"
        seen[key] = seen.get(key, 0) + 1

    target = next((m for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and "layers.0." in n and "lora" not in n),
                  None)

    def hook(_: Any, __: Any, output: Any) -> None:
        if "linear_output_dtype" not in seen and isinstance(output, torch.Tensor):
            kind = output.device.type
            seen["linear_output_dtype"] = str(output.dtype).removeprefix("torch.")
            seen["autocast"] = torch.is_autocast_enabled(kind)
            if seen["autocast"]:
                seen["autocast_dtype"] = str(torch.get_autocast_dtype(kind)).removeprefix("torch.")

    handles = ([layer.register_forward_pre_hook(count)] if layer is not None else []) + \
        ([target.register_forward_hook(hook)] if target is not None else [])
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def settings_in_effect(bench: Bench) -> dict[str, Any]:
    """What the trainer chose: the configs' fields as given (new knobs included, whatever their
    names), and what is observable on the loaded model."""
    model = bench.policy.model
    unwrap = getattr(model, "get_base_model", None)
    hf = unwrap() if unwrap is not None else model
    checkpointing = None
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        value = getattr(hf, name, None)
        if value is not None:
            checkpointing = bool(value)
            break

    def dtypes(trainable: bool) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in model.parameters():
            if p.requires_grad == trainable:
                key = str(p.dtype).removeprefix("torch.")
                out[key] = out.get(key, 0) + p.numel()
        return out

    return {
        "policy": bench.recipe.policy.model_dump(mode="json"),
        "loss": bench.recipe.loss.model_dump(mode="json"),
        "kind": bench.policy.kind,
        "trainable_params_by_dtype": dtypes(True),
        "frozen_params_by_dtype": dtypes(False),
        "gradient_checkpointing": checkpointing,
        # auto checkpointing (on CUDA): decided per micro-batch from the bytes per token it
        # measured (doubled after a micro-batch ran out of memory and the step was rerun)
        "auto_checkpointing": compute_of(model).auto_checkpointing,
        "auto_checkpointing_measured": dict(compute_of(model).measured),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "optimizer": type(bench.optimizer).__name__ + str(
            {k: v for k, v in bench.optimizer.defaults.items() if k in ("fused", "foreach")}),
    }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        memory = torch.cuda.get_device_properties(device).total_memory / 2**30
        return f"{torch.cuda.get_device_name(device)}, {memory:.0f} GiB (CUDA {torch.version.cuda})"
    return f"CPU {platform.machine()} ({torch.get_num_threads()} threads)"


# ------------------------------------------------------------------------------ one shape


def warmup_samples(bench: Bench, groups: int) -> list[Sample]:
    return bench.samples[: max(1, groups) * bench.shape.group_size]


def profile_shape(shape: Shape, model_dir: Path, *, warmup_groups: int = 1,
                  rows: int = 30, log: Callable[[str], None] = print) -> None:
    """Where one update's time goes: after the warm-up, the update under torch.profiler, its
    operators by their own device time (by CPU time off a GPU). No bare pass: this is for
    finding the cost, `run_shape` for the ratio."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    build_model_dir(shape, model_dir, device)
    bench = load(shape, model_dir)
    timed(lambda: bench.update(warmup_samples(bench, warmup_groups)), bench.device)
    # on a GPU the kernels only: with the CPU's operators too, summing a 7B update's events
    # took longer than the 150 s left of a 190 s limit on an H100 machine
    activities = [ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        ours, _ = timed(lambda: bench.update(bench.samples), bench.device)
    log(f"[{shape.name}] profiled update: {ours.seconds:.2f} s (the profiler adds some)")
    by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    log(prof.key_averages().table(sort_by=by, row_limit=rows, max_name_column_width=60))


@contextlib.contextmanager
def prefix_per_micro_batch() -> Iterator[None]:
    """train_step as it was before a group's prompt ran once for all its micro-batches
    (trainer/grpo/_prefix.py GroupPrefix): every micro-batch runs the prompt itself. For an A/B
    in the same run (`--compare-prefix`), nothing else."""
    from conductor_engine.trainer.grpo import _step  # train_step's accumulation reads it there

    runs = _step._group_runs
    _step._group_runs = lambda hf, batches: {}  # type: ignore[assignment]
    try:
        yield
    finally:
        _step._group_runs = runs


def run_shape(shape: Shape, model_dir: Path, *, warmup_groups: int = 1,
              compare_prefix: bool = False, fresh: int = 0,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build, load, warm up, time one update and one bare pass; the figures as a dict. With
    `compare_prefix`, also two updates with the prompt run per micro-batch (the old way),
    alternating with two more of ours: each way's fastest is reported. With `fresh` = N, N
    more updates, each on a new draw of the rollouts (other completion lengths, as every
    update of a trainer brings), after the others: their seconds, in order."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started = time.perf_counter()
    build_model_dir(shape, model_dir, device)
    built = time.perf_counter()
    bench = load(shape, model_dir)
    loaded = time.perf_counter()
    log(f"[{shape.name}] model built in {built - started:.1f} s, policy loaded in "
        f"{loaded - built:.1f} s on {device_name(bench.device)}")
    warm = warmup_samples(bench, warmup_groups)
    samples = bench.samples
    real = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)

    timed(lambda: bench.update(warm), bench.device)
    with compute_dtype_probe(bench.policy.model) as probe:
        ours, step = timed(lambda: bench.update(samples), bench.device)
    log(f"[{shape.name}] update: {ours.seconds:.2f} s")
    old: Timed | None = None
    if compare_prefix:  # old, ours, old, ours after the first: the order is not what is timed
        with prefix_per_micro_batch():
            timed(lambda: bench.update(warm), bench.device)
        olds, ourss = [], [ours]
        for _ in range(2):
            with prefix_per_micro_batch():
                olds.append(timed(lambda: bench.update(samples), bench.device)[0])
            ourss.append(timed(lambda: bench.update(samples), bench.device)[0])
        old = min(olds, key=lambda t: t.seconds)
        log(f"[{shape.name}] updates, ours: {', '.join(f'{t.seconds:.2f}' for t in ourss)} s; "
            f"the prompt run per micro-batch: {', '.join(f'{t.seconds:.2f}' for t in olds)} s")
        ours = min(ourss, key=lambda t: t.seconds)
    fresh_seconds = []
    for k in range(1, fresh + 1):
        drawn = make_samples(shape, SEED + k)
        fresh_seconds.append(timed(partial(bench.update, drawn), bench.device)[0].seconds)
    if fresh:
        log(f"[{shape.name}] updates on fresh rollouts: "
            f"{', '.join(f'{s:.2f}' for s in fresh_seconds)} s")
    timed(lambda: bench.bare(warm), bench.device)
    bare, bare_size = timed(lambda: bench.bare(samples), bench.device)
    log(f"[{shape.name}] bare forward+backward: {bare.seconds:.2f} s")
    return {
        "shape": shape.name,
        "model": {k: v for k, v in shape.config.items()},
        "device": device_name(bench.device),
        "rollouts": len(samples),
        "warmup_rollouts": len(warm),
        "tokens": real,
        "completion_tokens_in_loss": step.tokens,
        "update_seconds": ours.seconds,
        "update_tokens_per_s": real / ours.seconds,
        "update_completion_tokens_per_s": step.tokens / ours.seconds,
        "update_peak_bytes": ours.peak_bytes,
        "bare_seconds": bare.seconds,
        "bare_tokens_per_s": real / bare.seconds,
        "bare_peak_bytes": bare.peak_bytes,
        "bare_micro_batch": bare_size,
        "bare_precision": ("autocast bfloat16" if bench.device.type == "cuda"
                           and torch.cuda.is_bf16_supported() else "as the model's weights"),
        "ratio_update_to_bare": ours.seconds / bare.seconds,
        "update_seconds_prefix_per_micro_batch": old.seconds if old else None,
        "update_seconds_fresh_rollouts": fresh_seconds,
        "update_peak_bytes_prefix_per_micro_batch": old.peak_bytes if old else None,
        "peak_memory_is": memory_kind(bench.device),
        "settings": settings_in_effect(bench),
        "compute_seen": probe,
        "step": step.model_dump(mode="json"),
        "build_seconds": built - started,
        "load_seconds": loaded - built,
    }


def report(r: dict[str, Any]) -> str:
    def gib(n: int | None) -> str:
        return "-" if n is None else f"{n / 2**30:.2f} GiB"

    s = r["settings"]
    lines = [
        f"\n{r['shape']}: {r['rollouts']} rollouts, {r['tokens']:,} tokens "
        f"({r['completion_tokens_in_loss']:,} completion tokens in the loss) on {r['device']}",
        f"  ours  train_step: {r['update_seconds']:8.2f} s per update  "
        f"{r['update_tokens_per_s']:10,.0f} tokens/s  peak {gib(r['update_peak_bytes'])}",
        f"  bare  fwd+bwd:    {r['bare_seconds']:8.2f} s              "
        f"{r['bare_tokens_per_s']:10,.0f} tokens/s  peak {gib(r['bare_peak_bytes'])}  "
        f"({r['bare_precision']}, micro-batch {r['bare_micro_batch']})",
        f"  ours / bare = {r['ratio_update_to_bare']:.2f}x the time",
        *([f"  the prompt run per micro-batch (before GroupPrefix): "
           f"{r['update_seconds_prefix_per_micro_batch']:.2f} s per update, peak "
           f"{gib(r['update_peak_bytes_prefix_per_micro_batch'])}: ours "
           f"{r['update_seconds_prefix_per_micro_batch'] / r['update_seconds']:.2f}x faster"]
          if r.get("update_seconds_prefix_per_micro_batch") else []),
        f"  peak memory: {r['peak_memory_is']}",
        f"  settings: kind {s['kind']}, trainable {s['trainable_params_by_dtype']}, frozen "
        f"{s['frozen_params_by_dtype']}, gradient checkpointing (the model's flag after the "
        f"updates) {s['gradient_checkpointing']}, auto {s['auto_checkpointing']} "
        f"{s['auto_checkpointing_measured']}, "
        f"fp32 matmul precision {s['float32_matmul_precision']} (TF32 "
        f"{s['cuda_matmul_allow_tf32']}), {s['optimizer']}",
        f"  computed (first decoder layer's linear, during the update): {r['compute_seen']}",
        f"  policy config: {s['policy']}",
        f"  loss config: {s['loss']}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    parser.add_argument("--small", action="store_true",
                        help="both shapes shrunk to a 2-layer model: the code path, on a CPU")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--cache-dir", type=Path,
                        help="keep the random model directories here (reused by a rerun)")
    parser.add_argument("--warmup-groups", type=int, default=1,
                        help="groups the warm-up update runs on (default 1)")
    parser.add_argument("--gradient-checkpointing", choices=["auto", "on", "off"],
                        default="auto", help="the recipe's [policy] gradient_checkpointing: "
                        "auto (unset, the shipped default) or forced on/off")
    parser.add_argument("--compare-prefix", action="store_true",
                        help="also time an update with each micro-batch running its group's "
                        "prompt itself (before GroupPrefix), in the same run")
    parser.add_argument("--fresh", type=int, default=0, metavar="N",
                        help="then N updates, each on a new draw of the rollouts (new lengths)")
    parser.add_argument("--profile", action="store_true",
                        help="print where one update's time goes (torch.profiler), no figures")
    args = parser.parse_args(argv)

    shapes = SMALL if args.small else SHAPES
    if args.gradient_checkpointing != "auto":
        forced = {"gradient_checkpointing": args.gradient_checkpointing == "on"}
        shapes = {k: dataclasses.replace(v, policy_overrides=forced) for k, v in shapes.items()}
    names = list(shapes) if args.shape == "all" else [args.shape]
    results: dict[str, Any] = {"small": args.small, "torch": torch.__version__, "shapes": {}}
    failed = False
    with contextlib.ExitStack() as stack:
        root = args.cache_dir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="bench-gpu-trainer-")))
        for name in names:
            suffix = "-small" if args.small else ""
            if args.profile:
                profile_shape(shapes[name], root / f"{name}{suffix}",
                              warmup_groups=args.warmup_groups)
                continue
            try:
                r = run_shape(shapes[name], root / f"{name}{suffix}",
                              warmup_groups=args.warmup_groups,
                              compare_prefix=args.compare_prefix, fresh=args.fresh)
            except Exception as e:  # noqa: BLE001 (one shape failing must not lose the other)
                failed = True
                msg = f"{type(e).__name__}: {e}"
                print(f"\n{name}: FAILED: {msg}", flush=True)
                results["shapes"][name] = {"shape": name, "error": msg}
            else:
                print(report(r), flush=True)
                results["shapes"][name] = r
            if args.json:
                args.json.write_text(json.dumps(results, indent=2))
            _free(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    sys.exit(main())

"""Rollout throughput: plans per second of the local provider against a bare `model.generate` of
the same prompts and the same number of generated tokens, in the same run.

    python -m tests.benchmarks.bench_rollouts                       # CPU: SmolLM2, 8 plans
    python -m tests.benchmarks.bench_rollouts --shape 7b --cache-dir /tmp/bench-gpu-models
    python -m tests.benchmarks.bench_rollouts --shape 1.5b --small  # the GPU path, tiny, on a CPU

Ours: a group of `--batch` plan requests (the sim example's first task, the conductor's prompt,
the plan's JSON schema, temperature 1.0) submitted together to the provider's generation queue
(engine/providers/local/batching.py), which runs them as one `generate` under the plan grammar
(xgrammar), the provider's sampler, and the behaviour log-probabilities the trainer needs: what a
training iteration's rollouts cost. The device is the provider's own choice
(CONDUCTOR_LOCAL_DEVICE, default auto: the GPU when there is one, bfloat16 there).

Bare: the same model object, the same left-padded prompts, `model.generate(do_sample=True,
temperature=1.0, top_k=0)` with min_new_tokens = max_new_tokens = the number of steps our batch
ran (a batch runs until its longest row is done), so both sides run exactly as many forward
passes at the same batch size; no grammar, no log-probs, no queue. The ratio ours / bare (plans
per second, equivalently) is what the provider's machinery costs on top of the model.

Shapes:
  smollm2  (default) the project's local conductor, SmolLM2-135M-Instruct, on the CPU
  1.5b, 7b Qwen2.5-1.5B / 7B shapes with random bfloat16 weights, batch 64, plans of up to 200
           tokens. The model directories are bench_gpu_trainer.py's (`build_model_dir`, kept
           under --cache-dir, so a run after the trainer bench reuses them); the rollout model
           directory links those weights and adds a byte-level tokenizer (256 bytes + 3
           specials), since the trainer bench's three-word tokenizer cannot spell a plan. Random
           weights sample garbage, but the grammar still holds every row to a plan.

Printed: plans/s and tokens/s both sides, the steps run, peak GPU memory of each side (CUDA:
torch.cuda.max_memory_allocated, weights included), and the ratio. Goal (issue 33): the 7B shape
at >= 0.8 of bare at batch 64 in bfloat16.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from conductor_engine.engine.plan.language import plan_json_schema
from conductor_engine.engine.plan.prompts import conductor_messages
from conductor_engine.engine.providers import local
from conductor_engine.engine.providers.base import CompletionRequest
from conductor_engine.engine.providers.local import batching
from conductor_engine.engine.providers.local.chat import prompt_ids
from conductor_engine.engine.providers.pool import AgentSpec, Pool
from conductor_engine.engine.tasks.files import load_tasks

ROOT = Path(__file__).resolve().parents[2]

GOAL = 0.8  # ours / bare, 7B shape, batch 64, bfloat16 (issue 33)
TRAINER_SHAPES = {"1.5b": "full1.5b", "7b": "lora7b"}  # bench_gpu_trainer.py's shape names
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors",
               "model.safetensors.index.json")


def byte_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer with no merges: ids 0-2 the trainer bench's specials (pad,
    unk, eos), then one id per byte, so any text (a plan) tokenizes and xgrammar reads it as a
    byte-level vocabulary; then, as far as `vocab_size` allows, every pair of printable ASCII
    characters. Text always tokenizes to bytes (no merges), but the grammar sees thousands of
    tokens that free text may take, as a real vocabulary offers: a string's characters are no
    "choice" (at most grammar.CHOICE_MAX tokens), only the plan's decisions are."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2}
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord)
    for ch in alphabet:
        vocab[ch] = len(vocab)
    printable = [ch for ch in alphabet if ch.isprintable() and ord(ch) < 127] + ["\u0120"]
    for a in printable:
        for b in printable:
            if len(vocab) < vocab_size:
                vocab.setdefault(a + b, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>",
                                   eos_token="<eos>", unk_token="<unk>")


def rollout_model_dir(shape: str, cache: Path, small: bool) -> Path:
    """bench_gpu_trainer's random model of `shape` (built there unless cached) with the byte
    tokenizer, in `<cache>/<shape>-rollout` (the weights linked, not copied)."""
    import torch

    import tests.benchmarks.bench_gpu_trainer as trainer_bench

    name = TRAINER_SHAPES[shape]
    shapes = trainer_bench.SMALL if small else trainer_bench.SHAPES
    suffix = "-small" if small else ""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    weights = trainer_bench.build_model_dir(shapes[name], cache / f"{name}{suffix}", device)
    out = cache / f"{shape}{suffix}-rollout"
    out.mkdir(parents=True, exist_ok=True)
    for f in weights.iterdir():
        if f.name in MODEL_FILES or f.name.endswith(".safetensors"):
            link = out / f.name
            if not link.exists():
                link.symlink_to(f.resolve())
    byte_tokenizer(int(shapes[name].config["vocab_size"])).save_pretrained(out)
    return out


def requests(spec: AgentSpec, batch: int, max_tokens: int, max_steps: int) -> list[
        CompletionRequest]:
    """`batch` plan requests for the sim example's first task, as a GRPO group asks them."""
    pool = Pool.load(ROOT / "examples/sim/pool.toml")
    task = load_tasks(str(ROOT / "examples/sim/tasks.jsonl")).tasks[0]
    request = CompletionRequest(
        messages=conductor_messages(task.question, pool.available(), max_steps=max_steps,
                                    json_mode=True),
        temperature=1.0, max_tokens=max_tokens,
        json_schema=plan_json_schema([a.id for a in pool.agents], max_steps,
                                     subtask_max_chars=48),
        schema_name="plan",
    )
    return [request] * batch


async def ours(spec: AgentSpec, group: list[CompletionRequest]) -> tuple[float, list[int]]:
    """Seconds for the group through the provider's queue, and each plan's token count."""
    started = time.perf_counter()
    plans = await asyncio.gather(*(local.complete(spec, r) for r in group))
    seconds = time.perf_counter() - started
    print(f"  a plan: {plans[0].text[:100]!r}", flush=True)  # the grammar holds it to a plan
    return seconds, [p.usage.output_tokens for p in plans]


def bare(loaded: local.LoadedModel, group: list[CompletionRequest], steps: int) -> float:
    """Seconds for a plain sampled `generate` of the same prompts, exactly `steps` tokens each."""
    import torch

    ids = [prompt_ids(loaded.tokenizer, r) for r in group]
    width, pad = max(map(len, ids)), loaded.eos_ids[0]
    device = loaded.device or "cpu"
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in ids], device=device)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids], device=device)
    _sync()
    started = time.perf_counter()
    with torch.inference_mode():
        out = loaded.model.generate(
            input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=1.0,
            top_k=0, top_p=1.0, use_cache=True, min_new_tokens=steps, max_new_tokens=steps,
            pad_token_id=pad, eos_token_id=loaded.eos_ids)
    _sync()
    assert out.shape[1] - width == steps, (out.shape, width, steps)
    return time.perf_counter() - started


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


async def run(spec: AgentSpec, group: list[CompletionRequest], runs: int,
              warmup_tokens: int) -> dict[str, Any]:
    """Warm both sides up (short plans: kernels, the grammar compiled), then `runs` timed
    rounds, ours then bare, each bare at the steps ours ran in that round."""
    batching.queue = batching.GenerationQueue(max_batch=len(group), window_s=0.05)
    started = time.perf_counter()
    loaded = await asyncio.to_thread(local.load_model, spec)
    load_s = time.perf_counter() - started
    short = [r.model_copy(update={"max_tokens": warmup_tokens}) for r in group]
    await ours(spec, short)
    bare(loaded, short, warmup_tokens)
    rounds = []
    for _ in range(runs):
        _reset_peak()
        seconds, lengths = await ours(spec, group)
        ours_peak = _peak_gib()
        steps = max(lengths)
        _reset_peak()
        bare_s = bare(loaded, group, steps)
        rounds.append({"ours_s": seconds, "bare_s": bare_s, "steps": steps,
                       "tokens": sum(lengths), "min_len": min(lengths),
                       "ours_peak_gib": ours_peak, "bare_peak_gib": _peak_gib()})
        print(f"  ours {seconds:.2f} s ({sum(lengths)} tokens, plans {min(lengths)}-{steps} "
              f"tokens), bare {bare_s:.2f} s ({steps} steps)", flush=True)
    ours_s = statistics.median(r["ours_s"] for r in rounds)
    bare_s = statistics.median(r["bare_s"] for r in rounds)
    batch = len(group)
    return {
        "model": spec.model, "device": str(loaded.device), "dtype": str(loaded.model.dtype),
        "batch": batch, "load_s": round(load_s, 1), "rounds": rounds,
        "ours_plans_per_s": batch / ours_s, "bare_plans_per_s": batch / bare_s,
        "ratio": bare_s / ours_s,
        "ours_peak_gib": max((r["ours_peak_gib"] or 0) for r in rounds) or None,
        "bare_peak_gib": max((r["bare_peak_gib"] or 0) for r in rounds) or None,
    }


def report(name: str, r: dict[str, Any]) -> str:
    def gib(x: float | None) -> str:
        return "n/a (CPU)" if x is None else f"{x:.1f} GiB"

    return (f"\n{name}: {r['model']} on {r['device']} ({r['dtype']}), batch {r['batch']}: "
            f"ours {r['ours_plans_per_s']:.2f} plans/s, bare generate "
            f"{r['bare_plans_per_s']:.2f} plans/s, ratio ours/bare {r['ratio']:.2f} "
            f"(goal >= {GOAL} for 7b); peak GPU memory ours {gib(r['ours_peak_gib'])}, bare "
            f"{gib(r['bare_peak_gib'])}; model loaded in {r['load_s']} s")


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=["smollm2", *TRAINER_SHAPES], default="smollm2")
    parser.add_argument("--small", action="store_true",
                        help="the 1.5b/7b path on bench_gpu_trainer's 2-layer model (CPU)")
    parser.add_argument("--batch", type=int, help="plans at once (default 64 GPU, 8 CPU)")
    parser.add_argument("--max-tokens", type=int, help="per plan (default 200 GPU, 96 CPU)")
    parser.add_argument("--runs", type=int, default=None, help="timed rounds (1 GPU, 3 CPU)")
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/bench-gpu-models"))
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)

    big = args.shape != "smollm2" and not args.small
    if args.shape == "smollm2":
        spec = Pool.load(ROOT / "examples/sim/pool.toml").conductor
    else:
        where = rollout_model_dir(args.shape, args.cache_dir, args.small)
        spec = AgentSpec(id="conductor", provider="local", model=str(where))
    batch = args.batch or (64 if big else 8)
    max_tokens = args.max_tokens or (200 if big else 32 if args.small else 96)
    group = requests(spec, batch, max_tokens, max_steps=3)
    runs = args.runs or (3 if args.shape == "smollm2" else 1)
    print(f"{args.shape}{' (small)' if args.small else ''}: {batch} plans at once, "
          f"{runs} timed round(s)", flush=True)
    r = await run(spec, group, runs, warmup_tokens=8)
    r["shape"], r["small"] = args.shape, args.small
    print(report(args.shape, r), flush=True)
    if args.json:
        args.json.write_text(json.dumps(r, indent=2))
    return 0 if args.shape != "7b" or args.small or r["ratio"] >= GOAL else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    sys.exit(asyncio.run(main()))

"""Update throughput: `trainer.grpo.train_step` against TRL's GRPOTrainer doing the same update.

    python -m tests.benchmarks.bench_trainer [--runs 5] [--warmup 1] [--gpu]
    python -m tests.benchmarks.bench_trainer --hold [--updates 4] [--shapes tiny,smollm2] [--gpu]

With --hold it times instead what the trainer service saves by keeping its policy between the
updates of one training run: consecutive `Trainer.update` calls (real PostgreSQL, a local blob
store, groups of stored rollouts whose task_ids change every update, as the training workflow's
iterations do), once holding the policy and optimiser, once reloading the parent version from
the blob store before every update (what the service did while it compared whole recipes). The
updates are interleaved; the first of each run loads in both and is shown apart. Printed: the
median seconds per update and per getting the policy (`Trainer._hold`) of each, the time saved
per update and the ratio reload / hold of whole updates.

Both train the same model (same initial weights, float32 on the CPU, bfloat16 on the GPU) on the
same batch of rollouts (groups of completions of varied length sharing a prompt, advantages,
behaviour log-probs)
with the same loss (dapo by default), micro-batch size and gradient clipping, with AdamW. No
generation: only the update is timed, i.e. for every micro-batch the log-probs, the loss and
the backward pass, then clipping and the optimiser step.

  ours: train_step(model, optimizer, samples, cfg)
  TRL:  GRPOTrainer.compute_loss on each micro-batch of the inputs its
        _generate_and_score_completions hands its training step (the whole generation batch
        padded to one length, split into micro-batches), accelerator.backward, then the clip
        and optimiser step of transformers' Trainer loop

Each update is timed `--runs` times after `--warmup` updates, the two interleaved, and the
median tokens/s (completion tokens in the loss per second) is compared: goal ours/TRL >= 1.0.

Peak memory of an update, beyond what was in use before it (weights, gradients and optimiser
state, the same for both): on CUDA, torch.cuda.max_memory_allocated; on the CPU, the process's
peak resident set (VmHWM, reset before each update through /proc/self/clear_refs) minus its
resident set before the update. The CPU figure is approximate: memory the allocator kept from an
earlier update is reused without showing up.

Models: on the CPU, the tiny policy of the tests (tests/tiny_policy.py: a 2-layer Llama, hidden
64, SmolLM2's 49,152-token vocabulary, random weights); with --gpu (or when CUDA is present)
also a model of Qwen2.5-0.5B's shape built from its config (no download), in bfloat16.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from conductor_engine.engine.contracts.training import LossConfig
from conductor_engine.trainer.grpo import Sample, make_optimizer, train_step
from tests.benchmarks._harness import add_common_args, table
from tests.trl_inputs import trl_inputs

GOAL = 1.0
PAD, EOS = 0, 2

TINY = dict(model_type="llama", vocab_size=49152, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=2048, tie_word_embeddings=True)
QWEN_05B = dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1000000.0,
                rms_norm_eps=1e-6)


def build_model(shape: dict[str, Any], dtype: torch.dtype, device: str, seed: int = 0) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in shape.items() if k != "model_type"}
    config = AutoConfig.for_model(shape["model_type"], **fields, pad_token_id=PAD,
                                  eos_token_id=EOS, bos_token_id=None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)
    model.config.use_cache = False
    return model


def make_samples(n: int, vocab: int, prompt_len: int, completion_len: int, group_size: int,
                 seed: int = 0, header: int = 0) -> list[Sample]:
    """Rollouts as a GRPO update sees them: groups of `group_size` completions of one prompt of
    about `prompt_len` tokens, completions of 1/4 to all of `completion_len`, advantages of both
    signs, behaviour log-probs recorded. Every prompt opens with the same `header` tokens (the
    conductor's instructions, before a pool listing each run may see in its own order)."""
    rng = random.Random(seed)
    out = []
    prompt: list[int] = []
    opening = [rng.randrange(3, vocab) for _ in range(header)]
    for i in range(n):
        if i % group_size == 0:
            prompt = opening + [rng.randrange(3, vocab) for _ in
                                range(rng.randint(prompt_len * 3 // 4, prompt_len) - header)]
        completion = [rng.randrange(3, vocab) for _ in
                      range(rng.randint(completion_len // 4, completion_len))]
        out.append(Sample(
            prompt_ids=prompt,
            completion_ids=completion,
            advantage=rng.choice([-1, 1]) * rng.uniform(0.2, 1.5),
            behaviour_logprobs=[-rng.uniform(9.0, 12.0) for _ in completion],
        ))
    return out


def tiny_tokenizer() -> Any:
    """TRL needs a tokenizer for its pad and end ids; nothing is tokenized here."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<unk>": 1, "<eos>": EOS}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")),
                                   pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


# ------------------------------------------------------------------------------ the two updates


def ours(model: Any, samples: list[Sample], cfg: LossConfig) -> Callable[[], int]:
    optimizer = make_optimizer(model, cfg)

    def update() -> int:
        step = train_step(model, optimizer, samples, cfg, pad_id=PAD)
        assert step.skipped is None, step.skipped
        return step.tokens

    return update


def no_reward(completions: list[Any], **_: Any) -> list[float | None]:
    return [0.0] * len(completions)  # never called: no generation here


def trl(model: Any, samples: list[Sample], cfg: LossConfig, tmp: str) -> Callable[[], int]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import split_tensor_dict

    accumulation = -(-len(samples) // cfg.micro_batch_size)
    cuda = next(model.parameters()).device.type == "cuda"
    args = GRPOConfig(
        output_dir=tmp, report_to=[], use_cpu=not cuda, bf16=cuda, activation_checkpointing=False,
        per_device_train_batch_size=cfg.micro_batch_size, gradient_accumulation_steps=accumulation,
        num_generations=len(samples), loss_type=cfg.loss_type, epsilon=cfg.epsilon_low,
        epsilon_high=cfg.epsilon_high, beta=cfg.beta,
        max_completion_length=cfg.max_completion_length, learning_rate=cfg.learning_rate,
        max_grad_norm=cfg.max_grad_norm, weight_decay=0.0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=no_reward, args=args,
                          processing_class=tiny_tokenizer(),
                          train_dataset=Dataset.from_dict({"prompt": ["x"] * len(samples)}))
    optimizer = trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = accumulation
    device = next(model.parameters()).device

    inputs = trl_inputs(samples, cfg, pad_id=PAD)
    items = inputs.pop("num_items_in_batch")  # a scalar: not split into micro-batches
    generation_batch: dict[str, torch.Tensor | None] = {
        k: v.to(device) for k, v in inputs.items()}
    micro_batches = split_tensor_dict(generation_batch, accumulation)
    for mb in micro_batches:
        mb["num_items_in_batch"] = items.to(device)
    tokens = int(items)

    def update() -> int:
        model.train()
        for micro_batch in micro_batches:
            with trainer.compute_loss_context_manager():
                loss = trainer.compute_loss(model, micro_batch)
            trainer.accelerator.backward(loss)
        trainer.accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        model.zero_grad(set_to_none=True)
        return tokens

    return update


# ------------------------------------------------------------------------------ measuring


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(updates: dict[str, Callable[[], int]], device: str, runs: int, warmup: int
            ) -> dict[str, dict[str, list[float]]]:
    """Interleaved timed updates: tokens/s of each, and its peak memory beyond its baseline."""
    out: dict[str, dict[str, list[float]]] = {n: {"tps": [], "peak_mib": []} for n in updates}
    for i in range(warmup + runs):
        for name, update in updates.items():
            before = reset_peak(device)
            sync(device)
            started = time.perf_counter()
            tokens = update()
            sync(device)
            elapsed = time.perf_counter() - started
            peak = peak_since(device, before)
            if i >= warmup:
                out[name]["tps"].append(tokens / elapsed)
                if peak is not None:
                    out[name]["peak_mib"].append(peak)
    return out


def reset_peak(device: str) -> float:
    """Forget the peak so far; return the memory in use now (MiB)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        return float("nan")
    return proc_status_mib("VmRSS")


def peak_since(device: str, before: float) -> float | None:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20 - before
    return None if before != before else proc_status_mib("VmHWM") - before  # nan: unmeasured


def proc_status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def setup(which: str, args: argparse.Namespace, shape: dict[str, Any], device: str,
          dtype: torch.dtype, tmp: str) -> Callable[[], int]:
    cfg = LossConfig(loss_type=args.loss_type, micro_batch_size=args.micro_batch,
                     epsilon_high=0.28, max_completion_length=args.completion_len)
    samples = make_samples(args.samples, shape["vocab_size"], args.prompt_len,
                           args.completion_len, args.group_size, header=args.header)
    model = build_model(shape, dtype, device)
    return ours(model, samples, cfg) if which == "ours" else trl(model, samples, cfg, tmp)


def report(title: str, results: dict[str, dict[str, list[float]]]) -> float:
    def median(name: str, key: str) -> float | None:
        values = results[name][key]
        return statistics.median(values) if values else None

    rows = []
    for name, r in results.items():
        tps, peak = r["tps"], median(name, "peak_mib")
        rows.append([name, f"{statistics.median(tps):,.0f}", f"{min(tps):,.0f}",
                     f"{max(tps):,.0f}", len(tps), "-" if peak is None else f"{peak:,.0f}"])
    print(f"\n{title}")
    print(table(["trainer", "median tok/s", "min", "max", "n", "peak MiB"], rows))
    ratio = statistics.median(results["ours"]["tps"]) / statistics.median(results["TRL"]["tps"])
    print(f"ratio ours / TRL (median tokens/s) = {ratio:.2f}   goal >= {GOAL:.2f}: "
          f"{'MET' if ratio >= GOAL else 'MISSED'}")
    mine, theirs = median("ours", "peak_mib"), median("TRL", "peak_mib")
    if mine is None or theirs is None:
        print("peak memory: not measured here (no /proc/self/clear_refs)")
    else:
        print(f"peak memory of an update, ours / TRL = {mine:,.0f} / {theirs:,.0f} MiB = "
              f"{mine / theirs:.2f} ({'lower or equal' if mine <= theirs else 'HIGHER'})")
    return ratio


# ------------------------------------------------------------------------------ holding the policy

SMOLLM2_135M = dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    max_position_embeddings=2048, tie_word_embeddings=True)
HOLD_SHAPES = {"tiny": (TINY, False), "smollm2": (SMOLLM2_135M, True),  # shape, LoRA
               "smollm2-full": (SMOLLM2_135M, False)}


def policy_dir(shape: dict[str, Any], out: Path) -> Path:
    """A randomly initialised model of `shape` and a whitespace tokenizer, saved as a model
    directory a PolicyConfig can name (no download)."""
    from tokenizers.pre_tokenizers import Whitespace

    model = build_model(shape, torch.float32, "cpu")
    model.save_pretrained(out)
    tokenizer = tiny_tokenizer()
    tokenizer.backend_tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save_pretrained(out)
    return out


def hold_recipe(model: Path, lora: bool, task: str, group_size: int, device: str) -> Any:
    from conductor_engine.engine.contracts.training import PolicyConfig, Recipe, RolloutConfig

    return Recipe(policy=PolicyConfig(base=str(model), lora=lora, lora_r=16, device=device),
                  loss=LossConfig(learning_rate=1e-4, micro_batch_size=8),
                  rollouts=RolloutConfig(group_size=group_size, groups_per_update=1,
                                         max_staleness=1000, task_ids=[task]))


@dataclass
class HoldTimes:
    """Seconds of each kind of trainer ("hold", "reload"): per update after the first, the part
    of it spent getting the policy (`Trainer._hold`), the first update, and the loads."""

    updates: dict[str, list[float]]
    getting: dict[str, list[float]]
    first: dict[str, float]
    loads: dict[str, int]


def timed_trainer(settings: Any, reload_every_update: bool) -> Any:
    """The trainer service's Trainer, timing how long each update takes to get its policy; the
    baseline drops what it holds first, so the parent version is loaded from the blob store
    before every update."""
    from conductor_engine.trainer.service import Trainer

    class TimedTrainer(Trainer):
        def __init__(self) -> None:
            super().__init__(settings)
            self.getting: list[float] = []

        async def _hold(self, req: Any, registry: Any, store: Any) -> Any:
            started = time.perf_counter()
            if reload_every_update:
                self._kept = None
            held = await super()._hold(req, registry, store)
            self.getting.append(time.perf_counter() - started)
            return held

    return TimedTrainer()


async def time_holding(args: argparse.Namespace, shape_name: str, root: Path, url: str
                       ) -> HoldTimes:
    """Interleaved consecutive updates of a held and of a reloading trainer, each on its own
    policy name and its own tasks' groups."""
    from conductor_engine.engine.contracts.training import UpdateRequest
    from conductor_engine.engine.settings import Settings
    from conductor_engine.engine.storage.shared_store import shared_store
    from tests.rollout_groups import write_groups

    shape, lora = HOLD_SHAPES[shape_name]
    device = "cuda" if args.gpu else "cpu"
    model = policy_dir(shape, root / f"model-{shape_name}")
    settings = Settings(database_url=url, data_dir=root / "data", log_level="warning")
    store = await shared_store(settings)
    trainers = {"hold": timed_trainer(settings, False), "reload": timed_trainer(settings, True)}
    names = {k: f"{shape_name}-{k}" for k in trainers}
    for name in names.values():  # a group of a task of its own for every update
        tasks = [f"{name}-{i}" for i in range(args.updates + 1)]
        await write_groups(store, name, tasks, group_size=args.group_size,
                           completion_len=args.completion_len, vocab=shape["vocab_size"],
                           prompt_words=args.prompt_len)
    seconds: dict[str, list[float]] = {k: [] for k in trainers}
    for i in range(args.updates + 1):
        for kind, trainer in trainers.items():
            req = UpdateRequest(name=names[kind], parent=i, update_id=f"{names[kind]}-{i}",
                                recipe=hold_recipe(model, lora, f"{names[kind]}-{i}",
                                                   args.group_size, device))
            started = time.perf_counter()
            result = await trainer.update(req)
            seconds[kind].append(time.perf_counter() - started)
            assert result.published, result.reason
    return HoldTimes(updates={k: v[1:] for k, v in seconds.items()},
                     getting={k: t.getting[1:] for k, t in trainers.items()},
                     first={k: v[0] for k, v in seconds.items()},
                     loads={k: t.loads for k, t in trainers.items()})


async def hold_bench(args: argparse.Namespace) -> int:
    from conductor_engine.engine.storage.shared_store import close_shared_stores
    from tests.benchmarks._harness import postgres, reachable_tempdir

    print(f"{args.updates} consecutive updates after a first, each on a new task's group of "
          f"{args.group_size} rollouts (prompts ~{args.prompt_len} words, completions of "
          f"{args.completion_len} tokens), held vs reloaded, interleaved; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")
    rows, met = [], True
    with reachable_tempdir("bench-hold-") as root, postgres(root / "pg") as url:
        try:
            for shape_name in args.shapes.split(","):
                t = await time_holding(args, shape_name, root, url)
                med = {k: statistics.median(v) for k, v in t.updates.items()}
                get = {k: statistics.median(v) for k, v in t.getting.items()}
                saved = get["reload"] - get["hold"]
                met = met and t.loads["hold"] == 1 and saved > 0
                lora = "LoRA" if HOLD_SHAPES[shape_name][1] else "full"
                rows.append([f"{shape_name} ({lora})",
                             f"{t.first['hold']:.2f} / {t.first['reload']:.2f}",
                             f"{med['hold']:.2f} / {med['reload']:.2f}",
                             f"{get['hold']:.3f} / {get['reload']:.3f}",
                             f"{t.loads['hold']} / {t.loads['reload']}",
                             f"{saved:.3f} ({saved / med['reload']:.0%})",
                             f"{med['reload'] / med['hold']:.2f}"])
        finally:
            await close_shared_stores()
    print(table(["policy", "first update s", "s per update", "getting the policy s", "loads",
                 "saved s per update", "reload / hold"], rows))
    print("(hold / reload in each cell; medians over the updates after the first; saved: the "
          "median time to get the policy, reloading minus holding, and its share of a "
          "reloading update)")
    print(f"goal: the held trainer loads once and saves time on every shape: "
          f"{'MET' if met else 'MISSED'}")
    return 0 if met else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(parser)
    parser.add_argument("--hold", action="store_true",
                        help="time consecutive updates holding the policy vs reloading it")
    parser.add_argument("--updates", type=int, default=4, help="--hold: updates after the first")
    parser.add_argument("--shapes", default="tiny,smollm2",
                        help="--hold: tiny (full fine-tuning), smollm2 (SmolLM2-135M's shape, "
                        "LoRA), smollm2-full (the same, full fine-tuning); --gpu: on CUDA")
    parser.add_argument("--samples", type=int, default=16, help="rollouts per update")
    parser.add_argument("--group-size", type=int, default=8,
                        help="completions per prompt (1: every prompt its own)")
    parser.add_argument("--header", type=int, default=0,
                        help="tokens every prompt opens with (the ours side runs them once per "
                        "micro-batch); try --group-size 1 --header 96 --prompt-len 240, "
                        "prompts as runs offered the pool in their own orders have them")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--completion-len", type=int, default=128, help="the longest completion")
    parser.add_argument("--loss-type", default="dapo", choices=["grpo", "dr_grpo", "dapo"])
    parser.add_argument("--gpu", action="store_true", help="also the Qwen2.5-0.5B shape on CUDA")
    args = parser.parse_args()

    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("trl").setLevel(logging.ERROR)
    if args.hold:
        from tests.benchmarks._harness import quiet_logs, run

        quiet_logs("warning")
        return run(lambda: hold_bench(args))

    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        print(f"{args.samples} rollouts per update in groups of {args.group_size} "
              f"(prompts ~{args.prompt_len} tokens, the first {args.header} alike, "
              f"completions up to {args.completion_len}), micro-batches of {args.micro_batch}, "
              f"loss {args.loss_type}; {args.runs} timed updates each after {args.warmup} "
              f"warm-up, interleaved; torch {torch.__version__}, {torch.get_num_threads()} threads")
        updates = {n: setup(n, args, TINY, "cpu", torch.float32, tmp) for n in ("ours", "TRL")}
        results = measure(updates, "cpu", args.runs, args.warmup)
        ratios = [report("CPU, tiny policy (2 layers, hidden 64, vocab 49,152), float32",
                         results)]
        del updates

        if args.gpu or torch.cuda.is_available():
            if not torch.cuda.is_available():
                print("\n--gpu: no CUDA device here; skipped")
                return 1
            updates = {n: setup(n, args, QWEN_05B, "cuda", torch.bfloat16, tmp)
                       for n in ("ours", "TRL")}
            results = measure(updates, "cuda", args.runs, args.warmup)
            ratios.append(report(f"CUDA ({torch.cuda.get_device_name()}), Qwen2.5-0.5B shape, "
                                 "bfloat16", results))
    return 0 if min(ratios) >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())

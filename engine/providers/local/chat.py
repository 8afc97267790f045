"""A chat as the local model reads it: the model's chat template, rendered and tokenized.

The trainer renders a trace's prompt with `render_chat` too, so it scores exactly the tokens the
local provider sampled from.
"""

from __future__ import annotations

from typing import Any

from conductor_engine.engine.contracts.agent_calls import Message
from conductor_engine.engine.providers.base import CompletionRequest

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2's chat format, used only when a tokenizer arrives without a chat template."""


def ensure_chat_template(tokenizer: Any) -> None:
    """GGUF files usually carry the chat template; when one does not, use SmolLM2's ChatML."""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE


def render_chat(tokenizer: Any, messages: list[Message]) -> str:
    """The chat as the model reads it, ending with the assistant's turn opener. The trainer
    renders a trace's prompt with this too, so it scores exactly the tokens that were sampled."""
    ensure_chat_template(tokenizer)
    return str(tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages],
        tokenize=False, add_generation_prompt=True,
    ))


def prompt_ids(tokenizer: Any, request: CompletionRequest) -> list[int]:
    """The chat rendered with the model's template, ending with the assistant's turn opener.

    Rendered to text and tokenized without special tokens, since the template already writes
    every marker (otherwise some tokenizers add a second BOS).
    """
    text = render_chat(tokenizer, request.messages)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])

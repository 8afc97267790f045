"""The `kind`s of the local model's AgentCallErrors, and the install command they point to.

Every local failure a person must fix (a missing library, unusable weights, a schema xgrammar
cannot compile) is raised non-retryable with one of these kinds and a message that says what to do.
"""

from __future__ import annotations

from conductor_engine.engine.providers.errors import BAD_REQUEST

__all__ = ["BAD_REQUEST", "GENERATION_FAILED", "INSTALL_HINT", "LOAD_FAILED"]

LOAD_FAILED = "LocalModelLoadFailed"
GENERATION_FAILED = "LocalGenerationFailed"
INSTALL_HINT = "install the local extra with `pip install -e '.[local]'`"
"""How to get torch, transformers, gguf, accelerate, peft and xgrammar."""

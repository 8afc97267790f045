"""The models `conductor serve` offers: the conductor system (its pool and a policy version)
under the pool's conductor id. `ID` runs the version the pool file names (`latest` unless it pins
one); `ID@base`, `ID@v3` (or `ID@3`) and `ID@latest` pin a version for the one request.

Published versions come from the policy registry (engine/storage/policies.py); versions are
numbered without gaps (each publishes parent + 1), so a version exists when it is at most the
newest one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from conductor_engine.engine.contracts.policy_versions import (
    BASE,
    LATEST,
    parse_version,
    version_label,
)
from conductor_engine.engine.text import shorten

MAX_MODEL_NAME_CHARS = 256
"""The longest model name a request may give (the conductor's id, `@`, a version label)."""

Newest = Callable[[str], Awaitable[int]]
"""The newest published version of a policy (0 when none is): PolicyRegistry.latest_version."""


class UnknownModel(LookupError):
    """A model name the server does not offer; the message says what it does offer."""


class ModelCatalog:
    def __init__(self, conductor_id: str, newest: Newest) -> None:
        self.conductor_id, self._newest = conductor_id, newest

    async def names(self) -> list[str]:
        """Every model a request may name: the conductor, then each version pinned."""
        newest = await self._newest(self.conductor_id)
        pinned = [f"{self.conductor_id}@{version_label(v)}" for v in range(newest + 1)]
        return [self.conductor_id, f"{self.conductor_id}@{LATEST}", *pinned]

    async def policy_version(self, model: str) -> str | None:
        """The RunOptions.policy_version a model name asks for (None: the pool file's).
        UnknownModel for a name that is not the conductor's, or a version not published."""
        name, at, label = model.partition("@")
        if len(model) > MAX_MODEL_NAME_CHARS:
            raise UnknownModel(f"the model {shorten(model, 60)!r} does not exist: a model name "
                               f"is at most {MAX_MODEL_NAME_CHARS} characters; GET /v1/models "
                               "lists them")
        if name != self.conductor_id:
            raise UnknownModel(f"the model {model!r} does not exist; this server offers "
                               f"{self.conductor_id!r} (and {self.conductor_id}@VERSION, e.g. "
                               f"@base, @v1): GET /v1/models lists them")
        if not at:
            return None
        try:
            version = parse_version(label)
        except ValueError as e:
            raise UnknownModel(f"the model {model!r} does not exist: {e}") from None
        if version is None:
            return LATEST
        newest = await self._newest(self.conductor_id)
        if version > newest:
            raise UnknownModel(f"the model {model!r} does not exist: policy "
                               f"{self.conductor_id!r} has no version {version_label(version)} "
                               f"(newest: {version_label(newest)})")
        return BASE if version == 0 else version_label(version)

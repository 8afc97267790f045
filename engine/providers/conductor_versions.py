"""Which conductor serves a policy version: the pool's conductor as it is for the base
version, or as it must be to serve a trained one (the local provider from the version's
checkpoint, an openai-compatible server such as vLLM under the version's adapter name), with
the registry read, the checkpoint fetched and the adapter loaded on the way. The plan activity
asks; this module knows how."""

from __future__ import annotations

from conductor_engine.engine.contracts.policy_versions import (
    VersionPin,
    parse_version,
    version_label,
)
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.providers.base import AgentCallError
from conductor_engine.engine.providers.pool import AgentSpec, Pool
from conductor_engine.engine.providers.registry import capabilities
from conductor_engine.engine.providers.serving import (
    LORA_ADAPTER_LOST,
    ensure_lora_adapter,
    forget_lora_adapter,
)
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.policies import (
    PolicyError,
    PolicyRegistry,
    ServedMarks,
    VersionCache,
    materialise,
    served_name,
)
from conductor_engine.engine.storage.shared_store import shared_store


class ConductorVersions:
    """The pool's conductor at each policy version, for one worker: the newest version is
    cached (VersionCache) and every version served is marked so retention keeps it."""

    def __init__(self, pool: Pool, settings: Settings | None = None) -> None:
        self.pool = pool
        self.settings = settings
        self._versions: VersionCache | None = None
        self._served = ServedMarks()

    async def at(self, pinned: VersionPin | None) -> tuple[AgentSpec, str]:
        """The conductor spec serving the wanted policy version, and that version's label.

        The task may pin a version (training does, per iteration); otherwise the pool file's
        `policy_version`, where 'latest' follows the registry. A trained version is served by
        the local provider from its checkpoint (fetched from the blob store once) or, for an
        openai-compatible server such as vLLM, under the adapter name `NAME-vK`, which is
        loaded into vLLM (runtime LoRA) on first use; see engine/providers/serving.py. Which
        way a provider serves versions is its declared `trained_versions`.
        """
        conductor = self.pool.conductor
        wanted = parse_version(conductor.policy_version if pinned is None else pinned)
        if wanted == 0 or (wanted is None and self.settings is None):
            return conductor, version_label(0)
        store = await shared_store(self._settings())
        registry = PolicyRegistry(store.pool)
        if wanted is None:
            if self._versions is None:
                self._versions = VersionCache(registry)
            wanted = await self._versions.newest(conductor.id)
            if wanted == 0:
                return conductor, version_label(0)
        label = version_label(wanted)
        await self._served.mark(registry, conductor.id, wanted)  # retention keeps it meanwhile
        serves = capabilities(conductor.provider).trained_versions
        if serves == "checkpoint":
            version = await registry.get(conductor.id, wanted)
            where = await materialise(version, store.blobs, self._settings().data_dir / "policies")
            return revised(conductor, checkpoint=str(where)), label
        if serves == "served":
            version = await registry.get(conductor.id, wanted)  # clear error if never made
            if version.kind == "lora":  # full weights are served by a vLLM of their own
                where = await materialise(version, store.blobs, self._settings().lora_root)
                await ensure_lora_adapter(conductor, version, where)
            return revised(conductor, model=served_name(conductor.id, wanted)), label
        raise PolicyError(
            f"the conductor {conductor.id!r} runs on {conductor.provider}, which cannot serve a "
            f"trained version ({label}); serve it with vLLM (provider openai-compatible) or "
            f"the local provider, or pin policy_version = 'base'"
        )

    def _settings(self) -> Settings:
        assert self.settings is not None
        return self.settings


def adapter_lost(conductor: AgentSpec, error: AgentCallError) -> AgentCallError | None:
    """A 404 for an adapter this process loaded means vLLM lost it (it restarted): forget the
    load, and retry, which loads it again. None for every other error."""
    if error.status != 404 or not forget_lora_adapter(conductor, conductor.model):
        return None
    return AgentCallError(
        f"agent {conductor.id}: {conductor.base_url} no longer serves adapter "
        f"{conductor.model} (vLLM restarted?); it is loaded again on the next attempt",
        retryable=True, status=404, kind=LORA_ADAPTER_LOST,
    )

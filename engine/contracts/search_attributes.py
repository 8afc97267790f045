"""Search attributes: what lets the Temporal UI's filter box (and `temporal workflow list -q`)
find runs, e.g. `ConductorBatch = "nightly" AND ConductorReward = 0`.

The workflow upserts them as a run learns its values. They must be registered on the namespace
before a worker runs: the embedded dev server gets them at start (`--search-attribute`), and
`ensure_registered` adds any that are missing at worker start; on a cluster where the worker may
not, the error prints the `temporal operator search-attribute create` commands to run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

if TYPE_CHECKING:
    from conductor_engine.engine.contracts.tasks import Task

BATCH = SearchAttributeKey.for_keyword("ConductorBatch")
TASK = SearchAttributeKey.for_keyword("ConductorTask")
DATASET = SearchAttributeKey.for_keyword("ConductorDataset")
POLICY_VERSION = SearchAttributeKey.for_keyword("ConductorPolicyVersion")
REWARD = SearchAttributeKey.for_float("ConductorReward")
AGENTS = SearchAttributeKey.for_keyword_list("ConductorAgents")

ALL: list[SearchAttributeKey[Any]] = [BATCH, TASK, DATASET, POLICY_VERSION, REWARD, AGENTS]

def task_search_attributes(task: Task) -> TypedSearchAttributes:
    """Set by whoever starts a run, so a running batch is already searchable by name, task
    and dataset."""
    pairs: list[SearchAttributePair[Any]] = [SearchAttributePair(TASK, task.id)]
    if task.batch:
        pairs.append(SearchAttributePair(BATCH, task.batch))
    if task.dataset:
        pairs.append(SearchAttributePair(DATASET, task.dataset))
    return TypedSearchAttributes(pairs)


# The type names that `temporal` (CLI and dev server) takes.
_CLI_TYPES = {"KEYWORD": "Keyword", "DOUBLE": "Double", "KEYWORD_LIST": "KeywordList"}


def cli_type(key: SearchAttributeKey[Any]) -> str:
    return _CLI_TYPES[key.indexed_value_type.name]


def dev_server_flags() -> list[str]:
    flags: list[str] = []
    for key in ALL:
        flags += ["--search-attribute", f"{key.name}={cli_type(key)}"]
    return flags


def create_commands(namespace: str) -> list[str]:
    return [
        f"temporal operator search-attribute create --namespace {namespace} "
        f"--name {key.name} --type {cli_type(key)}"
        for key in ALL
    ]


class SearchAttributesMissing(RuntimeError):
    """The namespace lacks the engine's search attributes and the worker may not add them."""


async def ensure_registered(client: Any, namespace: str) -> list[str]:
    """Add the engine's search attributes that the namespace lacks; returns the names added."""
    from temporalio.api.enums.v1 import IndexedValueType  # same numbers as the SDK's enum
    from temporalio.api.operatorservice.v1 import (
        AddSearchAttributesRequest,
        ListSearchAttributesRequest,
    )
    from temporalio.service import RPCError

    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        have = set(listed.custom_attributes) | set(listed.system_attributes)
        missing = {k.name: IndexedValueType.ValueType(int(k.indexed_value_type))
                   for k in ALL if k.name not in have}
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=namespace, search_attributes=missing)
            )
    except RPCError as e:
        commands = "\n  ".join(create_commands(namespace))
        raise SearchAttributesMissing(
            f"cannot register the engine's search attributes on namespace {namespace!r} "
            f"({e.message}); ask an operator to run:\n  {commands}"
        ) from e
    return sorted(missing)

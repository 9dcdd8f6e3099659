"""Custom SearchParameter resources and the reindex that makes them (and any change of
the generated definitions) take effect.

A SearchParameter posted to ``/fhir/SearchParameter`` is stored like any resource; it
changes nothing until ``healthplatform reindex`` runs :func:`reindex`, which

1. collects the SearchParameter resources that are not retired,
2. builds the registry (built-ins + those) and re-extracts the index rows of every current
   resource, in batches, each batch replaced atomically,
3. records the active custom definitions in the ``search_registry`` document collection.

Every FhirService (this process or another one on the same store) compares that record's
version with its own at most every :data:`REFRESH_SECONDS` and rebuilds its registry when
it changed, so new writes are indexed, and searches accept, the new parameters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import orjson

from fhir_server.search.extract import IndexExtractor
from fhir_server.search.plan import SearchPlan
from fhir_server.search.registry import SearchRegistry, builtin_registry
from fhir_server.store.port import IndexRows, ResourceStore

REGISTRY_COLLECTION = "search_registry"
REGISTRY_DOCUMENT = "active"
REFRESH_SECONDS = 2.0
REINDEX_BATCH = 500

Progress = Callable[[int, int], None]  # (done, total)


async def active_registry(store: ResourceStore) -> SearchRegistry:
    """The registry the last reindex activated (the built-in one before any reindex)."""
    record = await store.get_document(REGISTRY_COLLECTION, REGISTRY_DOCUMENT)
    if not record or not record.get("parameters"):
        return builtin_registry()
    return builtin_registry().with_custom(record["parameters"], record["version"])


async def active_version(store: ResourceStore) -> str:
    record = await store.get_document(REGISTRY_COLLECTION, REGISTRY_DOCUMENT)
    return str(record["version"]) if record else "builtin"


async def stored_search_parameters(store: ResourceStore) -> list[dict[str, Any]]:
    """Every current SearchParameter resource whose status is not ``retired``."""
    definitions: list[dict[str, Any]] = []
    plan = SearchPlan(("SearchParameter",), count=500)
    while True:
        page = await store.search(plan)
        for stored in page.resources:
            definition = orjson.loads(stored.body)
            if definition.get("status") != "retired":
                definitions.append(definition)
        if page.next is None:
            return definitions
        plan.cursor = page.next


def _version(definitions: list[dict[str, Any]]) -> str:
    if not definitions:
        return "builtin"
    digest = hashlib.sha256(orjson.dumps(definitions, option=orjson.OPT_SORT_KEYS))
    return digest.hexdigest()[:16]


async def reindex(store: ResourceStore, progress: Progress | None = None) -> SearchRegistry:
    """Rebuild every current resource's index rows with the active definitions."""
    definitions = await stored_search_parameters(store)
    registry = builtin_registry().with_custom(definitions, _version(definitions))
    extract = IndexExtractor(registry)
    total = await store.count_current()
    done = 0
    if progress is not None:
        progress(done, total)
    async for batch in store.iter_current(REINDEX_BATCH):
        items: list[tuple[Any, IndexRows]] = [(s, extract(orjson.loads(s.body))) for s in batch]
        await store.replace_index(items)
        done += len(batch)
        if progress is not None:
            progress(done, total)
    async with store.unit_of_work() as uow:
        uow.put_document(REGISTRY_COLLECTION, REGISTRY_DOCUMENT,
                         {"version": registry.version, "parameters": definitions})
        await uow.commit()
    return registry

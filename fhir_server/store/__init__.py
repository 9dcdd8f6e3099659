"""The system of record: the store port and its adapters, chosen by a URL.

Adapters are imported when a URL of their scheme asks for one, so a deployment loads
only its own driver: ``sqlite:///path`` (:mod:`fhir_server.store.sqlite`, the embedded
default), ``mongodb://...`` and ``mongodb+srv://...`` (:mod:`fhir_server.store.mongo`, production:
a replica set or a sharded cluster).
"""

from __future__ import annotations

from typing import Any

from fhir_server.store.port import (
    Condition,
    ConditionChanged,
    DuplicateDocument,
    HistoryPage,
    IndexRows,
    InvalidSearch,
    MultipleMatches,
    ResourceExists,
    ResourceGone,
    ResourceNotFound,
    ResourceStore,
    SearchPage,
    SearchTooCostly,
    Staging,
    StoredResource,
    StoreError,
    TransactionsUnavailable,
    UnitOfWork,
    UnstorableResource,
    VersionConflict,
)


def store_from_url(url: str, **kwargs: Any) -> ResourceStore:
    """The adapter for ``url``'s scheme, imported now."""
    scheme = url.partition(":")[0]
    if scheme == "sqlite":
        from fhir_server.store.sqlite import SQLiteStore

        return SQLiteStore.from_url(url, **kwargs)
    if scheme in ("mongodb", "mongodb+srv"):
        from fhir_server.store.mongo import MongoStore

        return MongoStore.from_url(url, **kwargs)
    raise ValueError(f"unsupported store URL {url!r}: use sqlite:///path or mongodb://...")


__all__ = [
    "Condition",
    "ConditionChanged",
    "DuplicateDocument",
    "HistoryPage",
    "IndexRows",
    "InvalidSearch",
    "MultipleMatches",
    "ResourceExists",
    "ResourceGone",
    "ResourceNotFound",
    "ResourceStore",
    "SearchPage",
    "SearchTooCostly",
    "Staging",
    "StoreError",
    "StoredResource",
    "TransactionsUnavailable",
    "UnitOfWork",
    "UnstorableResource",
    "VersionConflict",
    "store_from_url",
]

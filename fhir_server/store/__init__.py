"""The system of record: the store port and its adapters, chosen by a URL."""

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
    UnitOfWork,
    VersionConflict,
)
from fhir_server.store.sqlite import SQLiteStore


def store_from_url(url: str, **kwargs: Any) -> ResourceStore:
    """``sqlite:///path`` → the embedded adapter (the only one so far)."""
    if url.startswith("sqlite:///"):
        return SQLiteStore.from_url(url, **kwargs)
    raise ValueError(f"unsupported store URL {url!r}: use sqlite:///path")


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
    "SQLiteStore",
    "SearchPage",
    "SearchTooCostly",
    "Staging",
    "StoreError",
    "StoredResource",
    "UnitOfWork",
    "VersionConflict",
    "store_from_url",
]

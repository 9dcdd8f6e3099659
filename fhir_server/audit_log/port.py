"""The audit log port: what each adapter of the log implements.

The log is append-only: entries are added in batches (:meth:`AuditLog.append`, durable
when it returns) and leave only when the retention expires them
(:meth:`AuditLog.purge`), never changed. Each store adapter brings its own log
(``store.audit_log``): on SQLite a database file of its own beside the store's, on
MongoDB collections of their own, one per month.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from fhir_server.audit_log.entry import Entry
from fhir_server.audit_log.query import LogQuery
from fhir_server.search.plan import Cursor


@dataclass(frozen=True, slots=True)
class Found:
    """An entry as read: enough to render it (:func:`~fhir_server.audit_log.entry.render`)."""

    id: str
    logged: str
    body: bytes


@dataclass(slots=True)
class LogPage:
    entries: list[Found]
    total: int | None = None
    next: Cursor | None = None


class AuditLog(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...

    async def append(self, entries: Sequence[Entry]) -> None:
        """Write ``entries`` (durably, in one step) before returning."""
        ...

    async def get(self, entry_id: str) -> Found | None: ...

    async def search(self, query: LogQuery) -> LogPage: ...

    async def purge(self, before: str, logged_before: str) -> int:
        """Remove the entries recorded before ``before`` and logged before
        ``logged_before`` (sortable UTC instants); how many went."""
        ...

    async def oldest(self) -> str | None:
        """The ``recorded`` instant of the oldest entry (None: the log is empty)."""
        ...

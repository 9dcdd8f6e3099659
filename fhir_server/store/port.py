"""The store port: what every storage adapter of the system of record implements.

The FHIR service and the /api facades talk to this protocol only; the SQLite adapter
(embedded default) and the MongoDB adapter (production) sit behind it and pass the same
contract suite in ``tests/contract/``.

Writes go through a :class:`UnitOfWork`. Its operations are *staged* and applied in one
atomic step on ``commit()``: version numbers, ``meta.lastUpdated`` and preconditions
(``If-Match``, and the search :class:`Condition` of a conditional create or update) are
checked and assigned inside that step, so two concurrent writers can never both win
against the same version, and two identical conditional creates never both create.

Erasure: ``UnitOfWork.expunge`` removes stored versions for good, the one write that
rewrites the past (a data subject's right to erasure; HAPI FHIR calls it ``$expunge``).
Every other write only adds versions.

Searches arrive as a backend-neutral :class:`~fhir_server.search.plan.SearchPlan`; each
adapter compiles it against its own index structures and answers a :class:`SearchPage`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fhir_server.search.plan import AccessGrant, Cursor, SearchPlan
from fhir_server.store.index import Row

JSON = dict[str, Any]


class StoreError(Exception):
    """Base of the errors a store raises; each maps to one HTTP status.

    ``staged`` is the staged write that failed, when a commit fails on one (a transaction
    bundle names the entry from it)."""

    staged: StagedWrite | None = None


class ResourceNotFound(StoreError):
    def __init__(self, resource_type: str, resource_id: str, version: str | None = None):
        self.resource_type, self.resource_id, self.version = resource_type, resource_id, version
        where = f"{resource_type}/{resource_id}" + (f"/_history/{version}" if version else "")
        super().__init__(f"Resource {where} is not known")


class ResourceGone(StoreError):
    """The resource existed and its current version is a delete tombstone."""

    def __init__(self, resource_type: str, resource_id: str, version: int):
        self.resource_type, self.resource_id, self.version = resource_type, resource_id, version
        super().__init__(f"Resource {resource_type}/{resource_id} was deleted (version {version})")


class VersionConflict(StoreError):
    """An If-Match precondition named a version that is no longer current."""

    def __init__(self, resource_type: str, resource_id: str, expected: int, current: int | None):
        self.resource_type, self.resource_id = resource_type, resource_id
        self.expected, self.current = expected, current
        super().__init__(
            f"{resource_type}/{resource_id}: expected version {expected}, current is {current}"
        )


class ResourceExists(StoreError):
    """A create named an id that is already taken."""

    def __init__(self, resource_type: str, resource_id: str):
        self.resource_type, self.resource_id = resource_type, resource_id
        super().__init__(f"Resource {resource_type}/{resource_id} already exists")


class DuplicateDocument(StoreError):
    """A document with the same id, or the same value of a unique field, already exists."""


class MultipleMatches(StoreError):
    """A conditional create or update matched more than one resource (HTTP 412)."""

    def __init__(self, resource_type: str, count: int):
        self.resource_type, self.count = resource_type, count
        super().__init__(f"The condition matches {count} {resource_type} resources; "
                         "it must match at most one")


class ConditionChanged(StoreError):
    """What a condition matches changed between resolving it and committing (a concurrent
    write won); the caller resolves again and retries."""


class SearchTooCostly(StoreError):
    """A search would scan too much; refine it (HTTP 400, issue code too-costly)."""


class InvalidSearch(StoreError):
    """A search the adapter cannot run as asked (HTTP 400)."""


class UnstorableResource(StoreError):
    """A staged resource cannot be written as JSON text (nested deeper than the encoder
    allows, an integer beyond 64 bits...): its own unit of work fails (HTTP 400), never
    the others committed with it."""

    def __init__(self, resource_type: str, resource_id: str, reason: str):
        self.resource_type, self.resource_id = resource_type, resource_id
        super().__init__(f"{resource_type}/{resource_id} cannot be stored: {reason}")


class TransactionsUnavailable(StoreError):
    """A unit of work writing several resources, on a store that cannot apply it all or
    nothing (a standalone MongoDB server: multi-document transactions need a replica
    set). Refused before anything is written (HTTP 501)."""


@dataclass(frozen=True, slots=True)
class StoredResource:
    """One version of a resource as stored. ``body`` is the JSON text including ``meta``."""

    resource_type: str
    id: str
    version: int
    last_updated: str  # FHIR instant, UTC, e.g. 2026-11-22T10:57:16.123456+00:00
    deleted: bool
    body: bytes  # JSON text (empty for a delete tombstone)
    method: str = "PUT"  # POST | PUT | PATCH | DELETE: the interaction that made this version
    seq: int = 0  # position in the store's global write order (history paging cursor)

    @property
    def etag(self) -> str:
        return f'W/"{self.version}"'


@dataclass(slots=True)
class HistoryPage:
    entries: list[StoredResource]
    total: int  # all versions matching the filters, regardless of the page


@dataclass(slots=True)
class SearchPage:
    """One page of search results, in order, with keyset cursors to the pages around it."""

    resources: list[StoredResource]
    included: list[StoredResource] = field(default_factory=list)
    total: int | None = None  # None when not asked for and not cheap to know
    next: Cursor | None = None
    previous: Cursor | None = None


@dataclass(slots=True)
class Condition:
    """The search a conditional create/update depends on, re-checked inside the commit.

    ``expected_ids``: the ids the caller saw when it resolved the condition before
    committing (a transaction must rewrite references first); the commit raises
    :class:`ConditionChanged` when they no longer match. None: decide in the commit.
    """

    plan: SearchPlan
    expected_ids: tuple[str, ...] | None = None


@dataclass(slots=True)
class IndexRows:
    """Search-index values extracted from one resource version, per kind of parameter.

    ``rows[kind]`` holds rows whose fields :data:`fhir_server.store.index.FIELDS` names
    (``rows["token"]``: ``(param, system, code, text)``); the FHIR service computes them
    (:mod:`fhir_server.search.extract`) and the adapter stores them in the same atomic
    step as the resource.
    """

    rows: dict[str, list[Row]] = field(default_factory=dict)


@dataclass(slots=True)
class StagedWrite:
    op: str  # create | update | delete | expunge | expunge-history (see UnitOfWork.expunge)
    resource_type: str
    id: str
    body: JSON | None = None
    if_match: int | None = None
    # For "create": fail if the id exists (POST assigns fresh ids; PUT-as-create does not).
    must_not_exist: bool = False
    method: str = "PUT"
    index: IndexRows | None = None
    condition: Condition | None = None
    result: StoredResource | None = None
    # Set by the commit when a conditional create found its match instead of creating.
    existing: bool = False
    # Set by the commit when no version was written: an update carried the current
    # content (``result`` is the current version), or a delete found nothing to delete.
    unchanged: bool = False

    @property
    def created(self) -> bool:
        """The write made the resource's first version: not a conditional create's match,
        not an update that changed nothing."""
        return (self.result is not None and self.result.version == 1 and not self.existing
                and not self.unchanged)


class Staging(Protocol):
    """What an ``after_writes`` callback may stage: documents and events."""

    def put_document(self, collection: str, id: str, body: JSON) -> None: ...
    def insert_document(self, collection: str, id: str, body: JSON) -> None: ...
    def delete_document(self, collection: str, id: str) -> None: ...
    def emit(self, topic: str, payload: JSON, *, event_id: str | None = None,
             source_service: str = "fhir_server") -> str: ...


class UnitOfWork(Protocol):
    """Stage resource writes, documents and outbox events; ``commit`` applies them all."""

    async def __aenter__(self) -> UnitOfWork: ...
    async def __aexit__(self, exc_type: object, *exc: object) -> None: ...

    def create(
        self, resource_type: str, id: str, body: JSON, *, index: IndexRows | None = None,
        method: str = "POST", condition: Condition | None = None,
    ) -> StagedWrite:
        """With a ``condition`` (If-None-Exist): create only when nothing matches; one
        match makes ``result`` that resource and ``existing`` true; more raise
        :class:`MultipleMatches`."""
        ...

    def update(
        self, resource_type: str, id: str, body: JSON, *, if_match: int | None = None,
        index: IndexRows | None = None, method: str = "PUT", condition: Condition | None = None,
    ) -> StagedWrite:
        """With a ``condition`` (conditional update): no match creates ``id``; one match is
        updated (its id replaces ``id``); more raise :class:`MultipleMatches`."""
        ...

    def delete(self, resource_type: str, id: str, *, if_match: int | None = None
               ) -> StagedWrite: ...

    def expunge(self, resource_type: str, id: str, *, history_only: bool = False
                ) -> StagedWrite:
        """Erase stored versions of a resource for good, applied in order with the unit's
        other writes. ``history_only``: every version before the current one (stage the
        rewritten current version first: it is the one that stays); else every version,
        the current one included, with its search-index rows, so the id reads as never
        used (404) and no history, search or include can reach it. ``result`` is the
        version that stays (a tombstone-like entry with the last version number when
        nothing stays); ``unchanged`` when there was nothing to erase. No resource event
        is emitted: the caller records the erasure itself (an AuditEvent)."""
        ...

    def put_document(self, collection: str, id: str, body: JSON) -> None: ...
    def insert_document(self, collection: str, id: str, body: JSON) -> None: ...
    def delete_document(self, collection: str, id: str) -> None: ...
    def emit(self, topic: str, payload: JSON, *, event_id: str | None = None,
             source_service: str = "fhir_server") -> str: ...

    def after_writes(self, callback: Callable[[Staging], None]) -> None:
        """Call ``callback(staging)`` inside the commit, once the writes are applied (their
        ``result`` set: ids a condition resolved, versions); the documents and events it
        stages commit with them, atomically. A callback that raises fails the unit."""
        ...

    def after_commit(self, callback: Callable[[], Awaitable[None]]) -> None:
        """``await callback()`` once the unit has committed (not when it fails)."""
        ...

    async def commit(self) -> None: ...
    async def rollback(self) -> None: ...


class ResourceStore(Protocol):
    """The system of record: versioned FHIR resources, documents and the outbox.

    ``audit_log``: the adapter's audit log (:mod:`fhir_server.audit_log`), opened and
    closed with the store; AuditEvent is kept there, not with the resources."""

    audit_log: Any

    async def open(self) -> None: ...
    async def close(self) -> None: ...

    # --- resources -------------------------------------------------------------------
    async def read(self, resource_type: str, id: str, version: int | None = None
                   ) -> StoredResource: ...
    async def read_current(self, resource_type: str, id: str) -> StoredResource | None:
        """The current version, a tombstone included; ``None`` if the id was never used."""
        ...

    async def created_instants(self, resource_type: str, ids: Sequence[str]
                               ) -> dict[str, str]:
        """When each of ``ids`` was created: the ``lastUpdated`` of its version 1, for
        the ids that have one (one question for a page of resources, not one read each)."""
        ...

    async def history(
        self, resource_type: str | None, id: str | None, *, since: str | None = None,
        at_or_before: str | None = None, count: int = 50, before_seq: int | None = None,
        access: Sequence[AccessGrant] | None = None,
    ) -> HistoryPage:
        """Versions newest first; ``before_seq`` continues after a page's last entry, so
        pages stay stable while new versions are written. With ``access`` (a search plan's
        access filter), only the versions of resources it admits now."""
        ...

    def unit_of_work(self) -> UnitOfWork: ...

    # --- search -------------------------------------------------------------------------
    async def search(self, plan: SearchPlan) -> SearchPage:
        """Run a search plan: one page of current resources, includes and cursors."""
        ...

    async def match_ids(self, plan: SearchPlan, limit: int) -> list[str]:
        """The sorted ids of up to ``limit`` current resources matching ``plan``'s
        criteria (what conditional interactions ask; sort, paging and includes ignored)."""
        ...

    async def match_ids_many(self, plans: Sequence[SearchPlan], limit: int
                             ) -> list[list[str]]:
        """``match_ids`` of each plan, in order: the conditions of a transaction's
        entries, asked before it commits (an adapter answers them together where it can).
        """
        ...

    async def count_current(self) -> int:
        """Current (not deleted) resources of every type: the size of a reindex."""
        ...

    def iter_current(self, batch: int = 500) -> AsyncIterator[list[StoredResource]]:
        """Every current resource, in batches (reindex reads through this)."""
        ...

    async def replace_index(self, items: Sequence[tuple[StoredResource, IndexRows]]) -> None:
        """Replace the index rows of current resources in one atomic step (reindex)."""
        ...

    def set_unique_document_fields(self, collection: str, fields: Sequence[str]) -> None:
        """Declare fields whose values are unique in a collection (and looked up fast)."""
        ...

    def add_outbox_listener(self, callback: Any) -> None:
        """``callback()`` runs after each commit that wrote outbox events."""
        ...

    # --- documents (platform bookkeeping, not health data) -----------------------------
    async def get_document(self, collection: str, id: str) -> JSON | None: ...
    async def find_documents(
        self, collection: str, where: Mapping[str, Any] | None = None, *, limit: int = 100,
        offset: int = 0, order_by: str | None = None, descending: bool = False,
    ) -> list[JSON]: ...
    async def count_documents(self, collection: str, where: Mapping[str, Any] | None = None
                              ) -> int: ...

    async def purge_documents(self, collection: str, field: str, before: str, *,
                              companions: Sequence[str] = ()) -> int:
        """Delete the documents of ``collection`` whose ``field`` (an instant, as text in
        the collection's own format) sorts before ``before``, and the documents with the
        same ids in ``companions``; how many of ``collection`` went (housekeeping)."""
        ...

    # --- outbox -----------------------------------------------------------------------
    async def pending_events(self, limit: int = 100) -> list[JSON]: ...
    async def mark_dispatched(self, event_ids: Sequence[str]) -> None: ...
    async def purge_dispatched_events(self, before: str) -> int:
        """Delete dispatched events stamped before ``before``; how many went. Events not
        yet dispatched are never purged."""
        ...

"""The staging half of a unit of work, which every store adapter shares.

A unit of work collects resource writes, documents, outbox events and after-write
callbacks (:class:`StagedUnit`); ``commit`` hands them to the adapter, which applies them
in one atomic step (:meth:`StagedUnit.submit`, the only part an adapter writes). Inside
that step the adapter applies the writes, then :func:`run_callbacks` (their documents and
events join the unit's), then the documents and the events.

Documents and events are kept as the rows they become: :class:`StagedDocument` and
:class:`OutboxEvent` (the outbox row of the spec's envelope: ``id``, ``topic``,
``timestamp``, ``source_service``, ``payload`` as JSON text).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

import orjson

from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.store.port import (
    JSON,
    Condition,
    IndexRows,
    StagedWrite,
    Staging,
    StoreError,
)

Callback = Callable[[Staging], None]


class StagedDocument(NamedTuple):
    op: str  # put | insert | delete
    collection: str
    id: str
    body: JSON | None


class OutboxEvent(NamedTuple):
    id: str
    topic: str
    timestamp: str
    source_service: str
    payload: str  # JSON text


class StagedRows:
    """Documents and outbox events staged for a commit, as the rows they become (what an
    ``after_writes`` callback stages into, too)."""

    def __init__(self) -> None:
        self.documents: list[StagedDocument] = []
        self.events: list[OutboxEvent] = []

    def put_document(self, collection: str, id: str, body: JSON) -> None:
        self.documents.append(StagedDocument("put", collection, id, body))

    def insert_document(self, collection: str, id: str, body: JSON) -> None:
        self.documents.append(StagedDocument("insert", collection, id, body))

    def delete_document(self, collection: str, id: str) -> None:
        self.documents.append(StagedDocument("delete", collection, id, None))

    def emit(self, topic: str, payload: JSON, *, event_id: str | None = None,
             source_service: str = "fhir_server") -> str:
        # Time-ordered ids: an outbox insert appends to its index instead of landing on a
        # random page (the spec asks for a UUID; version 7 is one).
        event_id = event_id or new_id()
        self.events.append(OutboxEvent(event_id, topic, now_instant(), source_service,
                                       orjson.dumps(payload).decode()))
        return event_id


class StagedUnit(StagedRows):
    """Stages writes, documents, events and callbacks; ``commit`` submits them to the
    adapter (:meth:`submit`), all or nothing. Used as ``async with store.unit_of_work()
    as uow: ...`` (what is staged and not committed is committed on a clean exit)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[StagedWrite] = []
        self.callbacks: list[Callback] = []
        self.committed_callbacks: list[Callable[[], Awaitable[None]]] = []
        self.committed = False

    async def __aenter__(self) -> StagedUnit:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None and not self.committed and (
                self.writes or self.documents or self.events or self.callbacks
                or self.committed_callbacks):
            await self.commit()

    # -- staging -------------------------------------------------------------------------
    def create(self, resource_type: str, id: str, body: JSON, *, index: IndexRows | None = None,
               method: str = "POST", condition: Condition | None = None) -> StagedWrite:
        return self._stage(StagedWrite("create", resource_type, id, body, must_not_exist=True,
                                       method=method, index=index, condition=condition))

    def update(self, resource_type: str, id: str, body: JSON, *, if_match: int | None = None,
               index: IndexRows | None = None, method: str = "PUT",
               condition: Condition | None = None) -> StagedWrite:
        return self._stage(StagedWrite("update", resource_type, id, body, if_match=if_match,
                                       method=method, index=index, condition=condition))

    def delete(self, resource_type: str, id: str, *, if_match: int | None = None) -> StagedWrite:
        return self._stage(StagedWrite("delete", resource_type, id, None, if_match=if_match,
                                       method="DELETE"))

    def expunge(self, resource_type: str, id: str, *, history_only: bool = False
                ) -> StagedWrite:
        return self._stage(StagedWrite("expunge-history" if history_only else "expunge",
                                       resource_type, id, None, method="DELETE"))

    def _stage(self, write: StagedWrite) -> StagedWrite:
        self.writes.append(write)
        return write

    def after_writes(self, callback: Callback) -> None:
        self.callbacks.append(callback)

    def after_commit(self, callback: Callable[[], Awaitable[None]]) -> None:
        """``await callback()`` once the unit has committed (what is written elsewhere
        only if the unit's changes are stored: the audit log's entries)."""
        self.committed_callbacks.append(callback)

    # -- committing -------------------------------------------------------------------------
    async def commit(self) -> None:
        if self.writes or self.documents or self.events or self.callbacks:
            await self.submit()
        self.committed = True
        for callback in self.committed_callbacks:
            await callback()

    async def submit(self) -> None:
        """Apply everything staged in one atomic step (the adapter's part)."""
        raise NotImplementedError

    async def rollback(self) -> None:
        self.writes.clear()
        self.documents.clear()
        self.events.clear()
        self.callbacks.clear()
        self.committed_callbacks.clear()


def run_callbacks(callbacks: Sequence[Callback], documents: Sequence[StagedDocument],
                  events: Sequence[OutboxEvent]
                  ) -> tuple[Sequence[StagedDocument], Sequence[OutboxEvent]]:
    """Inside the commit, once the writes are applied: run the ``after_writes`` callbacks;
    the unit's documents and events with theirs. A callback that raises fails its unit
    (a :class:`StoreError`), like a failed write."""
    if not callbacks:
        return documents, events
    staged = StagedRows()
    for callback in callbacks:
        try:
            callback(staged)
        except Exception as exc:
            raise StoreError(f"after-writes callback failed: {exc}") from exc
    return [*documents, *staged.documents], [*events, *staged.events]


def reset(writes: Sequence[StagedWrite]) -> None:
    """Forget what a failed commit decided for ``writes`` (a unit may be retried)."""
    for write in writes:
        write.result = None
        write.existing = False
        write.unchanged = False


__all__ = ["OutboxEvent", "StagedDocument", "StagedRows", "StagedUnit", "reset",
           "run_callbacks"]

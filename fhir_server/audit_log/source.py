"""AuditEvent served from the audit log: the FHIR service's source of that one type.

The FHIR service hands this source what concerns ``AuditEvent`` (see
:class:`~fhir_server.service.FhirService`): a read answers the entry rendered as the
AuditEvent it was (version 1: entries never change), a search of ``AuditEvent`` alone
is compiled to the log's query with the caller's grants (:mod:`.query`), a create
staged in a unit of work is appended once that unit has committed (the change it
records is then stored; a unit that fails leaves no record of what did not happen).
Updates and deletes are refused: the log is append-only; entries leave when the
retention expires them (:mod:`.retention`).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any

from fhir_server.audit_log.entry import Entry, entry_of, render
from fhir_server.audit_log.port import AuditLog, Found
from fhir_server.audit_log.query import RESOURCE_TYPE, log_query
from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.outcome import FhirError
from fhir_server.search.plan import SearchPlan
from fhir_server.store.port import (
    Condition,
    ResourceNotFound,
    SearchPage,
    StagedWrite,
    StoredResource,
    UnitOfWork,
)

JSON = dict[str, Any]


def stored(found: Found) -> StoredResource:
    return StoredResource(RESOURCE_TYPE, found.id, 1, found.logged, False,
                          render(found.id, found.logged, found.body), "POST")


class AuditLogSource:
    """``AuditEvent`` reads, searches and creates, on ``log``."""

    resource_type = RESOURCE_TYPE

    def __init__(self, log: AuditLog):
        self.log = log
        # the entries each unit of work staged, appended together once it commits
        self._pending: weakref.WeakKeyDictionary[UnitOfWork, list[Entry]] = \
            weakref.WeakKeyDictionary()

    async def read(self, resource_id: str, version: int | None = None) -> StoredResource:
        found = await self.log.get(resource_id) if version in (None, 1) else None
        if found is None:
            raise ResourceNotFound(RESOURCE_TYPE, resource_id,
                                   None if version is None else str(version))
        return stored(found)

    async def search(self, plan: SearchPlan) -> SearchPage:
        page = await self.log.search(log_query(plan))
        return SearchPage([stored(f) for f in page.entries], total=page.total,
                          next=page.next)

    async def append(self, events: Sequence[JSON]) -> list[StoredResource]:
        """Write AuditEvents (valid ones: the platform's own) now; as stored."""
        logged = now_instant()
        entries = [entry_of(e, e.get("id") or new_id(), logged) for e in events]
        await self.log.append(entries)
        return [stored(Found(e.id, e.logged, e.body)) for e in entries]

    def stage_create(self, uow: UnitOfWork, resource: JSON, *, resource_id: str | None,
                     condition: Condition | None) -> StagedWrite:
        """A create whose entry is appended once ``uow`` commits; its ``result`` is set
        now (the id and the instant are the log's to give)."""
        if condition is not None:
            raise FhirError.of(400, "not-supported", "AuditEvent records are not created "
                               "conditionally: the audit log is append-only")
        entry = entry_of(resource, resource_id or new_id(), now_instant())
        staged = StagedWrite("create", RESOURCE_TYPE, entry.id, resource, method="POST",
                             result=stored(Found(entry.id, entry.logged, entry.body)))
        pending = self._pending.get(uow)
        if pending is None:
            pending = self._pending[uow] = []
            uow.after_commit(functools.partial(self.log.append, pending))
        pending.append(entry)
        return staged


def append_only(resource_type: str, interaction: str) -> FhirError:
    return FhirError.of(405, "not-supported", f"{resource_type} records are append-only "
                        f"(the audit log): {interaction} is not supported")

"""AuditEvents a store kept as resources, before it had an audit log, moved into the log.

A store that ran an earlier version holds its AuditEvents among the clinical resources,
where nothing reads them any more (``AuditEvent`` is served from the log). At start
:func:`move_stored_events` copies them into the log page by page, each with its id,
``recorded`` and ``meta.lastUpdated`` kept (an id already in the log is not copied
twice: a pass cut short is run again), and then erases them from the store (every
version, with their search-index rows): the trail is whole in one place. A store
without such events costs one empty search.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from fhir_server.audit_log.entry import entry_of, sortable
from fhir_server.search.plan import parse_search
from fhir_server.service import FhirService

log = logging.getLogger("healthplatform.audit_log")
RESOURCE_TYPE = "AuditEvent"
PAGE = 500


async def move_stored_events(service: FhirService) -> int:
    """Move the store's AuditEvent resources into the audit log; how many moved."""
    source = service.sources.get(RESOURCE_TYPE)
    if source is None:
        return 0
    moved = 0
    while True:
        plan = parse_search(service.registry, [RESOURCE_TYPE], [("_count", str(PAGE))])
        page = await service.store.search(plan)  # the store itself, not the log
        if not page.resources:
            break
        events = [orjson.loads(s.body) for s in page.resources]
        fresh = [e for e in events if await source.log.get(e["id"]) is None]
        await source.log.append([entry_of(e, e["id"], _logged(e)) for e in fresh])
        # one unit for the page; one each on a store without multi-document transactions
        together = getattr(service.store, "transactions", True) is not False
        for batch in [page.resources] if together else [[s] for s in page.resources]:
            async with service.store.unit_of_work() as uow:
                for stored in batch:
                    uow.expunge(RESOURCE_TYPE, stored.id)
                await uow.commit()
        moved += len(fresh)
    if moved:
        log.info("audit log: %s AuditEvents moved from the store into the log", moved)
    return moved


def _logged(event: dict[str, Any]) -> str:
    updated = (event.get("meta") or {}).get("lastUpdated")
    return sortable(updated) if isinstance(updated, str) else sortable(event["recorded"])

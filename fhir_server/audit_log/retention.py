"""Retention of the audit log: export, then expire.

Entries recorded more than the retention ago leave the log, but only after they were
exported: :func:`expire` runs the bulk export (:class:`~fhir_server.bulk.exporter.Exporter`
as the system, ``_type=AuditEvent`` with ``_typeFilter=AuditEvent?date=lt<cutoff>``)
into ``<archive>/<cutoff>/`` (``AuditEvent.ndjson`` and a Bulk Data ``manifest.json``),
and purges what it exported once the files are written and flushed to disk. An export
that fails purges nothing; the next pass tries again. The cutoff is rounded down to the
day, so a pass exports at most a day's worth more than the last one did.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson

from fhir_server.access import SYSTEM
from fhir_server.bulk.exporter import Exporter, Progress, file_name
from fhir_server.bulk.request import SYSTEM as SYSTEM_LEVEL
from fhir_server.bulk.request import ExportRequest
from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.private_files import private_directory, write_private
from fhir_server.service import FhirService

log = logging.getLogger("healthplatform.audit_log")
RESOURCE_TYPE = "AuditEvent"


@dataclass(frozen=True, slots=True)
class Expired:
    cutoff: str
    exported: int
    purged: int
    archive: Path | None


def cutoff_for(days: float, now: datetime | None = None) -> str:
    """The start of the day ``days`` ago (UTC), in the log's instant form."""
    moment = (now or datetime.now(UTC)) - timedelta(days=days)
    return moment.strftime("%Y-%m-%dT00:00:00.000000Z")


async def expire(service: FhirService, days: float, archive: Path,
                 now: datetime | None = None) -> Expired | None:
    """Export the entries recorded before the cutoff into ``archive``, then purge them;
    None when there is nothing that old."""
    source = service.sources.get(RESOURCE_TYPE)
    if source is None or days <= 0:
        return None
    cutoff = cutoff_for(days, now)
    oldest = await source.log.oldest()
    if oldest is None or oldest >= cutoff:
        return None
    directory = archive / cutoff[:10]
    request = ExportRequest(level=SYSTEM_LEVEL, types=(RESOURCE_TYPE,),
                            type_filters={RESOURCE_TYPE: (f"date=lt{cutoff[:10]}",)},
                            url=f"audit log retention: recorded before {cutoff}")
    # what the export can see: an entry appended from now on (an old event a client
    # posts late) is not purged by this pass
    started = now_instant()

    async def checkpoint(progress: Progress) -> None:
        return None  # a pass that stops is run again whole: the files are rewritten

    private_directory(archive)  # audit records name patients: the server's account only
    for stale in directory.glob("*.ndjson") if directory.exists() else ():
        stale.unlink()
    done = await Exporter(CallerFhir(service, SYSTEM), request, directory, Progress(),
                          checkpoint).run()
    exported = done.files.get(RESOURCE_TYPE, {}).get("count", 0)
    path = directory / file_name(RESOURCE_TYPE)
    if exported:
        await asyncio.to_thread(_fsync, path)  # on disk before the entries go
    manifest = {"transactionTime": started, "request": request.url,
                "requiresAccessToken": False,
                "output": [{"type": RESOURCE_TYPE, "url": path.resolve().as_uri(),
                            "count": exported}] if exported else [], "error": []}
    write_private(directory / "manifest.json", orjson.dumps(manifest,
                                                            option=orjson.OPT_INDENT_2))
    purged = await source.log.purge(cutoff, started)
    log.info("audit log: %s entries recorded before %s exported to %s, %s purged",
             exported, cutoff, directory, purged)
    return Expired(cutoff, exported, purged, directory)


def _fsync(path: Path) -> None:
    with open(path, "rb") as written:
        os.fsync(written.fileno())

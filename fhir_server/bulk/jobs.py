"""Bulk export jobs: kicked off, run in the background, polled, cancelled, expired.

A job is a document (collection ``bulk_exports``) holding its request, whose it is, its
status (``in-progress`` → ``completed`` | ``failed``), the ``transactionTime`` and its
:class:`~fhir_server.bulk.exporter.Progress`; its files are in ``<directory>/<job id>/``.
A job is a ``$export`` of resources or, when its request says ``kind: view``, a
``$viewdefinition-export`` of views' rows (:mod:`fhir_server.bulk.view_exporter`).

- **One export per client at a time**: a kick-off inserts a lock document whose id is the
  client's (``bulk_export_locks``), refused by the store when it exists (so two processes
  cannot both start one); the lock goes when the job ends or is cancelled.
- **Resumable**: a running job's document is stamped (``heartbeat``) at every checkpoint.
  Every ``interval`` seconds, and at start, each process picks up the jobs still
  ``in-progress`` whose stamp is older than ``stale_seconds`` (their process died) and
  runs them on from their progress, under their client's access as it is *now*
  (:class:`ExportIdentity`: a client whose rights were withdrawn gets no more).
- **Expiry**: a finished job and its files are removed ``retention_seconds`` after it
  ended; a cancelled one at once.

The platform supplies the :class:`ExportIdentity` (who a caller is, and their access again
later): ``fhir_server`` knows nothing of users or tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from fhir_server.access import Access
from fhir_server.bulk.exporter import Exporter, Progress, file_name
from fhir_server.bulk.request import ExportRequest
from fhir_server.bulk.view_exporter import (
    PART_ROWS,
    ViewExporter,
    ViewExportRequest,
    ViewProgress,
    is_view_export,
)
from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.outcome import FhirError
from fhir_server.service import FhirService
from fhir_server.store import DuplicateDocument

log = logging.getLogger("healthplatform.bulk_export")

JSON = dict[str, Any]
JOBS, LOCKS = "bulk_exports", "bulk_export_locks"
IN_PROGRESS, COMPLETED, FAILED = "in-progress", "completed", "failed"


class ExportIdentity(Protocol):
    """Who asks for an export, as the platform knows them."""

    def owner(self, access: Access) -> str:
        """The client the export belongs to (one at a time each; only they poll it and
        fetch its files)."""
        ...

    def dump(self, access: Access) -> JSON:
        """What :meth:`load` needs to give the same client's access back (no secret)."""
        ...

    async def load(self, data: JSON) -> Access:
        """The client's access now (raises when the client is gone)."""
        ...


class _Cancelled(Exception):
    """The job's document went while it ran (cancelled from another process)."""


class BulkExports:
    """The jobs of one server (see the module docstring)."""

    def __init__(self, service: FhirService, identity: ExportIdentity, directory: Path, *,
                 retention_seconds: float = 86_400, stale_seconds: float = 60,
                 interval: float = 30, page_size: int = 1000, part_rows: int = PART_ROWS):
        self.service, self.store, self.identity = service, service.store, identity
        self.directory = directory
        self.retention_seconds, self.stale_seconds = retention_seconds, stale_seconds
        self.interval, self.page_size, self.part_rows = interval, page_size, part_rows
        self._running: dict[str, asyncio.Task[None]] = {}
        self._loop_task: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._every_interval())

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self._running.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._loop_task = None
        self._running.clear()

    async def _every_interval(self) -> None:
        while True:
            try:
                await self.tend()
            except Exception:  # one bad pass must not end the loop; the next one retries
                log.exception("bulk export housekeeping failed")
            await asyncio.sleep(self.interval)

    async def tend(self, now: float | None = None) -> dict[str, int]:
        """Resume orphaned jobs and remove expired ones; how many of each."""
        now = time.time() if now is None else now
        resumed = expired = 0
        for job in await self.store.find_documents(JOBS, limit=10_000):
            if job["status"] == IN_PROGRESS and job["id"] not in self._running \
                    and job.get("heartbeat", 0) < now - self.stale_seconds:
                self._launch(job)
                resumed += 1
            elif job["status"] != IN_PROGRESS and job.get("expires", now + 1) <= now:
                await self._remove(job)
                expired += 1
        return {"resumed": resumed, "expired": expired}

    # -- the operations ---------------------------------------------------------------------
    async def kick_off(self, caller: CallerFhir, request: ExportRequest | ViewExportRequest
                       ) -> str:
        """Start an export as ``caller``; its job id. 429 while the client has one
        running."""
        owner = self.identity.owner(caller.access)
        job_id = uuid.uuid4().hex
        now = time.time()
        progress = ViewProgress() if isinstance(request, ViewExportRequest) else Progress()
        job: JSON = {
            "id": job_id, "owner": owner, "identity": self.identity.dump(caller.access),
            "request": request.to_json(), "status": IN_PROGRESS,
            "transaction_time": now_instant(), "progress": progress.to_json(),
            "created": now, "heartbeat": now, "error": None,
        }
        try:
            async with self.store.unit_of_work() as uow:
                uow.insert_document(LOCKS, owner, {"id": owner, "job": job_id})
                uow.put_document(JOBS, job_id, job)
                await uow.commit()
        except DuplicateDocument:
            raise FhirError.of(429, "throttled", "An export of yours is still running; "
                               "wait for it to finish, or cancel it (DELETE its status URL)",
                               headers={"Retry-After": "30"}) from None
        self._launch(job, CallerFhir(self.service, caller.access))
        return job_id

    async def job(self, caller: CallerFhir, job_id: str) -> JSON:
        """The job, when it is the caller's (404 otherwise: another's is not named)."""
        job = await self.store.get_document(JOBS, job_id)
        if job is None or job["owner"] != self.identity.owner(caller.access):
            raise FhirError.of(404, "not-found", f"No export {job_id!r} of yours")
        return job

    async def cancel(self, caller: CallerFhir, job_id: str) -> None:
        """Stop the job if it runs, and remove it and its files."""
        job = await self.job(caller, job_id)
        task = self._running.pop(job_id, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._remove(job)

    async def file(self, caller: CallerFhir, job_id: str, name: str) -> Path:
        """The path of one output file of the caller's completed job."""
        job = await self.job(caller, job_id)
        files = job["progress"]["files"]
        names = set(files) if is_view_export(job["request"]) else \
            {file_name(t) for t in files}
        if job["status"] != COMPLETED or name not in names:
            raise FhirError.of(404, "not-found", f"Export {job_id} has no file {name!r}")
        return self.directory / job_id / name

    # -- running ----------------------------------------------------------------------------
    def _launch(self, job: JSON, caller: CallerFhir | None = None) -> None:
        task = asyncio.get_running_loop().create_task(self._run(job, caller))
        self._running[job["id"]] = task
        task.add_done_callback(lambda _: self._running.pop(job["id"], None))

    async def _run(self, job: JSON, caller: CallerFhir | None) -> None:
        job_id = job["id"]
        try:
            if caller is None:  # resumed: the client's access as it is now
                caller = CallerFhir(self.service, await self.identity.load(job["identity"]))

            async def checkpoint(progress: Progress | ViewProgress) -> None:
                if await self.store.get_document(JOBS, job_id) is None:
                    raise _Cancelled
                await self._save({**job, "progress": progress.to_json(),
                                  "heartbeat": time.time()})

            exporter: Exporter | ViewExporter
            if is_view_export(job["request"]):
                exporter = ViewExporter(
                    caller, ViewExportRequest.from_json(job["request"]),
                    self.directory / job_id, ViewProgress.from_json(job["progress"]),
                    checkpoint, page_size=self.page_size, part_rows=self.part_rows)
            else:
                exporter = Exporter(caller, ExportRequest.from_json(job["request"]),
                                    self.directory / job_id,
                                    Progress.from_json(job["progress"]), checkpoint,
                                    page_size=self.page_size)
            progress = await exporter.run()
            await self._finish(job, COMPLETED, progress.to_json(), None)
        except asyncio.CancelledError:
            raise
        except _Cancelled:
            await asyncio.to_thread(shutil.rmtree, self.directory / job_id, True)
        except FhirError as exc:  # e.g. the Group is gone, or no longer the client's
            await self._finish(job, FAILED, None, str(exc))
        except Exception as exc:
            log.exception("bulk export %s failed", job_id)
            await self._finish(job, FAILED, None, f"The export failed: {type(exc).__name__}")

    async def _save(self, job: JSON) -> None:
        async with self.store.unit_of_work() as uow:
            uow.put_document(JOBS, job["id"], job)
            await uow.commit()

    async def _finish(self, job: JSON, status: str, progress: JSON | None,
                      error: str | None) -> None:
        current = await self.store.get_document(JOBS, job["id"])
        if current is None:  # cancelled meanwhile
            return
        now = time.time()
        finished = {**current, "status": status, "error": error, "finished": now,
                    "expires": now + self.retention_seconds, "heartbeat": now}
        if progress is not None:
            finished["progress"] = progress
        async with self.store.unit_of_work() as uow:
            uow.put_document(JOBS, job["id"], finished)
            uow.delete_document(LOCKS, job["owner"])
            await uow.commit()

    async def _remove(self, job: JSON) -> None:
        async with self.store.unit_of_work() as uow:
            uow.delete_document(JOBS, job["id"])
            lock = await self.store.get_document(LOCKS, job["owner"])
            if lock is not None and lock.get("job") == job["id"]:
                uow.delete_document(LOCKS, job["owner"])
            await uow.commit()
        await asyncio.to_thread(shutil.rmtree, self.directory / job["id"], True)


def expires_header(job: JSON) -> str:
    """The ``Expires`` HTTP date of a finished job's files."""
    moment = datetime.fromtimestamp(job["expires"], UTC)
    return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")


def retry_after(job: JSON, now: float | None = None) -> int:
    """Seconds to wait before polling again: sooner early on, at most 10."""
    age = (time.time() if now is None else now) - job["created"]
    return max(1, min(10, int(timedelta(seconds=age).total_seconds() // 10) + 1))

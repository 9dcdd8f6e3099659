"""The Sessions and clinical notes area: consultation recordings and their audio, their
transcription, the extraction of structured data from transcripts, clinical notes and
dictation, action items, and the clinical audit trail.

One module per part, each stating its FHIR mapping: :mod:`.recordings` (Media; the audio
in the blob store of :mod:`.blobs`), :mod:`.transcripts` (DocumentReference, and Task for
the jobs :mod:`.transcription` runs), :mod:`.notes` (Composition), :mod:`.dictation`
(DocumentReference merged into a Composition), :mod:`.action_items` (Task),
:mod:`.extraction` (Task with contained proposals, by :mod:`.extractor`).

:mod:`.audit` records AuditEvents of clinical reads and writes and answers the audit
queries. :func:`start` starts the transcription worker and the audit recorder; the app
stops them on shutdown.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter

from platform_api.services import Services
from platform_api.sessions import (
    action_items,
    audit,
    dictation,
    extraction,
    notes,
    recordings,
    transcripts,
)
from platform_api.sessions.audit import ClinicalAudit, start_audit
from platform_api.sessions.transcription import TranscriptionWorker

router = APIRouter()
router.include_router(recordings.router)
router.include_router(notes.router)
router.include_router(dictation.router)
router.include_router(action_items.router)
router.include_router(extraction.router)
router.include_router(audit.router)


@dataclass
class Runtime:
    """What :func:`start` started: the transcription worker and the audit recorder."""

    worker: TranscriptionWorker
    audit: ClinicalAudit | None

    async def stop(self) -> None:
        await self.worker.stop()
        if self.audit is not None:
            await self.audit.stop()  # writes what it still holds


def start(services: Services) -> Runtime:
    """Start the transcription worker and the clinical audit recorder."""
    return Runtime(transcripts.start_worker(services), start_audit(services))


__all__ = ["router", "start"]

"""The Sessions and clinical notes area: consultation recordings and their audio, their
transcription, the extraction of structured data from transcripts, clinical notes and
dictation, action items, and the clinical audit trail.

One module per part, each stating its FHIR mapping: :mod:`.recordings` (Media; the audio
in the blob store of :mod:`.blobs`), :mod:`.transcripts` (DocumentReference, and Task for
the jobs :mod:`.transcription` runs), :mod:`.notes` (Composition), :mod:`.dictation`
(DocumentReference merged into a Composition), :mod:`.action_items` (Task), :mod:`.extraction` (Task with contained proposals, by
:mod:`.extractor`).

:func:`start` starts the transcription worker; the app stops it on shutdown.
"""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.services import Services
from platform_api.sessions import (
    action_items,
    dictation,
    extraction,
    notes,
    recordings,
    transcripts,
)
from platform_api.sessions.transcription import TranscriptionWorker

router = APIRouter()
router.include_router(recordings.router)
router.include_router(notes.router)
router.include_router(dictation.router)
router.include_router(action_items.router)
router.include_router(extraction.router)


def start(services: Services) -> TranscriptionWorker:
    """Start the transcription worker (``await worker.stop()``)."""
    return transcripts.start_worker(services)


__all__ = ["router", "start"]

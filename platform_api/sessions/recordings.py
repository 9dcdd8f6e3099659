"""Recordings of consultations: FHIR **Media** (an audio recording about a patient),
the audio itself in the blob store (:mod:`.blobs`).

Mapping (/api field → FHIR Media element):

    patient_id        → subject (Patient/<id>)
    encounter_id      → encounter (Encounter/<id>, one of the patient's)
    title             → content.title
    content_type      → content.contentType (audio/wav, audio/mpeg, audio/mp4, audio/ogg,
                        audio/webm, audio/flac, audio/aac, audio/amr)
    language          → content.language (BCP-47, e.g. en, sw)
    recorded_at       → createdDateTime (default: when created)
    (caller)          → operator (identifier urn:healthplatform:user|<user id>)
    (always)          → type media-type#audio
    status            → status: preparation (created) → in-progress (audio arriving)
                        → completed (ready); entered-in-error
    size              → content.size, once ready (the bytes received so far before)
    sha256            → content extension urn:healthplatform:extension:sha256 (hex);
                        content.hash holds the SHA-1 FHIR defines (base64)
    duration_seconds  → duration
    audio_url         → content.url (GET …/recordings/<id>/audio)
    transcripts       → the DocumentReferences whose context.related is this Media

**Upload.** ``POST /api/sessions/recordings/:id/audio`` appends one part: the raw body
with the recording's ``Content-Type``, streamed to a temporary file while it is counted
and hashed, then stored as the object ``recordings/<id>/part-<n>``; nothing holds a
whole part, let alone the recording, in memory. ``?offset=`` (optional) must be the bytes
received so far (409 ``OFFSET_MISMATCH`` otherwise, so a retried part is never stored
twice); ``offset=0`` on a recording with parts starts it over. The first part's leading
bytes must look like the declared type (422 ``AUDIO_MISMATCH``). All parts together are
at most ``HEALTHPLATFORM_RECORDING_MAX_BYTES`` (413 ``RECORDING_TOO_LARGE``), each at
most ``HEALTHPLATFORM_MAX_BODY_BYTES``. Which parts were received is platform
bookkeeping (the document ``recording_uploads/<id>``), not health data. Parts of one
recording are appended one at a time (a lock per recording in the process: send them in
order, each after the previous one's answer).

**Ready.** ``PATCH …/:id/ready`` (optionally with the client's ``sha256`` of the whole
audio, and its ``duration_seconds``) reads the parts back in order, hashes them, checks
the size and checksum (409 ``CHECKSUM_MISMATCH``: the recording stays open for a fresh
upload), and completes the Media; event ``platform.sessions.recording_ready``.

Who: whoever the policy lets write a Media in the patient's record (the patient's
clinicians), reads as the policy allows (their organization, consent, the patient).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any, Literal

import filetype  # type: ignore[import-untyped]
from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field
from starlette.responses import StreamingResponse

from fhir_server.clock import now_instant
from fhir_server.ownership import owner_labels
from platform_api.envelope import ApiError, Envelope, conflict, ok
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    ItemContext,
    SearchParam,
    StatusTable,
    api_context,
)
from platform_api.services import Services
from platform_api.sessions.blobs import (
    BlobMissing,
    BlobStore,
    BlobTooLarge,
    blob_store,
    spool,
)
from platform_api.sessions.common import (
    EXTENSION,
    check_patient_and_encounter,
    local_id,
    ref,
    user_of,
    user_reference,
)

JSON = dict[str, Any]
UPLOADS = "recording_uploads"
BLOBS = "sessions.blobs"
MEDIA_TYPE = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/media-type",
                          "code": "audio", "display": "Audio"}]}
SHA256 = EXTENSION + "sha256"
READY_TOPIC = "platform.sessions.recording_ready"

# Declared content type → what its leading bytes may be sniffed as (filetype's names):
# browsers record audio-only WebM, which sniffers call video/webm.
AUDIO_TYPES: dict[str, frozenset[str]] = {
    "audio/wav": frozenset({"audio/x-wav"}),
    "audio/mpeg": frozenset({"audio/mpeg"}),
    "audio/mp4": frozenset({"audio/mp4", "video/mp4", "audio/m4a"}),
    "audio/ogg": frozenset({"audio/ogg", "audio/opus"}),
    "audio/webm": frozenset({"video/webm", "video/x-matroska"}),
    "audio/flac": frozenset({"audio/x-flac"}),
    "audio/aac": frozenset({"audio/aac"}),
    "audio/amr": frozenset({"audio/amr"}),
}
ALIASES = {"audio/x-wav": "audio/wav", "audio/wave": "audio/wav", "audio/vnd.wave": "audio/wav",
           "audio/mp3": "audio/mpeg", "audio/x-m4a": "audio/mp4", "audio/m4a": "audio/mp4",
           "audio/opus": "audio/ogg", "audio/x-flac": "audio/flac"}
AudioType = Literal["audio/wav", "audio/mpeg", "audio/mp4", "audio/ogg", "audio/webm",
                    "audio/flac", "audio/aac", "audio/amr"]

RECORDING_STATUS = StatusTable.of(
    preparation=("in-progress", "entered-in-error"),
    in_progress=("completed", "entered-in-error"),
    completed=("entered-in-error",),
    entered_in_error=(),
)
VIEW_STATUS = {"preparation": "created", "in-progress": "uploading", "completed": "ready",
               "entered-in-error": "entered-in-error"}


def normalized_type(content_type: str | None) -> str:
    media = (content_type or "").split(";")[0].strip().lower()
    return ALIASES.get(media, media)


# --- payloads -----------------------------------------------------------------------------


class RecordingCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    encounter_id: str | None = Field(default=None, min_length=1, max_length=64)
    title: str | None = Field(default=None, max_length=200,
                              examples=["Antenatal consultation, second visit"])
    content_type: AudioType = "audio/wav"
    language: str = Field(default="en", pattern=r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})*$",
                          examples=["en", "sw"])
    recorded_at: datetime | None = None


class TranscriptSummary(BaseModel):
    id: str
    status: str


class RecordingView(BaseModel):
    id: str
    patient_id: str | None = None
    encounter_id: str | None = None
    title: str | None = None
    status: str = Field(description="created | uploading | ready | entered-in-error")
    content_type: str | None = None
    language: str | None = None
    size: int = Field(0, description="Bytes received (all of them once ready)")
    parts: int = 0
    sha256: str | None = None
    duration_seconds: float | None = None
    recorded_by: str | None = None
    recorded_at: str | None = None
    audio_url: str | None = None
    transcripts: list[TranscriptSummary] = []
    created_at: str | None = None
    updated_at: str | None = None


class ReadyRequest(BaseModel):
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$",
                               description="SHA-256 of the whole audio, to check")
    duration_seconds: float | None = Field(default=None, gt=0, le=86_400)


class RecordingQuery(BaseModel):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64)
    encounter_id: Annotated[str | None, SearchParam("encounter", "Encounter/{}")] = Field(
        None, max_length=64)
    status: Annotated[Literal["preparation", "in-progress", "completed",
                              "entered-in-error"] | None, SearchParam("status")] = None


# --- mapping --------------------------------------------------------------------------------


def recording_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    now = now_instant()
    recorded = payload.get("recorded_at")
    media: JSON = {
        "resourceType": "Media", "status": "preparation", "type": MEDIA_TYPE,
        "subject": ref("Patient", payload["patient_id"]),
        "createdDateTime": recorded.isoformat() if isinstance(recorded, datetime)
        else recorded or now,
        "issued": now, "operator": user_reference(ctx.principal),
        "content": {"contentType": payload.get("content_type", "audio/wav"),
                    "language": payload.get("language", "en"), "creation": now},
    }
    if payload.get("encounter_id"):
        media["encounter"] = ref("Encounter", payload["encounter_id"])
    if payload.get("title"):
        media["content"]["title"] = payload["title"]
    return media


def recording_view(media: JSON, upload: JSON | None = None,
                   transcripts: list[JSON] | None = None) -> JSON:
    content = media.get("content") or {}
    ready = media.get("status") == "completed"
    sha = next((e.get("valueString") for e in content.get("extension") or []
                if e.get("url") == SHA256), None)
    return RecordingView(
        id=media["id"], patient_id=local_id(media.get("subject"), "Patient"),
        encounter_id=local_id(media.get("encounter"), "Encounter"),
        title=content.get("title"), status=VIEW_STATUS.get(media.get("status", ""), "created"),
        content_type=content.get("contentType"), language=content.get("language"),
        size=content.get("size", 0) if ready else (upload or {}).get("size", 0),
        parts=len((upload or {}).get("parts") or []), sha256=sha,
        duration_seconds=media.get("duration"), recorded_by=user_of(media.get("operator")),
        recorded_at=media.get("createdDateTime"), audio_url=content.get("url"),
        transcripts=[TranscriptSummary.model_validate(t) for t in transcripts or []],
        created_at=media.get("issued"), updated_at=(media.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


async def recording_views(ctx: ApiContext, media: list[JSON]) -> list[JSON]:
    """Views with the upload state of each (a document by id) and their transcripts
    (one DocumentReference search for the page)."""
    if not media:
        return []
    store = ctx.services.store
    uploads = [await store.get_document(UPLOADS, m["id"]) for m in media]
    found = await ctx.fhir.search("DocumentReference", [
        ("related", ",".join(f"Media/{m['id']}" for m in media)), ("_sort", "-_lastUpdated")])
    transcripts: dict[str, list[JSON]] = {}
    for document in found:
        for related in (document.get("context") or {}).get("related") or []:
            if (media_id := local_id(related, "Media")) is not None:
                transcripts.setdefault(media_id, []).append(
                    {"id": document["id"], "status": transcript_status(document)})
    return [recording_view(m, u, transcripts.get(m["id"])) for m, u in zip(media, uploads,
                                                                         strict=True)]


def transcript_status(document: JSON) -> str:
    """The state of a transcript as its DocumentReference tells it (see transcripts)."""
    from platform_api.sessions.transcripts import document_state

    return document_state(document)


recordings = Facade(
    resource="Media", name="Recording", create=RecordingCreate, view=RecordingView,
    query=RecordingQuery, to_fhir=recording_to_fhir, from_fhir=recording_view,
    views=recording_views, prepare=check_patient_and_encounter, statuses=RECORDING_STATUS,
    fixed=(("type", "http://terminology.hl7.org/CodeSystem/media-type|audio"),),
    events=Events(created="platform.sessions.recording_created"), sort="-created",
    tags=["sessions"],
    summaries={"list": "List consultation recordings (filter by patient, encounter, status)",
               "create": "Start a consultation recording (a FHIR Media); then upload its "
                         "audio in parts and mark it ready",
               "get": "A recording, with its upload state and transcripts"},
)
router = APIRouter(tags=["sessions"])
recordings.mount(router, "/api/sessions/recordings", ops=("list", "create", "get"))


def blobs(services: Services) -> BlobStore:
    """The process's blob store (made from the settings on first use)."""
    store = services.extras.get(BLOBS)
    if store is None:
        store = services.extras[BLOBS] = blob_store(services.settings)
    return store  # type: ignore[no-any-return]


def part_key(recording_id: str, number: int) -> str:
    return f"recordings/{recording_id}/part-{number:05d}"


async def audio_chunks(services: Services, recording_id: str) -> AsyncIterator[bytes]:
    """The recording's audio, its parts in order, in chunks."""
    upload = await services.store.get_document(UPLOADS, recording_id) or {}
    store = blobs(services)
    for part in upload.get("parts") or []:
        async for chunk in store.chunks(part["key"]):
            yield chunk


def _require_update(ctx: ApiContext, media: JSON) -> None:
    ctx.authorize("recording.change", owner_labels(media))


def _require_open(media: JSON) -> None:
    status = str(media.get("status", ""))
    if status not in ("preparation", "in-progress"):
        raise conflict("RECORDING_CLOSED", f"The recording is {VIEW_STATUS.get(status, status)}"
                       ": no more audio can be added")


# --- upload ----------------------------------------------------------------------------------


@router.post("/api/sessions/recordings/{resource_id}/audio",
             response_model=Envelope[RecordingView],
             summary="Upload a part of a recording's audio (raw body, the recording's "
                     "Content-Type); parts are appended in order",
             openapi_extra={"requestBody": {"required": True, "content": {
                 t: {"schema": {"type": "string", "format": "binary"}} for t in AUDIO_TYPES}}})
async def upload_audio(resource_id: str,
                       offset: int | None = Query(None, ge=0, description="Bytes received "
                                                  "so far (0 starts over)"),
                       ctx: ApiContext = Depends(api_context)) -> Any:
    media = await recordings.load(ctx, resource_id)
    _require_update(ctx, media)
    _require_open(media)
    declared = normalized_type(ctx.request.headers.get("content-type"))
    expected = normalized_type((media.get("content") or {}).get("contentType"))
    if declared != expected:
        raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE",
                       f"This recording takes {expected}, not {declared or 'no type'}")
    services = ctx.services
    async with services.fhir.resource_lock("Media", resource_id):
        upload = await services.store.get_document(UPLOADS, resource_id) or {
            "recording_id": resource_id, "parts": [], "size": 0}
        if offset == 0 and upload["parts"]:
            await _discard_parts(services, upload)
        elif offset is not None and offset != upload["size"]:
            raise conflict("OFFSET_MISMATCH", f"{upload['size']} bytes were received so far; "
                           f"send the part at offset {upload['size']}")
        if len(upload["parts"]) >= services.settings.recording_max_parts:
            raise conflict("TOO_MANY_PARTS", "The recording has as many parts as it may")
        number = len(upload["parts"]) + 1
        spooled = await _spooled_body(ctx, services.settings.recording_max_bytes
                                      - upload["size"])
        try:
            if number == 1:
                _check_sniffed(spooled.head, expected)
            key = part_key(resource_id, number)
            await blobs(services).put_file(key, spooled.path, expected)
        finally:
            spooled.path.unlink(missing_ok=True)
        upload["parts"].append({"number": number, "key": key, "size": spooled.size,
                                "sha256": spooled.sha256, "received_at": now_instant()})
        upload["size"] += spooled.size
        unit = ctx.unit()
        async with unit:
            if media.get("status") == "preparation":
                moved = RECORDING_STATUS.move(media, "in-progress")
                version = int((media.get("meta") or {}).get("versionId", 0)) or None
                staged = await unit.update(moved, if_match=version)
            unit.put_document(UPLOADS, resource_id, upload)
            await unit.commit()
        if media.get("status") == "preparation":
            media = _committed(staged)
    return ok((await recording_views(ctx, [media]))[0])


async def _spooled_body(ctx: ApiContext, room: int) -> Any:
    services = ctx.services
    try:
        spooled = await spool(ctx.request.stream(), blobs(services).spool_dir, max(room, 0))
    except BlobTooLarge:
        raise ApiError(413, "RECORDING_TOO_LARGE", "A recording may hold at most "
                       f"{services.settings.recording_max_bytes} bytes") from None
    if spooled.size == 0:
        spooled.path.unlink(missing_ok=True)
        raise ApiError(422, "VALIDATION_ERROR", "The part is empty", field="body")
    return spooled


def _check_sniffed(head: bytes, expected: str) -> None:
    sniffed = filetype.guess_mime(head)
    if sniffed not in AUDIO_TYPES.get(expected, frozenset()):
        raise ApiError(422, "AUDIO_MISMATCH", f"The audio does not look like {expected}"
                       + (f" (it looks like {sniffed})" if sniffed else ""), field="body")


async def _discard_parts(services: Services, upload: JSON) -> None:
    store = blobs(services)
    for part in upload["parts"]:
        await store.delete(part["key"])
    upload["parts"], upload["size"] = [], 0


def _committed(staged: Any) -> JSON:
    from platform_api.facade import staged_body

    return staged_body(staged)


# --- ready -----------------------------------------------------------------------------------


@recordings.route("PATCH", "/{resource_id}/ready", body=ReadyRequest,
                  summary="Mark a recording complete: its parts are checked (size, SHA-256) "
                          "and it becomes ready for transcription")
async def mark_ready(ctx: ItemContext[ReadyRequest]) -> JSON:
    media, services = ctx.resource, ctx.services
    _require_update(ctx, media)
    if media.get("status") == "preparation":
        raise conflict("NO_AUDIO", "No audio was uploaded to this recording")
    async with services.fhir.resource_lock("Media", ctx.id):
        upload = await services.store.get_document(UPLOADS, ctx.id) or {"parts": [], "size": 0}
        moved = RECORDING_STATUS.move(media, "completed")
        size, sha256, sha1 = await _digests(services, ctx.id)
        if size != upload["size"]:
            raise conflict("AUDIO_INCOMPLETE", f"The blob store holds {size} of the "
                           f"{upload['size']} bytes received; upload the audio again")
        asked = ctx.body.sha256 if ctx.body else None
        if asked and asked.lower() != sha256:
            raise conflict("CHECKSUM_MISMATCH", f"The audio received has SHA-256 {sha256}, "
                           "not the one sent; upload it again (offset=0)")
        content = {**moved["content"], "size": size, "hash": sha1,
                   "url": f"{services.settings.public_base_url}/api/sessions/recordings/"
                          f"{ctx.id}/audio",
                   "extension": [{"url": SHA256, "valueString": sha256}]}
        moved["content"] = content
        if ctx.body and ctx.body.duration_seconds:
            moved["duration"] = ctx.body.duration_seconds
        return await ctx.save(moved, event=READY_TOPIC, payload={
            "recording_id": ctx.id, "patient_id": local_id(media.get("subject"), "Patient"),
            "encounter_id": local_id(media.get("encounter"), "Encounter"),
            "content_type": content.get("contentType"), "size": size, "sha256": sha256,
            "duration_seconds": moved.get("duration"), "parts": len(upload["parts"])})


async def _digests(services: Services, recording_id: str) -> tuple[int, str, str]:
    """(size, SHA-256 hex, SHA-1 base64) of the audio, read back from the blob store;
    hashing runs in a worker thread (hashlib releases the GIL on large buffers)."""
    sha256, sha1, size = hashlib.sha256(), hashlib.sha1(), 0  # FHIR's Attachment.hash

    def feed(chunk: bytes) -> None:
        sha256.update(chunk)
        sha1.update(chunk)

    try:
        async for chunk in audio_chunks(services, recording_id):
            size += len(chunk)
            await asyncio.to_thread(feed, chunk)
    except BlobMissing:
        raise conflict("AUDIO_INCOMPLETE", "A part of the audio is missing from the blob "
                       "store; upload the audio again (offset=0)") from None
    return size, sha256.hexdigest(), base64.b64encode(sha1.digest()).decode("ascii")


# --- download ----------------------------------------------------------------------------------


@router.get("/api/sessions/recordings/{resource_id}/audio", response_class=StreamingResponse,
            summary="The audio of a ready recording (streamed)",
            responses={200: {"content": {t: {} for t in AUDIO_TYPES}}})
async def download_audio(resource_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    media = await recordings.load(ctx, resource_id)
    if media.get("status") != "completed":
        raise conflict("RECORDING_NOT_READY", "The recording is not ready yet")
    content = media.get("content") or {}
    return StreamingResponse(audio_chunks(ctx.services, resource_id),
                             media_type=content.get("contentType"),
                             headers={"Content-Length": str(content.get("size", 0)),
                                      "Cache-Control": "private, no-store"})


__all__ = ["READY_TOPIC", "RecordingView", "audio_chunks", "blobs", "recordings", "router"]

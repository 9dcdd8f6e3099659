"""Transcripts of recordings: FHIR **DocumentReference** (the text), and transcription
jobs as FHIR **Task** (the work of producing it).

Transcript (/api field → DocumentReference element):

    id                → id
    recording_id      → context.related (Media/<id>)
    patient_id        → subject;  encounter_id → context.encounter
    (always)          → type urn:healthplatform:document-type#consultation-transcript,
                        status current
    status            → docStatus: preliminary = pending (queued, being transcribed, or
                        waiting for a person), final = completed, amended = corrected;
                        status entered-in-error = withdrawn
    text              → content[0].attachment (text/plain; charset=utf-8, base64 data)
    segments          → content[1].attachment (text/vtt: WebVTT cues, start/end/text)
    language          → content[0].attachment.language
    source            → extension urn:healthplatform:extension:transcript-source
                        (automatic | manual)
    transcribed_by    → author: the engine (identifier urn:healthplatform:speech-to-text
                        |<provider>:<model>) or the person (urn:healthplatform:user|<id>)
    correction_reason → extension urn:healthplatform:extension:correction-reason
    version           → meta.versionId: every correction is a new version; the earlier
                        text stays readable in the resource's history

Job (/api ``job`` → Task element): code urn:healthplatform:task-code#transcription,
intent order, ``focus`` the transcript, ``for`` the patient, ``input`` the recording
(``audio``), the language and the provider; status requested (queued) → in-progress →
completed | failed (``statusReason`` says why) | cancelled (a person submitted the text
first); progress (0..1) in the extension urn:healthplatform:extension:progress and in
``businessStatus``; ``executionPeriod`` when it ran; ``output`` the transcript.

Routes: ``POST /api/sessions/transcripts`` queues a job for a ready recording
(``provider`` local | http, default the setting; ``manual`` waits for a person's text),
409 ``RECORDING_NOT_READY``, 409 ``TRANSCRIPTION_IN_PROGRESS`` while a job of the same
recording is queued or running; ``GET /api/sessions/transcripts/:id`` (to follow the
job); ``PATCH /api/sessions/transcripts/:id`` submits the text (a pending transcript
becomes completed, a running job is cancelled) or corrects it (status corrected, with a
reason). Events: ``platform.sessions.transcription_requested`` (the worker's wake-up),
``platform.sessions.transcript_completed`` (payload: transcript_id, recording_id,
patient_id, encounter_id, source, provider, model, words), ``…transcript_failed``,
``…transcript_corrected``. Who: the patient's clinicians (the policy's DocumentReference
and Task rights), readers as the policy allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import orjson
from fastapi import Depends
from pydantic import BaseModel, Field

from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.store import ConditionChanged, VersionConflict
from platform_api.envelope import ApiError, Envelope, conflict, created, not_found
from platform_api.facade import ApiContext, Facade, ItemContext, api_context, staged_body
from platform_api.services import Services
from platform_api.sessions.common import (
    DOCUMENT_TYPES,
    TASK_CODES,
    attachment_text,
    concept,
    extension,
    local_id,
    ref,
    set_extension,
    source_service,
    text_attachment,
    user_of,
    user_reference,
)
from platform_api.sessions.recordings import audio_chunks, router
from platform_api.sessions.transcription import (
    PROVIDERS,
    JobHandlers,
    Segment,
    Transcription,
    TranscriptionWorker,
    provider_configured,
    provider_for,
)

JSON = dict[str, Any]
TRANSCRIPT_TYPE = f"{DOCUMENT_TYPES}|consultation-transcript"
JOB_CODE = f"{TASK_CODES}|transcription"
ENGINE_SYSTEM = "urn:healthplatform:speech-to-text"
REQUESTED = "platform.sessions.transcription_requested"
COMPLETED = "platform.sessions.transcript_completed"
FAILED = "platform.sessions.transcript_failed"
CORRECTED = "platform.sessions.transcript_corrected"
ACTIVE_JOB = "requested,in-progress"
WORKER = "sessions.transcription_worker"
STATES = {"preliminary": "pending", "final": "completed", "amended": "corrected"}


def document_state(document: JSON) -> str:
    if document.get("status") == "entered-in-error":
        return "withdrawn"
    return STATES.get(str(document.get("docStatus")), "pending")


# --- payloads -----------------------------------------------------------------------------


class TranscriptCreate(BaseModel):
    recording_id: str = Field(min_length=1, max_length=64)
    language: str | None = Field(default=None, pattern=r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})*$",
                                 description="Default: the recording's")
    provider: Literal["local", "http", "manual"] | None = Field(
        default=None, description="Speech-to-text engine (default: the server's setting); "
        "manual: a person will submit the text")


class SegmentView(BaseModel):
    start: float = Field(ge=0)
    end: float = Field(ge=0)
    text: str = Field(max_length=5000)


class TranscriptSubmit(BaseModel):
    text: str = Field(min_length=1, max_length=500_000)
    segments: list[SegmentView] | None = Field(default=None, max_length=20_000)
    language: str | None = Field(default=None, pattern=r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})*$")
    reason: str | None = Field(default=None, max_length=1000,
                               description="Why a completed transcript is corrected")


class JobView(BaseModel):
    id: str
    status: str = Field(description="requested (queued) | in-progress | completed | failed "
                                    "| cancelled")
    progress: float = 0.0
    provider: str | None = None
    model: str | None = None
    error: str | None = None
    queued_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None


class TranscriptView(BaseModel):
    id: str
    recording_id: str | None = None
    patient_id: str | None = None
    encounter_id: str | None = None
    status: str = Field(description="pending | completed | corrected | withdrawn")
    text: str | None = None
    segments: list[SegmentView] = []
    language: str | None = None
    source: str | None = Field(None, description="automatic | manual")
    transcribed_by: str | None = None
    correction_reason: str | None = None
    job: JobView | None = None
    version: str | None = None
    created_at: str | None = None
    updated_at: str | None = None


# --- WebVTT ------------------------------------------------------------------------------------


def _vtt_time(seconds: float) -> str:
    millis = round(seconds * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    return f"{hours:02d}:{minutes:02d}:{rest // 1000:02d}.{rest % 1000:03d}"


def _vtt_seconds(stamp: str) -> float:
    parts = [float(p) for p in stamp.strip().split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return round(parts[0] * 3600 + parts[1] * 60 + parts[2], 3)


def to_webvtt(segments: list[SegmentView]) -> str:
    """WebVTT (W3C): a header, then one cue per segment."""
    cues = [f"{_vtt_time(s.start)} --> {_vtt_time(s.end)}\n"
            f"{s.text.replace('-->', '->').strip() or '-'}" for s in segments]
    return "WEBVTT\n\n" + "\n\n".join(cues) + "\n"


def from_webvtt(text: str) -> list[SegmentView]:
    segments = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [line for line in block.strip().split("\n") if line]
        timing = next((i for i, line in enumerate(lines) if "-->" in line), None)
        if timing is None:
            continue
        start, _, end = lines[timing].partition("-->")
        segments.append(SegmentView(start=_vtt_seconds(start),
                                    end=_vtt_seconds(end.split()[0]),
                                    text=" ".join(lines[timing + 1:])))
    return segments


# --- mapping --------------------------------------------------------------------------------


def pending_document(media: JSON, language: str, source: str) -> JSON:
    document: JSON = {
        "resourceType": "DocumentReference", "status": "current", "docStatus": "preliminary",
        "type": concept(DOCUMENT_TYPES, "consultation-transcript", "Consultation transcript"),
        "subject": media["subject"], "date": now_instant(),
        "description": "Transcript of a consultation recording",
        "content": [{"attachment": {"contentType": "text/plain; charset=utf-8",
                                    "language": language, "title": "Transcript (pending)"}}],
        "context": {"related": [ref("Media", media["id"])]},
    }
    if media.get("encounter"):
        document["context"]["encounter"] = [media["encounter"]]
    set_extension(document, "transcript-source", "valueCode", source)
    return document


def with_text(document: JSON, text: str, segments: list[SegmentView], language: str | None,
              author: JSON) -> JSON:
    changed = orjson.loads(orjson.dumps(document))
    language = language or (changed["content"][0]["attachment"].get("language"))
    attachment = text_attachment(text, title="Transcript", creation=now_instant())
    if language:
        attachment["language"] = language
    changed["content"] = [{"attachment": attachment}]
    if segments:
        changed["content"].append({"attachment": text_attachment(
            to_webvtt(segments), "text/vtt", title="Timed transcript (WebVTT)")})
    changed["author"] = [author]
    return changed  # type: ignore[no-any-return]


def job_task(document_id: str, media: JSON, language: str, provider: str, requester: JSON
             ) -> JSON:
    now = now_instant()
    task: JSON = {
        "resourceType": "Task", "status": "requested", "intent": "order",
        "code": concept(TASK_CODES, "transcription", "Transcription of a recording"),
        "focus": ref("DocumentReference", document_id), "for": media["subject"],
        "authoredOn": now, "lastModified": now, "requester": requester,
        "businessStatus": {"text": "queued"},
        "input": [
            {"type": {"text": "audio"}, "valueReference": ref("Media", media["id"])},
            {"type": {"text": "language"}, "valueCode": language},
            {"type": {"text": "provider"}, "valueCode": provider},
        ],
    }
    if media.get("encounter"):
        task["encounter"] = media["encounter"]
    return task


def _input(task: JSON, name: str) -> Any:
    for item in task.get("input") or []:
        if (item.get("type") or {}).get("text") == name:
            return next((v for k, v in item.items() if k.startswith("value")), None)
    return None


def job_view(task: JSON) -> JSON:
    period = task.get("executionPeriod") or {}
    owner = task.get("owner") or {}
    engine = ((owner.get("identifier") or {}).get("value") or "").partition(":")[2] or None
    return JobView(
        id=task["id"], status=task["status"], progress=extension(task, "progress") or 0.0,
        provider=_input(task, "provider"), model=engine,
        error=(task.get("statusReason") or {}).get("text"), queued_at=task.get("authoredOn"),
        started_at=period.get("start"), finished_at=period.get("end"),
    ).model_dump()


def transcript_view(document: JSON, job: JSON | None = None) -> JSON:
    content = document.get("content") or []
    text = attachment_text(content[0].get("attachment")) if content else None
    timed = next((c["attachment"] for c in content[1:]
                  if (c.get("attachment") or {}).get("contentType") == "text/vtt"), None)
    related = ((document.get("context") or {}).get("related") or [{}])[0]
    encounters = (document.get("context") or {}).get("encounter") or [{}]
    author = (document.get("author") or [{}])[0]
    return TranscriptView(
        id=document["id"], recording_id=local_id(related, "Media"),
        patient_id=local_id(document.get("subject"), "Patient"),
        encounter_id=local_id(encounters[0], "Encounter"), status=document_state(document),
        text=text, segments=from_webvtt(attachment_text(timed) or "") if timed else [],
        language=content[0].get("attachment", {}).get("language") if content else None,
        source=extension(document, "transcript-source"),
        transcribed_by=user_of(author) or author.get("display"),
        correction_reason=extension(document, "correction-reason"),
        job=JobView.model_validate(job_view(job)) if job else None,
        version=(document.get("meta") or {}).get("versionId"), created_at=document.get("date"),
        updated_at=(document.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


async def transcript_views(ctx: ApiContext, documents: list[JSON]) -> list[JSON]:
    """Views with each transcript's latest job (one Task search for the page)."""
    if not documents:
        return []
    tasks = await ctx.fhir.search("Task", [
        ("focus", ",".join(f"DocumentReference/{d['id']}" for d in documents)),
        ("code", JOB_CODE), ("_sort", "-authored-on")])
    latest: dict[str, JSON] = {}
    for task in tasks:
        document_id = local_id(task.get("focus"), "DocumentReference")
        if document_id is not None:
            latest.setdefault(document_id, task)
    return [transcript_view(d, latest.get(d["id"])) for d in documents]


def _refuse_create(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    raise AssertionError("transcripts are created by start_transcription")


transcripts = Facade(
    resource="DocumentReference", name="Transcript", create=TranscriptCreate,
    update=TranscriptSubmit, view=TranscriptView, to_fhir=_refuse_create,
    from_fhir=transcript_view, views=transcript_views, fixed=(("type", TRANSCRIPT_TYPE),),
    tags=["sessions"],
    summaries={"get": "A transcript, with its transcription job's state and progress"},
)
transcripts.mount(router, "/api/sessions/transcripts", ops=("get",))


# --- routes ------------------------------------------------------------------------------------


@router.post("/api/sessions/transcripts", status_code=201,
             response_model=Envelope[TranscriptView],
             summary="Start transcribing a ready recording (a queued job), or open a "
                     "transcript for a person to write (provider manual)")
async def start_transcription(body: TranscriptCreate, ctx: ApiContext = Depends(api_context)
                              ) -> Any:
    media = await ctx.fhir.find_json("Media", body.recording_id)
    if media is None or (media.get("type") or {}).get("coding", [{}])[0].get("code") != "audio":
        raise not_found("Recording")
    if media.get("status") != "completed":
        raise conflict("RECORDING_NOT_READY", "The recording is not ready: upload its audio "
                       "and mark it ready first")
    settings = ctx.services.settings
    provider = body.provider or settings.transcription_provider
    if provider != "manual" and not provider_configured(settings, provider):
        raise ApiError(422, "PROVIDER_NOT_CONFIGURED", f"The {provider} speech-to-text "
                       "provider is not configured on this server", field="provider")
    await _refuse_second_job(ctx, media["id"])
    language = body.language or (media.get("content") or {}).get("language") or "en"
    source = "manual" if provider == "manual" else "automatic"
    unit = ctx.unit()
    async with unit:
        document = await unit.create(pending_document(media, language, source))
        task = None
        if source == "automatic":
            task = await unit.create(job_task(document.id, media, language, provider,
                                              user_reference(ctx.principal)))
            unit.emit(REQUESTED, {"transcript_id": document.id, "job_id": task.id,
                                  "recording_id": media["id"], "provider": provider},
                      source_service="sessions")
        await unit.commit()
    return created(transcript_view(staged_body(document),
                                   staged_body(task) if task is not None else None))


async def _refuse_second_job(ctx: ApiContext, media_id: str) -> None:
    pending = await ctx.fhir.search("DocumentReference", [
        ("related", f"Media/{media_id}"), ("type", TRANSCRIPT_TYPE)])
    waiting = [d["id"] for d in pending if d.get("docStatus") == "preliminary"]
    if not waiting:
        return
    active = await ctx.fhir.search("Task", [
        ("focus", ",".join(f"DocumentReference/{i}" for i in waiting)), ("code", JOB_CODE),
        ("status", ACTIVE_JOB), ("_count", "1")])
    if active:
        busy = local_id(active[0].get("focus"), "DocumentReference")
        raise conflict("TRANSCRIPTION_IN_PROGRESS",
                       f"Transcript {busy} of this recording is being transcribed")


@transcripts.route("PATCH", "/{resource_id}", body=TranscriptSubmit,
                   summary="Submit a transcript's text (e.g. a transcriptionist's) or correct "
                           "it; corrections are kept as new versions")
async def submit_transcript(ctx: ItemContext[TranscriptSubmit]) -> JSON:
    document, body = ctx.resource, ctx.body
    assert body is not None
    if document.get("status") == "entered-in-error":
        raise conflict("TRANSCRIPT_WITHDRAWN", "This transcript was withdrawn")
    pending = document.get("docStatus") == "preliminary"
    if not pending and not body.reason:
        raise ApiError(422, "VALIDATION_ERROR", "A completed transcript is corrected with a "
                       "reason", field="reason")
    changed = with_text(document, body.text, body.segments or [], body.language,
                        user_reference(ctx.principal))
    changed["docStatus"] = "final" if pending else "amended"
    set_extension(changed, "correction-reason", "valueString", None if pending else body.reason)
    if pending:
        set_extension(changed, "transcript-source", "valueCode", "manual")
    running = await ctx.fhir.search("Task", [("focus", f"DocumentReference/{ctx.id}"),
                                             ("code", JOB_CODE), ("status", ACTIVE_JOB)])
    payload = _event_payload(changed, "manual", None, body.text)
    unit = ctx.unit()
    async with unit:
        for task in running:
            await unit.update(_finished(task, "cancelled", reason="A person submitted the "
                                        "transcript"), if_match=_version(task))
        await unit.update(changed, if_match=_version(document))
        unit.emit(COMPLETED if pending else CORRECTED,
                  {**payload, **({} if pending else {"reason": body.reason})},
                  source_service=source_service(ctx.request))
        await unit.commit()
    return await ctx.fhir.read_json("DocumentReference", ctx.id)


def _version(resource: JSON) -> int | None:
    return int((resource.get("meta") or {}).get("versionId", 0)) or None


def _finished(task: JSON, status: str, *, reason: str | None = None) -> JSON:
    now = now_instant()
    changed = orjson.loads(orjson.dumps(task))
    changed.update(status=status, lastModified=now, businessStatus={"text": status})
    changed["executionPeriod"] = {**(changed.get("executionPeriod") or {"start": now}),
                                  "end": now}
    if reason:
        changed["statusReason"] = {"text": reason[:1000]}
    return changed  # type: ignore[no-any-return]


def _event_payload(document: JSON, source: str, provider: str | None, text: str,
                   model: str | None = None) -> JSON:
    related = ((document.get("context") or {}).get("related") or [{}])[0]
    encounters = (document.get("context") or {}).get("encounter") or [{}]
    return {"transcript_id": document["id"], "recording_id": local_id(related, "Media"),
            "patient_id": local_id(document.get("subject"), "Patient"),
            "encounter_id": local_id(encounters[0], "Encounter"), "source": source,
            "provider": provider, "model": model, "words": len(text.split())}


# --- the worker's side of a job ------------------------------------------------------------------


@dataclass
class Job:
    task: JSON
    transcript_id: str
    recording_id: str
    language: str | None
    provider: str

    @property
    def id(self) -> str:
        return str(self.task["id"])


def _job(task: JSON) -> Job:
    return Job(task, local_id(task.get("focus"), "DocumentReference") or "",
               local_id(_input(task, "audio"), "Media") or "", _input(task, "language"),
               _input(task, "provider") or "local")


async def claim(fhir: CallerFhir, job_id: str, stale_seconds: float) -> Job | None:
    task = await fhir.read_json("Task", job_id)
    if task.get("status") == "in-progress":
        last = task.get("lastModified") or ""
        if last > _seconds_ago(stale_seconds):
            return None  # another worker has it
    elif task.get("status") != "requested":
        return None
    now = now_instant()
    changed = {**task, "status": "in-progress", "lastModified": now,
               "businessStatus": {"text": "transcribing"},
               "executionPeriod": {"start": now}}
    job = _job(task)
    engine = provider_for_name(job.provider)
    if engine is not None:
        changed["owner"] = engine
    set_extension(changed, "progress", "valueDecimal", 0.0)
    async with fhir.unit() as unit:
        staged = await unit.update(changed, if_match=_version(task))
        await unit.commit()
    return _job(staged_body(staged))


def provider_for_name(provider: str) -> JSON | None:
    return {"display": f"speech-to-text ({provider})",
            "identifier": {"system": ENGINE_SYSTEM, "value": f"{provider}:"}}


def _seconds_ago(seconds: float) -> str:
    from datetime import UTC, datetime, timedelta

    moment = datetime.now(UTC) - timedelta(seconds=seconds)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def report(fhir: CallerFhir, job: Job, share: float) -> None:
    task = await fhir.read_json("Task", job.id)
    if task.get("status") != "in-progress":
        return
    changed = {**task, "lastModified": now_instant(),
               "businessStatus": {"text": f"transcribing {round(share * 100)}%"}}
    set_extension(changed, "progress", "valueDecimal", round(share, 3))
    try:
        async with fhir.unit() as unit:
            await unit.update(changed, if_match=_version(task))
            await unit.commit()
    except (VersionConflict, ConditionChanged):
        pass  # the job moved on meanwhile: its outcome says more than this progress


async def succeed(fhir: CallerFhir, job: Job, result: Transcription) -> None:
    for _attempt in range(3):
        task = await fhir.read_json("Task", job.id)
        document = await fhir.read_json("DocumentReference", job.transcript_id)
        if task.get("status") != "in-progress" or document.get("docStatus") != "preliminary":
            return  # cancelled: a person's text came first
        engine = {"display": f"{job.provider} speech-to-text ({result.model})",
                  "identifier": {"system": ENGINE_SYSTEM,
                                 "value": f"{job.provider}:{result.model}"}}
        segments = [SegmentView(start=s.start, end=max(s.end, s.start), text=s.text)
                    for s in result.segments]
        changed = with_text(document, result.text, segments,
                            _input(task, "language"), engine)
        changed["docStatus"] = "final"
        done = _finished(task, "completed")
        done["owner"] = engine
        set_extension(done, "progress", "valueDecimal", 1.0)
        done["output"] = [{"type": {"text": "transcript"},
                           "valueReference": ref("DocumentReference", job.transcript_id)}]
        try:
            async with fhir.unit() as unit:
                await unit.update(changed, if_match=_version(document))
                await unit.update(done, if_match=_version(task))
                await _record_duration(fhir, unit, job.recording_id, result.duration)
                unit.emit(COMPLETED, _event_payload(changed, "automatic", job.provider,
                                                    result.text, result.model),
                          source_service="sessions")
                await unit.commit()
            return
        except (VersionConflict, ConditionChanged):
            continue


async def _record_duration(fhir: CallerFhir, unit: Any, media_id: str,
                           duration: float | None) -> None:
    if not duration:
        return
    media = await fhir.find_json("Media", media_id)
    if media is not None and not media.get("duration"):
        await unit.update({**media, "duration": duration}, if_match=_version(media))


async def fail(fhir: CallerFhir, job: Job, message: str) -> None:
    task = await fhir.read_json("Task", job.id)
    if task.get("status") != "in-progress":
        return
    async with fhir.unit() as unit:
        await unit.update(_finished(task, "failed", reason=message), if_match=_version(task))
        unit.emit(FAILED, {"transcript_id": job.transcript_id, "job_id": job.id,
                           "recording_id": job.recording_id, "provider": job.provider,
                           "error": message}, source_service="sessions")
        await unit.commit()


async def queued(fhir: CallerFhir, stale_seconds: float) -> list[str]:
    """Jobs waiting, oldest first, and jobs whose worker went silent."""
    waiting = await _job_ids(fhir, [("status", "requested"), ("_sort", "authored-on")])
    stale = await _job_ids(fhir, [("status", "in-progress"),
                                  ("_lastUpdated", f"lt{_seconds_ago(stale_seconds)}")])
    return waiting + stale


async def _job_ids(fhir: CallerFhir, criteria: list[tuple[str, str]]) -> list[str]:
    plan = await fhir.parse(["Task"], [("code", JOB_CODE), *criteria], strict=True)
    plan.count = 100
    page = await fhir.search_page(plan)
    return [s.id for s in page.resources]


def job_handlers(services: Services) -> JobHandlers:
    async def audio(job: Job, path: Path) -> None:
        async with await anyio.open_file(path, "wb") as out:
            async for chunk in audio_chunks(services, job.recording_id):
                await out.write(chunk)

    return JobHandlers(claim=claim, audio=audio, succeed=succeed, fail=fail, report=report,
                       queued=queued,
                       provider=lambda job: provider_for(services.settings, job.provider))


def start_worker(services: Services) -> TranscriptionWorker:
    worker = TranscriptionWorker(services, job_handlers(services), REQUESTED)
    worker.start()
    services.extras[WORKER] = worker
    return worker


__all__ = ["COMPLETED", "PROVIDERS", "Segment", "TranscriptView", "document_state",
           "start_worker", "transcripts"]

"""Voice dictation: a **DocumentReference** collecting ordered segments, merged into a
clinical note (a Composition, see :mod:`.notes`).

Mapping (/api field → DocumentReference element):

    patient_id    → subject;  encounter_id → context.encounter
    (always)      → type urn:healthplatform:document-type#dictation, status current
    status        → docStatus: preliminary = open, final = merged;
                    status entered-in-error = cancelled
    note_id       → context.related (Composition/<id>): the note it merges into (given at
                    the start, or the one the merge made)
    created_by    → author (urn:healthplatform:user|<id>)
    segments      → content[1..]: one text/plain attachment each, with the extensions
                    urn:healthplatform:extension:segment-sequence (valueInteger) and
                    …:segment-section (valueCode subjective | objective | assessment |
                    plan); content[0] is the dictation's header (no data)

A segment is text the client recognised, or ``transcript_id``: the text of a completed
transcript (a dictation recorded as a recording and transcribed, :mod:`.transcripts`).
Segments may arrive in any order; their ``sequence`` orders them (409
``SEGMENT_EXISTS`` for a number already used). ``merge`` appends the segments, in order,
to the sections of the note (``subjective`` unless a segment names another): a new
preliminary Composition (``relatesTo`` transforms this dictation), or the open note it
names (409 ``NOTE_SIGNED`` when that note was signed meanwhile); the dictation becomes
merged, in the same unit of work. Event ``platform.clinical.dictation_merged``
(dictation_id, note_id, patient_id, segments).
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from fastapi import APIRouter
from pydantic import BaseModel, Field, model_validator

from fhir_server.clock import now_instant
from platform_api.envelope import ApiError, conflict, not_found
from platform_api.facade import ApiContext, Facade, ItemContext
from platform_api.sessions.common import (
    DOCUMENT_TYPES,
    EXTENSION,
    attachment_text,
    check_patient_and_encounter,
    concept,
    local_id,
    ref,
    text_attachment,
    user_of,
    user_reference,
)
from platform_api.sessions.notes import SECTIONS, narrative_text, note_to_fhir

JSON = dict[str, Any]
DICTATION_TYPE = f"{DOCUMENT_TYPES}|dictation"
SEQUENCE, SECTION = EXTENSION + "segment-sequence", EXTENSION + "segment-section"
MERGED = "platform.clinical.dictation_merged"
STATES = {"preliminary": "open", "final": "merged"}
Section = Literal["subjective", "objective", "assessment", "plan"]


class DictationCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    encounter_id: str | None = Field(default=None, min_length=1, max_length=64)
    note_id: str | None = Field(default=None, min_length=1, max_length=64,
                                description="An open note to merge into (default: a new one)")
    title: str | None = Field(default=None, max_length=200)


class SegmentCreate(BaseModel):
    sequence: int = Field(ge=1, le=100_000)
    text: str | None = Field(default=None, min_length=1, max_length=20_000)
    transcript_id: str | None = Field(default=None, min_length=1, max_length=64)
    section: Section = "subjective"

    @model_validator(mode="after")
    def one_source(self) -> SegmentCreate:
        if (self.text is None) == (self.transcript_id is None):
            raise ValueError("give the segment's text or a transcript_id, one of the two")
        return self


class MergeRequest(BaseModel):
    title: str | None = Field(default=None, max_length=200)


class SegmentView(BaseModel):
    sequence: int
    section: str
    text: str
    received_at: str | None = None


class DictationView(BaseModel):
    id: str
    patient_id: str | None = None
    encounter_id: str | None = None
    status: str = Field(description="open | merged | cancelled")
    title: str | None = None
    note_id: str | None = None
    created_by: str | None = None
    segments: list[SegmentView] = []
    created_at: str | None = None
    updated_at: str | None = None


def dictation_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    document: JSON = {
        "resourceType": "DocumentReference", "status": "current", "docStatus": "preliminary",
        "type": concept(DOCUMENT_TYPES, "dictation", "Dictation"),
        "subject": ref("Patient", payload["patient_id"]), "date": now_instant(),
        "author": [user_reference(ctx.principal)],
        "description": payload.get("title") or "Dictation",
        "content": [{"attachment": {"contentType": "text/plain; charset=utf-8",
                                    "title": payload.get("title") or "Dictation"}}],
    }
    context: JSON = {}
    if payload.get("encounter_id"):
        context["encounter"] = [ref("Encounter", payload["encounter_id"])]
    if payload.get("note_id"):
        context["related"] = [ref("Composition", payload["note_id"])]
    if context:
        document["context"] = context
    return document


def _value(content: JSON, url: str) -> Any:
    for ext in content.get("extension") or []:
        if ext.get("url") == url:
            return ext.get("valueInteger", ext.get("valueCode"))
    return None


def segments_of(document: JSON) -> list[JSON]:
    found = []
    for content in document.get("content") or []:
        sequence = _value(content, SEQUENCE)
        if sequence is None:
            continue
        attachment = content.get("attachment") or {}
        found.append({"sequence": sequence, "section": _value(content, SECTION) or "subjective",
                      "text": attachment_text(attachment) or "",
                      "received_at": attachment.get("creation")})
    return sorted(found, key=lambda s: s["sequence"])


def dictation_view(document: JSON) -> JSON:
    context = document.get("context") or {}
    state = "cancelled" if document.get("status") == "entered-in-error" else \
        STATES.get(str(document.get("docStatus")), "open")
    return DictationView(
        id=document["id"], patient_id=local_id(document.get("subject"), "Patient"),
        encounter_id=local_id((context.get("encounter") or [{}])[0], "Encounter"),
        status=state, title=document.get("description"),
        note_id=local_id((context.get("related") or [{}])[0], "Composition"),
        created_by=user_of((document.get("author") or [{}])[0]),
        segments=[SegmentView.model_validate(s) for s in segments_of(document)],
        created_at=document.get("date"),
        updated_at=(document.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


async def _check_target_note(ctx: ApiContext, payload: JSON) -> JSON:
    payload = await check_patient_and_encounter(ctx, payload)
    if payload.get("note_id"):
        note = await _open_note(ctx, payload["note_id"])
        if local_id(note.get("subject"), "Patient") != payload["patient_id"]:
            raise ApiError(422, "NOTE_PATIENT_MISMATCH", "The note is about another patient",
                           field="note_id")
    return payload


async def _open_note(ctx: ApiContext, note_id: str) -> JSON:
    note = await ctx.fhir.find_json("Composition", note_id)
    if note is None:
        raise not_found("Clinical note")
    if note.get("status") != "preliminary":
        raise conflict("NOTE_SIGNED", "The note was signed: dictate into a new note, or "
                       "amend it")
    return note


dictations = Facade(
    resource="DocumentReference", name="Dictation", create=DictationCreate,
    view=DictationView, to_fhir=dictation_to_fhir, from_fhir=dictation_view,
    prepare=_check_target_note, fixed=(("type", DICTATION_TYPE),), tags=["clinical notes"],
    summaries={"create": "Start a dictation for a patient (segments follow; merge makes "
                         "or fills a note)"},
)
router = APIRouter(tags=["clinical notes"])
dictations.mount(router, "/api/clinical/dictation", ops=("create",))


def _require_open(document: JSON) -> None:
    if document.get("status") == "entered-in-error" or document.get("docStatus") != \
            "preliminary":
        raise conflict("DICTATION_CLOSED", "This dictation was merged or cancelled")


def _version(resource: JSON) -> int | None:
    return int((resource.get("meta") or {}).get("versionId", 0)) or None


@dictations.route("POST", "/{resource_id}/segments", body=SegmentCreate, status_code=201,
                  summary="Add a segment (text, or a completed transcript's) at its place in "
                          "the dictation")
async def add_segment(ctx: ItemContext[SegmentCreate]) -> JSON:
    document, body = ctx.resource, ctx.body
    assert body is not None
    _require_open(document)
    if any(s["sequence"] == body.sequence for s in segments_of(document)):
        raise conflict("SEGMENT_EXISTS", f"Segment {body.sequence} was already received")
    text = body.text or await _transcript_text(ctx, body.transcript_id or "")
    changed = orjson.loads(orjson.dumps(document))
    changed["content"].append({
        "attachment": text_attachment(text, title=f"Segment {body.sequence}",
                                      creation=now_instant()),
        "extension": [{"url": SEQUENCE, "valueInteger": body.sequence},
                      {"url": SECTION, "valueCode": body.section}]})
    return await ctx.save(changed)


async def _transcript_text(ctx: ApiContext, transcript_id: str) -> str:
    from platform_api.sessions.transcripts import transcript_view, transcripts

    document = await transcripts.load(ctx, transcript_id)
    view = transcript_view(document)
    if view["status"] not in ("completed", "corrected") or not view["text"]:
        raise conflict("TRANSCRIPT_NOT_READY", "That transcript has no text yet")
    return str(view["text"])


@dictations.route("POST", "/{resource_id}/merge", body=MergeRequest,
                  summary="Merge the segments, in order, into a clinical note (a new draft, or "
                          "the open note the dictation names)")
async def merge_dictation(ctx: ItemContext[MergeRequest]) -> JSON:
    document = ctx.resource
    _require_open(document)
    segments = segments_of(document)
    if not segments:
        raise conflict("NO_SEGMENTS", "The dictation has no segments to merge")
    context = document.get("context") or {}
    note_id = local_id((context.get("related") or [{}])[0], "Composition")
    existing = await _open_note(ctx, note_id) if note_id else None
    payload = _sections_with(existing, segments)
    if ctx.body and ctx.body.title:
        payload["title"] = ctx.body.title
    merged = orjson.loads(orjson.dumps(document))
    merged["docStatus"] = "final"
    unit = ctx.unit()
    async with unit:
        if existing is not None:
            note = note_to_fhir(payload, ctx, existing)
            staged = await unit.update(note, if_match=_version(existing))
        else:
            note = note_to_fhir({**payload, "patient_id": local_id(document.get("subject"),
                                                                   "Patient"),
                                 "encounter_id": local_id((context.get("encounter") or [{}])[0],
                                                          "Encounter")}, ctx, None)
            note["relatesTo"] = [{"code": "transforms",
                                  "targetReference": ref("DocumentReference", ctx.id)}]
            staged = await unit.create(note)
        merged.setdefault("context", {})["related"] = [ref("Composition", staged.id)]
        await unit.update(merged, if_match=_version(document))
        unit.emit(MERGED, {"dictation_id": ctx.id, "note_id": staged.id,
                           "patient_id": local_id(document.get("subject"), "Patient"),
                           "segments": len(segments)}, source_service="clinical notes")
        await unit.commit()
    return await ctx.fhir.read_json("DocumentReference", ctx.id)


def _sections_with(note: JSON | None, segments: list[JSON]) -> JSON:
    """The section texts after appending the segments (in order) to ``note``'s."""
    texts: dict[str, list[str]] = {name: [] for name in SECTIONS}
    if note is not None:
        for section in note.get("section") or []:
            code = ((section.get("code") or {}).get("coding") or [{}])[0].get("code")
            name = next((n for n, (c, _) in SECTIONS.items() if c == code), None)
            text = narrative_text(section.get("text"))
            if name and text:
                texts[name].append(text)
    for segment in segments:
        texts[segment["section"]].append(segment["text"])
    return {name: "\n".join(parts) for name, parts in texts.items() if parts}


__all__ = ["DictationView", "dictations", "router"]

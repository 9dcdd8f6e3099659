"""Clinical notes: FHIR **Composition** (a SOAP note about a patient and encounter).

Mapping (/api field → Composition element):

    patient_id       → subject (Patient/<id>);  encounter_id → encounter
    type             → type (LOINC): progress 11506-3 Progress note, consultation 11488-4
                       Consult note, admission 34117-2 History and physical note,
                       discharge 18842-5 Discharge summary
    title            → title (default: the type's display)
    subjective       → section[code LOINC 61150-9 Subjective].text
    objective        → section[code LOINC 61149-1 Objective].text
    assessment       → section[code LOINC 51848-0 Assessment].text
    plan             → section[code LOINC 18776-5 Plan of care].text
                       (each section's narrative is XHTML: the text escaped, line breaks
                       as <br/>, read back exactly)
    author_ids       → author: the users who wrote it (identifier
                       urn:healthplatform:user|<id>, with their Practitioner record when
                       they have one)
    status           → status: preliminary (draft) → final (signed) → amended
    signed_by/at     → attester[mode legal].party / .time (the signer; each amendment adds
                       the amender as attester too)
    amendment_reason → extension urn:healthplatform:extension:amendment-reason
    dictation_id     → relatesTo[code transforms].targetReference (the dictation merged)
    version          → meta.versionId: every change is a version, so the note as signed
                       stays readable in its history after an amendment

Rules: ``POST /api/clinical/notes/:id/sign`` moves preliminary → final (409
``INVALID_TRANSITION`` otherwise) and only a doctor or nurse of an organization that owns
the note may sign (the access policy's ``clinical-note.sign``, 403 otherwise). A
preliminary note is edited freely (by whoever the policy lets update it); a signed one
changes only by amendment: a PATCH with ``amendment_reason`` by a signer, which makes it
``amended`` (422 without a reason).
``GET /api/clinical/notes/patient/:patient_id`` lists a patient's notes, newest first.
Events: ``platform.clinical.note_created``, ``platform.clinical.note_signed`` and
``platform.clinical.note_amended`` (payload: note_id, patient_id, encounter_id, type,
status, version, by, at).
"""

from __future__ import annotations

import html
import re
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ownership import owner_labels
from platform_api.envelope import ApiError, conflict
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    ItemContext,
    PatientScope,
    SearchParam,
    StatusTable,
)
from platform_api.sessions.common import (
    LOINC,
    check_patient_and_encounter,
    concept,
    extension,
    first_code,
    local_id,
    ref,
    set_extension,
    user_of,
    user_reference,
)

JSON = dict[str, Any]
NOTE_TYPES: dict[str, tuple[str, str]] = {
    "progress": ("11506-3", "Progress note"),
    "consultation": ("11488-4", "Consult note"),
    "admission": ("34117-2", "History and physical note"),
    "discharge": ("18842-5", "Discharge summary"),
}
SECTIONS: dict[str, tuple[str, str]] = {
    "subjective": ("61150-9", "Subjective"),
    "objective": ("61149-1", "Objective"),
    "assessment": ("51848-0", "Assessment"),
    "plan": ("18776-5", "Plan of care"),
}
NOTE_STATUS = StatusTable.of(
    preliminary=("final", "entered-in-error"),
    final=("amended", "entered-in-error"),
    amended=("amended", "entered-in-error"),
    entered_in_error=(),
)
CREATED, SIGNED, AMENDED = ("platform.clinical.note_created", "platform.clinical.note_signed",
                            "platform.clinical.note_amended")
NoteType = Literal["progress", "consultation", "admission", "discharge"]
SectionName = Literal["subjective", "objective", "assessment", "plan"]
SECTION_TEXT = Field(default=None, max_length=50_000)


class NoteCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    encounter_id: str | None = Field(default=None, min_length=1, max_length=64)
    type: NoteType = "progress"
    title: str | None = Field(default=None, max_length=200)
    subjective: str | None = SECTION_TEXT
    objective: str | None = SECTION_TEXT
    assessment: str | None = SECTION_TEXT
    plan: str | None = SECTION_TEXT


class NoteUpdate(BaseModel):
    title: str | None = Field(default=None, max_length=200)
    subjective: str | None = SECTION_TEXT
    objective: str | None = SECTION_TEXT
    assessment: str | None = SECTION_TEXT
    plan: str | None = SECTION_TEXT
    amendment_reason: str | None = Field(default=None, min_length=1, max_length=1000,
                                         description="Needed to change a signed note")


class SignRequest(BaseModel):
    comment: str | None = Field(default=None, max_length=1000)


class NoteView(BaseModel):
    id: str
    patient_id: str | None = None
    encounter_id: str | None = None
    type: str | None = None
    title: str | None = None
    status: str
    subjective: str | None = None
    objective: str | None = None
    assessment: str | None = None
    plan: str | None = None
    author_ids: list[str] = []
    signed_by: str | None = None
    signed_at: str | None = None
    amendment_reason: str | None = None
    dictation_id: str | None = None
    version: str | None = None
    date: str | None = None
    updated_at: str | None = None


class NoteQuery(BaseModel):
    status: Annotated[Literal["preliminary", "final", "amended", "entered-in-error"] | None,
                      SearchParam("status")] = None
    type: NoteType | None = None  # a LOINC code in the search (note_type_criteria)
    encounter_id: Annotated[str | None, SearchParam("encounter", "Encounter/{}")] = Field(
        None, max_length=64)


# --- narrative --------------------------------------------------------------------------------
_DIV_OPEN = '<div xmlns="http://www.w3.org/1999/xhtml">'
_DIV = re.compile(r"^<div[^>]*>(.*)</div>$", re.S)


def narrative(text: str) -> JSON:
    body = html.escape(text, quote=False).replace("\r\n", "\n").replace("\n", "<br/>")
    return {"status": "generated", "div": f"{_DIV_OPEN}{body}</div>"}


def narrative_text(value: JSON | None) -> str | None:
    found = _DIV.match((value or {}).get("div", ""))
    if found is None:
        return None
    return html.unescape(found.group(1).replace("<br/>", "\n"))


# --- mapping ----------------------------------------------------------------------------------


def author_reference(ctx: ApiContext) -> JSON:
    author = user_reference(ctx.principal)
    practitioners = sorted(ctx.access.subject.practitioner_ids)
    if practitioners:
        author["reference"] = f"Practitioner/{practitioners[0]}"
    return author


def set_sections(composition: JSON, payload: JSON) -> None:
    """Write the SOAP sections the payload names (an empty text removes one)."""
    sections = {first_code(s.get("code"), LOINC): s for s in composition.get("section") or []}
    for name, (code, display) in SECTIONS.items():
        if name not in payload:
            continue
        text = payload[name]
        if text:
            sections[code] = {"title": display, "code": concept(LOINC, code, display),
                              "text": narrative(text)}
        else:
            sections.pop(code, None)
    ordered = [sections[code] for code, _ in SECTIONS.values() if code in sections]
    ordered += [s for c, s in sections.items() if c not in {c for c, _ in SECTIONS.values()}]
    if ordered:
        composition["section"] = ordered
    else:
        composition.pop("section", None)


def note_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    if existing is not None:
        note: JSON = orjson.loads(orjson.dumps(existing))
        me = author_reference(ctx)
        if user_of(me) not in {user_of(a) for a in note.get("author") or []}:
            note.setdefault("author", []).append(me)
    else:
        code, display = NOTE_TYPES[payload.get("type", "progress")]
        note = {"resourceType": "Composition", "status": "preliminary",
                "type": concept(LOINC, code, display),
                "subject": ref("Patient", payload["patient_id"]), "date": now_instant(),
                "author": [author_reference(ctx)], "title": payload.get("title") or display}
        if payload.get("encounter_id"):
            note["encounter"] = ref("Encounter", payload["encounter_id"])
    if payload.get("title"):
        note["title"] = payload["title"]
    set_sections(note, payload)
    return note


def note_view(note: JSON) -> JSON:
    sections = {first_code(s.get("code"), LOINC): narrative_text(s.get("text"))
                for s in note.get("section") or []}
    signature: JSON = next((a for a in reversed(note.get("attester") or [])
                      if a.get("mode") == "legal"), {})
    code = first_code(note.get("type"), LOINC)
    transforms: JSON = next((r for r in note.get("relatesTo") or []
                             if r.get("code") == "transforms"), {})
    return NoteView(
        id=note["id"], patient_id=local_id(note.get("subject"), "Patient"),
        encounter_id=local_id(note.get("encounter"), "Encounter"),
        type=next((k for k, (c, _) in NOTE_TYPES.items() if c == code), code),
        title=note.get("title"), status=note["status"],
        **{name: sections.get(code) for name, (code, _) in SECTIONS.items()},
        author_ids=[u for a in note.get("author") or [] if (u := user_of(a))],
        signed_by=user_of(signature.get("party")), signed_at=signature.get("time"),
        amendment_reason=extension(note, "amendment-reason"),
        dictation_id=local_id(transforms.get("targetReference"), "DocumentReference"),
        version=(note.get("meta") or {}).get("versionId"), date=note.get("date"),
        updated_at=(note.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


def note_event(note: JSON, ctx: ApiContext) -> JSON:
    view = note_view(note)
    return {"note_id": view["id"], "patient_id": view["patient_id"],
            "encounter_id": view["encounter_id"], "type": view["type"],
            "status": view["status"], "version": view["version"],
            "by": ctx.principal.user_id, "at": now_instant()}


notes = Facade(
    resource="Composition", name="Clinical note", create=NoteCreate, update=NoteUpdate,
    view=NoteView, to_fhir=note_to_fhir, from_fhir=note_view,
    prepare=check_patient_and_encounter, statuses=NOTE_STATUS,
    events=Events(created=CREATED, payload=lambda note: {
        "note_id": note["id"], "patient_id": local_id(note.get("subject"), "Patient"),
        "status": note.get("status")}),
    tags=["clinical notes"],
    summaries={"create": "Write a clinical note (a FHIR Composition with SOAP sections)",
               "get": "A clinical note"},
)
def note_type_criteria(ctx: ApiContext, query: NoteQuery | None) -> list[tuple[str, str]]:
    if query is None or query.type is None:
        return []
    return [("type", f"{LOINC}|{NOTE_TYPES[query.type][0]}")]


patient_notes = Facade(
    resource="Composition", name="Clinical note", create=NoteCreate, view=NoteView,
    query=NoteQuery, to_fhir=note_to_fhir, from_fhir=note_view, scope=PatientScope("subject"),
    sort="-date", list_criteria=note_type_criteria, tags=["clinical notes"],
    summaries={"list": "A patient's clinical notes, newest first"},
)
router = APIRouter(tags=["clinical notes"])
notes.mount(router, "/api/clinical/notes", ops=("create", "get"))
patient_notes.mount(router, "/api/clinical/notes/patient/{patient_id}", ops=("list",))


def require_signer(ctx: ApiContext, note: JSON) -> None:
    """Only a doctor or nurse of an organization owning the note signs or amends it."""
    ctx.authorize("clinical-note.sign", owner_labels(note))


@notes.route("POST", "/{resource_id}/sign", body=SignRequest,
             summary="Sign a clinical note: it becomes final, with the signer as its legal "
                     "attester; afterwards it changes only by amendment")
async def sign_note(ctx: ItemContext[SignRequest]) -> JSON:
    note = ctx.resource
    require_signer(ctx, note)
    signed = NOTE_STATUS.move(note, "final")
    now = now_instant()
    signed["attester"] = [*note.get("attester", []),
                          {"mode": "legal", "time": now, "party": author_reference(ctx)}]
    signed["date"] = now
    payload = note_event(signed, ctx)
    if ctx.body and ctx.body.comment:
        payload["comment"] = ctx.body.comment
    return await ctx.save(signed, event=SIGNED, payload=payload)


@notes.route("PATCH", "/{resource_id}", body=NoteUpdate,
             summary="Edit a draft note, or amend a signed one (with amendment_reason: it "
                     "becomes amended; the signed version stays in its history)")
async def update_note(ctx: ItemContext[NoteUpdate]) -> JSON:
    note = ctx.resource
    payload = ctx.body.model_dump(exclude_unset=True) if ctx.body else {}
    reason = payload.pop("amendment_reason", None)
    if note["status"] == "entered-in-error":
        raise conflict("INVALID_TRANSITION", "This note was entered in error")
    if note["status"] == "preliminary":
        return await ctx.save(note_to_fhir(payload, ctx, note))
    if not reason:
        raise ApiError(422, "VALIDATION_ERROR", "A signed note changes only by amendment: "
                       "give an amendment_reason", field="amendment_reason")
    require_signer(ctx, note)
    amended = NOTE_STATUS.move(note_to_fhir(payload, ctx, note), "amended")
    now = now_instant()
    amended["attester"] = [*note.get("attester", []),
                           {"mode": "legal", "time": now, "party": author_reference(ctx)}]
    amended["date"] = now
    set_extension(amended, "amendment-reason", "valueString", reason)
    event = {**note_event(amended, ctx), "reason": reason}
    event["version"] = str(int(note.get("meta", {}).get("versionId", "0")) + 1)
    return await ctx.save(amended, event=AMENDED, payload=event)


__all__ = ["NOTE_STATUS", "NoteView", "narrative", "narrative_text", "note_to_fhir",
           "note_view", "notes", "router", "set_sections"]

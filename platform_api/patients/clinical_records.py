"""Patients area, clinical records: the record of a visit ⇄ FHIR Encounter, its notes in a
DocumentReference, who made each version in a Provenance.

Mapping (/api field → FHIR):
    id              → Encounter.id
    patient_id      → Encounter.subject (Patient/<id>, the patient's name as display)
    encounter_type  → Encounter.type[0].text, with the SNOMED CT coding of the known kinds
                      (``ENCOUNTER_TYPES``: consultation 11429006, follow-up 185389009,
                      emergency 50849002, inpatient 32485007, home visit 439708006,
                      telemedicine 448337001), and Encounter.class (v3-ActCode AMB, EMER,
                      IMP, HH, VR; AMB for a kind not in the table)
    chief_complaint → Encounter.reasonCode[0].text
    status          → Encounter.status (default finished; moves follow ``ENCOUNTER_STATUS``,
                      a refused move is 409 INVALID_TRANSITION)
    date            → Encounter.period.start (default: when it is recorded)
    recorded_by     → Encounter.participant[0]: type PPRF (primary performer), individual
                      the user (``urn:healthplatform:user`` identifier)
    notes           → a DocumentReference a FHIR client can read: status current, docStatus
                      final (amended once changed), type LOINC 11506-3 Progress note,
                      category clinical-note (US Core), subject, context.encounter → the
                      Encounter, date, author, content[0].attachment (text/plain, UTF-8,
                      the text base64-encoded)
    note_id         → DocumentReference.id
    version         → Encounter.meta.versionId; updated_at → Encounter.meta.lastUpdated

Every create, update and delete through /api writes, in one unit of work: the Encounter,
its DocumentReference, a Provenance naming the versions written (``target``
``Encounter/<id>/_history/<n>`` and the note's, ``agent.who`` the user, ``activity``
CREATE / UPDATE / DELETE), and the event ``platform.clinical.record_updated``
(``record_id``, ``patient_id``, ``change`` created | updated | deleted, ``version``,
``encounter_type``, ``status``, ``changed_by``, ``changed_at``).

``GET /api/clinical-records/:id/audit`` is the record's history, newest first: one entry
per unit of work that wrote it (the Encounter's and the note's versions written together
share their ``lastUpdated``), with who (the Provenance of those versions, whichever of
them it names: a change of the notes alone names only the note; none for a
version written through /fhir or HL7v2 without one), when, and what changed (the /api
fields, before and after), plus the AuditEvents naming the record (``entity``). Whoever
may read the record may read its trail: the Provenances and AuditEvents are read through
the policy's named elevation once the record was read as the caller.

Lists: ``GET /api/patients/:id/clinical-records`` (a patient's, newest visit first) and
``GET /api/clinical-records`` (the caller's own, see ``shared``; ``patient_id`` for a
patient's).
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from platform_api.envelope import PageEnvelope, Pagination, pagination
from platform_api.facade import (
    ApiContext,
    Facade,
    PatientScope,
    SearchParam,
    StatusTable,
    Write,
    api_context,
)
from platform_api.patients.shared import (
    JSON,
    LOINC,
    SNOMED,
    MineQuery,
    concept,
    concept_text,
    deep_copy,
    fhir_datetime,
    known_patient,
    local_id,
    mine,
    provenance,
    provenance_owners,
    source_service,
    subject_of,
    user_of,
    user_reference,
    version_of,
    versioned,
    without_meta,
)

TOPIC = "platform.clinical.record_updated"
ACT_CODE = "http://terminology.hl7.org/CodeSystem/v3-ActCode"
PARTICIPATION = "http://terminology.hl7.org/CodeSystem/v3-ParticipationType"
NOTE_CATEGORY = "http://hl7.org/fhir/us/core/CodeSystem/us-core-documentreference-category"
PROGRESS_NOTE = concept(LOINC, "11506-3", "Progress note")
# encounter_type (lower case) → (Encounter.class code, SNOMED CT code, display)
ENCOUNTER_TYPES: dict[str, tuple[str, str, str]] = {
    "consultation": ("AMB", "11429006", "Consultation"),
    "outpatient": ("AMB", "11429006", "Consultation"),
    "follow-up": ("AMB", "185389009", "Follow-up visit"),
    "emergency": ("EMER", "50849002", "Emergency room admission"),
    "inpatient": ("IMP", "32485007", "Hospital admission"),
    "admission": ("IMP", "32485007", "Hospital admission"),
    "home-visit": ("HH", "439708006", "Home visit"),
    "telemedicine": ("VR", "448337001", "Telemedicine consultation with patient"),
}
CLASS_DISPLAY = {"AMB": "ambulatory", "EMER": "emergency", "IMP": "inpatient encounter",
                 "HH": "home health", "VR": "virtual"}
ENCOUNTER_STATUS = StatusTable.of(
    planned=("arrived", "triaged", "in-progress", "cancelled", "entered-in-error"),
    arrived=("triaged", "in-progress", "cancelled", "entered-in-error"),
    triaged=("in-progress", "cancelled", "entered-in-error"),
    in_progress=("onleave", "finished", "cancelled", "entered-in-error"),
    onleave=("in-progress", "finished", "cancelled", "entered-in-error"),
    finished=("entered-in-error",),
    cancelled=("entered-in-error",),
    entered_in_error=(),
)
EncounterStatus = Annotated[str, Field(pattern="^(planned|arrived|triaged|in-progress|onleave|"
                                               "finished|cancelled|entered-in-error)$")]
FIELDS = ("encounter_type", "chief_complaint", "notes", "status", "date")
MAX_VERSIONS = 1000  # versions of one resource an audit trail reads


class ClinicalRecordCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    encounter_type: str = Field(min_length=1, max_length=100, examples=["consultation"])
    chief_complaint: str = Field(min_length=1, max_length=1000,
                                 examples=["Fever and headache for three days"])
    notes: str = Field(min_length=1, max_length=100_000,
                       examples=["Malaria RDT positive. Started artemether-lumefantrine."])
    status: EncounterStatus = "finished"
    date: datetime | None = Field(default=None, description="When the visit began (default: "
                                                            "now)")


class ClinicalRecordUpdate(BaseModel):
    encounter_type: str | None = Field(default=None, min_length=1, max_length=100)
    chief_complaint: str | None = Field(default=None, min_length=1, max_length=1000)
    notes: str | None = Field(default=None, min_length=1, max_length=100_000)
    status: EncounterStatus | None = None
    date: datetime | None = None


class ClinicalRecordView(BaseModel):
    id: str
    patient_id: str | None = None
    encounter_type: str | None = None
    chief_complaint: str | None = None
    notes: str | None = None
    status: str
    date: str | None = None
    recorded_by: str | None = None
    note_id: str | None = None
    version: str | None = None
    updated_at: str | None = None


class RecordQuery(MineQuery):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64, description="A patient's records (default: your own)")
    status: Annotated[EncounterStatus | None, SearchParam("status")] = None


class FieldChange(BaseModel):
    field: str
    old: Any = Field(default=None, alias="from")
    new: Any = Field(default=None, alias="to")


class AuditEntryView(BaseModel):
    at: str
    action: str = Field(description="created | updated | deleted, or the AuditEvent's action")
    source: str = Field(description="version (the record's history) | audit-event")
    version: str | None = Field(default=None, description="The Encounter version written")
    note_version: str | None = None
    by: str | None = Field(default=None, description="The user who made it, when known")
    by_display: str | None = None
    changes: list[FieldChange] = []
    description: str | None = None


# -- mapping ------------------------------------------------------------------------------------
def _type_of(encounter_type: str) -> tuple[JSON, JSON]:
    """(Encounter.class, Encounter.type[0]) of an /api encounter type."""
    known = ENCOUNTER_TYPES.get(encounter_type.strip().lower())
    class_code = known[0] if known else "AMB"
    kind: JSON = {"text": encounter_type}
    if known:
        kind = concept(SNOMED, known[1], known[2], encounter_type)
    return {"system": ACT_CODE, "code": class_code, "display": CLASS_DISPLAY[class_code]}, kind


def record_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    """The Encounter; on update only the fields sent change (status through the table)."""
    if existing is None:
        encounter: JSON = {
            "resourceType": "Encounter", "status": payload.get("status", "finished"),
            "subject": subject_of(payload),
            "period": {"start": fhir_datetime(payload.get("date") or now_instant())},
            "participant": [{"type": [concept(PARTICIPATION, "PPRF", "primary performer")],
                             "individual": user_reference(ctx.principal)}],
        }
    else:
        encounter = deep_copy(existing)
        if payload.get("status") and payload["status"] != encounter.get("status"):
            encounter = ENCOUNTER_STATUS.move(encounter, payload["status"])
        if payload.get("date"):
            encounter.setdefault("period", {})["start"] = fhir_datetime(payload["date"])
    if payload.get("encounter_type"):
        encounter["class"], kind = _type_of(payload["encounter_type"])
        encounter["type"] = [kind]
    if payload.get("chief_complaint"):
        encounter["reasonCode"] = [{"text": payload["chief_complaint"]}]
    return encounter


def note_to_fhir(encounter: JSON, text: str, ctx: ApiContext, existing: JSON | None) -> JSON:
    data = base64.b64encode(text.encode()).decode()
    attachment = {"contentType": "text/plain; charset=utf-8", "data": data,
                  "title": "Clinical notes"}
    if existing is not None:
        return {**deep_copy(existing), "docStatus": "amended", "date": now_instant(),
                "content": [{"attachment": attachment}]}
    return {
        "resourceType": "DocumentReference", "status": "current", "docStatus": "final",
        "type": PROGRESS_NOTE,
        "category": [concept(NOTE_CATEGORY, "clinical-note", "Clinical Note")],
        "subject": encounter["subject"], "date": now_instant(),
        "author": [user_reference(ctx.principal)],
        "content": [{"attachment": attachment}],
        "context": {"encounter": [{"reference": f"Encounter/{encounter['id']}"}]},
    }


def note_text(note: JSON | None) -> str | None:
    if note is None:
        return None
    attachment = ((note.get("content") or [{}])[0]).get("attachment") or {}
    if "data" not in attachment:
        return attachment.get("title")  # type: ignore[no-any-return]
    return base64.b64decode(attachment["data"]).decode(errors="replace")


def record_view(encounter: JSON, note: JSON | None) -> JSON:
    participant = (encounter.get("participant") or [{}])[0].get("individual")
    meta = encounter.get("meta") or {}
    return ClinicalRecordView(
        id=encounter["id"], patient_id=local_id(encounter.get("subject"), "Patient"),
        encounter_type=concept_text((encounter.get("type") or [None])[0]),
        chief_complaint=concept_text((encounter.get("reasonCode") or [None])[0]),
        notes=note_text(note), status=encounter["status"],
        date=(encounter.get("period") or {}).get("start"),
        recorded_by=user_of(participant) or (participant or {}).get("display"),
        note_id=note["id"] if note else None, version=meta.get("versionId"),
        updated_at=meta.get("lastUpdated"),
    ).model_dump()


def _encounter_of(note: JSON) -> str | None:
    refs = (note.get("context") or {}).get("encounter") or []
    return local_id(refs[0], "Encounter") if refs else None


async def notes_of(ctx: ApiContext, encounter_ids: list[str]) -> dict[str, JSON]:
    """The notes of these records (one search, as the caller), by Encounter id."""
    if not encounter_ids:
        return {}
    found = await ctx.fhir.search("DocumentReference", [
        ("encounter", ",".join(f"Encounter/{i}" for i in encounter_ids)),
        ("type", f"{LOINC}|11506-3")])
    return {encounter: note for note in found if (encounter := _encounter_of(note))}


async def record_views(ctx: ApiContext, encounters: list[JSON]) -> list[JSON]:
    notes = await notes_of(ctx, [e["id"] for e in encounters])
    return [record_view(e, notes.get(e["id"])) for e in encounters]


# -- what a write brings along ------------------------------------------------------------
async def _with_note(write: Write) -> JSON:
    """Stage the note, the Provenance of the versions written and the event."""
    ctx, unit, encounter, payload = write.ctx, write.unit, write.resource, write.payload
    targets: list[str] = []
    note = None if write.current is None else (
        await notes_of(ctx, [encounter["id"]])).get(encounter["id"])
    if write.change == "deleted":
        if note is not None:
            await unit.delete("DocumentReference", note["id"])
            targets.append(versioned(note, version_of(note) + 1))
    elif note is None and payload and payload.get("notes"):
        created = {**note_to_fhir(encounter, payload["notes"], ctx, None), "id": new_id()}
        await unit.create(created, resource_id=created["id"])
        targets.append(versioned(created, 1))
    elif note is not None and payload and payload.get("notes") \
            and payload["notes"] != note_text(note):
        await unit.update(note_to_fhir(encounter, payload["notes"], ctx, note))
        targets.append(versioned(note, version_of(note) + 1))
    encounter_changed = write.current is None or write.change == "deleted" \
        or without_meta(encounter) != without_meta(write.current)
    if encounter_changed:
        targets.insert(0, versioned(encounter, version_of(write.current or {}) + 1))
    if not targets:
        return encounter  # nothing changes: no version, no Provenance, no event
    when = now_instant()
    activity = {"created": "CREATE", "updated": "UPDATE", "deleted": "DELETE"}[write.change]
    await unit.create(provenance(targets, activity, ctx.principal, when,
                                 owners=provenance_owners(ctx, write.current or encounter)))
    unit.emit(TOPIC, {
        "record_id": encounter["id"], "patient_id": local_id(encounter.get("subject"),
                                                               "Patient"),
        "change": write.change, "version": str(version_of(write.current or {}) + 1),
        "encounter_type": concept_text((encounter.get("type") or [None])[0]),
        "status": encounter.get("status"), "changed_by": ctx.principal.user_id,
        "changed_at": when}, source_service=source_service("clinical_records"))
    return encounter


patient_records = Facade(
    resource="Encounter", name="Clinical record", create=ClinicalRecordCreate,
    view=ClinicalRecordView, to_fhir=record_to_fhir, from_fhir=lambda e: record_view(e, None),
    views=record_views, scope=PatientScope("subject"), sort="-date", tags=["clinical records"],
    summaries={"list": "A patient's clinical records, newest visit first"},
)
records = Facade(
    resource="Encounter", name="Clinical record", create=ClinicalRecordCreate,
    update=ClinicalRecordUpdate, view=ClinicalRecordView, query=RecordQuery,
    to_fhir=record_to_fhir, from_fhir=lambda e: record_view(e, None), views=record_views,
    prepare=known_patient, alongside=_with_note, statuses=ENCOUNTER_STATUS,
    list_criteria=mine("subject", "participant"), sort="-date", tags=["clinical records"],
    summaries={"create": "Record a visit (an Encounter with its notes in a DocumentReference)",
               "list": "Your clinical records (role=patient: about you; clinician: written "
                       "by you), or a patient's (patient_id)",
               "get": "A clinical record with its notes",
               "update": "Change a clinical record (only the fields sent change; a new "
                         "version, with its Provenance)",
               "delete": "Delete a clinical record and its notes (versioned tombstones)"},
)

router = APIRouter(tags=["clinical records"])
patient_records.mount(router, "/api/patients/{patient_id}/clinical-records", ops=("list",))
records.mount(router, "/api/clinical-records")


# -- the audit trail ---------------------------------------------------------------------------
async def _versions(ctx: ApiContext, resource_type: str, resource_id: str) -> list[JSON]:
    """Every stored version of a resource, oldest first (the record was read as the caller
    already)."""
    page = await ctx.services.store.history(resource_type, resource_id, count=MAX_VERSIONS)
    return [{"type": resource_type, "id": resource_id, "version": e.version,
             "at": e.last_updated, "deleted": e.deleted,
             "body": None if e.deleted else orjson.loads(e.body)}
            for e in reversed(page.entries)]


def _authors(provenances: list[JSON]) -> dict[str, JSON]:
    """Provenance by the version-specific reference of each of its targets."""
    found: dict[str, JSON] = {}
    for record in provenances:
        for target in record.get("target") or []:
            found[target.get("reference", "")] = record
    return found


def _changes(before: JSON | None, after: JSON | None) -> list[FieldChange]:
    if after is None:
        return []
    return [FieldChange.model_validate({"field": f, "from": (before or {}).get(f),
                                        "to": after.get(f)})
            for f in FIELDS if (before or {}).get(f) != after.get(f)]


def _version_entries(versions: list[JSON], authors: dict[str, JSON]) -> list[AuditEntryView]:
    """One entry per instant the record's resources were written at (a unit of work)."""
    entries: list[AuditEntryView] = []
    encounter: JSON | None = None
    note: JSON | None = None
    before: JSON | None = None
    for at in sorted({v["at"] for v in versions}):
        written = [v for v in versions if v["at"] == at]
        refs = []
        for v in written:
            if v["type"] == "Encounter":
                encounter = v["body"]
            else:
                note = v["body"]
            refs.append(f"{v['type']}/{v['id']}/_history/{v['version']}")
        enc = next((v for v in written if v["type"] == "Encounter"), None)
        doc = next((v for v in written if v["type"] == "DocumentReference"), None)
        after = record_view(encounter, note) if encounter is not None else None
        who = next((authors[r] for r in refs if r in authors), None)
        agent = ((who or {}).get("agent") or [{}])[0].get("who")
        action = "deleted" if enc is not None and enc["deleted"] else (
            "created" if before is None else "updated")
        entries.append(AuditEntryView(
            at=at, action=action, source="version",
            version=str(enc["version"]) if enc else None,
            note_version=str(doc["version"]) if doc else None,
            by=user_of(agent), by_display=(agent or {}).get("display"),
            changes=_changes(before, None if action == "deleted" else after)))
        before = after if action != "deleted" else None
    return entries


def _audit_entries(events: list[JSON]) -> list[AuditEntryView]:
    entries = []
    for event in events:
        agent = (event.get("agent") or [{}])[0].get("who")
        entries.append(AuditEntryView(
            at=event.get("recorded", ""), action=event.get("action", "E"),
            source="audit-event", by=user_of(agent), by_display=(agent or {}).get("display"),
            description=concept_text(event.get("type")) if not event.get("outcomeDesc")
            else event["outcomeDesc"]))
    return entries


@router.get("/api/clinical-records/{record_id}/audit",
            response_model=PageEnvelope[AuditEntryView],
            summary="A clinical record's audit trail: who changed what, when (newest first)")
async def record_audit(record_id: str, page: Pagination = Depends(pagination),
                       ctx: ApiContext = Depends(api_context)) -> Any:
    encounter = await records.load(ctx, record_id)  # 404 unknown, 403 not the caller's
    # Whoever may read the record reads its trail: its notes' and its own Provenances and
    # AuditEvents, which their role may not read otherwise.
    system = ctx.elevate("clinical record audit: read the record's Provenances, notes and "
                         "AuditEvents")
    note_ids = {n["id"] for n in await system.search("DocumentReference", [
        ("encounter", f"Encounter/{record_id}")])}
    provenances = await system.search("Provenance", [("target", f"Encounter/{record_id}")])
    note_ids |= {local_id(t, "DocumentReference") or "" for p in provenances
                 for t in p.get("target") or []} - {""}
    if note_ids:  # a change of the notes alone names only the note in its Provenance
        seen = {p["id"] for p in provenances}
        provenances += [p for p in await system.search("Provenance", [("target", ",".join(
            f"DocumentReference/{n}" for n in sorted(note_ids)))]) if p["id"] not in seen]
    versions = await _versions(ctx, "Encounter", encounter["id"])
    for note_id in sorted(note_ids):
        versions += await _versions(ctx, "DocumentReference", note_id)
    entries = _version_entries(versions, _authors(provenances))
    events = await system.search("AuditEvent", [("entity", f"Encounter/{record_id}")])
    merged = sorted([*entries, *_audit_entries(events)], key=lambda e: e.at, reverse=True)
    chosen = merged[page.offset:page.offset + page.limit]
    return page.respond([e.model_dump(by_alias=True) for e in chosen], len(merged))


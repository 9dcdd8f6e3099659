"""Patients area, data subject rights: erasure requests ⇄ FHIR Task, the erasure itself
(across current resources and their history) recorded by an AuditEvent, and the export of
the whole record (Patient/$everything).

**An erasure request** (``POST /api/patients/:id/erasure-request``, by the patient or a
platform administrator on their behalf) is a Task:

    code           → urn:healthplatform:task-code#erasure-request
    status         → requested → rejected, or accepted → completed (``ERASURE_STATUS``)
    for            → the Patient; requester → Patient/<id> (or the administrator)
    reason         → reasonCode.text; authoredOn, lastModified
    decided_by     → owner (the administrator who decided); decision_note →
                     statusReason.text
    erased, pseudonymized, audit_event_id → output[] (counts, the AuditEvent)

It belongs to no organization (the patient and platform administrators see it); a second
one while one is open is 409 ``ERASURE_PENDING``. ``GET /api/patients/:id/dsr`` lists the
patient's requests (the patient and platform administrators only).

**Deciding** (not in the spec; platform administrators): ``POST .../dsr/:id/reject``
(``{reason}``) or ``POST .../dsr/:id/approve``, which, in one unit of work, goes through
the patient's record (every resource of their compartment, the Patient itself, and the
Provenances naming any of them):

- what must legally stay (``RETAINED``: prescriptions and dispenses, immunizations,
  adverse events, detected issues, consents, financial records, audit events, tasks and
  Provenances of what stays) is **pseudonymized**: every free text but the kept elements
  (:mod:`.erasure_text`: narrative, notes, descriptions, instructions, string and
  markdown extensions, attachments' data and titles), the patient's name on references
  and a Provenance's link to the original message go; the Patient keeps only its id,
  gender, birth year, its managing organization and a random pseudonym identifier
  (inactive); consents in force end; then its **history is expunged**
  (``UnitOfWork.expunge``), as the earlier versions hold what was removed;
- everything else is **erased**: deleted (subscribers get the deleted event) and expunged
  with its whole history, as if never written; so are the original HL7v2 messages
  (Binary, the Provenances' source) about the patient, which hold their identity as sent,
  and the clinics' requests for the patient's consent (:mod:`.consent`);
- an AuditEvent records it (DCM 110110 Patient Record, action D, purposeOfEvent v3-ActReason
  PATRQT, the administrator as agent, the Patient and the Task as entities, the counts in
  ``outcomeDesc``); the Task completes; event ``platform.privacy.erasure_completed``.

The user account stays (it is not health data); the patient's link to the pseudonymized
record (their user identifier) goes with the rest.

**Export** (``GET /api/patients/:id/export``): the complete record as the caller may see it
(whoever may see the patient: the patient for portability, their clinicians for a
transfer of care), as a FHIR searchset Bundle of Patient/$everything (the Patient, its
compartment and what those reference, every page), or with ``?format=json`` in the /api
shapes of the area. Each export is recorded as an AuditEvent (DCM 110106 Export, action R).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from fhir_server.access import READ, may_touch_type
from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.ownership import owner_labels, with_owners
from fhir_server.search.plan import MAX_COUNT, Include, compartment
from fhir_server.service import MAX_SEARCH_RESULTS
from platform_api import labs
from platform_api.audit import DCM, ENTITY_TYPE, OBJECT_ROLE, ROLE_TYPE, SOURCE_TYPE
from platform_api.envelope import (
    ApiError,
    Envelope,
    conflict,
    created,
    ok,
)
from platform_api.facade import (
    ApiContext,
    Facade,
    ItemContext,
    PatientScope,
    StatusTable,
    api_context,
    require_patient,
    staged_body,
)
from platform_api.patients import (
    allergies,
    clinical_records,
    consent,
    eprescriptions,
    imaging,
    immunizations,
    journey,
    observations,
    prescriptions,
    profiles,
    vitals,
)
from platform_api.patients.allergies import AllergyView
from platform_api.patients.clinical_records import ClinicalRecordView
from platform_api.patients.consent import ConsentView
from platform_api.patients.eprescriptions import EPrescriptionView
from platform_api.patients.erasure_text import without_free_text
from platform_api.patients.imaging import ImagingOrderView
from platform_api.patients.immunizations import ImmunizationView
from platform_api.patients.journey import TimelineEntryView
from platform_api.patients.observations import ObservationView
from platform_api.patients.prescriptions import PrescriptionView
from platform_api.patients.profiles import PatientView
from platform_api.patients.shared import (
    JSON,
    TASK_CODES,
    coding,
    concept,
    local_id,
    source_service,
    user_of,
    user_reference,
)
from platform_api.patients.vitals import VitalsView

ERASURE = coding(TASK_CODES, "erasure-request", "Request to erase personal data")
PSEUDONYM_SYSTEM = "urn:healthplatform:pseudonym"
ACT_REASON = "http://terminology.hl7.org/CodeSystem/v3-ActReason"
ERASURE_STATUS = StatusTable.of(
    requested=("accepted", "rejected"),
    accepted=("completed",),
    completed=(),
    rejected=(),
)
OPEN = ("requested", "accepted")
# What must legally stay when a patient's data is erased, and why (pseudonymized, kept).
RETAINED: dict[str, str] = {
    "MedicationRequest": "prescriptions: medicines and pharmacy law",
    "MedicationDispense": "dispensing records: pharmacy law",
    "MedicationAdministration": "administration records: medicines law",
    "Immunization": "immunization registries: public health law",
    "AdverseEvent": "adverse event reporting: pharmacovigilance",
    "DetectedIssue": "prescribing decisions, kept with their prescriptions",
    "Consent": "proof of the consent given and withdrawn",
    "AuditEvent": "the security audit trail",
    "Provenance": "who wrote the records that are kept",
    "Task": "the record of requests, this one included",
    **dict.fromkeys(("Account", "ChargeItem", "Claim", "ClaimResponse", "Coverage",
                     "ExplanationOfBenefit", "Invoice", "PaymentNotice",
                     "PaymentReconciliation"), "financial records: tax law"),
}


class ErasureRequest(BaseModel):
    reason: str | None = Field(default=None, max_length=2000,
                               examples=["I am moving abroad and withdraw my consent"])


class DecisionRequest(BaseModel):
    reason: str | None = Field(default=None, max_length=2000)


class DataRequestView(BaseModel):
    id: str
    patient_id: str | None = None
    type: str = "erasure"
    status: str
    reason: str | None = None
    requested_by: str | None = None
    requested_at: str | None = None
    decided_by: str | None = None
    decision_note: str | None = None
    erased: int | None = None
    pseudonymized: int | None = None
    audit_event_id: str | None = None
    updated_at: str | None = None


class ExportView(BaseModel):
    patient: PatientView
    clinical_records: list[ClinicalRecordView] = []
    vitals: list[VitalsView] = []
    observations: list[ObservationView] = []
    prescriptions: list[PrescriptionView] = []
    eprescriptions: list[EPrescriptionView] = []
    immunizations: list[ImmunizationView] = []
    allergies: list[AllergyView] = []
    imaging_orders: list[ImagingOrderView] = []
    lab_orders: list[labs.LabOrderView] = []
    lab_results: list[labs.LabResultView] = []
    consents: list[ConsentView] = []
    journey_events: list[TimelineEntryView] = []


class BundleView(BaseModel):
    resourceType: Literal["Bundle"] = "Bundle"
    type: str
    timestamp: str | None = None
    total: int | None = None
    entry: list[dict[str, Any]] = []


# -- the request -------------------------------------------------------------------------------
def _output(task: JSON, name: str) -> Any:
    for out in task.get("output") or []:
        if (out.get("type") or {}).get("text") == name:
            return out.get("valueInteger", out.get("valueReference"))
    return None


def request_view(task: JSON) -> JSON:
    requester = task.get("requester") or {}
    audit = _output(task, "audit-event")
    return DataRequestView(
        id=task["id"], patient_id=local_id(task.get("for"), "Patient"), status=task["status"],
        reason=((task.get("reasonCode") or {}).get("text")),
        requested_by=user_of(requester) or local_id(requester, "Patient"),
        requested_at=task.get("authoredOn"), decided_by=user_of(task.get("owner")),
        decision_note=(task.get("statusReason") or {}).get("text"),
        erased=_output(task, "erased"), pseudonymized=_output(task, "pseudonymized"),
        audit_event_id=local_id(audit, "AuditEvent") if isinstance(audit, dict) else None,
        updated_at=(task.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


async def _only_self_or_admin(ctx: ApiContext, query: Any) -> list[tuple[str, str]]:
    ctx.authorize("patient.data-rights", patient_id=ctx.path["patient_id"])
    return []



requests = Facade(
    resource="Task", name="Data subject request", create=ErasureRequest,
    view=DataRequestView, from_fhir=request_view,
    scope=PatientScope("patient"), fixed=[("code", f"{TASK_CODES}|erasure-request")],
    statuses=ERASURE_STATUS, list_criteria=_only_self_or_admin, sort="-authored-on",
    tags=["data subject rights"],
    summaries={"list": "A patient's data subject requests and their state (the patient and "
                       "platform administrators)"},
)

router = APIRouter(tags=["data subject rights"])
requests.mount(router, "/api/patients/{patient_id}/dsr", ops=("list",))


@router.post("/api/patients/{patient_id}/erasure-request", status_code=201,
             response_model=Envelope[DataRequestView],
             summary="Ask for the patient's data to be erased (reviewed by an administrator)")
async def request_erasure(patient_id: str, body: ErasureRequest | None = None,
                          ctx: ApiContext = Depends(api_context)) -> Any:
    await require_patient(ctx, patient_id)
    ctx.authorize("patient.data-rights", patient_id=patient_id)
    when = now_instant()
    by_patient = ctx.access.subject.patient_id == patient_id
    task: JSON = {
        "resourceType": "Task", "status": "requested", "intent": "order",
        "code": {"coding": [ERASURE]}, "for": {"reference": f"Patient/{patient_id}"},
        "authoredOn": when, "lastModified": when,
        "requester": {"reference": f"Patient/{patient_id}"} if by_patient
        else user_reference(ctx.principal),
        "businessStatus": {"text": "awaiting review"},
    }
    if body and body.reason:
        task["reasonCode"] = {"text": body.reason}
    # A patient reads Tasks of their record but writes none: the platform records it.
    unit = ctx.elevate("erasure request: record the patient's request as a Task").unit()
    async with unit:
        staged = await unit.create(task, ownerless=True, if_none_exist=[
            ("patient", f"Patient/{patient_id}"), ("code", f"{TASK_CODES}|erasure-request"),
            ("status", ",".join(OPEN))])
        unit.after_writes(lambda staging: None if staged.existing else staging.emit(
            "platform.privacy.erasure_requested",
            {"request_id": staged.id, "patient_id": patient_id,
             "requested_by": ctx.principal.user_id}, source_service=source_service(
                "data_rights")))
        await unit.commit()
    if staged.existing:
        raise conflict("ERASURE_PENDING", "An erasure request of this patient is already "
                       "waiting for review")
    return created(request_view(staged_body(staged)))


@requests.route("POST", "/{resource_id}/reject", body=DecisionRequest,
                summary="Refuse an erasure request, with the reason (platform administrators)")
async def reject(ctx: ItemContext[DecisionRequest]) -> JSON:
    ctx.authorize("patient.erasure.decide")
    when = now_instant()
    rejected = {**ERASURE_STATUS.move(ctx.resource, "rejected"), "lastModified": when,
                "owner": user_reference(ctx.principal),
                "businessStatus": {"text": "rejected"}}
    if ctx.body and ctx.body.reason:
        rejected["statusReason"] = {"text": ctx.body.reason}
    return await ctx.save(rejected, event="platform.privacy.erasure_rejected", payload={
        "request_id": ctx.id, "patient_id": ctx.path["patient_id"],
        "decided_by": ctx.principal.user_id})


# -- the erasure ----------------------------------------------------------------------------
async def record_of(fhir: CallerFhir, patient_id: str, *, includes: bool = False
                    ) -> list[JSON]:
    """The Patient and everything in its compartment that ``fhir``'s caller may see (with
    ``includes``, what those reference too: Patient/$everything), every page."""
    service = fhir.service
    registry = await service.refresh_registry()
    types = sorted({"Patient", *registry.compartment_types("Patient")})
    types = [t for t in types if may_touch_type(fhir.access, READ, t)]
    plan = await fhir.parse(types, [], strict=True)
    plan.compartment = compartment(registry, "Patient", patient_id, types, include_owner=True)
    if includes:
        plan.includes = [Include(t, "*") for t in types]
    plan.count = MAX_COUNT
    found: list[JSON] = []
    while True:
        page = await fhir.search_page(plan)
        found += [orjson.loads(s.body) for s in page.resources]
        found += [{**orjson.loads(s.body), "_included": True} for s in page.included]
        if len(found) > MAX_SEARCH_RESULTS:
            raise ApiError(422, "EXPORT_TOO_LARGE", "This record is too large to gather in "
                           "one answer; page through /fhir/Patient/{id}/$everything")
        if page.next is None:
            return found
        plan.cursor = page.next


async def provenances_of(fhir: CallerFhir, resources: list[JSON]) -> list[JSON]:
    """The Provenances whose targets are any of ``resources`` (in chunks of references)."""
    refs = [f"{r['resourceType']}/{r['id']}" for r in resources
            if r["resourceType"] != "Provenance"]
    found: dict[str, JSON] = {}
    for start in range(0, len(refs), 100):
        for record in await fhir.search("Provenance", [("target",
                                                        ",".join(refs[start:start + 100]))]):
            found[record["id"]] = record
    return list(found.values())


async def source_messages(fhir: CallerFhir, provenances: list[JSON], patient_id: str
                          ) -> list[JSON]:
    """The original messages (HL7v2 Binaries, the Provenances' ``source`` entities) that
    are about this patient: they hold the patient's identity as sent."""
    found: dict[str, JSON] = {}
    for record in provenances:
        for entity in record.get("entity") or []:
            binary_id = local_id(entity.get("what"), "Binary")
            if binary_id is None or binary_id in found:
                continue
            binary = await fhir.find_json("Binary", binary_id)
            context = local_id((binary or {}).get("securityContext"), "Patient")
            if binary is not None and context in (None, patient_id):
                found[binary_id] = binary
    return list(found.values())


def _targets(provenance: JSON) -> set[tuple[str, str]]:
    found = set()
    for target in provenance.get("target") or []:
        kind = (target.get("reference") or "").split("/")[0]
        if (target_id := local_id(target, kind)) is not None:
            found.add((kind, target_id))
    return found


def _without_patient_names(value: Any, patient_ref: str) -> Any:
    if isinstance(value, dict):
        cleaned = {k: _without_patient_names(v, patient_ref) for k, v in value.items()}
        if cleaned.get("reference") == patient_ref:
            cleaned.pop("display", None)
        return cleaned
    if isinstance(value, list):
        return [_without_patient_names(v, patient_ref) for v in value]
    return value


def pseudonymized(resource: JSON, patient_id: str, when: str) -> JSON:
    """A kept resource without what identifies the patient (see the module docstring)."""
    if resource["resourceType"] == "Patient":
        kept: JSON = {"resourceType": "Patient", "id": resource["id"], "active": False,
                      "identifier": [{"system": PSEUDONYM_SYSTEM, "value": str(uuid.uuid4())}]}
        for element in ("gender", "managingOrganization"):
            if element in resource:
                kept[element] = resource[element]
        if resource.get("birthDate"):
            kept["birthDate"] = resource["birthDate"][:4]
        return with_owners(kept, owner_labels(resource))
    changed = _without_patient_names(without_free_text(resource), f"Patient/{patient_id}")
    if changed["resourceType"] == "Provenance" and changed.get("entity"):
        # the original messages it names are erased
        changed["entity"] = [e for e in changed["entity"]
                             if local_id(e.get("what"), "Binary") is None]
        if not changed["entity"]:
            del changed["entity"]
    if changed["resourceType"] == "Consent" and changed.get("status") in ("active",
                                                                          "proposed"):
        changed["status"] = "inactive" if changed["status"] == "active" else "rejected"
        provision = changed.setdefault("provision", {})
        provision["period"] = {**provision.get("period", {}), "end": when}
    return changed  # type: ignore[no-any-return]


def audit_record(ctx: ApiContext, kind: tuple[str, str], action: str, summary: str,
                 patient_id: str, when: str, *entities: JSON) -> JSON:
    """An AuditEvent of what an administrator or a reader did to a patient's record (DICOM
    event ``kind``, the user as agent, the Patient and ``entities`` as entities)."""
    return {
        "resourceType": "AuditEvent", "type": coding(DCM, *kind), "action": action,
        "recorded": when, "outcome": "0", "outcomeDesc": summary,
        "agent": [{"type": concept(ROLE_TYPE, "humanuser", "human user"),
                   "who": user_reference(ctx.principal), "requestor": True}],
        "source": {"observer": {"display": "healthplatform"},
                   "type": [coding(SOURCE_TYPE, "4", "Application Server")]},
        "entity": [{"what": {"reference": f"Patient/{patient_id}"},
                    "type": coding(ENTITY_TYPE, "1", "Person"),
                    "role": coding(OBJECT_ROLE, "1", "Patient")}, *entities],
    }


def _erasure_audit(ctx: ApiContext, patient_id: str, task: JSON, summary: str, when: str
                   ) -> JSON:
    event = audit_record(ctx, ("110110", "Patient Record"), "D", summary, patient_id, when, {
        "what": {"reference": f"Task/{task['id']}"},
        "type": coding(ENTITY_TYPE, "2", "System Object"),
        "role": coding(OBJECT_ROLE, "20", "Job"), "description": "erasure request"})
    event["subtype"] = [coding("http://hl7.org/fhir/restful-interaction", "delete", "delete")]
    event["purposeOfEvent"] = [concept(ACT_REASON, "PATRQT", "patient requested")]
    return event


def _summary(erased: dict[str, int], kept: dict[str, int]) -> str:
    def listed(counts: dict[str, int]) -> str:
        return ", ".join(f"{n} {t}" for t, n in sorted(counts.items())) or "nothing"
    reasons = "; ".join(sorted({f"{t}: {RETAINED[t]}" for t in kept if t in RETAINED}))
    return (f"Erased {listed(erased)}. Pseudonymized and kept {listed(kept)}"
            + (f" ({reasons})." if reasons else "."))


@requests.route("POST", "/{resource_id}/approve", body=DecisionRequest,
                summary="Approve an erasure request and erase the patient's data "
                        "(platform administrators)")
async def approve(ctx: ItemContext[DecisionRequest]) -> JSON:
    task, patient_id = ctx.resource, ctx.path["patient_id"]
    ctx.authorize("patient.erasure.decide")
    ERASURE_STATUS.check(task["status"], "accepted")
    # As the platform, not as the administrator: the erasure reads and rewrites every
    # record of the patient, and the audit trail must not note those reads afresh (its
    # events would name what was just erased); its own AuditEvent records it instead.
    system = ctx.elevate("erasure: erase and pseudonymize the patient's record and its "
                         "history")
    record = [r for r in await record_of(system, patient_id) if r["id"] != task["id"]
              or r["resourceType"] != "Task"]
    record += [p for p in await provenances_of(system, record)
               if p["id"] not in {r["id"] for r in record if r["resourceType"] == "Provenance"}]
    record += await source_messages(system, [r for r in record
                                             if r["resourceType"] == "Provenance"], patient_id)
    kept_ids = {(r["resourceType"], r["id"]) for r in record
                if r["resourceType"] in RETAINED or r["resourceType"] == "Patient"}
    for resource in record:  # a Provenance of nothing kept goes with what it names
        if resource["resourceType"] == "Provenance" and not _targets(resource) & kept_ids:
            kept_ids.discard(("Provenance", resource["id"]))
    when = now_instant()
    erased: dict[str, int] = {}
    kept: dict[str, int] = {}
    users = [i["value"] for r in record if r["resourceType"] == "Patient"
             for i in r.get("identifier") or [] if i.get("system") == profiles.USER_SYSTEM]
    asked = await ctx.services.store.find_documents(
        consent.REQUESTS, {"patient_id": patient_id}, limit=MAX_SEARCH_RESULTS)
    unit = system.unit()
    async with unit:
        for request in asked:  # clinics' requests for consent name the patient too
            consent.forget_request(unit, request)
        if asked:
            erased["consent request"] = len(asked)
        for resource in record:
            kind, rid = resource["resourceType"], resource["id"]
            if (kind, rid) in kept_ids:
                changed = pseudonymized(resource, patient_id, when)
                if changed != resource:
                    await unit.update(changed)
                unit.expunge(kind, rid, history_only=True)
                kept[kind] = kept.get(kind, 0) + 1
            else:
                await unit.delete(kind, rid)
                unit.expunge(kind, rid)
                erased[kind] = erased.get(kind, 0) + 1
        summary = _summary(erased, kept)
        audit = await unit.create(_erasure_audit(ctx, patient_id, task, summary, when))
        done = {**ERASURE_STATUS.move(ERASURE_STATUS.move(task, "accepted"), "completed"),
                "lastModified": when, "owner": user_reference(ctx.principal),
                "businessStatus": {"text": "erased"},
                "executionPeriod": {"start": when, "end": when},
                "output": [
                    {"type": {"text": "erased"}, "valueInteger": sum(erased.values())},
                    {"type": {"text": "pseudonymized"}, "valueInteger": sum(kept.values())},
                    {"type": {"text": "audit-event"},
                     "valueReference": {"reference": f"AuditEvent/{audit.id}"}}]}
        if ctx.body and ctx.body.reason:
            done["statusReason"] = {"text": ctx.body.reason}
        staged = await unit.update(done, if_match=int(task["meta"]["versionId"]))
        unit.emit("platform.privacy.erasure_completed", {
            "request_id": task["id"], "patient_id": patient_id,
            "erased": sum(erased.values()), "pseudonymized": sum(kept.values()),
            "approved_by": ctx.principal.user_id, "audit_event_id": audit.id},
            source_service=source_service("data_rights"))
        await unit.commit()
    for user_id in users:  # their own record is no longer theirs
        ctx.services.policy.membership_changed(user_id)
    return staged_body(staged)


# -- export ------------------------------------------------------------------------------------
def _export_audit(ctx: ApiContext, patient_id: str, count: int, when: str) -> JSON:
    return audit_record(ctx, ("110106", "Export"), "R",
                        f"Exported {count} resources of the patient's record", patient_id,
                        when)


def _codes(concepts: Any) -> set[str]:
    concepts = concepts if isinstance(concepts, list) else [concepts or {}]
    return {c.get("code") for concept_ in concepts for c in (concept_ or {}).get("coding") or []}


def export_views(resources: list[JSON]) -> JSON:
    """The record in the /api shapes of the area, from the resources of the export."""
    by_type: dict[str, list[JSON]] = {}
    for resource in resources:
        by_type.setdefault(resource["resourceType"], []).append(resource)
    by_id = {(r["resourceType"], r["id"]): r for r in resources}
    notes = {enc: doc for doc in by_type.get("DocumentReference", [])
             if (enc := clinical_records._encounter_of(doc))}
    issues: dict[str, list[JSON]] = {}
    for issue in by_type.get("DetectedIssue", []):
        for ref in issue.get("implicated") or []:
            if (mr := local_id(ref, "MedicationRequest")) is not None:
                issues.setdefault(mr, []).append(issue)
    observations_ = by_type.get("Observation", [])
    panels = [o for o in observations_ if vitals.PANEL[0] in _codes(o.get("code"))]
    members = {i for p in panels for i in vitals._member_ids(p)}
    journey_codes = {journey.JOURNEY.rsplit("|", 1)[1]}
    orders = by_type.get("ServiceRequest", [])
    tasks = by_type.get("Task", [])
    patient = next(p for p in by_type.get("Patient", []) if not p.get("_included"))
    return {
        "patient": profiles.patient_from_fhir(patient),
        "clinical_records": [clinical_records.record_view(e, notes.get(e["id"]))
                             for e in by_type.get("Encounter", [])],
        "vitals": [vitals.vitals_view(p, [by_id[("Observation", i)]
                                          for i in vitals._member_ids(p)
                                          if ("Observation", i) in by_id]) for p in panels],
        "observations": [observations.observation_view(o) for o in observations_
                         if o not in panels and o["id"] not in members
                         and not journey_codes & _codes(o.get("category"))],
        "journey_events": [journey.journey_event_view(o) for o in observations_
                           if journey_codes & _codes(o.get("category"))],
        "prescriptions": [prescriptions.prescription_view(r, issues.get(r["id"]))
                          for r in by_type.get("MedicationRequest", [])],
        "eprescriptions": [eprescriptions.eprescription_view(t) for t in tasks
                           if "fulfill" in _codes(t.get("code"))],
        "immunizations": [immunizations.immunization_view(i)
                          for i in by_type.get("Immunization", [])],
        "allergies": [allergies.allergy_view(a) for a in by_type.get("AllergyIntolerance", [])],
        "imaging_orders": [imaging.imaging_view(o) for o in orders
                           if imaging.IMAGING[0] in _codes(o.get("category"))],
        "lab_orders": [labs.order_view(o) for o in orders
                       if "108252007" in _codes(o.get("category"))],
        "lab_results": [labs.lab_result_view(r, {i: o for (t, i), o in by_id.items()
                                                 if t == "Observation"}, None)
                        for r in by_type.get("DiagnosticReport", [])],
        "consents": [consent.consent_view(c) for c in by_type.get("Consent", [])],
    }


@router.get("/api/patients/{patient_id}/export",
            response_model=Envelope[BundleView | ExportView],
            summary="Export the patient's record: a FHIR Bundle (Patient/$everything), or "
                    "with format=json the /api shapes")
async def export(patient_id: str,
                 format: Literal["fhir", "json"] = Query(
                     "fhir", description="fhir: a FHIR Bundle; json: the /api shapes"),
                 ctx: ApiContext = Depends(api_context)) -> Any:
    await require_patient(ctx, patient_id)
    found = await record_of(ctx.fhir, patient_id, includes=True)
    when = now_instant()
    # The reader may read the record, not write the audit trail: the platform records it.
    unit = ctx.elevate("export: record the export of the patient's record as an "
                       "AuditEvent").unit()
    async with unit:
        await unit.create(_export_audit(ctx, patient_id, len(found), when))
        await unit.commit()
    if format == "json":
        return ok(export_views(found))
    base = str(ctx.request.base_url).rstrip("/") + "/fhir"
    entries = [{"fullUrl": f"{base}/{r['resourceType']}/{r['id']}",
                "resource": {k: v for k, v in r.items() if k != "_included"},
                "search": {"mode": "include" if r.get("_included") else "match"}}
               for r in found]
    matches = sum(1 for r in found if not r.get("_included"))
    return ok({"resourceType": "Bundle", "type": "searchset", "timestamp": when,
               "total": matches, "entry": entries})

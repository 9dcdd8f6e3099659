"""Clinicians' orders and results: service requests (FHIR ServiceRequest), diagnostic
reports (FHIR DiagnosticReport) and imaging studies (FHIR ImagingStudy).

Service request (/api → ServiceRequest, intent order):
    patient_id → subject; category → category (SNOMED CT: laboratory 108252007, imaging
    363679005, procedure 387713003, referral 3457005, counselling 409063005, education
    409073007); code, system, display → code; priority → priority; reason →
    reasonCode[0].text; notes → note[0]; occurrence → occurrenceDateTime; encounter_id →
    encounter; (caller) → requester (their Practitioner when they have one, and their
    user identifier); authored_at → authoredOn. Status moves (``PUT …/status``): draft →
    active | revoked; active → on-hold | completed | revoked; on-hold → active |
    revoked; every state but entered-in-error → entered-in-error. A reason given with a
    move is kept as a note.

Diagnostic report (/api → DiagnosticReport):
    patient_id → subject; code (LOINC by default) → code; category (v2-0074: LAB, RAD,
    SP pathology, EC cardiology, OTH) → category; status → status (registered, partial
    or preliminary while it is written); conclusion → conclusion; conclusion_codes
    (SNOMED CT) → conclusionCode; result_ids → result (Observations of the same
    patient); service_request_ids → basedOn; imaging_study_ids → imagingStudy;
    effective_at → effectiveDateTime; encounter_id → encounter.
    ``POST …/sign`` makes it ``final``: ``issued`` is the signing instant and the signer
    joins ``resultsInterpreter``; only a doctor or a lab member (``ORG:DOCTOR``,
    ``ORG:LAB``) of an organization that owns the report signs (403 otherwise: the
    policy's ``diagnostic-report.sign``), and a report already signed can only be amended
    or corrected (409 ``INVALID_TRANSITION``).

Imaging study (/api → ImagingStudy):
    patient_id → subject; modality (DICOM: CR, CT, DX, MG, MR, NM, PT, RF, US, XA, OT) →
    modality; description → description; study_uid → identifier (``urn:dicom:uid``,
    ``urn:oid:<uid>``; a 2.25 UUID-derived UID when absent); started_at → started;
    service_request_id → basedOn; number_of_series / number_of_instances → the counts;
    notes → note. Status moves (``PUT …/status``): registered → available | cancelled |
    entered-in-error; available → entered-in-error. (Its list has no modality filter:
    R4's ``modality`` search parameter reads the series' modality, which a study
    registered before its images arrive does not have yet.)

Lists are one search over what the caller may see (their organizations' records, the
patients who consented, their own record), filtered by patient, status, category,
``mine`` (ordered or requested by the caller). Writes go through the access policy: a
clinician of the patient's organization (the record is owned by it).

Events: ``platform.doctors.service_request_created`` / ``…_status_changed``,
``…diagnostic_report_created`` / ``…diagnostic_report_signed``,
``…imaging_study_created`` / ``…imaging_study_status_changed`` (the /api view).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter
from pydantic import AwareDatetime, BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ownership import owner_labels
from platform_api.envelope import ApiError
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    ItemContext,
    ListCriteria,
    SearchParam,
    StatusTable,
    require_patient,
    visible_patient,
)
from platform_api.fhir_values import (
    coding,
    concept,
    concept_text,
    local_id,
    reference,
    referenced_user,
    user_reference,
)
from platform_api.policy.subject import USER_SYSTEM

JSON = dict[str, Any]
SNOMED = "http://snomed.info/sct"
LOINC = "http://loinc.org"
DICOM = "http://dicom.nema.org/resources/ontology/DCM"
V2_0074 = "http://terminology.hl7.org/CodeSystem/v2-0074"
SERVICE_CATEGORIES = {"laboratory": ("108252007", "Laboratory procedure"),
                      "imaging": ("363679005", "Imaging"),
                      "procedure": ("387713003", "Surgical procedure"),
                      "referral": ("3457005", "Patient referral"),
                      "counselling": ("409063005", "Counseling"),
                      "education": ("409073007", "Education")}
REPORT_CATEGORIES = {"laboratory": ("LAB", "Laboratory"), "radiology": ("RAD", "Radiology"),
                     "pathology": ("SP", "Surgical Pathology"),
                     "cardiology": ("EC", "Electrocardiac"), "other": ("OTH", "Other")}
MODALITIES = {"CR": "Computed Radiography", "CT": "Computed Tomography",
              "DX": "Digital Radiography", "MG": "Mammography", "MR": "Magnetic Resonance",
              "NM": "Nuclear Medicine", "PT": "Positron emission tomography",
              "RF": "Radio Fluoroscopy", "US": "Ultrasound", "XA": "X-Ray Angiography",
              "OT": "Other"}
ServiceCategory = Literal["laboratory", "imaging", "procedure", "referral", "counselling",
                          "education"]
ReportCategory = Literal["laboratory", "radiology", "pathology", "cardiology", "other"]
Modality = Literal["CR", "CT", "DX", "MG", "MR", "NM", "PT", "RF", "US", "XA", "OT"]
Priority = Literal["routine", "urgent", "asap", "stat"]
SERVICE_REQUEST_STATUS = StatusTable.of(
    draft=("active", "revoked", "entered-in-error"),
    active=("on-hold", "completed", "revoked", "entered-in-error"),
    on_hold=("active", "revoked", "entered-in-error"),
    completed=("entered-in-error",), revoked=("entered-in-error",), entered_in_error=())
REPORT_STATUS = StatusTable.of(
    registered=("partial", "preliminary", "final", "cancelled", "entered-in-error"),
    partial=("preliminary", "final", "cancelled", "entered-in-error"),
    preliminary=("final", "cancelled", "entered-in-error"),
    final=("amended", "corrected", "appended", "entered-in-error"),
    amended=("amended", "corrected", "appended", "entered-in-error"),
    corrected=("amended", "corrected", "appended", "entered-in-error"),
    appended=("amended", "corrected", "appended", "entered-in-error"),
    cancelled=(), entered_in_error=())
IMAGING_STATUS = StatusTable.of(
    registered=("available", "cancelled", "entered-in-error"),
    available=("entered-in-error",), cancelled=(), entered_in_error=())


# -- shared ---------------------------------------------------------------------------------------
class Code(BaseModel):
    code: str | None = Field(default=None, max_length=64, examples=["58410-2"])
    system: str | None = Field(default=None, max_length=200, examples=[LOINC])
    display: str = Field(min_length=1, max_length=300,
                         examples=["CBC panel - Blood by Automated count"])


class CodeView(BaseModel):
    code: str | None = None
    system: str | None = None
    display: str | None = None


class PersonRef(BaseModel):
    user_id: str | None = None
    practitioner_id: str | None = None
    name: str | None = None


def _code_view(value: JSON | None) -> JSON:
    first = coding(value)
    return {"code": first.get("code"), "system": first.get("system"),
            "display": concept_text(value)}


def _person(value: JSON | None) -> JSON:
    return {"user_id": referenced_user(value), "name": (value or {}).get("display"),
            "practitioner_id": local_id(value, "Practitioner")}


def _me(ctx: ApiContext) -> JSON:
    practitioners = ctx.access.subject.practitioner_ids
    return user_reference(ctx.principal, min(practitioners) if practitioners else None)


def _copy(resource: JSON | None, base: JSON) -> JSON:
    return orjson.loads(orjson.dumps(resource)) if resource else dict(base)  # type: ignore[no-any-return]


def _instant(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def _with_note(resource: JSON, text: str, ctx: ItemContext[Any]) -> JSON:
    return {**resource, "note": [*resource.get("note", []), {
        "text": text, "time": now_instant(),
        "authorReference": _me(ctx)}]}


def _reason_noted(resource: JSON, ctx: ItemContext[Any]) -> JSON:
    """The resource moved, with the reason given for the move as a note."""
    reason = getattr(ctx.body, "reason", None)
    return _with_note(resource, f"Status {resource['status']}: {reason}", ctx) if reason \
        else resource


class Mine(BaseModel):
    mine: bool = Field(False, description="Only what the caller ordered or requested")


def _list_filters(person: str, category_system: str,
                  categories: Mapping[str, tuple[str, str]]) -> ListCriteria:
    """List criteria from a query's ``mine`` (the caller's user identifier on the
    ``person`` reference) and ``category`` (its code in ``category_system``)."""
    def criteria(ctx: ApiContext, query: Any) -> list[tuple[str, str]]:
        found = []
        if getattr(query, "mine", False):
            found.append((f"{person}:identifier", f"{USER_SYSTEM}|{ctx.principal.user_id}"))
        if (category := getattr(query, "category", None)) is not None:
            found.append(("category", f"{category_system}|{categories[category][0]}"))
        return found
    return criteria


async def _check_refs(ctx: ApiContext, resource_type: str, ids: Sequence[str],
                      patient_id: str, field: str) -> None:
    """422 naming ``field`` unless every id is a visible ``resource_type`` about the
    patient (one search)."""
    if not ids:
        return
    found = await ctx.fhir.match_ids(resource_type, [
        ("_id", ",".join(ids)), ("subject", f"Patient/{patient_id}")], limit=len(ids) + 1)
    missing = sorted(set(ids) - set(found))
    if missing:
        raise ApiError(422, "VALIDATION_ERROR", f"{field}: no {resource_type} "
                       f"{', '.join(missing)} for this patient", field=field)


class StatusChange(BaseModel):
    reason: str | None = Field(default=None, max_length=1000)


# -- service requests -------------------------------------------------------------------------
class ServiceRequestCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    category: ServiceCategory = Field(examples=["laboratory"])
    code: Code
    priority: Priority = "routine"
    status: Literal["draft", "active"] = "active"
    reason: str | None = Field(default=None, max_length=1000,
                               examples=["Fever for 3 days, suspected malaria"])
    notes: str | None = Field(default=None, max_length=2000)
    occurrence: AwareDatetime | None = None
    encounter_id: str | None = Field(default=None, max_length=64)


class ServiceRequestView(BaseModel):
    id: str
    patient_id: str | None
    category: str | None
    code: CodeView
    priority: str | None
    status: str
    reason: str | None = None
    notes: list[str] = []
    occurrence: str | None = None
    encounter_id: str | None = None
    requester: PersonRef
    authored_at: str | None = None
    updated_at: str | None = None


class ServiceRequestQuery(Mine):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64)
    status: Annotated[Literal["draft", "active", "on-hold", "completed", "revoked",
                              "entered-in-error"] | None, SearchParam("status")] = None
    category: ServiceCategory | None = None


class ServiceRequestStatus(StatusChange):
    status: Literal["draft", "active", "on-hold", "completed", "revoked", "entered-in-error"]


def service_request_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    code, display = SERVICE_CATEGORIES[payload["category"]]
    request: JSON = {
        "resourceType": "ServiceRequest", "status": payload.get("status", "active"),
        "intent": "order", "category": [concept(code, SNOMED, display)],
        "code": concept(payload["code"].get("code"), payload["code"].get("system"),
                        payload["code"]["display"], payload["code"]["display"]),
        "priority": payload.get("priority", "routine"),
        "subject": reference("Patient", payload["patient_id"]), "authoredOn": now_instant(),
        "requester": _me(ctx)}
    if payload.get("reason"):
        request["reasonCode"] = [{"text": payload["reason"]}]
    if payload.get("notes"):
        request["note"] = [{"text": payload["notes"]}]
    if payload.get("occurrence"):
        request["occurrenceDateTime"] = _instant(payload["occurrence"])
    if payload.get("encounter_id"):
        request["encounter"] = reference("Encounter", payload["encounter_id"])
    return request


def service_request_view(request: JSON) -> JSON:
    category = coding((request.get("category") or [None])[0]).get("code")
    return ServiceRequestView.model_validate({
        "id": request["id"], "patient_id": local_id(request.get("subject"), "Patient"),
        "category": next((k for k, (c, _) in SERVICE_CATEGORIES.items() if c == category),
                         category),
        "code": _code_view(request.get("code")), "priority": request.get("priority"),
        "status": request["status"],
        "reason": ((request.get("reasonCode") or [{}])[0]).get("text"),
        "notes": [n.get("text", "") for n in request.get("note", [])],
        "occurrence": request.get("occurrenceDateTime"),
        "encounter_id": local_id(request.get("encounter"), "Encounter"),
        "requester": _person(request.get("requester")),
        "authored_at": request.get("authoredOn"),
        "updated_at": (request.get("meta") or {}).get("lastUpdated")}).model_dump()


service_requests = Facade(
    resource="ServiceRequest", name="Service request", create=ServiceRequestCreate,
    view=ServiceRequestView, query=ServiceRequestQuery, to_fhir=service_request_to_fhir,
    from_fhir=service_request_view, statuses=SERVICE_REQUEST_STATUS,
    prepare=visible_patient, sort="-authored",
    list_criteria=_list_filters("requester", SNOMED, SERVICE_CATEGORIES),
    events=Events(created="platform.doctors.service_request_created"), tags=["doctors"],
    summaries={"list": "Service requests the caller may see (patient, status, category, "
                       "mine)",
               "create": "Order a service: a lab test, imaging, a procedure, a referral"},
)


# -- diagnostic reports -------------------------------------------------------------------------
class DiagnosticReportCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    code: Code
    category: ReportCategory = "laboratory"
    status: Literal["registered", "partial", "preliminary"] = "preliminary"
    conclusion: str | None = Field(default=None, max_length=10_000,
                                   examples=["Plasmodium falciparum seen, 2% parasitaemia"])
    conclusion_codes: list[Annotated[str, Field(pattern=r"^\d{6,18}$")]] = Field(
        default_factory=list, max_length=20, examples=[["61462000"]],
        description="SNOMED CT codes")
    result_ids: list[str] = Field(default_factory=list, max_length=200)
    service_request_ids: list[str] = Field(default_factory=list, max_length=20)
    imaging_study_ids: list[str] = Field(default_factory=list, max_length=20)
    effective_at: AwareDatetime | None = None
    encounter_id: str | None = Field(default=None, max_length=64)


class DiagnosticReportView(BaseModel):
    id: str
    patient_id: str | None
    code: CodeView
    category: str | None
    status: str
    conclusion: str | None = None
    conclusion_codes: list[str] = []
    result_ids: list[str] = []
    service_request_ids: list[str] = []
    imaging_study_ids: list[str] = []
    effective_at: str | None = None
    issued_at: str | None = None
    signed_by: list[PersonRef] = []
    updated_at: str | None = None


class DiagnosticReportQuery(Mine):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64)
    status: Annotated[str | None, SearchParam("status")] = Field(None, max_length=30)
    category: ReportCategory | None = None
    service_request_id: Annotated[str | None, SearchParam(
        "based-on", "ServiceRequest/{}")] = Field(None, max_length=64)


def report_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    category, display = REPORT_CATEGORIES[payload.get("category", "laboratory")]
    code = payload["code"]
    report: JSON = {
        "resourceType": "DiagnosticReport", "status": payload.get("status", "preliminary"),
        "category": [concept(category, V2_0074, display)],
        "code": concept(code.get("code"), code.get("system") or (LOINC if code.get("code")
                                                                 else None),
                        code["display"], code["display"]),
        "subject": reference("Patient", payload["patient_id"]),
        "effectiveDateTime": _instant(payload.get("effective_at")) or now_instant(),
        "performer": [_me(ctx)]}
    for field, element, kind in (("result_ids", "result", "Observation"),
                                 ("service_request_ids", "basedOn", "ServiceRequest"),
                                 ("imaging_study_ids", "imagingStudy", "ImagingStudy")):
        if payload.get(field):
            report[element] = [reference(kind, i) for i in payload[field]]
    if payload.get("conclusion"):
        report["conclusion"] = payload["conclusion"]
    if payload.get("conclusion_codes"):
        report["conclusionCode"] = [concept(c, SNOMED) for c in payload["conclusion_codes"]]
    if payload.get("encounter_id"):
        report["encounter"] = reference("Encounter", payload["encounter_id"])
    return report


def report_view(report: JSON) -> JSON:
    category = coding((report.get("category") or [None])[0]).get("code")
    return DiagnosticReportView.model_validate({
        "id": report["id"], "patient_id": local_id(report.get("subject"), "Patient"),
        "code": _code_view(report.get("code")),
        "category": next((k for k, (c, _) in REPORT_CATEGORIES.items() if c == category),
                         category),
        "status": report["status"], "conclusion": report.get("conclusion"),
        "conclusion_codes": [coding(c).get("code") for c in report.get("conclusionCode", [])],
        "result_ids": [i for r in report.get("result", []) if (i := local_id(r, "Observation"))],
        "service_request_ids": [i for r in report.get("basedOn", [])
                                if (i := local_id(r, "ServiceRequest"))],
        "imaging_study_ids": [i for r in report.get("imagingStudy", [])
                              if (i := local_id(r, "ImagingStudy"))],
        "effective_at": report.get("effectiveDateTime"), "issued_at": report.get("issued"),
        "signed_by": [_person(r) for r in report.get("resultsInterpreter", [])],
        "updated_at": (report.get("meta") or {}).get("lastUpdated")}).model_dump()


async def _checked_report(ctx: ApiContext, payload: JSON) -> JSON:
    patient = payload["patient_id"]
    await require_patient(ctx, patient)
    await _check_refs(ctx, "Observation", payload.get("result_ids", []), patient, "result_ids")
    await _check_refs(ctx, "ServiceRequest", payload.get("service_request_ids", []), patient,
                      "service_request_ids")
    await _check_refs(ctx, "ImagingStudy", payload.get("imaging_study_ids", []), patient,
                      "imaging_study_ids")
    return payload


diagnostic_reports = Facade(
    resource="DiagnosticReport", name="Diagnostic report", create=DiagnosticReportCreate,
    view=DiagnosticReportView, query=DiagnosticReportQuery, to_fhir=report_to_fhir,
    from_fhir=report_view, statuses=REPORT_STATUS, prepare=_checked_report,
    list_criteria=_list_filters("performer", V2_0074, REPORT_CATEGORIES), sort="-date",
    events=Events(created="platform.doctors.diagnostic_report_created"), tags=["doctors"],
    summaries={"list": "Diagnostic reports the caller may see",
               "create": "Write a diagnostic report (its results, orders and images)"},
)


# -- imaging studies -----------------------------------------------------------------------------
class ImagingStudyCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    modality: Modality = Field(examples=["CR"])
    description: str = Field(min_length=1, max_length=500, examples=["Chest X-ray PA view"])
    study_uid: str | None = Field(default=None, pattern=r"^[0-2](\.(0|[1-9]\d*))+$",
                                  max_length=64, description="The DICOM Study Instance UID")
    started_at: AwareDatetime | None = None
    service_request_id: str | None = Field(default=None, max_length=64)
    number_of_series: int | None = Field(default=None, ge=0, le=10_000)
    number_of_instances: int | None = Field(default=None, ge=0, le=1_000_000)
    notes: str | None = Field(default=None, max_length=2000)


class ImagingStudyView(BaseModel):
    id: str
    patient_id: str | None
    modality: str | None
    description: str | None
    study_uid: str | None
    status: str
    started_at: str | None = None
    service_request_id: str | None = None
    number_of_series: int | None = None
    number_of_instances: int | None = None
    notes: list[str] = []
    updated_at: str | None = None


class ImagingStudyQuery(BaseModel):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64)
    status: Annotated[Literal["registered", "available", "cancelled", "entered-in-error"]
                      | None, SearchParam("status")] = None
    service_request_id: Annotated[str | None, SearchParam(
        "basedon", "ServiceRequest/{}")] = Field(None, max_length=64)


class ImagingStatus(StatusChange):
    status: Literal["registered", "available", "cancelled", "entered-in-error"]


def imaging_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    uid = payload.get("study_uid") or f"2.25.{uuid.uuid4().int}"
    study: JSON = {
        "resourceType": "ImagingStudy", "status": "registered",
        "identifier": [{"system": "urn:dicom:uid", "value": f"urn:oid:{uid}"}],
        "subject": reference("Patient", payload["patient_id"]),
        "modality": [{"system": DICOM, "code": payload["modality"],
                      "display": MODALITIES[payload["modality"]]}],
        "description": payload["description"],
        "started": _instant(payload.get("started_at")) or now_instant(),
        "referrer": _me(ctx)}
    if payload.get("service_request_id"):
        study["basedOn"] = [reference("ServiceRequest", payload["service_request_id"])]
    for field, element in (("number_of_series", "numberOfSeries"),
                           ("number_of_instances", "numberOfInstances")):
        if payload.get(field) is not None:
            study[element] = payload[field]
    if payload.get("notes"):
        study["note"] = [{"text": payload["notes"]}]
    return study


def imaging_view(study: JSON) -> JSON:
    uid = next((i.get("value", "") for i in study.get("identifier", [])
                if i.get("system") == "urn:dicom:uid"), None)
    return ImagingStudyView.model_validate({
        "id": study["id"], "patient_id": local_id(study.get("subject"), "Patient"),
        "modality": ((study.get("modality") or [{}])[0]).get("code"),
        "description": study.get("description"),
        "study_uid": uid.removeprefix("urn:oid:") if uid else None, "status": study["status"],
        "started_at": study.get("started"),
        "service_request_id": local_id((study.get("basedOn") or [None])[0], "ServiceRequest"),
        "number_of_series": study.get("numberOfSeries"),
        "number_of_instances": study.get("numberOfInstances"),
        "notes": [n.get("text", "") for n in study.get("note", [])],
        "updated_at": (study.get("meta") or {}).get("lastUpdated")}).model_dump()


async def _checked_study(ctx: ApiContext, payload: JSON) -> JSON:
    await require_patient(ctx, payload["patient_id"])
    if payload.get("service_request_id"):
        await _check_refs(ctx, "ServiceRequest", [payload["service_request_id"]],
                          payload["patient_id"], "service_request_id")
    return payload


imaging_studies = Facade(
    resource="ImagingStudy", name="Imaging study", create=ImagingStudyCreate,
    view=ImagingStudyView, query=ImagingStudyQuery, to_fhir=imaging_to_fhir,
    from_fhir=imaging_view, statuses=IMAGING_STATUS, prepare=_checked_study,
    sort="-started", events=Events(created="platform.doctors.imaging_study_created"),
    tags=["doctors"],
    summaries={"list": "Imaging studies the caller may see",
               "create": "Register an imaging study (DICOM modality and study UID)"},
)


# -- routes ---------------------------------------------------------------------------------------
router = APIRouter(tags=["doctors"])
service_requests.mount(router, "/api/service-requests", ops=("list", "create"))
service_requests.status_route(
    body=ServiceRequestStatus, summary="Move a service request's status",
    event="platform.doctors.service_request_status_changed",
    change=_reason_noted)
diagnostic_reports.mount(router, "/api/diagnostic-reports", ops=("list", "create"))
imaging_studies.mount(router, "/api/imaging-studies", ops=("list", "create"))
imaging_studies.status_route(
    body=ImagingStatus, summary="Move an imaging study's status (registered → available)",
    event="platform.doctors.imaging_study_status_changed",
    change=_reason_noted)


@diagnostic_reports.route("POST", "/{resource_id}/sign",
                          summary="Sign a diagnostic report (final; the signer is recorded)")
async def sign_report(ctx: ItemContext[Any]) -> JSON:
    """A doctor or lab member of an organization owning the report signs it."""
    report = ctx.resource
    ctx.authorize("diagnostic-report.sign", owner_labels(report))
    signed = REPORT_STATUS.move(report, "final")
    signed = {**signed, "issued": now_instant(),
              "resultsInterpreter": [*signed.get("resultsInterpreter", []), _me(ctx)]}
    return await ctx.save(signed, event="platform.doctors.diagnostic_report_signed",
                          payload=report_view(signed))

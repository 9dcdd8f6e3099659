"""Labs area: HL7v2 ingestion over HTTP, lab results and their review, lab orders.

Routes and what they map to:

- ``POST /api/lab/hl7-ingest``: one v2 message (body ``x-application/hl7-v2+er7`` or
  ``text/plain``, or JSON ``{"message": "..."}``) through the same gateway as MLLP
  (``hl7_gateway.gateway``); the envelope's data holds the ACK(s). The HTTP status says the
  request reached the gateway; the ACK says what became of the message, exactly as on
  MLLP (an AE or AR is still a 200 carrying that ACK). Who may ingest: API keys (scope
  ``lab:write``), platform administrators and members of an organization (labs and
  clinics); a patient account may not push results.
- ``GET /api/patients/:id/lab-results``: a lab result is a FHIR **DiagnosticReport** (one
  per order: OBR) with its **Observations** (OBX) inlined as ``results``, newest first.
  The patient themself, members of an organization that registered the patient, admins.
- ``PATCH /api/lab-results/:id/review``: a clinician acknowledges a result. Recorded as a
  FHIR **Task** (code ``lab-result-review``, status completed, ``focus`` the version-
  specific DiagnosticReport reviewed, ``for`` the patient, ``owner`` the reviewer,
  ``note`` the comment), not as a change to the DiagnosticReport or its Observations:
  those belong to the lab, and a corrected result from the lab replaces them (the
  gateway's conditional update), which would silently wipe a review stored inside them.
  Because the Task points at the version reviewed, a correction arriving after the review
  shows as ``review.current: false`` (needs another look). Reviewers: admins and members
  of an organization that registered the patient (not the patient).
- ``/api/labs``: lab orders as FHIR **ServiceRequest** (intent order, category
  laboratory procedure):

      patient_id → subject (Patient/<id>)
      test_type  → code.text
      priority   → priority (routine | urgent | asap | stat)
      notes      → note[0].text
      status     → status, moved by the status table below
      (generated) placer number → identifier[type PLAC, system urn:healthplatform:lab-order]

  The placer number is what a lab echoes in ORC-2 / OBR-2 (``<number>^HEALTHPLATFORM``):
  the gateway maps that to the same identifier, so an ORM status update merges into the
  order and an ORU's DiagnosticReport points at it (``based-on``); the order view lists
  those results. Status table: draft → active | revoked; active → on-hold | completed |
  revoked; on-hold → active | revoked; completed and revoked are final.
  ``POST /api/labs/:id/cancel`` moves to revoked. Who ordered what is also kept in the
  ``lab_orders`` documents, so a clinician can list their own orders.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Literal
from zoneinfo import ZoneInfo

import orjson
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field, ValidationError

from fhir_server.store.sqlite import now_instant
from hl7_gateway.gateway import FAILED_TOPIC, HL7Gateway
from hl7_gateway.listener import server_tls_context, start_listener
from hl7_gateway.mllp import MLLPServer
from hl7_gateway.parser import encode_message
from hl7_gateway.v2_to_fhir.obr import PLATFORM_PLACER_SYSTEM
from platform_api.auth.dependencies import current_principal
from platform_api.auth.principal import Principal
from platform_api.envelope import (
    ApiError,
    Envelope,
    PageEnvelope,
    Pagination,
    created,
    forbidden,
    not_found,
    ok,
    pagination,
)
from platform_api.facade import StatusTable
from platform_api.organizations import MEMBERS, membership
from platform_api.patients import ORG_PATIENTS, can_access_patient
from platform_api.services import Services

__all__ = ["LAB_ORDERS", "hl7_gateway", "router", "start_hl7"]

JSON = dict[str, Any]
LAB_ORDERS = "lab_orders"
GATEWAY = "hl7_gateway"
MLLP_SERVER = "mllp_server"
HL7_MEDIA_TYPES = frozenset({"x-application/hl7-v2+er7", "application/hl7-v2",
                             "application/edi-hl7", "text/plain"})
USER_SYSTEM = "urn:healthplatform:user"
REVIEW_SYSTEM = "urn:healthplatform:lab-result-review"
TASK_CODES = "urn:healthplatform:task-code"
PLAC = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0203",
                    "code": "PLAC", "display": "Placer Identifier"}]}
LAB_PROCEDURE = {"coding": [{"system": "http://snomed.info/sct", "code": "108252007",
                             "display": "Laboratory procedure"}]}
ORDER_STATUS = StatusTable.of(
    draft=("active", "revoked"),
    active=("on-hold", "completed", "revoked"),
    on_hold=("active", "revoked"),
    completed=(),
    revoked=(),
    entered_in_error=(),
)
Priority = Literal["routine", "urgent", "asap", "stat"]
OrderStatus = Literal["draft", "active", "on-hold", "completed", "revoked"]


# --- the gateway in this process ------------------------------------------------------------


def hl7_gateway(services: Services) -> HL7Gateway:
    """The process's gateway (HTTP ingest and the MLLP listener share it)."""
    gateway = services.extras.get(GATEWAY)
    if gateway is None:
        zone = ZoneInfo(services.settings.hl7_default_timezone or "UTC")
        gateway = HL7Gateway(services.fhir, default_tz=zone)
        services.extras[GATEWAY] = gateway
    return gateway  # type: ignore[no-any-return]


async def start_hl7(services: Services) -> MLLPServer | None:
    """At startup: let dead-letter retries reach the gateway, and start the MLLP listener
    when ``HEALTHPLATFORM_MLLP_ENABLED``; the caller closes the returned server."""
    gateway = hl7_gateway(services)

    async def retry(event: JSON) -> None:
        await gateway.retry_failed_event(event)

    services.bus.subscribe(FAILED_TOPIC, retry)
    settings = services.settings
    if not settings.mllp_enabled:
        return None
    tls = server_tls_context(settings.tls_cert_file, settings.tls_key_file) \
        if settings.tls_cert_file and settings.tls_key_file else None
    server = await start_listener(gateway, settings.mllp_host, settings.mllp_port, tls=tls,
                                  max_message_bytes=settings.mllp_max_message_bytes,
                                  idle_timeout=settings.mllp_idle_timeout or None)
    services.extras[MLLP_SERVER] = server
    return server


# --- payloads ---------------------------------------------------------------------------------


class IngestRequest(BaseModel):
    message: str = Field(min_length=1, description="One HL7 v2 message (ER7 text)")


class IngestError(BaseModel):
    code: int
    severity: str
    message: str
    segment: str | None = None
    field: int | None = None


class IngestView(BaseModel):
    outcome: str = Field(description="accept | error | reject")
    ack_code: str = Field(description="MSA-1 of the last ACK: AA, AE, AR (or CA, CE, CR)")
    ack: str | None = Field(description="The last ACK (ER7, CR-separated)")
    acks: list[str] = Field(description="Every ACK, in order (enhanced mode: commit first)")
    control_id: str
    message_type: str
    duplicate: bool = Field(description="The message was seen before; stored once")
    resources: list[str] = Field(description="FHIR resources written or referenced")
    dead_letter_id: str | None = None
    errors: list[IngestError]


class ObservationView(BaseModel):
    id: str
    code: str | None = None
    name: str | None = None
    value: float | int | str | None = None
    unit: str | None = None
    value_text: str | None = None
    reference_range: str | None = None
    interpretation: list[str] = []
    abnormal: bool = False
    status: str | None = None
    effective_at: str | None = None
    notes: list[str] = []


class ReviewView(BaseModel):
    id: str
    reviewed_by: str | None = None
    reviewed_at: str | None = None
    comment: str | None = None
    report_version: str | None = None
    current: bool = Field(description="False when the lab corrected the result afterwards")


class LabResultView(BaseModel):
    id: str
    patient_id: str | None = None
    order_id: str | None = None
    status: str
    code: str | None = None
    name: str | None = None
    category: str | None = None
    effective_at: str | None = None
    issued_at: str | None = None
    filler_order_number: str | None = None
    placer_order_number: str | None = None
    abnormal: bool = False
    results: list[ObservationView] = []
    review: ReviewView | None = None
    updated_at: str | None = None


class ReviewRequest(BaseModel):
    comment: str | None = Field(default=None, max_length=2000,
                                examples=["Discussed with the patient; repeat in 3 months"])


class LabOrderCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    test_type: str = Field(min_length=1, max_length=200, examples=["Complete blood count"])
    priority: Priority = "routine"
    notes: str | None = Field(default=None, max_length=2000)


class LabOrderUpdate(BaseModel):
    test_type: str | None = Field(default=None, min_length=1, max_length=200)
    priority: Priority | None = None
    notes: str | None = Field(default=None, max_length=2000)
    status: OrderStatus | None = None


class LabOrderView(BaseModel):
    id: str
    patient_id: str | None = None
    test_type: str | None = None
    priority: str | None = None
    notes: str | None = None
    status: str
    placer_order_number: str | None = None
    filler_order_number: str | None = None
    requested_by: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    result_ids: list[str] = []


router = APIRouter(tags=["labs"])


def _services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


# --- HL7 ingest -------------------------------------------------------------------------------


async def _may_ingest(services: Services, principal: Principal) -> bool:
    if principal.kind == "api_key" or principal.is_platform_admin:
        return True
    return bool(await services.store.find_documents(MEMBERS, {"user_id": principal.user_id},
                                                    limit=1))


async def _message_bytes(request: Request) -> bytes:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await request.body()
    if media == "application/json" or media.endswith("+json"):
        try:
            payload = IngestRequest.model_validate(orjson.loads(body or b"null"))
        except orjson.JSONDecodeError as exc:
            raise ApiError(422, "VALIDATION_ERROR", f"The body is not JSON: {exc}") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ApiError(422, "VALIDATION_ERROR", f"message: {first['msg']}",
                           field="message") from None
        return encode_message(payload.message)
    if media not in HL7_MEDIA_TYPES:
        raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE",
                       "Send the message as x-application/hl7-v2+er7 or text/plain, or as "
                       'JSON {"message": "..."}')
    if not body.strip():
        raise ApiError(422, "VALIDATION_ERROR", "The message is empty", field="message")
    return body


_INGEST_BODY = {"requestBody": {"required": True, "content": {
    "x-application/hl7-v2+er7": {"schema": {"type": "string"}},
    "text/plain": {"schema": {"type": "string"}},
    "application/json": {"schema": IngestRequest.model_json_schema()},
}}}


@router.post("/api/lab/hl7-ingest", response_model=Envelope[IngestView],
             summary="Ingest one HL7 v2 message; the data holds its ACK",
             openapi_extra=_INGEST_BODY)
async def ingest(request: Request, principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    if not await _may_ingest(services, principal):
        raise forbidden("Only labs, organization members and administrators may send HL7")
    raw = await _message_bytes(request)
    processed = await hl7_gateway(services).process(raw)
    return ok(processed.to_json())


# --- lab results ------------------------------------------------------------------------------


def _coding(concept: JSON | None) -> JSON:
    return ((concept or {}).get("coding") or [{}])[0]  # type: ignore[no-any-return]


def _concept_text(concept: JSON | None) -> str | None:
    coding = _coding(concept)
    return (concept or {}).get("text") or coding.get("display") or coding.get("code")


def _quantity_text(quantity: JSON) -> str:
    unit = quantity.get("unit") or quantity.get("code") or ""
    return f"{quantity.get('comparator', '')}{quantity.get('value', '')} {unit}".strip()


def _value(observation: JSON) -> tuple[Any, str | None, str | None]:
    """(value, unit, text) of an Observation's value[x]."""
    if "valueQuantity" in observation:
        q = observation["valueQuantity"]
        return q.get("value"), q.get("unit") or q.get("code"), _quantity_text(q)
    if "valueString" in observation:
        return observation["valueString"], None, observation["valueString"]
    if "valueCodeableConcept" in observation:
        text = _concept_text(observation["valueCodeableConcept"])
        return text, None, text
    for key in ("valueDateTime", "valueTime"):
        if key in observation:
            return observation[key], None, observation[key]
    if "valueRange" in observation:
        r = observation["valueRange"]
        text = f"{_quantity_text(r.get('low', {}))} - {_quantity_text(r.get('high', {}))}"
        return text, None, text
    if "valueRatio" in observation:
        r = observation["valueRatio"]
        text = f"{_quantity_text(r.get('numerator', {}))} / " \
               f"{_quantity_text(r.get('denominator', {}))}"
        return text, None, text
    if "component" in observation:
        texts = [t for c in observation["component"] if (t := _value(c)[2])]
        return ", ".join(texts), None, ", ".join(texts)
    return None, None, None


_NORMAL_FLAGS = frozenset({"N", "NEG", "ND", "NR", "S"})


def observation_view(observation: JSON) -> JSON:
    value, unit, text = _value(observation)
    flags = [_coding(i).get("code") or i.get("text") for i in observation.get("interpretation",
                                                                               [])]
    ranges = observation.get("referenceRange") or [{}]
    return ObservationView(
        id=observation["id"], code=_coding(observation.get("code")).get("code"),
        name=_concept_text(observation.get("code")), value=value, unit=unit,
        value_text=text, reference_range=ranges[0].get("text"),
        interpretation=[f for f in flags if f],
        abnormal=any(f not in _NORMAL_FLAGS for f in flags if f),
        status=observation.get("status"), effective_at=observation.get("effectiveDateTime"),
        notes=[n.get("text", "") for n in observation.get("note", [])],
    ).model_dump()


def _identifier(resource: JSON, type_code: str) -> str | None:
    for identifier in resource.get("identifier", []):
        if _coding(identifier.get("type")).get("code") == type_code:
            return identifier.get("value")  # type: ignore[no-any-return]
    return None


def _local_id(reference: JSON | None, resource_type: str) -> str | None:
    ref = (reference or {}).get("reference", "")
    prefix = f"{resource_type}/"
    return ref[len(prefix):].split("/_history/")[0] if ref.startswith(prefix) else None


def review_view(task: JSON, report: JSON) -> JSON:
    focus = (task.get("focus") or {}).get("reference", "")
    version = focus.split("/_history/")[1] if "/_history/" in focus else None
    current = version is not None and version == report.get("meta", {}).get("versionId")
    notes = task.get("note") or [{}]
    return ReviewView(id=task["id"], reviewed_by=(task.get("owner") or {}).get("display"),
                      reviewed_at=(task.get("executionPeriod") or {}).get("end"),
                      comment=notes[0].get("text"), report_version=version,
                      current=current).model_dump()


def lab_result_view(report: JSON, observations: dict[str, JSON], review: JSON | None) -> JSON:
    results = [observation_view(observations[i]) for ref in report.get("result", [])
               if (i := _local_id(ref, "Observation")) and i in observations]
    based_on = report.get("basedOn") or [{}]
    return LabResultView.model_validate({
        "id": report["id"], "patient_id": _local_id(report.get("subject"), "Patient"),
        "order_id": _local_id(based_on[0], "ServiceRequest"), "status": report["status"],
        "code": _coding(report.get("code")).get("code"),
        "name": _concept_text(report.get("code")),
        "category": _concept_text((report.get("category") or [{}])[0]),
        "effective_at": report.get("effectiveDateTime")
        or (report.get("effectivePeriod") or {}).get("start"),
        "issued_at": report.get("issued"),
        "filler_order_number": _identifier(report, "FILL"),
        "placer_order_number": _identifier(report, "PLAC"),
        "abnormal": any(r["abnormal"] for r in results), "results": results,
        "review": review_view(review, report) if review else None,
        "updated_at": report.get("meta", {}).get("lastUpdated"),
    }).model_dump()


async def _observations_of(services: Services, reports: Sequence[JSON]) -> dict[str, JSON]:
    ids = [i for r in reports for ref in r.get("result", [])
           if (i := _local_id(ref, "Observation"))]
    if not ids:
        return {}
    found = await services.fhir.search("Observation", [("_id", ",".join(ids))])
    return {o["id"]: o for o in found}


async def _reviews_of(services: Services, reports: Sequence[JSON]) -> dict[str, JSON]:
    if not reports:
        return {}
    tokens = ",".join(f"{REVIEW_SYSTEM}|{r['id']}" for r in reports)
    latest: dict[str, JSON] = {}
    for task in await services.fhir.search("Task", [("identifier", tokens)]):
        report_id = task["identifier"][0]["value"]
        stamp = (task.get("executionPeriod") or {}).get("end", "")
        seen = latest.get(report_id)
        if seen is None or stamp > (seen.get("executionPeriod") or {}).get("end", ""):
            latest[report_id] = task
    return latest


async def _views(services: Services, reports: Sequence[JSON]) -> list[JSON]:
    observations = await _observations_of(services, reports)
    reviews = await _reviews_of(services, reports)
    return [lab_result_view(r, observations, reviews.get(r["id"])) for r in reports]


async def _patient_exists(services: Services, patient_id: str) -> None:
    if await services.fhir.find_json("Patient", patient_id) is None:
        raise not_found("Patient")


@router.get("/api/patients/{patient_id}/lab-results", response_model=PageEnvelope[LabResultView],
            summary="A patient's lab results (reports with their observations), newest first")
async def list_lab_results(request: Request, patient_id: str,
                           page: Pagination = Depends(pagination),
                           principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    await _patient_exists(services, patient_id)
    if not await can_access_patient(services, principal, patient_id):
        raise forbidden("You may not see this patient's results")
    reports = await services.fhir.search("DiagnosticReport",
                                         [("subject", f"Patient/{patient_id}")])
    reports.sort(key=lambda r: (r.get("effectiveDateTime")
                                or (r.get("effectivePeriod") or {}).get("start")
                                or r.get("meta", {}).get("lastUpdated", "")), reverse=True)
    chosen = reports[page.offset:page.offset + page.limit]
    return page.respond(await _views(services, chosen), len(reports))


async def _may_review(services: Services, principal: Principal, patient_id: str | None) -> bool:
    """Admins, and members of an organization that registered the patient."""
    if principal.is_platform_admin:
        return True
    if patient_id is None:
        return False
    for link in await services.store.find_documents(ORG_PATIENTS, {"patient_id": patient_id},
                                                    limit=50):
        if await membership(services, link["organization_id"], principal.user_id):
            return True
    return False


def review_task(report: JSON, principal: Principal, comment: str | None, when: str) -> JSON:
    version = report.get("meta", {}).get("versionId")
    focus = f"DiagnosticReport/{report['id']}" + (f"/_history/{version}" if version else "")
    task: JSON = {
        "resourceType": "Task", "status": "completed", "intent": "order",
        "identifier": [{"system": REVIEW_SYSTEM, "value": report["id"]}],
        "code": {"coding": [{"system": TASK_CODES, "code": "lab-result-review",
                             "display": "Review of a lab result"}]},
        "focus": {"reference": focus}, "authoredOn": when, "lastModified": when,
        "executionPeriod": {"start": when, "end": when},
        "owner": {"identifier": {"system": USER_SYSTEM, "value": principal.user_id},
                  "display": principal.email or principal.user_id},
    }
    if report.get("subject"):
        task["for"] = report["subject"]
    if comment:
        task["note"] = [{"text": comment}]
    return task


@router.patch("/api/lab-results/{result_id}/review", response_model=Envelope[LabResultView],
              summary="Record that a clinician reviewed a lab result")
async def review_lab_result(request: Request, result_id: str, body: ReviewRequest,
                            principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    report = await services.fhir.find_json("DiagnosticReport", result_id)
    if report is None:
        raise not_found("Lab result")
    patient_id = _local_id(report.get("subject"), "Patient")
    if not await _may_review(services, principal, patient_id):
        raise forbidden("Only clinicians of the patient's organization may review results")
    when = now_instant()
    async with services.store.unit_of_work() as uow:
        staged = services.fhir.stage_create(uow, review_task(report, principal, body.comment,
                                                             when))
        uow.emit("platform.lab.result_reviewed",
                 {"lab_result_id": result_id, "patient_id": patient_id,
                  "task_id": staged.id, "reviewed_by": principal.user_id,
                  "reviewed_at": when}, source_service="labs")
        await uow.commit()
    return ok((await _views(services, [report]))[0])


# --- lab orders -------------------------------------------------------------------------------


def order_to_fhir(payload: JSON, principal: Principal, existing: JSON | None) -> JSON:
    order = orjson.loads(orjson.dumps(existing)) if existing else {
        "resourceType": "ServiceRequest", "status": "active", "intent": "order",
        "category": [LAB_PROCEDURE], "subject": {"reference": f"Patient/{payload['patient_id']}"},
        "identifier": [{"type": PLAC, "system": PLATFORM_PLACER_SYSTEM,
                        "value": "HP" + uuid.uuid4().hex[:12].upper()}],
        "authoredOn": now_instant(),
        "requester": {"identifier": {"system": USER_SYSTEM, "value": principal.user_id},
                      "display": principal.email or principal.user_id},
    }
    if payload.get("test_type"):
        order["code"] = {"text": payload["test_type"]}
    if payload.get("priority"):
        order["priority"] = payload["priority"]
    if "notes" in payload:
        if payload["notes"]:
            order["note"] = [{"text": payload["notes"]}]
        else:
            order.pop("note", None)
    return order  # type: ignore[no-any-return]


def order_view(order: JSON, result_ids: Sequence[str] = ()) -> JSON:
    requester = order.get("requester") or {}
    return LabOrderView(
        id=order["id"], patient_id=_local_id(order.get("subject"), "Patient"),
        test_type=_concept_text(order.get("code")), priority=order.get("priority"),
        notes=(order.get("note") or [{}])[0].get("text"), status=order["status"],
        placer_order_number=_identifier(order, "PLAC"),
        filler_order_number=_identifier(order, "FILL"),
        requested_by=(requester.get("identifier") or {}).get("value")
        or requester.get("display"),
        created_at=order.get("authoredOn"), updated_at=order.get("meta", {}).get("lastUpdated"),
        result_ids=list(result_ids),
    ).model_dump()


async def _order_access(services: Services, principal: Principal, order: JSON) -> bool:
    requester = ((order.get("requester") or {}).get("identifier") or {}).get("value")
    if requester == principal.user_id:
        return True
    patient_id = _local_id(order.get("subject"), "Patient")
    return patient_id is not None and await can_access_patient(services, principal, patient_id)


async def _load_order(services: Services, principal: Principal, order_id: str) -> JSON:
    order = await services.fhir.find_json("ServiceRequest", order_id)
    if order is None:
        raise not_found("Lab order")
    if not await _order_access(services, principal, order):
        raise forbidden("You may not see this lab order")
    return order


async def _results_of(services: Services, order_id: str) -> list[str]:
    found = await services.fhir.search("DiagnosticReport",
                                       [("based-on", f"ServiceRequest/{order_id}")])
    return [r["id"] for r in found]


async def _save_order(services: Services, order: JSON) -> JSON:
    version = int(order.get("meta", {}).get("versionId", "0")) or None
    async with services.store.unit_of_work() as uow:
        staged = services.fhir.stage_update(uow, order, if_match=version)
        await uow.commit()
    assert staged.result is not None
    return orjson.loads(staged.result.body)  # type: ignore[no-any-return]


@router.post("/api/labs", status_code=201, response_model=Envelope[LabOrderView],
             summary="Order a lab test (a FHIR ServiceRequest with a placer number)")
async def create_lab_order(request: Request, body: LabOrderCreate,
                           principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    await _patient_exists(services, body.patient_id)
    if not await can_access_patient(services, principal, body.patient_id):
        raise forbidden("You may not order tests for this patient")
    order = order_to_fhir(body.model_dump(exclude_none=True), principal, None)
    async with services.store.unit_of_work() as uow:
        staged = services.fhir.stage_create(uow, order)
        uow.put_document(LAB_ORDERS, staged.id, {
            "id": staged.id, "patient_id": body.patient_id, "requested_by": principal.user_id,
            "created_at": order["authoredOn"]})
        await uow.commit()
    assert staged.result is not None
    return created(order_view(orjson.loads(staged.result.body)))


@router.get("/api/labs", response_model=PageEnvelope[LabOrderView],
            summary="List lab orders: a patient's (patient_id), else the caller's own")
async def list_lab_orders(request: Request, page: Pagination = Depends(pagination),
                          patient_id: str | None = Query(None, max_length=64),
                          status: OrderStatus | None = Query(None),
                          principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    if patient_id is not None:
        await _patient_exists(services, patient_id)
        if not await can_access_patient(services, principal, patient_id):
            raise forbidden("You may not see this patient's orders")
        params = [("subject", f"Patient/{patient_id}")]
        if status:
            params.append(("status", status))
        orders = await services.fhir.search("ServiceRequest", params)
    else:
        where: JSON = {} if principal.is_platform_admin else {"requested_by": principal.user_id}
        links = await services.store.find_documents(LAB_ORDERS, where, limit=10_000,
                                                    order_by="created_at", descending=True)
        orders = [o for link in links
                  if (o := await services.fhir.find_json("ServiceRequest", link["id"]))
                  and (status is None or o["status"] == status)]
    orders.sort(key=lambda o: o.get("authoredOn", ""), reverse=True)
    chosen = orders[page.offset:page.offset + page.limit]
    return page.respond([order_view(o) for o in chosen], len(orders))


@router.get("/api/labs/{order_id}", response_model=Envelope[LabOrderView],
            summary="A lab order, with the ids of the results reported for it")
async def get_lab_order(request: Request, order_id: str,
                        principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    order = await _load_order(services, principal, order_id)
    return ok(order_view(order, await _results_of(services, order_id)))


@router.patch("/api/labs/{order_id}", response_model=Envelope[LabOrderView],
              summary="Change a lab order (status moves follow the status table)")
async def update_lab_order(request: Request, order_id: str, body: LabOrderUpdate,
                           principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    order = await _load_order(services, principal, order_id)
    payload = body.model_dump(exclude_unset=True)
    target = payload.pop("status", None)
    if target and target != order["status"]:
        ORDER_STATUS.check(order["status"], target)
        order["status"] = target
    saved = await _save_order(services, order_to_fhir(payload, principal, order))
    return ok(order_view(saved, await _results_of(services, order_id)))


@router.post("/api/labs/{order_id}/cancel", response_model=Envelope[LabOrderView],
             summary="Cancel a lab order (status revoked)")
async def cancel_lab_order(request: Request, order_id: str,
                           principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    order = await _load_order(services, principal, order_id)
    ORDER_STATUS.check(order["status"], "revoked")
    order["status"] = "revoked"
    saved = await _save_order(services, order)
    return ok(order_view(saved, await _results_of(services, order_id)))


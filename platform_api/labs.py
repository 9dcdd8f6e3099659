"""Labs area: HL7v2 ingestion over HTTP, lab results and their review, lab orders.

Routes and what they map to:

- ``POST /api/lab/hl7-ingest``: one v2 message or a batch file (FHS/BHS ... BTS/FTS; body
  ``x-application/hl7-v2+er7`` or ``text/plain``, or JSON ``{"message": "..."}``) through
  the same intake as MLLP (``hl7_gateway.intake``); the envelope's data holds the ACK(s),
  for a batch the acknowledgement batch and each message's outcome. The HTTP status says the
  request reached the gateway; the ACK says what became of the message, exactly as on
  MLLP (an AE or AR is still a 200 carrying that ACK). Who may ingest: API keys (scope
  ``lab:write``), platform administrators and members whose role writes lab results
  (labs and clinics); a patient account may not push results. What a message stores
  belongs to the organizations that own the patient it is about (``fhir_server.ownership``).
- ``GET /api/patients/:id/lab-results``: a lab result is a FHIR **DiagnosticReport** (one
  per order: OBR) with its **Observations** (OBX) inlined as ``results``, newest first
  (``_sort=-date``; one search with ``_include=DiagnosticReport:result`` and
  ``_revinclude=Task:focus`` for the page). Whoever the access policy lets see the
  patient's records: the patient, members of the organizations that own them, consent
  holders, admins.
- ``PATCH /api/lab-results/:id/review``: a clinician acknowledges a result. Recorded as a
  FHIR **Task** (code ``lab-result-review``, status completed, ``focus`` the version-
  specific DiagnosticReport reviewed, ``for`` the patient, ``owner`` the reviewer,
  ``note`` the comment), not as a change to the DiagnosticReport or its Observations:
  those belong to the lab, and a corrected result from the lab replaces them (the
  gateway's conditional update), which would silently wipe a review stored inside them.
  Because the Task points at the version reviewed, a correction arriving after the review
  shows as ``review.current: false`` (needs another look). Reviewers: whoever the policy
  lets write a Task in the patient's record (clinicians of the owning organizations, not
  the patient).
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
  ``POST /api/labs/:id/cancel`` moves to revoked. ``GET /api/labs`` without
  ``patient_id`` lists the caller's own orders (``requester:identifier``
  ``urn:healthplatform:user|<id>``; every lab order for platform administrators).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo

import orjson
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field, ValidationError

from fhir_server.clock import now_instant
from hl7_gateway.gateway import FAILED_TOPIC, HL7Gateway
from hl7_gateway.intake import receive
from hl7_gateway.listener import server_tls_context, start_listener
from hl7_gateway.mllp import MLLPServer
from hl7_gateway.parser import encode_message
from hl7_gateway.v2_to_fhir.obr import PLATFORM_PLACER_SYSTEM
from platform_api.auth.principal import Principal
from platform_api.envelope import ApiError, Envelope, ok
from platform_api.facade import (
    ApiContext,
    Facade,
    ItemContext,
    PatientScope,
    SearchParam,
    StatusTable,
    api_context,
    require_patient,
)
from platform_api.services import Services

__all__ = ["hl7_gateway", "router", "start_hl7"]

JSON = dict[str, Any]
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
        access = services.policy.elevated_access(
            "hl7 gateway: store what the lab and clinical interfaces send")
        gateway = HL7Gateway(services.fhir, access=access, default_tz=zone,
                             max_segments=services.settings.hl7_max_segments)
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
    message: str = Field(min_length=1, description="One HL7 v2 message or batch file (ER7)")


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


class BatchIngestView(BaseModel):
    batch: Literal[True] = True
    outcome: str = Field(description="The worst of its messages': accept | error | reject")
    ack: str = Field(description="The acknowledgement batch (FHS/BHS, every message's ACKs, "
                     "BTS/FTS; ER7, CR-separated)")
    control_id: str = Field(description="FHS-11 (else BHS-11) of the batch received")
    messages: list[IngestView] = Field(description="Each message's outcome, in order")
    errors: list[IngestError] = Field(description="The batch's own: trailer counts that "
                                      "disagree with what arrived refuse it whole")


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




# --- lab results --------------------------------------------------------------------------


async def lab_result_views(ctx: ApiContext, reports: list[JSON]) -> list[JSON]:
    """Views of reports with their observations and latest reviews: one search for the
    page (``_include`` the results, ``_revinclude`` the review Tasks), as the caller."""
    if not reports:
        return []
    bundle = await ctx.fhir.search("DiagnosticReport", [
        ("_id", ",".join(r["id"] for r in reports)),
        ("_include", "DiagnosticReport:result"), ("_revinclude", "Task:focus")],
        included=True)
    included = {(r["resourceType"], r["id"]): r for r in bundle}
    reviews: dict[str, JSON] = {}
    for task in (r for (kind, _id), r in included.items() if kind == "Task"):
        report_id = next((i["value"] for i in task.get("identifier", [])
                          if i.get("system") == REVIEW_SYSTEM), None)
        stamp = (task.get("executionPeriod") or {}).get("end", "")
        seen = reviews.get(report_id or "")
        if report_id and (seen is None or stamp > (seen.get("executionPeriod") or {}).get(
                "end", "")):
            reviews[report_id] = task
    observations = {i: r for (kind, i), r in included.items() if kind == "Observation"}
    return [lab_result_view(r, observations, reviews.get(r["id"])) for r in reports]


def _no_payload(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    raise ApiError(405, "METHOD_NOT_ALLOWED", "Lab results are written by the lab (HL7v2)")


patient_lab_results = Facade(
    resource="DiagnosticReport", name="Lab result", create=ReviewRequest,
    view=LabResultView, to_fhir=_no_payload, from_fhir=lambda r: r,
    views=lab_result_views, scope=PatientScope("subject"), sort="-date", tags=["labs"],
    summaries={"list": "A patient's lab results (reports with their observations), "
                       "newest first"},
)
lab_results = Facade(
    resource="DiagnosticReport", name="Lab result", create=ReviewRequest, view=LabResultView,
    to_fhir=_no_payload, from_fhir=lambda r: r, views=lab_result_views, tags=["labs"],
)


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


# --- lab orders -------------------------------------------------------------------------------


def order_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    principal = ctx.principal
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


async def order_views(ctx: ApiContext, orders: list[JSON]) -> list[JSON]:
    """Views with the ids of the results reported for each order (one search)."""
    if not orders:
        return []
    reports = await ctx.fhir.search("DiagnosticReport", [
        ("based-on", ",".join(f"ServiceRequest/{o['id']}" for o in orders))])
    results: dict[str, list[str]] = {}
    for report in reports:
        for ref in report.get("basedOn", []):
            if (order_id := _local_id(ref, "ServiceRequest")) is not None:
                results.setdefault(order_id, []).append(report["id"])
    return [order_view(o, results.get(o["id"], [])) for o in orders]


class LabOrderQuery(BaseModel):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64, description="A patient's orders (default: your own)")
    status: Annotated[OrderStatus | None, SearchParam("status")] = None


def _own_orders(ctx: ApiContext, query: LabOrderQuery | None) -> list[tuple[str, str]]:
    """Without ``patient_id``: the caller's own orders (every lab order, for platform
    administrators)."""
    criteria = [("category", "http://snomed.info/sct|108252007")]
    if (query is None or query.patient_id is None) and not ctx.may("records.list-all"):
        criteria.append(("requester:identifier", f"{USER_SYSTEM}|{ctx.principal.user_id}"))
    return criteria


async def _known_patient(ctx: ApiContext, payload: JSON) -> JSON:
    await require_patient(ctx, payload["patient_id"])
    return payload


lab_orders = Facade(
    resource="ServiceRequest", name="Lab order", create=LabOrderCreate,
    update=LabOrderUpdate, view=LabOrderView, query=LabOrderQuery, to_fhir=order_to_fhir,
    from_fhir=order_view, views=order_views, statuses=ORDER_STATUS, prepare=_known_patient,
    list_criteria=_own_orders, sort="-authored", tags=["labs"],
    summaries={"create": "Order a lab test (a FHIR ServiceRequest with a placer number)",
               "list": "List lab orders: a patient's (patient_id), else the caller's own",
               "get": "A lab order, with the ids of the results reported for it"},
)

router = APIRouter(tags=["labs"])
# --- HL7 ingest -------------------------------------------------------------------------------


def _authorize_ingest(ctx: ApiContext) -> None:
    """Platform administrators and members whose role writes lab results in some
    organization (``lab.ingest-hl7``); an API key (a lab's system) was held to its
    ``lab:write`` scope by the access table, which is its rule here."""
    if ctx.principal.kind != "api_key":
        ctx.authorize("lab.ingest-hl7")


async def _message_bytes(request: Request) -> bytes:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await request.body()
    if media == "application/json" or media.endswith("+json"):
        try:
            payload = IngestRequest.model_validate(orjson.loads(body or b"null"))
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, "INVALID_JSON", f"The request body is not valid JSON: {exc}"
                           ) from None
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


@router.post("/api/lab/hl7-ingest", response_model=Envelope[IngestView | BatchIngestView],
             summary="Ingest one HL7 v2 message or batch file; the data holds its ACK(s)",
             openapi_extra=_INGEST_BODY)
async def ingest(request: Request, ctx: ApiContext = Depends(api_context)) -> Any:
    _authorize_ingest(ctx)
    raw = await _message_bytes(request)
    received = await receive(hl7_gateway(ctx.services), raw)
    return ok(received.to_json())


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




patient_lab_results.mount(router, "/api/patients/{patient_id}/lab-results", ops=("list",))
lab_results.mount(router, "/api/lab-results", ops=())
lab_orders.mount(router, "/api/labs", ops=("list", "create", "get"))
lab_orders.action("cancel", to="revoked", summary="Cancel a lab order (status revoked)")


@lab_results.route("PATCH", "/{resource_id}/review", body=ReviewRequest,
                   summary="Record that a clinician reviewed a lab result")
async def review_lab_result(ctx: ItemContext[ReviewRequest]) -> JSON:
    """A Task in the patient's record (the policy decides who may write one: the
    patient's clinicians, not the patient)."""
    report, when = ctx.resource, now_instant()
    comment = ctx.body.comment if ctx.body else None
    unit = ctx.unit()
    async with unit:
        staged = await unit.create(review_task(report, ctx.principal, comment, when))
        unit.emit("platform.lab.result_reviewed",
                  {"lab_result_id": report["id"],
                   "patient_id": _local_id(report.get("subject"), "Patient"),
                   "task_id": staged.id, "reviewed_by": ctx.principal.user_id,
                   "reviewed_at": when}, source_service="labs")
        await unit.commit()
    return report


@lab_orders.route("PATCH", "/{resource_id}", body=LabOrderUpdate,
                  summary="Change a lab order (status moves follow the status table)")
async def update_lab_order(ctx: ItemContext[LabOrderUpdate]) -> JSON:
    payload = ctx.body.model_dump(exclude_unset=True) if ctx.body else {}
    order = ctx.resource
    target = payload.pop("status", None)
    if target and target != order["status"]:
        order = ORDER_STATUS.move(order, target)
    return await ctx.save(order_to_fhir(payload, ctx, order))



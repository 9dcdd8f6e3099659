"""Patients area, e-prescriptions: a signed prescription dispatched to a pharmacy ⇄ FHIR
Task (fulfil the MedicationRequest), each fill ⇄ MedicationDispense.

Mapping (/api field → FHIR Task, code task-code#fulfill, intent order):
    prescription_id  → focus (MedicationRequest/<id>: it must be signed, i.e. active)
    pharmacy_id      → owner (Organization/<id>, a pharmacy: its type says so); also the
                       MedicationRequest's dispenseRequest.performer
    patient_id       → for (the prescription's subject, with the patient's name)
    status           → status, moved by ``EPRESCRIPTION_STATUS``: draft (created) →
                       requested (``transmit``) → in-progress (a fill dispensed, refills
                       left) or completed (the last fill) ; in-progress → requested
                       (``refill``); cancelled from any open state
    fills_allowed    → restriction.repetitions: 1 + the prescription's refills
                       (dispenseRequest.numberOfRepeatsAllowed)
    dispense_ids     → output[] (valueReference MedicationDispense/<id>, one per fill);
                       fills_dispensed is their count
    transmitted_at   → executionPeriod.start; created_by → requester (the user);
                       business_status → businessStatus.text

A fill (``PATCH /api/eprescriptions/:id/dispense``) is a MedicationDispense: status
completed, type v3-ActCode FF (first fill) or RF (refill), the prescription's medication
and dosage, ``subject``, ``authorizingPrescription``, ``performer`` the pharmacist,
``quantity`` and ``daysSupply`` (given, else the prescription's), ``whenHandedOver``. The
last fill completes the Task and the MedicationRequest.

Who may do what (the access policy's rules, :mod:`platform_api.policy.actions.care`, on
top of the resource policy):

- create: whoever may write the Task (the resource policy);
- transmit (``eprescription.transmit``): members of the prescribing organization whose
  role may update a Task (from the role table);
- dispense (``eprescription.dispense``): members of the pharmacy the Task is addressed to
  whose role may create a MedicationDispense (``ORG:PHARMACIST``, ``ORG:ADMIN``, ...);
- refill (``eprescription.refill``): the patient, the prescribing organization's
  clinicians, or the pharmacy (``eprescription.dispense``).

Transmitting adds the pharmacy to the owners of the Task and the MedicationRequest
(``meta.security``), so its members see what was sent to them; as no caller may hand a
record to another organization, that write (and the pharmacy's and the patient's steps)
goes through the policy's named elevation once the rule admitted the caller. The pharmacy
sees the patient's name on the prescription, not their record.

Events: ``platform.prescription.transmitted``, ``platform.prescription.dispensed``,
``platform.prescription.refill_requested`` (``eprescription_id``, ``prescription_id``,
``patient_id``, ``pharmacy_id``; dispensed adds ``dispense_id``, ``fill``,
``fills_allowed``, ``dispensed_by``).

``GET /api/eprescriptions`` (not in the spec: a pharmacy's queue) lists those addressed to
the caller's organizations (``pharmacy_id`` for one), or the patient's own.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.ownership import owner_labels, with_owners
from platform_api.envelope import ApiError, conflict, not_found
from platform_api.facade import (
    ApiContext,
    Facade,
    ItemContext,
    PatientScope,
    SearchParam,
    StatusTable,
    Unique,
    staged_body,
)
from platform_api.patients.shared import (
    JSON,
    MineQuery,
    concept,
    concept_text,
    deep_copy,
    local_id,
    mine,
    source_service,
    user_of,
    user_reference,
)

TASK_CODE = "http://hl7.org/fhir/CodeSystem/task-code"
FULFILL = concept(TASK_CODE, "fulfill", "Fulfill the focal request")
ACT_CODE = "http://terminology.hl7.org/CodeSystem/v3-ActCode"
EPRESCRIPTION_STATUS = StatusTable.of(
    draft=("requested", "cancelled"),
    requested=("in-progress", "completed", "cancelled"),
    in_progress=("requested", "completed", "cancelled"),
    completed=(),
    cancelled=(),
)
OPEN = ("draft", "requested", "in-progress")
EPrescriptionStatus = Literal["draft", "requested", "in-progress", "completed", "cancelled"]


class EPrescriptionCreate(BaseModel):
    prescription_id: str = Field(min_length=1, max_length=64)
    pharmacy_id: str = Field(min_length=1, max_length=64)


class DispenseRequest(BaseModel):
    quantity: float | None = Field(default=None, gt=0, examples=[21])
    quantity_unit: str | None = Field(default=None, max_length=40, examples=["capsule"])
    days_supply: int | None = Field(default=None, ge=1, le=366, examples=[7])
    notes: str | None = Field(default=None, max_length=1000)


class RefillRequest(BaseModel):
    notes: str | None = Field(default=None, max_length=1000)


class EPrescriptionView(BaseModel):
    id: str
    prescription_id: str | None = None
    patient_id: str | None = None
    patient_name: str | None = None
    pharmacy_id: str | None = None
    pharmacy_name: str | None = None
    medication: str | None = None
    status: str
    business_status: str | None = None
    fills_allowed: int = 1
    fills_dispensed: int = 0
    refills_remaining: int = 0
    dispense_ids: list[str] = []
    transmitted_at: str | None = None
    created_by: str | None = None
    updated_at: str | None = None


class EPrescriptionQuery(MineQuery):
    pharmacy_id: Annotated[str | None, SearchParam("owner", "Organization/{}")] = Field(
        None, max_length=64, description="Those addressed to this pharmacy")
    status: Annotated[EPrescriptionStatus | None, SearchParam("status")] = None


# -- mapping ------------------------------------------------------------------------------------
def _dispenses(task: JSON) -> list[str]:
    return [i for out in task.get("output") or []
            if (i := local_id(out.get("valueReference"), "MedicationDispense"))]


def _allowed(task: JSON) -> int:
    return int((task.get("restriction") or {}).get("repetitions") or 1)


def eprescription_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    request, pharmacy = payload["_prescription"], payload["_pharmacy"]
    when = now_instant()
    refills = (request.get("dispenseRequest") or {}).get("numberOfRepeatsAllowed") or 0
    return {
        "resourceType": "Task", "status": "draft", "intent": "order", "code": FULFILL,
        "description": concept_text(request.get("medicationCodeableConcept")),
        "focus": {"reference": f"MedicationRequest/{request['id']}"},
        "for": request["subject"], "authoredOn": when, "lastModified": when,
        "requester": user_reference(ctx.principal),
        "owner": {"reference": f"Organization/{pharmacy['id']}",
                  "display": pharmacy.get("name", "")},
        "restriction": {"repetitions": 1 + int(refills)},
        "businessStatus": {"text": "created"},
    }


def eprescription_view(task: JSON) -> JSON:
    dispensed = _dispenses(task)
    allowed = _allowed(task)
    owner = task.get("owner") or {}
    meta = task.get("meta") or {}
    return EPrescriptionView(
        id=task["id"], prescription_id=local_id(task.get("focus"), "MedicationRequest"),
        patient_id=local_id(task.get("for"), "Patient"),
        patient_name=(task.get("for") or {}).get("display"),
        pharmacy_id=local_id(owner, "Organization"), pharmacy_name=owner.get("display"),
        medication=task.get("description"), status=task["status"],
        business_status=(task.get("businessStatus") or {}).get("text"),
        fills_allowed=allowed, fills_dispensed=len(dispensed),
        refills_remaining=max(0, allowed - max(1, len(dispensed))),
        dispense_ids=dispensed,
        transmitted_at=(task.get("executionPeriod") or {}).get("start"),
        created_by=user_of(task.get("requester")), updated_at=meta.get("lastUpdated"),
    ).model_dump()


def _is_pharmacy(organization: JSON) -> bool:
    kinds = [t.get("text") or "" for t in organization.get("type") or []]
    kinds += [c.get("code") or c.get("display") or "" for t in organization.get("type") or []
              for c in t.get("coding") or []]
    return any(k.lower() in ("pharmacy", "pharm") for k in kinds)


async def _prepared(ctx: ApiContext, payload: JSON) -> JSON:
    """The signed prescription (read as the caller) and the pharmacy it goes to."""
    request = await ctx.fhir.find_json("MedicationRequest", payload["prescription_id"])
    if request is None:
        raise not_found("Prescription")
    if request.get("status") != "active":
        raise conflict("PRESCRIPTION_NOT_SIGNED", "Only a signed (active) prescription can be "
                       f"sent to a pharmacy; this one is {request.get('status')}")
    pharmacy = await ctx.fhir.find_json("Organization", payload["pharmacy_id"])  # directory
    if pharmacy is None:
        raise not_found("Pharmacy")
    if not _is_pharmacy(pharmacy):
        raise ApiError(422, "VALIDATION_ERROR", "pharmacy_id: this organization is not a "
                       "pharmacy", field="pharmacy_id")
    return {**payload, "_prescription": request, "_pharmacy": pharmacy}


def _open_for_prescription(task: JSON) -> list[tuple[str, str]]:
    return [("focus", task["focus"]["reference"]), ("code", f"{TASK_CODE}|fulfill"),
            ("status", ",".join(OPEN))]


def _addressed_to_mine(ctx: ApiContext) -> list[tuple[str, str]]:
    """A clinician's (a pharmacist's) queue: those addressed to their organizations."""
    orgs = sorted(ctx.organizations_for("organization.work-in") or ()) or ["none"]
    return [("owner", ",".join(f"Organization/{o}" for o in orgs))]


FIXED = [("code", f"{TASK_CODE}|fulfill")]
patient_eprescriptions = Facade(
    resource="Task", name="E-prescription", create=EPrescriptionCreate,
    view=EPrescriptionView, to_fhir=eprescription_to_fhir, from_fhir=eprescription_view,
    scope=PatientScope("patient"), fixed=FIXED, sort="-authored-on", tags=["e-prescriptions"],
    summaries={"list": "A patient's e-prescriptions"},
)
eprescriptions = Facade(
    resource="Task", name="E-prescription", create=EPrescriptionCreate,
    view=EPrescriptionView, query=EPrescriptionQuery, to_fhir=eprescription_to_fhir,
    from_fhir=eprescription_view, fixed=FIXED, statuses=EPRESCRIPTION_STATUS,
    prepare=_prepared, list_criteria=mine("patient", clinician=_addressed_to_mine,
                       narrowed_by="pharmacy_id"), sort="-authored-on", tags=["e-prescriptions"],
    unique=Unique(
        _open_for_prescription, "EPRESCRIPTION_EXISTS",
        "This prescription was already sent to a pharmacy"),
    summaries={"create": "Send a signed prescription to a pharmacy (a FHIR Task, draft "
                         "until transmitted)",
               "list": "E-prescriptions addressed to your pharmacies (pharmacy_id for one), "
                       "or your own as a patient",
               "get": "An e-prescription"},
)

router = APIRouter(tags=["e-prescriptions"])
patient_eprescriptions.mount(router, "/api/patients/{patient_id}/eprescriptions",
                             ops=("list",))
eprescriptions.mount(router, "/api/eprescriptions", ops=("list", "create", "get"))


# -- the workflow --------------------------------------------------------------------------
async def _prescription(ctx: ItemContext[Any]) -> JSON:
    """The prescription the e-prescription fulfils, as the caller reads it (the
    prescriber's organization owns it, the pharmacy once it was transmitted, the patient
    reads their own)."""
    request_id = local_id(ctx.resource.get("focus"), "MedicationRequest") or ""
    request = await ctx.fhir.find_json("MedicationRequest", request_id)
    if request is None:
        raise not_found("Prescription")
    return request


def _touch(task: JSON, status: str, business: str, when: str) -> JSON:
    return {**EPRESCRIPTION_STATUS.move(task, status), "lastModified": when,
            "businessStatus": {"text": business}}


def _payload(task: JSON, **more: Any) -> JSON:
    return {"eprescription_id": task["id"],
            "prescription_id": local_id(task.get("focus"), "MedicationRequest"),
            "patient_id": local_id(task.get("for"), "Patient"),
            "pharmacy_id": local_id(task.get("owner"), "Organization"), **more}


@eprescriptions.route("PATCH", "/{resource_id}/transmit",
                      summary="Transmit an e-prescription to its pharmacy")
async def transmit(ctx: ItemContext[Any]) -> JSON:
    task = ctx.resource
    ctx.authorize("eprescription.transmit", owner_labels(task))
    EPRESCRIPTION_STATUS.check(task["status"], "requested")
    request = await _prescription(ctx)
    if request.get("status") != "active":
        raise conflict("PRESCRIPTION_NOT_ACTIVE", f"The prescription is {request['status']}")
    pharmacy_id = local_id(task.get("owner"), "Organization") or ""
    when = now_instant()
    sent = _touch(task, "requested", "transmitted", when)
    sent["executionPeriod"] = {"start": when}
    dispatched = deep_copy(request)
    dispatched.setdefault("dispenseRequest", {})["performer"] = task["owner"]
    unit = ctx.elevate("eprescription transmit: add the pharmacy to the owners of the "
                       "e-prescription and its prescription").unit()
    async with unit:
        staged = await unit.update(with_owners(sent, owner_labels(task) | {pharmacy_id}),
                                   if_match=int(task["meta"]["versionId"]))
        await unit.update(with_owners(dispatched, owner_labels(request) | {pharmacy_id}),
                          if_match=int(request["meta"]["versionId"]))
        unit.emit("platform.prescription.transmitted", _payload(task, transmitted_at=when),
                  source_service=source_service("eprescriptions"))
        await unit.commit()
    return staged_body(staged)


def _require_dispenser(ctx: ItemContext[Any]) -> str:
    pharmacy_id = local_id(ctx.resource.get("owner"), "Organization") or ""
    ctx.authorize("eprescription.dispense", pharmacy_id)
    return pharmacy_id


def dispense_to_fhir(request: JSON, body: DispenseRequest, ctx: ApiContext, fill: int,
                     when: str) -> JSON:
    supply = request.get("dispenseRequest") or {}
    dispense: JSON = {
        "resourceType": "MedicationDispense", "status": "completed",
        "type": concept(ACT_CODE, "FF", "First Fill") if fill == 1 else concept(
            ACT_CODE, "RF", "Refill"),
        "medicationCodeableConcept": request["medicationCodeableConcept"],
        "subject": request["subject"],
        "authorizingPrescription": [{"reference": f"MedicationRequest/{request['id']}"}],
        "performer": [{"actor": user_reference(ctx.principal)}],
        "whenPrepared": when, "whenHandedOver": when,
        "dosageInstruction": request.get("dosageInstruction") or [],
    }
    if body.quantity is not None:
        dispense["quantity"] = {"value": body.quantity, "unit": body.quantity_unit or "unit"}
    elif supply.get("quantity"):
        dispense["quantity"] = supply["quantity"]
    days = body.days_supply
    if days is not None:
        dispense["daysSupply"] = {"value": days, "unit": "days",
                                  "system": "http://unitsofmeasure.org", "code": "d"}
    elif supply.get("expectedSupplyDuration"):
        dispense["daysSupply"] = supply["expectedSupplyDuration"]
    if body.notes:
        dispense["note"] = [{"text": body.notes}]
    return dispense


@eprescriptions.route("PATCH", "/{resource_id}/dispense", body=DispenseRequest,
                      summary="Record that the pharmacy dispensed a fill")
async def dispense(ctx: ItemContext[DispenseRequest]) -> JSON:
    task = ctx.resource
    pharmacy_id = _require_dispenser(ctx)
    if task["status"] != "requested":
        raise conflict("INVALID_TRANSITION", f"This e-prescription is {task['status']}, not "
                       "waiting to be dispensed (transmit it, or request a refill)")
    request = await _prescription(ctx)
    if request.get("status") != "active":
        raise conflict("PRESCRIPTION_NOT_ACTIVE", f"The prescription is {request['status']}")
    fill, allowed = len(_dispenses(task)) + 1, _allowed(task)
    if fill > allowed:
        raise conflict("NO_REFILLS_LEFT", "Every fill of this prescription was dispensed")
    when = now_instant()
    dispensed = {**dispense_to_fhir(request, ctx.body or DispenseRequest(), ctx, fill, when),
                 "id": new_id()}
    last = fill >= allowed
    done = _touch(task, "completed" if last else "in-progress",
                  f"dispensed {fill} of {allowed}", when)
    done["output"] = [*task.get("output", []), {
        "type": {"text": "MedicationDispense"},
        "valueReference": {"reference": f"MedicationDispense/{dispensed['id']}"}}]
    unit = ctx.elevate("eprescription dispense: record the fill and complete the "
                       "e-prescription and its prescription").unit()
    async with unit:
        await unit.create(with_owners(dispensed, owner_labels(request) | {pharmacy_id}),
                          resource_id=dispensed["id"])
        staged = await unit.update(done, if_match=int(task["meta"]["versionId"]))
        if last:
            await unit.update({**request, "status": "completed"},
                              if_match=int(request["meta"]["versionId"]))
        unit.emit("platform.prescription.dispensed", _payload(
            task, dispense_id=dispensed["id"], fill=fill, fills_allowed=allowed,
            dispensed_by=ctx.principal.user_id), source_service=source_service(
            "eprescriptions"))
        await unit.commit()
    return staged_body(staged)


@eprescriptions.route("POST", "/{resource_id}/refill", body=RefillRequest,
                      summary="Request the next fill of an e-prescription")
async def refill(ctx: ItemContext[RefillRequest]) -> JSON:
    task = ctx.resource
    pharmacy_id = local_id(task.get("owner"), "Organization") or ""
    if not ctx.may("eprescription.dispense", pharmacy_id):  # else the patient or prescriber
        ctx.authorize("eprescription.refill", owner_labels(task),
                      patient_id=local_id(task.get("for"), "Patient"))
    dispensed, allowed = len(_dispenses(task)), _allowed(task)
    if task["status"] == "completed" or dispensed >= allowed:
        raise conflict("NO_REFILLS_LEFT", "No refill is left on this prescription")
    if task["status"] != "in-progress":
        raise conflict("INVALID_TRANSITION", f"This e-prescription is {task['status']}: a "
                       "refill follows a dispensed fill")
    when = now_instant()
    asked = _touch(task, "requested", "refill requested", when)
    if ctx.body and ctx.body.notes:
        asked["note"] = [*task.get("note", []), {"text": ctx.body.notes, "time": when,
                                                 "authorString": ctx.principal.email or ""}]
    unit = ctx.elevate("eprescription refill: move the e-prescription back to the "
                       "pharmacy's queue").unit()
    async with unit:
        staged = await unit.update(asked, if_match=int(task["meta"]["versionId"]))
        unit.emit("platform.prescription.refill_requested",
                  _payload(task, requested_by=ctx.principal.user_id, fill=dispensed + 1),
                  source_service=source_service("eprescriptions"))
        await unit.commit()
    return staged_body(staged)

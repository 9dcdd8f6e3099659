"""Appointment requests: a patient asks for a time, the organization's staff approve it
into a booking or reject it with a reason.

Mapping (/api field → FHIR):

    the request     → Appointment tagged urn:healthplatform:scheduling|appointment-request,
                      status ``pending`` when an exact time was asked (start, end and the
                      Slots it would take, not yet taken), else ``proposed`` with the
                      preferred period in ``requestedPeriod``; the patient participant
                      accepted, the resource's ``needs-action``
    resource_id, patient_id, reason → as for appointments (participant, reasonCode)
    preferred_start / preferred_end → requestedPeriod[0].start / .end
    decision        → AppointmentResponse (appointment → the request, actor → the
                      resource, participantStatus accepted | declined, comment → the
                      rejection's reason, start/end → the time approved)
    request_status  → pending (proposed, pending, waitlist), approved (booked and what
                      follows), rejected (cancelled)

Approving books the time exactly as a booking does (its Slots are taken against their
versions: 409 ``SLOT_UNAVAILABLE`` when it is gone; a ``proposed`` request needs the
``start_time`` / ``end_time`` chosen) and emits ``platform.scheduling.appointment_booked``;
rejecting cancels the Appointment with the reason and emits
``platform.scheduling.appointment_request_rejected``. A request emits
``platform.scheduling.appointment_requested``.

Who (the policy's ``appointment.request``, ``appointment-request.approve``,
``appointment-request.reject``): a patient asks for themselves (their own Patient
record; the request is written by the platform for them, through a named elevation, and
owned by the resource's organization); staff who create scheduling resources in the
organization may ask for any of its patients they can see. Approving and rejecting is
for staff who update the organization's scheduling resources.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field, model_validator

from fhir_server.caller import CallerFhir, FhirUnit
from fhir_server.clock import now_instant
from platform_api.envelope import ApiError, Envelope, conflict, created, not_found
from platform_api.facade import ApiContext, Facade, ItemContext, SearchParam, api_context
from platform_api.scheduling import booking
from platform_api.scheduling.appointments import (
    BOOKED,
    STATUS_TABLE,
    AppointmentView,
    actor_for,
    appointment_from_fhir,
    authorize,
    event_payload,
    move_to,
    new_appointment,
    write_change,
)
from platform_api.scheduling.common import (
    JSON,
    REQUEST_TAG,
    SOURCE,
    aware_utc,
    instant,
    now_utc,
    organization_of,
    reference,
    with_tag,
)
from platform_api.scheduling.resources import is_active, load_resource

REQUESTED = "platform.scheduling.appointment_requested"
REJECTED = "platform.scheduling.appointment_request_rejected"
REQUEST_STATES = {"pending": "proposed,pending,waitlist",
                  "approved": "booked,arrived,checked-in,fulfilled,noshow",
                  "rejected": "cancelled"}


class RequestCreate(BaseModel):
    resource_id: str = Field(min_length=1, max_length=64)
    patient_id: str | None = Field(default=None, max_length=64, description="Staff: the "
                                   "patient asked for (default: your own record)")
    start_time: datetime | None = Field(default=None, description="An exact free time")
    end_time: datetime | None = None
    preferred_start: datetime | None = Field(default=None, description="Or a preferred "
                                             "period for staff to choose in")
    preferred_end: datetime | None = None
    reason: str | None = Field(default=None, max_length=1000, examples=["Follow-up of "
                                                                        "hypertension"])

    @model_validator(mode="after")
    def _a_time(self) -> RequestCreate:
        exact = (self.start_time, self.end_time)
        preferred = (self.preferred_start, self.preferred_end)
        for first, last, name in ((*exact, "end_time"), (*preferred, "preferred_end")):
            if (first is None) != (last is None):
                raise ValueError(f"give both or neither of the times ending in {name}")
            if first is not None and last is not None and aware_utc(last) <= aware_utc(first):
                raise ValueError(f"{name} must come after its start")
        if exact == (None, None) and preferred == (None, None):
            raise ValueError("give start_time and end_time, or preferred_start and "
                             "preferred_end")
        return self


class ApproveRequest(BaseModel):
    start_time: datetime | None = Field(default=None, description="Needed when the "
                                        "request gave only a preferred period")
    end_time: datetime | None = None


class RejectRequest(BaseModel):
    reason: str = Field(min_length=1, max_length=1000, examples=["Dr. Kamau is on leave "
                                                                 "that week"])


class RequestView(AppointmentView):
    request_status: str = Field(description="pending | approved | rejected")
    preferred_start: str | None = None
    preferred_end: str | None = None


class RequestQuery(BaseModel):
    resource_id: Annotated[str | None, SearchParam("actor")] = Field(None, max_length=64)
    patient_id: Annotated[str | None, SearchParam("patient", "Patient/{}")] = Field(
        None, max_length=64)
    organization_id: Annotated[str | None, SearchParam(
        "_security", "urn:healthplatform:organization|{}")] = Field(None, max_length=64)
    status: Literal["pending", "approved", "rejected"] | None = None


def request_status(status: str) -> str:
    return next((name for name, states in REQUEST_STATES.items()
                 if status in states.split(",")), "rejected")


def request_from_fhir(appointment: JSON) -> JSON:
    period = (appointment.get("requestedPeriod") or [{}])[0]
    return {**appointment_from_fhir(appointment),
            "request_status": request_status(appointment["status"]),
            "preferred_start": period.get("start"), "preferred_end": period.get("end")}


def _status_criteria(ctx: ApiContext, query: RequestQuery | None) -> list[tuple[str, str]]:
    if query is None or query.status is None:
        return []
    return [("status", REQUEST_STATES[query.status])]


requests = Facade(
    resource="Appointment", name="Appointment request", create=RequestCreate,
    view=RequestView, query=RequestQuery, to_fhir=lambda payload, ctx, existing: existing or {},
    from_fhir=request_from_fhir, fixed=[("_tag", REQUEST_TAG)], statuses=STATUS_TABLE,
    list_criteria=_status_criteria, tags=["scheduling"],
    summaries={"list": "List appointment requests (the caller's organizations', or their "
                       "own)"},
)


def response_resource(appointment: JSON, actor: JSON, status: str, *,
                      comment: str | None = None) -> JSON:
    """The resource's AppointmentResponse to a request."""
    response: JSON = {"resourceType": "AppointmentResponse",
                      "appointment": {"reference": f"Appointment/{appointment['id']}"},
                      "actor": {"reference": reference(actor)},
                      "participantStatus": status}
    if appointment.get("start") and status == "accepted":
        response.update(start=appointment["start"], end=appointment["end"])
    if comment:
        response["comment"] = comment
    meta = appointment.get("meta") or {}
    if meta.get("security"):
        response["meta"] = {"security": meta["security"]}
    return response


async def _patient_for(ctx: ApiContext, body: RequestCreate) -> JSON:
    if body.patient_id is None:
        own = ctx.access.subject.patient_id
        if own is None:
            raise conflict("PATIENT_PROFILE_REQUIRED", "Create your patient profile "
                           "(POST /api/patients) before asking for an appointment")
        patient = await ctx.fhir.find_json("Patient", own)
    else:
        patient = await ctx.fhir.find_json("Patient", body.patient_id)
    if patient is None:
        raise not_found("Patient")
    return patient


router = APIRouter(tags=["scheduling"])


@router.post("/api/appointment-requests", status_code=201,
             response_model=Envelope[RequestView],
             summary="Ask for an appointment (an exact free time or a preferred period)")
async def create_request(body: RequestCreate, ctx: ApiContext = Depends(api_context)) -> Any:
    actor = await load_resource(ctx, body.resource_id)
    if not is_active(actor):
        raise not_found("Resource")
    patient = await _patient_for(ctx, body)
    ctx.authorize("appointment.request", organization_of(actor), patient_id=patient["id"])
    # A patient may neither read Slots nor write Appointments: the request is the
    # platform's to write for them.
    fhir = ctx.elevate("appointment.request: read the free Slots and store the request")
    slots: list[JSON] = []
    start = aware_utc(body.start_time) if body.start_time else None
    end = aware_utc(body.end_time) if body.end_time else None
    if start is not None and end is not None:
        if start <= now_utc():
            raise ApiError(422, "VALIDATION_ERROR", "start_time: must be in the future",
                           field="start_time")
        slots = await booking.free_time(fhir, actor, start, end)
    appointment = with_tag(new_appointment(
        actor, patient, "pending" if slots else "proposed", start=start, end=end,
        slots=slots, reason=body.reason, actor_status="needs-action"), REQUEST_TAG)
    if body.preferred_start and body.preferred_end:
        appointment["requestedPeriod"] = [{"start": instant(aware_utc(body.preferred_start)),
                                           "end": instant(aware_utc(body.preferred_end))}]
    async with fhir.unit() as unit:
        staged = await unit.create(appointment)
        unit.emit(REQUESTED, event_payload({**appointment, "id": staged.id}),
                  source_service=SOURCE)
        await unit.commit()
    assert staged.result is not None
    return created(request_from_fhir({**appointment, "id": staged.id,
                                      "meta": {**appointment.get("meta", {}),
                                               "lastUpdated": staged.result.last_updated}}))


requests.mount(router, "/api/appointment-requests", ops=("list",))


@requests.route("POST", "/{resource_id}/approve", body=ApproveRequest,
                summary="Approve a request: its time is booked (409 when no longer free)")
async def approve(ctx: ItemContext[ApproveRequest]) -> JSON:
    authorize(ctx, "appointment-request.approve", ctx.resource)
    body = ctx.body or ApproveRequest()
    if (body.start_time is None) != (body.end_time is None):
        raise ApiError(422, "VALIDATION_ERROR", "end_time: give both start_time and "
                       "end_time", field="end_time")
    start = aware_utc(body.start_time) if body.start_time else None
    end = aware_utc(body.end_time) if body.end_time else None
    if start is not None and start <= now_utc():
        raise ApiError(422, "VALIDATION_ERROR", "start_time: must be in the future",
                       field="start_time")
    actor = await actor_for(ctx.fhir, ctx.resource)
    book = move_to("booked", start=start, end=end, actor=actor)

    async def change(fhir: CallerFhir, unit: FhirUnit, latest: JSON
                     ) -> tuple[JSON, str | None, JSON]:
        changed, _topic, extra = await book(fhir, unit, latest)
        await unit.create(response_resource(changed, actor, "accepted"))
        return changed, BOOKED, {**extra, "channel": "request", "approved_at": now_instant()}
    fhir = ctx.elevate("appointment-request.approve: take the Slots, book the request")
    return await write_change(fhir, ctx.id, change)


@requests.route("POST", "/{resource_id}/reject", body=RejectRequest,
                summary="Reject a request with a reason")
async def reject(ctx: ItemContext[RejectRequest]) -> JSON:
    authorize(ctx, "appointment-request.reject", ctx.resource)
    assert ctx.body is not None
    reason = ctx.body.reason
    if ctx.resource["status"] not in REQUEST_STATES["pending"].split(","):
        raise conflict("INVALID_TRANSITION", f"This request is already "
                       f"{request_status(ctx.resource['status'])}")
    actor = await actor_for(ctx.fhir, ctx.resource)
    cancel = move_to("cancelled", reason=reason)

    async def change(fhir: CallerFhir, unit: FhirUnit, latest: JSON
                     ) -> tuple[JSON, str | None, JSON]:
        changed, _topic, extra = await cancel(fhir, unit, latest)
        changed["participant"] = [
            {**p, "status": "declined"} if (p.get("actor") or {}).get("reference") ==
            reference(actor) else p for p in changed.get("participant") or []]
        await unit.create(response_resource(changed, actor, "declined", comment=reason))
        return changed, REJECTED, extra
    fhir = ctx.elevate("appointment-request.reject: free the Slots, decline the request")
    return await write_change(fhir, ctx.id, change)

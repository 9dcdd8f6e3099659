"""Appointments: booking a resource's free time, moving it, cancelling it, and the day's
board.

Mapping (/api field → FHIR Appointment):

    status            → status (the FHIR Appointment statuses, moved by ``STATUS_TABLE``)
    resource_id       → participant[actor = Practitioner | Location | Device/<id>] (status
                        accepted, required)
    patient_id, patient_name → participant[actor = Patient/<id>, display] (accepted)
    patient_confirmed → false while the patient is the contact a booking gave (no
                        Patient yet): participant[actor = #contact], the contact a
                        contained Patient (name, telecom), tag
                        urn:healthplatform:scheduling|unconfirmed-patient
    patient_contact   → that contained Patient's name, e-mail and phone
    start_time, end_time → start, end (UTC instants); minutesDuration
    reason            → reasonCode[0].text
    slot_ids          → slot[] (every Slot of the resource the time overlaps, busy while
                        the appointment holds them: see ``booking``)
    cancellation_reason → cancelationReason.text
    created_at        → created
    organization_id   → owner label: the resource's organization

**Booking** (``POST /api/appointments``, public: :mod:`.contacts`) takes a free time of
a resource for the contact given, or for the signed-in patient's own record. The Slots
are taken against their versions (``booking``): of two bookings racing for a time
exactly one gets 201 ``booked``, the other 409 ``SLOT_UNAVAILABLE``, in one process or
several. The confirmation is e-mailed (SMTP) by a handler of the ``appointment_booked``
event, once per event, to the patient's or the contact's address.

**Status table** (a refused move is 409 ``INVALID_TRANSITION``): proposed → pending,
booked, waitlist, cancelled; pending → booked, waitlist, cancelled; waitlist → proposed,
pending, booked, cancelled; booked → arrived, checked-in, fulfilled, noshow, cancelled;
arrived → checked-in, fulfilled, cancelled; checked-in → fulfilled; every status but
entered-in-error → entered-in-error. Moving to booked takes the Slots; to cancelled,
noshow or entered-in-error frees them.

**Reschedule** takes the new time's Slots and frees the old ones in one unit of work
(the new time is taken before the old is given up: a refused new time leaves the booking
as it was); Slots common to both stay held. **Cancel** frees the Slots.

Who (the policy's rules ``appointment.change``, ``.reschedule``, ``.cancel``): the
appointment's organization's staff whose role updates scheduling resources
(``ORG:ADMIN``, ``ORG:DOCTOR``, ``ORG:NURSE``, ``ORG:RECEPTIONIST``) move, reschedule
and cancel; the patient may read, reschedule and cancel their own appointment (through
their own Patient record); lists are the caller's grants (one search). The Slots a move
takes or frees are written with the platform's rights (a named elevation: a patient may
not write Slots), after the rule admitted the caller.

Events (payloads in the README): ``platform.scheduling.appointment_booked``,
``..._cancelled``, ``..._rescheduled``, ``..._status_changed``.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from datetime import date, datetime
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, EmailStr, Field, model_validator

from fhir_server.caller import CallerFhir, FhirUnit
from fhir_server.clock import now_instant
from fhir_server.store import DuplicateDocument
from platform_api.envelope import ApiError, Envelope, conflict, not_found, ok
from platform_api.facade import (
    ApiContext,
    Facade,
    ItemContext,
    SearchParam,
    StatusTable,
    api_context,
)
from platform_api.scheduling import booking
from platform_api.scheduling.common import (
    ATTEMPTS,
    JSON,
    RACE_ERRORS,
    SOURCE,
    UNCONFIRMED_TAG,
    aware_utc,
    day_bounds,
    instant,
    local_id,
    now_utc,
    organization_of,
    owned_by,
    owner_criterion,
    parse_instant,
    reference,
    valid_zone,
    version_of,
    with_tag,
    zone,
)
from platform_api.scheduling.resources import (
    display_name,
    find_resource,
    is_active,
    load_resource,
    time_zone_of,
)
from platform_api.services import Services

log = logging.getLogger("healthplatform.scheduling")

PHONE = r"^\+[1-9]\d{6,14}$"
BOOKED = "platform.scheduling.appointment_booked"
CANCELLED = "platform.scheduling.appointment_cancelled"
RESCHEDULED = "platform.scheduling.appointment_rescheduled"
STATUS_CHANGED = "platform.scheduling.appointment_status_changed"
NOTICES = "scheduling_notices"  # e-mails sent, one per event (idempotent handler)
ACTORS = ("Practitioner", "Location", "Device", "PractitionerRole", "HealthcareService")

Status = Literal["proposed", "pending", "booked", "arrived", "fulfilled", "cancelled",
                 "noshow", "entered-in-error", "checked-in", "waitlist"]
STATUS_ORDER: tuple[str, ...] = ("proposed", "pending", "waitlist", "booked", "arrived",
                                 "checked-in", "fulfilled", "noshow", "cancelled",
                                 "entered-in-error")
STATUS_TABLE = StatusTable.of(
    proposed=("pending", "booked", "waitlist", "cancelled", "entered-in-error"),
    pending=("booked", "waitlist", "cancelled", "entered-in-error"),
    waitlist=("proposed", "pending", "booked", "cancelled", "entered-in-error"),
    booked=("arrived", "checked-in", "fulfilled", "noshow", "cancelled", "entered-in-error"),
    arrived=("checked-in", "fulfilled", "cancelled", "entered-in-error"),
    checked_in=("fulfilled", "entered-in-error"),
    fulfilled=("entered-in-error",),
    noshow=("entered-in-error",),
    cancelled=("entered-in-error",),
    entered_in_error=(),
)
# Moves that give the time back.
RELEASING = frozenset({"cancelled", "noshow", "entered-in-error"})
TOPICS = {"booked": BOOKED, "cancelled": CANCELLED}


# -- payloads ---------------------------------------------------------------------------------
class BookingRequest(BaseModel):
    resource_id: str = Field(min_length=1, max_length=64)
    patient_name: str = Field(min_length=1, max_length=200, examples=["Amina Odhiambo"])
    patient_email: EmailStr | None = Field(default=None, examples=["amina@example.org"])
    patient_phone: str | None = Field(default=None, pattern=PHONE,
                                      examples=["+254712345678"])
    start_time: datetime = Field(examples=["2026-12-01T06:00:00Z"])
    end_time: datetime = Field(examples=["2026-12-01T06:30:00Z"])
    reason: str | None = Field(default=None, max_length=1000,
                               examples=["Antenatal check-up"])

    @model_validator(mode="after")
    def _contact_and_times(self) -> BookingRequest:
        if not self.patient_email and not self.patient_phone:
            raise ValueError("give patient_email or patient_phone")
        if aware_utc(self.end_time) <= aware_utc(self.start_time):
            raise ValueError("end_time must come after start_time")
        return self


class StatusChange(BaseModel):
    status: Status
    reason: str | None = Field(default=None, max_length=1000)


class RescheduleRequest(BaseModel):
    start_time: datetime
    end_time: datetime
    resource_id: str | None = Field(default=None, max_length=64,
                                    description="Another resource of the organization")
    reason: str | None = Field(default=None, max_length=1000)

    @model_validator(mode="after")
    def _times(self) -> RescheduleRequest:
        if aware_utc(self.end_time) <= aware_utc(self.start_time):
            raise ValueError("end_time must come after start_time")
        return self


class CancelRequest(BaseModel):
    reason: str | None = Field(default=None, max_length=1000, examples=["Patient travelling"])


class ContactView(BaseModel):
    name: str | None = None
    email: str | None = None
    phone: str | None = None


class AppointmentView(BaseModel):
    id: str
    status: str
    resource_id: str | None = None
    resource_type: str | None = None
    resource_name: str | None = None
    patient_id: str | None = None
    patient_name: str | None = None
    patient_confirmed: bool = Field(default=True, description="false: booked without "
                                    "signing in, for the contact given, until the "
                                    "organization's staff confirm who it is")
    patient_contact: ContactView | None = Field(default=None, description="The contact "
                                                "an unconfirmed booking gave")
    organization_id: str | None = None
    start_time: str | None = None
    end_time: str | None = None
    reason: str | None = None
    slot_ids: list[str] = []
    cancellation_reason: str | None = None
    request: bool = Field(default=False, description="Began as an appointment request")
    created_at: str | None = None
    updated_at: str | None = None


class AppointmentQuery(BaseModel):
    resource_id: Annotated[str | None, SearchParam("actor")] = Field(None, max_length=64)
    patient_id: Annotated[str | None, SearchParam("patient", "Patient/{}")] = Field(
        None, max_length=64)
    organization_id: Annotated[str | None, SearchParam(
        "_security", "urn:healthplatform:organization|{}")] = Field(None, max_length=64)
    status: Annotated[Status | None, SearchParam("status")] = None
    date: dt.date | None = Field(None, description="Appointments starting that day (UTC)")


class SlotView(BaseModel):
    slot_id: str
    schedule_id: str | None = None
    start: str = Field(description="Local time in the resource's zone, with its offset")
    end: str
    start_utc: str
    end_utc: str


class AvailabilityView(BaseModel):
    resource_id: str
    resource_name: str | None = None
    date: str
    time_zone: str
    slots: list[SlotView]


class KanbanColumn(BaseModel):
    status: str
    count: int
    appointments: list[AppointmentView]


class KanbanView(BaseModel):
    date: str
    time_zone: str
    total: int
    columns: list[KanbanColumn]


# -- mapping ----------------------------------------------------------------------------------
def participant(appointment: JSON, kinds: tuple[str, ...]) -> JSON | None:
    for item in appointment.get("participant") or []:
        ref = (item.get("actor") or {}).get("reference", "")
        if ref.split("/")[0] in kinds:
            return item  # type: ignore[no-any-return]
    return None


def actor_of(appointment: JSON) -> JSON:
    return (participant(appointment, ACTORS) or {}).get("actor") or {}


CONTACT = "contact"  # the id of the contained Patient an unconfirmed booking holds


def patient_of(appointment: JSON) -> JSON:
    """The patient participant's actor: ``Patient/<id>``, or ``#contact`` while the
    booking is unconfirmed."""
    found = participant(appointment, ("Patient",)) or next(
        (p for p in appointment.get("participant") or []
         if (p.get("actor") or {}).get("reference") == f"#{CONTACT}"), None)
    return (found or {}).get("actor") or {}


def contact_of(appointment: JSON) -> JSON | None:
    """The contact an unconfirmed booking holds (a contained Patient), if any."""
    return next((c for c in appointment.get("contained") or []
                 if c.get("resourceType") == "Patient" and c.get("id") == CONTACT), None)


def telecom_value(patient: JSON, system: str) -> str | None:
    return next((t.get("value") for t in patient.get("telecom") or []
                 if t.get("system") == system and t.get("value")), None)


def contact_view(contact: JSON | None) -> ContactView | None:
    if contact is None:
        return None
    return ContactView(name=patient_display(contact), email=telecom_value(contact, "email"),
                       phone=telecom_value(contact, "phone"))


def appointment_from_fhir(appointment: JSON) -> JSON:
    actor, patient = actor_of(appointment), patient_of(appointment)
    tags = (appointment.get("meta") or {}).get("tag") or []
    contact = contact_of(appointment)
    return AppointmentView(
        id=appointment["id"], status=appointment["status"], resource_id=local_id(actor),
        resource_type=(actor.get("reference") or "/").split("/")[0] or None,
        resource_name=actor.get("display"), patient_id=local_id(patient, "Patient"),
        patient_name=patient.get("display"), patient_confirmed=contact is None,
        patient_contact=contact_view(contact), organization_id=organization_of(appointment),
        start_time=appointment.get("start"), end_time=appointment.get("end"),
        reason=(appointment.get("reasonCode") or [{}])[0].get("text"),
        slot_ids=[i for ref in appointment.get("slot") or [] if (i := local_id(ref, "Slot"))],
        cancellation_reason=(appointment.get("cancelationReason") or {}).get("text"),
        request=any(t.get("code") == "appointment-request" for t in tags),
        created_at=appointment.get("created"),
        updated_at=(appointment.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


def new_appointment(actor: JSON, patient: JSON, status: str, *, start: datetime | None,
                    end: datetime | None, slots: list[JSON], reason: str | None,
                    actor_status: str = "accepted") -> JSON:
    """The Appointment of ``patient`` (a stored Patient, or the contact a booking without
    signing in gave: a Patient with the id ``contact`` and no ``meta``, held contained
    and tagged unconfirmed) with the resource ``actor``."""
    contact = patient.get("id") == CONTACT and "meta" not in patient
    appointment: JSON = {
        "resourceType": "Appointment", "status": status, "created": now_instant(),
        "participant": [
            {"actor": {"reference": f"#{CONTACT}" if contact else f"Patient/{patient['id']}",
                       "display": patient_display(patient)},
             "required": "required", "status": "accepted"},
            {"actor": {"reference": reference(actor), "display": display_name(actor)},
             "required": "required", "status": actor_status}]}
    if contact:
        appointment["contained"] = [patient]
        appointment = with_tag(appointment, UNCONFIRMED_TAG)
    if start is not None and end is not None:
        appointment.update(start=instant(start), end=instant(end),
                           minutesDuration=int((end - start).total_seconds() // 60))
    if slots:
        appointment["slot"] = booking.slot_references(slots)
    if reason:
        appointment["reasonCode"] = [{"text": reason}]
    return owned_by(appointment, organization_of(actor))


def patient_display(patient: JSON) -> str | None:
    name = (patient.get("name") or [{}])[0]
    return name.get("text") or " ".join([*name.get("given", []), name.get("family", "")]
                                        ).strip() or None


def event_payload(appointment: JSON, **extra: Any) -> JSON:
    actor = actor_of(appointment)
    return {"appointment_id": appointment["id"], "status": appointment["status"],
            "organization_id": organization_of(appointment),
            "resource": actor.get("reference"), "resource_id": local_id(actor),
            "patient_id": local_id(patient_of(appointment), "Patient"),
            "start": appointment.get("start"), "end": appointment.get("end"),
            "slot_ids": [i for r in appointment.get("slot") or [] if (i := local_id(r))],
            **extra}


appointments = Facade(
    resource="Appointment", name="Appointment", create=BookingRequest, view=AppointmentView,
    query=AppointmentQuery, to_fhir=lambda payload, ctx, existing: existing or {},
    from_fhir=appointment_from_fhir, statuses=STATUS_TABLE, sort="date",
    list_criteria=lambda ctx, query: _day_criteria(query.date if query else None),
    tags=["scheduling"],
    summaries={"list": "List appointments (the caller's organizations', or their own)",
               "get": "An appointment"},
)


def _day_criteria(day: date | None, tz_name: str = "UTC") -> list[tuple[str, str]]:
    if day is None:
        return []
    start, end = day_bounds(day, zone(tz_name))
    return [("date", f"ge{instant(start)}"), ("date", f"lt{instant(end)}")]


# -- who may change an appointment ------------------------------------------------------------
def authorize(ctx: ApiContext, action: str, appointment: JSON) -> None:
    """403 unless the policy's rule for ``action`` admits the caller on this appointment:
    its organization, and its patient (the ``Patient/<id>`` it names: an unconfirmed
    booking's contact is nobody's own record)."""
    ctx.authorize(action, organization_of(appointment),
                  patient_id=local_id(patient_of(appointment), "Patient"))


# -- the writes ---------------------------------------------------------------------------
Change = Callable[[CallerFhir, FhirUnit, JSON], Awaitable[tuple[JSON, str | None, JSON]]]


async def write_change(fhir: CallerFhir, appointment_id: str, change: Change) -> JSON:
    """Apply ``change(fhir, unit, latest) -> (changed, topic, event extras)`` to the latest
    version of the appointment in a unit of ``fhir`` (the platform's rights, elevated for
    an action the policy admitted), again on fresh data when it lost a race (a Slot or the
    appointment changed meanwhile); the stored appointment."""
    for _attempt in range(ATTEMPTS):
        latest = await fhir.read_json("Appointment", appointment_id)
        try:
            async with fhir.unit() as unit:
                changed, topic, extra = await change(fhir, unit, latest)
                staged = await unit.update(changed, if_match=version_of(latest))
                if topic is not None:
                    unit.emit(topic, event_payload(changed, **extra), source_service=SOURCE)
                await unit.commit()
        except RACE_ERRORS:
            continue
        assert staged.result is not None
        return orjson.loads(staged.result.body)  # type: ignore[no-any-return]
    raise booking.unavailable("The time kept changing while it was being booked; retry")


async def actor_for(fhir: CallerFhir, appointment: JSON) -> JSON:
    actor_id = local_id(actor_of(appointment))
    actor = await find_resource(fhir, actor_id or "")
    if actor is None:
        raise conflict("RESOURCE_UNAVAILABLE", "The appointment's resource is no longer "
                       "schedulable")
    return actor


def move_to(target: str, *, reason: str | None = None,
            start: datetime | None = None, end: datetime | None = None,
            actor: JSON | None = None) -> Change:
    """A status move through the table, taking the time's Slots when it books and giving
    them back when it releases."""
    async def change(fhir: CallerFhir, unit: FhirUnit, latest: JSON
                     ) -> tuple[JSON, str | None, JSON]:
        STATUS_TABLE.check(latest["status"], target)
        changed = dict(latest)
        extra: JSON = {"previous_status": latest["status"]}
        if target == "booked":
            begins = start or (parse_instant(latest["start"]) if latest.get("start") else None)
            ends = end or (parse_instant(latest["end"]) if latest.get("end") else None)
            if begins is None or ends is None:
                raise ApiError(422, "VALIDATION_ERROR", "start_time: a time is needed to "
                               "book this appointment", field="start_time")
            who = actor or await actor_for(fhir, latest)
            slots = await booking.free_time(fhir, who, begins, ends)
            await booking.take(unit, slots)
            changed.update(start=instant(begins), end=instant(ends),
                           slot=booking.slot_references(slots),
                           minutesDuration=int((ends - begins).total_seconds() // 60))
            changed["participant"] = [{**p, "status": "accepted"}
                                      for p in latest.get("participant") or []]
        if target in RELEASING:
            extra["freed_slot_ids"] = await booking.release(fhir, unit,
                                                            latest.get("slot") or [])
        if target == "cancelled" and reason:
            changed["cancelationReason"] = {"text": reason}
        if reason:
            extra["reason"] = reason
        changed["status"] = target
        return changed, TOPICS.get(target, STATUS_CHANGED), extra
    return change


def reschedule_to(start: datetime, end: datetime, actor: JSON | None, reason: str | None
                  ) -> Change:
    async def change(fhir: CallerFhir, unit: FhirUnit, latest: JSON
                     ) -> tuple[JSON, str | None, JSON]:
        if latest["status"] != "booked":
            raise conflict("INVALID_TRANSITION", f"Only a booked appointment can be "
                           f"rescheduled (this one is {latest['status']!r})")
        who = actor or await actor_for(fhir, latest)
        held = frozenset(i for r in latest.get("slot") or [] if (i := local_id(r, "Slot")))
        same_actor = reference(who) == actor_of(latest).get("reference")
        slots = await booking.free_time(fhir, who, start, end,
                                        held=held if same_actor else frozenset())
        await booking.take(unit, slots)  # the new time first ...
        kept = frozenset(s["id"] for s in slots)
        await booking.release(fhir, unit, latest.get("slot") or [], keep=kept)  # ... then
        changed = {**latest, "start": instant(start), "end": instant(end),
                   "minutesDuration": int((end - start).total_seconds() // 60),
                   "slot": booking.slot_references(slots)}
        if not same_actor:
            changed["participant"] = [
                {**p, "actor": {"reference": reference(who), "display": display_name(who)}}
                if (p.get("actor") or {}).get("reference", "").split("/")[0] in ACTORS else p
                for p in latest.get("participant") or []]
        extra = {"previous_start": latest.get("start"), "previous_end": latest.get("end"),
                 "previous_resource": actor_of(latest).get("reference"), "reason": reason}
        return changed, RESCHEDULED, extra
    return change


# -- routes ---------------------------------------------------------------------------------
router = APIRouter(tags=["scheduling"])


@router.get("/api/appointments/availability", response_model=Envelope[AvailabilityView],
            summary="A resource's free slots on a day, in its time zone and in UTC")
async def availability(resource_id: Annotated[str, Query(min_length=1, max_length=64)],
                       day: Annotated[date, Query(alias="date", description="YYYY-MM-DD, in "
                                                  "the resource's time zone")],
                       ctx: ApiContext = Depends(api_context)) -> Any:
    actor = await load_resource(ctx, resource_id)
    tz_name = time_zone_of(actor)
    tz = zone(tz_name)
    start, end = day_bounds(day, tz)
    found: list[JSON] = []
    if is_active(actor) and end > now_utc():
        # Slots are the organization's inventory: its scheduling staff read them as
        # themselves; anyone else (a patient choosing a time) is shown the free ones
        # through an elevation.
        slots_reader = ctx.fhir if ctx.may("schedule.write", organization_of(actor)) else \
            ctx.elevate("appointment.availability: read a resource's free Slots")
        found = await booking.resource_slots(slots_reader, actor, [
            ("status", "free"), ("start", f"ge{instant(max(start, now_utc()))}"),
            ("start", f"lt{instant(end)}"), ("_sort", "start")])
    return ok(AvailabilityView(
        resource_id=actor["id"], resource_name=display_name(actor), date=day.isoformat(),
        time_zone=tz_name, slots=[SlotView(
            slot_id=s["id"], schedule_id=local_id(s.get("schedule"), "Schedule"),
            start=parse_instant(s["start"]).astimezone(tz).isoformat(),
            end=parse_instant(s["end"]).astimezone(tz).isoformat(),
            start_utc=s["start"], end_utc=s["end"]) for s in found]).model_dump())


@router.get("/api/appointments/kanban", response_model=Envelope[KanbanView],
            summary="The day's appointments grouped by status")
async def kanban(day: Annotated[date, Query(alias="date", description="YYYY-MM-DD")],
                 ctx: ApiContext = Depends(api_context),
                 organization_id: Annotated[str | None, Query(max_length=64)] = None,
                 resource_id: Annotated[str | None, Query(max_length=64)] = None,
                 time_zone: Annotated[str | None, Query(description="IANA zone of the day "
                                                        "(default: the resource's, or UTC)"
                                                        )] = None) -> Any:
    tz_name = time_zone or "UTC"
    criteria: list[tuple[str, str]] = [("_sort", "date")]
    if resource_id is not None:
        actor = await load_resource(ctx, resource_id)
        tz_name = time_zone or time_zone_of(actor)
        criteria.append(("actor", reference(actor)))
    if organization_id is not None:
        criteria.append(owner_criterion(organization_id))
    try:
        criteria += _day_criteria(day, valid_zone(tz_name))
    except ValueError as exc:
        raise ApiError(422, "VALIDATION_ERROR", f"time_zone: {exc}", field="time_zone"
                       ) from None
    found = await ctx.fhir.search("Appointment", criteria)
    views = [appointment_from_fhir(a) for a in found]
    columns = [{"status": s, "count": len(items), "appointments": items}
               for s in STATUS_ORDER
               if (items := [v for v in views if v["status"] == s]) or s in (
                   "booked", "arrived", "checked-in", "fulfilled", "cancelled", "noshow")]
    return ok({"date": day.isoformat(), "time_zone": tz_name, "total": len(views),
               "columns": columns})


appointments.mount(router, "/api/appointments", ops=("list", "get"))


@appointments.route("PATCH", "/{resource_id}/status", body=StatusChange,
                    summary="Move an appointment's status through the status table")
async def change_status(ctx: ItemContext[StatusChange]) -> JSON:
    assert ctx.body is not None
    authorize(ctx, "appointment.change", ctx.resource)
    fhir = ctx.elevate("appointment.change: take or free the appointment's Slots")
    return await write_change(fhir, ctx.id, move_to(ctx.body.status, reason=ctx.body.reason))


@appointments.route("POST", "/{resource_id}/reschedule", body=RescheduleRequest,
                    summary="Move a booked appointment to another free time (atomically)")
async def reschedule(ctx: ItemContext[RescheduleRequest]) -> JSON:
    assert ctx.body is not None
    authorize(ctx, "appointment.reschedule", ctx.resource)
    start, end = aware_utc(ctx.body.start_time), aware_utc(ctx.body.end_time)
    if start <= now_utc():
        raise ApiError(422, "VALIDATION_ERROR", "start_time: must be in the future",
                       field="start_time")
    actor = None
    if ctx.body.resource_id is not None:
        actor = await find_resource(ctx.fhir, ctx.body.resource_id)
        if actor is None or not is_active(actor):
            raise not_found("Resource")
        if organization_of(actor) != organization_of(ctx.resource):
            raise conflict("OTHER_ORGANIZATION", "An appointment moves to a resource of "
                           "its own organization only")
    fhir = ctx.elevate("appointment.reschedule: take the new time's Slots, free the old")
    return await write_change(fhir, ctx.id, reschedule_to(start, end, actor, ctx.body.reason))


@appointments.route("POST", "/{resource_id}/cancel", body=CancelRequest,
                    summary="Cancel an appointment; its slots become free")
async def cancel(ctx: ItemContext[CancelRequest]) -> JSON:
    authorize(ctx, "appointment.cancel", ctx.resource)
    reason = ctx.body.reason if ctx.body else None
    fhir = ctx.elevate("appointment.cancel: free the appointment's Slots")
    return await write_change(fhir, ctx.id, move_to("cancelled", reason=reason))


# -- confirmations by e-mail ---------------------------------------------------------------------
SUBJECTS = {BOOKED: "Your appointment is booked", CANCELLED: "Your appointment is cancelled",
            RESCHEDULED: "Your appointment has moved"}


async def send_notice(services: Services, fhir: CallerFhir, event: JSON) -> None:
    """E-mail the patient (or the contact an unconfirmed booking gave) about a booked,
    moved or cancelled appointment: once per event (a redelivered event finds its notice
    recorded); a refused send fails the handler, so the event becomes a dead letter to
    retry. ``fhir``: the rights the handler was elevated to."""
    mailer = services.auth.mailer
    if not mailer.enabled:
        mailer.report_disabled(SUBJECTS[event["topic"]])
        return
    payload = event["payload"]
    appointment = await fhir.find_json("Appointment", payload["appointment_id"])
    patient_id = local_id(patient_of(appointment or {}), "Patient")
    patient = contact_of(appointment or {}) or (
        await fhir.find_json("Patient", patient_id) if patient_id else None)
    address = telecom_value(patient or {}, "email")
    if appointment is None or not address:
        return
    try:
        async with services.store.unit_of_work() as uow:
            uow.insert_document(NOTICES, event["id"], {"id": event["id"], "to_patient":
                                                       payload.get("patient_id"),
                                                       "sent_at": now_instant()})
            await uow.commit()
    except DuplicateDocument:
        return
    body = await _notice_text(services, fhir, event["topic"], appointment, patient or {})
    if not await mailer.send(address, SUBJECTS[event["topic"]], body):
        async with services.store.unit_of_work() as uow:
            uow.delete_document(NOTICES, event["id"])
            await uow.commit()
        raise RuntimeError(f"the {event['topic']} notice could not be sent")


async def _notice_text(services: Services, fhir: CallerFhir, topic: str, appointment: JSON,
                       patient: JSON) -> str:
    actor = await find_resource(fhir, local_id(actor_of(appointment)) or "")
    tz = zone(time_zone_of(actor) if actor else "UTC")
    when = parse_instant(appointment["start"]).astimezone(tz) if appointment.get(
        "start") else None
    what = {BOOKED: "is booked", CANCELLED: "is cancelled", RESCHEDULED: "has moved to a "
            "new time"}[topic]
    lines = [f"Dear {patient_display(patient) or 'patient'},", "",
             f"Your appointment with {actor_of(appointment).get('display') or 'the clinic'} "
             f"{what}."]
    if when is not None:
        lines.append(f"When: {when:%A %d %B %Y, %H:%M} ({tz.key})")
    lines += [f"Reference: {appointment['id']}", "",
              f"{services.settings.service_name}"]
    return "\n".join(lines)


def subscribe_notices(services: Services) -> None:
    # The handler works for the platform (no caller): it reads each appointment and whom
    # to write to with rights elevated once, here.
    fhir = services.policy.elevate("appointment notices: read the appointment, its "
                                   "resource and the patient's e-mail address")

    async def notice(event: JSON) -> None:
        await send_notice(services, fhir, event)
    for topic in SUBJECTS:
        services.bus.subscribe(topic, notice)


__all__ = ["BOOKED", "CANCELLED", "CONTACT", "RESCHEDULED", "STATUS_CHANGED", "STATUS_TABLE",
           "BookingRequest", "appointment_from_fhir", "appointments", "authorize",
           "contact_of", "new_appointment", "router", "subscribe_notices"]

"""Booking a free time (``POST /api/appointments``, public), and confirming whom a booking
made without signing in is for.

**Without signing in** (the specification makes the route public; the access table's
``booking`` rate class holds it tight) a booking never looks for, names or uses a
registered patient: the Appointment holds the contact as given (name, e-mail, phone) as
a contained Patient (``participant.actor`` ``#contact``, tag
``urn:healthplatform:scheduling|unconfirmed-patient``), and the answer has the same
fields and values whether or not the e-mail or phone is known to the organization
(``patient_id`` null, ``patient_confirmed`` false, ``patient_contact`` what was sent).
Nobody learns from a booking who is a patient of which clinic.

**Signed in** with one's own Patient record (the policy's ``appointment.book``), a
booking whose e-mail (compared case-insensitively) or phone is one of the caller's own
(their account's e-mail, their Patient record's telecom) is for themselves: the
Appointment names their Patient. Anything else is a booking for someone else, held as a
contact like one made without signing in.

**Confirming** (``POST /api/appointments/{id}/confirm-patient``, the organization's
staff: the policy's ``appointment.confirm-patient``): ``patient_id`` names the Patient
the booking is for (one the caller may see); without it the contact is registered as a
new Patient of the organization (``managingOrganization`` and owner: the organization),
unless the organization has patients with the contact's e-mail (case-insensitive) or
phone: then 409 ``PATIENT_MATCHES`` names them, to confirm one or send
``register_new: true``. The contained contact and the tag go; event
``platform.scheduling.appointment_patient_confirmed``. The staff write with their own
rights (their role writes Patients and Appointments); only the booking itself (Slots, an
Appointment nobody could write) is written with the platform's, through the policy's
named elevation.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from fhir_server.caller import CallerFhir, FhirUnit
from fhir_server.clock import now_instant
from platform_api.auth.dependencies import optional_principal
from platform_api.auth.principal import Principal
from platform_api.envelope import ApiError, Envelope, conflict, created, not_found
from platform_api.facade import ApiContext, ItemContext, api_context, require_patient
from platform_api.scheduling import booking
from platform_api.scheduling.appointments import (
    BOOKED,
    CONTACT,
    AppointmentView,
    BookingRequest,
    appointment_from_fhir,
    appointments,
    contact_of,
    event_payload,
    new_appointment,
    patient_display,
    patient_of,
)
from platform_api.scheduling.common import (
    ATTEMPTS,
    JSON,
    RACE_ERRORS,
    SOURCE,
    UNCONFIRMED_TAG,
    aware_utc,
    now_utc,
    organization_of,
    owned_by,
    owner_criterion,
    with_tag,
)
from platform_api.scheduling.resources import find_resource, is_active
from platform_api.services import request_services

PATIENT_CONFIRMED = "platform.scheduling.appointment_patient_confirmed"
MAX_MATCHES = 20


class ConfirmPatient(BaseModel):
    patient_id: str | None = Field(default=None, max_length=64, description="The "
                                   "organization's Patient the booking is for")
    register_new: bool = Field(default=False, description="Without patient_id: register the "
                           "contact as a new Patient even when patients with its e-mail "
                           "or phone exist")


# -- the contact ------------------------------------------------------------------------------
def _split_name(text: str) -> JSON:
    words = text.split()
    name: JSON = {"use": "official", "text": text}
    if len(words) > 1:
        name["given"], name["family"] = words[:-1], words[-1]
    elif words:
        name["given"] = words
    return name


def _telecom(email: str | None, phone: str | None) -> list[JSON]:
    telecom = []
    if phone:
        telecom.append({"system": "phone", "value": phone, "use": "mobile"})
    if email:
        telecom.append({"system": "email", "value": email})
    return telecom


def contact(body: BookingRequest) -> JSON:
    """The contact a booking gives, as the Patient held contained in its Appointment."""
    return {"resourceType": "Patient", "id": CONTACT, "name": [_split_name(body.patient_name)],
            "telecom": _telecom(str(body.patient_email) if body.patient_email else None,
                                body.patient_phone)}


def same_email(first: str | None, second: str | None) -> bool:
    """E-mail addresses compared as people write them: case does not matter."""
    return bool(first and second and first.casefold() == second.casefold())


def telecoms(patient: JSON, system: str) -> list[str]:
    return [str(t["value"]) for t in patient.get("telecom") or []
            if t.get("system") == system and t.get("value")]


def is_own_contact(body: BookingRequest, principal: Principal, own: JSON) -> bool:
    """Whether the booking's contact is the signed-in caller's own."""
    email = str(body.patient_email) if body.patient_email else None
    return any(same_email(email, known) for known in [principal.email,
                                                      *telecoms(own, "email")]) \
        or bool(body.patient_phone and body.patient_phone in telecoms(own, "phone"))


# -- booking ----------------------------------------------------------------------------------
def _times(body: BookingRequest) -> tuple[datetime, datetime]:
    start, end = aware_utc(body.start_time), aware_utc(body.end_time)
    if start <= now_utc():
        raise ApiError(422, "VALIDATION_ERROR", "start_time: must be in the future",
                       field="start_time")
    return start, end


async def _resource(fhir: CallerFhir, resource_id: str) -> tuple[JSON, str]:
    actor = await find_resource(fhir, resource_id)
    if actor is None or not is_active(actor):
        raise not_found("Resource")
    organization_id = organization_of(actor)
    if organization_id is None:
        raise conflict("RESOURCE_UNAVAILABLE", "This resource belongs to no organization")
    return actor, organization_id


async def book(fhir: CallerFhir, actor: JSON, patient: JSON, body: BookingRequest) -> JSON:
    """Take the time's Slots and store the Appointment of ``patient`` (a Patient, or the
    contact) in one unit of ``fhir`` (the platform's rights, elevated for the booking),
    again on fresh Slots when a race was lost; the stored Appointment."""
    start, end = _times(body)
    for _attempt in range(ATTEMPTS):
        slots = await booking.free_time(fhir, actor, start, end)
        try:
            async with fhir.unit() as unit:
                await booking.take(unit, slots)
                appointment = new_appointment(actor, patient, "booked", start=start, end=end,
                                              slots=slots, reason=body.reason)
                staged = await unit.create(appointment)
                stored = {**appointment, "id": staged.id}
                unit.emit(BOOKED, event_payload(stored, channel="public"),
                          source_service=SOURCE)
                await unit.commit()
        except RACE_ERRORS:
            continue
        assert staged.result is not None
        return orjson.loads(staged.result.body)  # type: ignore[no-any-return]
    raise booking.unavailable()


async def _book_signed_in(ctx: ApiContext, body: BookingRequest) -> JSON:
    own_id = ctx.access.subject.patient_id
    own = await ctx.fhir.find_json("Patient", own_id) if own_id else None
    if own is None or not is_own_contact(body, ctx.principal, own):
        # Staff, or a patient booking for someone else: the contact, held as anonymous.
        fhir = ctx.elevate("appointment.book: take the Slots and store the booking for the "
                           "contact given")
        actor, _organization = await _resource(fhir, body.resource_id)
        return await book(fhir, actor, contact(body), body)
    actor, organization_id = await _resource(ctx.fhir, body.resource_id)
    ctx.authorize("appointment.book", organization_id, patient_id=own["id"])
    fhir = ctx.elevate("appointment.book: take the Slots and store the patient's own "
                       "appointment")
    return await book(fhir, actor, own, body)


router = APIRouter(tags=["scheduling"])


@router.post("/api/appointments", status_code=201, response_model=Envelope[AppointmentView],
             summary="Book a free time of a resource (public; signed in: for yourself; 409 "
                     "when it is not free)")
async def book_appointment(body: BookingRequest, request: Request,
                           principal: Principal | None = Depends(optional_principal)) -> Any:
    if principal is not None:
        ctx = await api_context(request, principal)
        return created(appointment_from_fhir(await _book_signed_in(ctx, body)))
    services = request_services(request)
    # No caller: the booking is the platform's to write, for the contact as given.
    fhir = services.policy.elevate("appointment.book: take the Slots and store the booking "
                                   "for the contact given")
    actor, _organization = await _resource(fhir, body.resource_id)
    return created(appointment_from_fhir(await book(fhir, actor, contact(body), body)))


# -- confirming who it is ---------------------------------------------------------------------
async def matching_patients(ctx: ApiContext, organization_id: str, held: JSON) -> list[JSON]:
    """The organization's patients the caller sees whose e-mail is the contact's (any
    case: the full-text index finds the candidates, compared here exactly but for case)
    or whose phone is the contact's."""
    found: dict[str, JSON] = {}
    for email in telecoms(held, "email"):
        for patient in await ctx.fhir.search("Patient", [
                owner_criterion(organization_id), ("_content", email),
                ("_count", str(MAX_MATCHES))]):
            if any(same_email(email, known) for known in telecoms(patient, "email")):
                found[patient["id"]] = patient
    for phone in telecoms(held, "phone"):
        for patient in await ctx.fhir.search("Patient", [
                owner_criterion(organization_id), ("phone", phone),
                ("_count", str(MAX_MATCHES))]):
            found[patient["id"]] = patient
    return list(found.values())


def registered(held: JSON, organization_id: str) -> JSON:
    """The contact as a new Patient of the organization."""
    return owned_by({"resourceType": "Patient", "active": True, "name": held.get("name", []),
                     "telecom": held.get("telecom", []),
                     "managingOrganization": {"reference": f"Organization/{organization_id}"}},
                    organization_id)


def confirmed(appointment: JSON, patient: JSON) -> JSON:
    """The appointment naming ``patient`` instead of the contact it held."""
    changed = with_tag({k: v for k, v in appointment.items() if k != "contained"},
                       UNCONFIRMED_TAG, present=False)
    changed["participant"] = [
        {**p, "actor": {"reference": f"Patient/{patient['id']}",
                        "display": patient_display(patient)}}
        if (p.get("actor") or {}).get("reference") == f"#{CONTACT}" else p
        for p in appointment.get("participant") or []]
    return changed


@appointments.route("POST", "/{resource_id}/confirm-patient", body=ConfirmPatient,
                    summary="Say whom a booking made without signing in is for (the "
                            "organization's staff): link a Patient or register the contact",
                    conflicts={"PATIENT_CONFIRMED": "the booking names its Patient already",
                               "PATIENT_MATCHES": "patients with the contact's e-mail or "
                                                  "phone exist: name one, or register"})
async def confirm_patient(ctx: ItemContext[ConfirmPatient]) -> JSON:
    appointment = ctx.resource
    organization_id = organization_of(appointment)
    ctx.authorize("appointment.confirm-patient", organization_id)
    held = contact_of(appointment)
    if held is None or organization_id is None or patient_of(appointment).get(
            "reference") != f"#{CONTACT}":
        raise conflict("PATIENT_CONFIRMED", "This appointment names its patient already")
    body = ctx.body or ConfirmPatient()
    patient: JSON | None = None
    if body.patient_id is not None:
        patient = await require_patient(ctx, body.patient_id)
    elif not body.register_new:
        matches = await matching_patients(ctx, organization_id, held)
        if matches:
            raise conflict("PATIENT_MATCHES", "Patients of the organization have this "
                           "contact's e-mail or phone: confirm one with patient_id ("
                           + ", ".join(sorted(m["id"] for m in matches)) + "), or register "
                           "a new patient with register_new: true")
    new = patient is None

    async def alongside(unit: FhirUnit, resource: JSON) -> JSON:
        """The new Patient (if any), the appointment naming it and the event, in the unit
        that stores the appointment."""
        nonlocal patient
        if patient is None:
            fresh = registered(held, organization_id)
            staged = await unit.create(fresh)
            patient = {**fresh, "id": staged.id}
        changed = confirmed(resource, patient)
        unit.emit(PATIENT_CONFIRMED, event_payload(
            changed, registered=new, confirmed_by=ctx.principal.user_id,
            confirmed_at=now_instant()), source_service=SOURCE)
        return changed

    return await ctx.save(appointment, alongside=alongside)


__all__ = ["PATIENT_CONFIRMED", "book", "confirm_patient", "contact", "router"]

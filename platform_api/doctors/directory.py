"""The public doctor directory: search, profiles and availability, without signing in.

Only verified, active doctors are public (``_tag=urn:healthplatform:doctor-verification|
verified``, ``active=true``), and a public view holds only the name, the specialties and
what the doctor chose to publish (:func:`~platform_api.doctors.records.public_view`):
never contact details, identifiers or the licence. Anonymous callers read through a
fixed access (:data:`~platform_api.doctors.records.PUBLIC`: the directory and the
schedules, nothing else).

``GET /api/doctors/search`` is one FHIR search over Practitioner (with the page's roles
and organizations included):

- ``name``: each word the start of a name part (``name=``); when no doctor's name
  starts so, names that sound alike (``phonetic=``, Metaphone: Mohamed finds Muhammad);
- ``specialty``: a code (``_has:PractitionerRole:practitioner:specialty=``; SNOMED CT
  ``394579002`` or ``system|code``), or words of its name (``specialty:text``);
- ``organization_id``: practises there (``_has:PractitionerRole:practitioner:
  organization=``), ``city`` (``address-city``), ``language`` (``communication``, BCP-47):
  each only among the doctors who publish it (``_tag=urn:healthplatform:published|...``),
  so a search cannot reveal what a doctor keeps private;
- ``available_on`` (a date, UTC): doctors with a free Slot starting that day. R4 has no
  search parameter joining a Slot's status and start with its Schedule's actor, so the
  practitioners are first looked up among that day's free Slots (``Slot?status=free&
  start=...&_include=Slot:schedule``, one search) and the list then narrowed to them.

``GET /api/doctors/:id/availability?from=YYYY-MM-DD&days=7``: the doctor's free Slots in
the range (``Slot?schedule.actor=Practitioner/<id>&status=free&start=...``, sorted), per
day the number of free slots and whether an active Schedule's planning horizon covers it
(what a schedule without slots yet says), the active Schedules, and the next free slot.
Schedules and Slots are the standard resources the Scheduling area writes (a doctor's
Schedule has the Practitioner among its actors).
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from fhir_server.caller import CallerFhir
from platform_api.doctors.records import (
    PUBLISHED_TAG,
    VERIFICATION_TAG,
    VIEW_INCLUDES,
    PublicDoctorView,
    assemble,
    public_fhir,
    verification_status,
)
from platform_api.envelope import (
    ApiError,
    Envelope,
    PageEnvelope,
    Pagination,
    not_found,
    ok,
    pagination,
)
from platform_api.facade import search_page
from platform_api.fhir_values import coding, concept_text, local_id
from platform_api.services import request_services

JSON = dict[str, Any]
MAX_SLOTS_SHOWN = 500


class DoctorSearch(BaseModel):
    name: str | None = Field(None, min_length=1, max_length=100, examples=["Wanjiru"])
    specialty: str | None = Field(None, min_length=1, max_length=200,
                                  examples=["394579002", "cardiology"])
    organization_id: str | None = Field(None, max_length=64)
    city: str | None = Field(None, min_length=1, max_length=100, examples=["Nairobi"])
    language: str | None = Field(None, pattern=r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})*$",
                                 examples=["sw"])
    available_on: date | None = Field(None, description="A free slot starts that day (UTC)")


class SlotView(BaseModel):
    id: str
    start: str | None
    end: str | None
    schedule_id: str | None
    service_type: str | None = None


class DayView(BaseModel):
    date: str
    free_slots: int
    scheduled: bool = Field(description="An active schedule's planning horizon covers it")


class ScheduleView(BaseModel):
    id: str
    planning_horizon_start: str | None = None
    planning_horizon_end: str | None = None
    service_types: list[str] = []
    comment: str | None = None


class AvailabilityView(BaseModel):
    doctor_id: str
    start: str
    end: str
    next_available: str | None
    days: list[DayView]
    slots: list[SlotView]
    schedules: list[ScheduleView]


def _published(field: str) -> tuple[str, str]:
    return ("_tag", f"{PUBLISHED_TAG}|{field}")


def _criteria(query: DoctorSearch) -> list[tuple[str, str]]:
    criteria = [("_tag", f"{VERIFICATION_TAG}|verified"), ("active", "true")]
    if query.specialty:
        code = query.specialty.strip()
        criteria.append(("_has:PractitionerRole:practitioner:specialty", code)
                        if re.search(r"\d", code) else
                        ("_has:PractitionerRole:practitioner:specialty:text", code))
    if query.organization_id:
        criteria += [("_has:PractitionerRole:practitioner:organization",
                      f"Organization/{query.organization_id}"), _published("organizations")]
    if query.city:
        criteria += [("address-city", query.city), _published("city")]
    if query.language:
        criteria += [("communication", query.language), _published("languages")]
    return criteria


async def _available_on(fhir: CallerFhir, day: date) -> list[str]:
    """The practitioners with a free slot starting on ``day``."""
    found = await fhir.search("Slot", [
        ("status", "free"), ("start", f"ge{day.isoformat()}"),
        ("start", f"lt{(day + timedelta(days=1)).isoformat()}"),
        ("_include", "Slot:schedule")], included=True)
    return sorted({practitioner for s in found if s["resourceType"] == "Schedule"
                   for actor in s.get("actor", [])
                   if (practitioner := local_id(actor, "Practitioner"))})


router = APIRouter(tags=["doctors"])


@router.get("/api/doctors/search", response_model=PageEnvelope[PublicDoctorView],
            summary="Find verified doctors (public): name, specialty, organization, city, "
                    "language, available on a date")
async def search_doctors(request: Request, query: Annotated[DoctorSearch, Query()],
                         page: Pagination = Depends(pagination)) -> Any:
    fhir = public_fhir(request_services(request))
    criteria = _criteria(query)
    if query.available_on is not None:
        available = await _available_on(fhir, query.available_on)
        if not available:
            return page.respond([], 0)
        criteria.append(("_id", ",".join(available)))
    words = (query.name or "").split()
    sort = [*VIEW_INCLUDES, ("_sort", "family,given")]
    found = await search_page(fhir, "Practitioner", [*criteria, *(("name", w) for w in words),
                                                     *sort], page)
    if found.total == 0 and words:  # nobody's name starts so: names that sound alike
        found = await search_page(fhir, "Practitioner", [
            *criteria, *(("phonetic", w) for w in words), *sort], page)
    return page.respond(assemble(found.resources, found.included, public=True), found.total)


async def _public_doctor(fhir: CallerFhir, doctor_id: str) -> JSON:
    doctor = await fhir.find_json("Practitioner", doctor_id)
    if doctor is None or verification_status(doctor) != "verified" \
            or doctor.get("active") is False:
        raise not_found("Doctor")
    return doctor


@router.get("/api/doctors/{doctor_id}", response_model=Envelope[PublicDoctorView],
            summary="A verified doctor's public profile (public)")
async def public_profile(request: Request, doctor_id: str) -> Any:
    fhir = public_fhir(request_services(request))
    doctor = await _public_doctor(fhir, doctor_id)
    related = await fhir.search("Practitioner", [("_id", doctor_id), *VIEW_INCLUDES],
                                included=True)
    return ok(assemble([doctor], related, public=True)[0])


def _covers(schedule: JSON, day: date) -> bool:
    horizon = schedule.get("planningHorizon") or {}
    start, end = horizon.get("start"), horizon.get("end")
    return (start is None or start[:10] <= day.isoformat()) and \
        (end is None or day.isoformat() <= end[:10])


def _schedule_view(schedule: JSON) -> JSON:
    horizon = schedule.get("planningHorizon") or {}
    return ScheduleView(id=schedule["id"], planning_horizon_start=horizon.get("start"),
                        planning_horizon_end=horizon.get("end"),
                        service_types=[t for s in schedule.get("serviceType", [])
                                       if (t := concept_text(s))],
                        comment=schedule.get("comment")).model_dump()


def _slot_view(slot: JSON) -> JSON:
    service = (slot.get("serviceType") or [None])[0]
    return SlotView(id=slot["id"], start=slot.get("start"), end=slot.get("end"),
                    schedule_id=local_id(slot.get("schedule"), "Schedule"),
                    service_type=concept_text(service) or coding(service).get("code")
                    ).model_dump()


@router.get("/api/doctors/{doctor_id}/availability", response_model=Envelope[AvailabilityView],
            summary="A verified doctor's free slots and schedules over some days (public)")
async def availability(request: Request, doctor_id: str,
                       start: date | None = Query(None, alias="from",
                                                  description="First day (default: today, "
                                                  "UTC)"),
                       days: int = Query(7, ge=1, description="How many days")) -> Any:
    services = request_services(request)
    if days > services.settings.doctor_availability_max_days:
        raise ApiError(422, "VALIDATION_ERROR", f"days: at most "
                       f"{services.settings.doctor_availability_max_days}", field="days")
    fhir = public_fhir(services)
    await _public_doctor(fhir, doctor_id)
    first = start or date.today()
    end = first + timedelta(days=days)
    slots = await fhir.search("Slot", [
        ("schedule.actor", f"Practitioner/{doctor_id}"), ("status", "free"),
        ("start", f"ge{first.isoformat()}"), ("start", f"lt{end.isoformat()}"),
        ("_sort", "start")])
    schedules = await fhir.search("Schedule", [("actor", f"Practitioner/{doctor_id}"),
                                               ("active", "true")])
    per_day: dict[str, int] = {}
    for slot in slots:
        per_day[str(slot.get("start", ""))[:10]] = per_day.get(str(slot.get("start", ""))[
            :10], 0) + 1
    every_day = [first + timedelta(days=n) for n in range(days)]
    return ok(AvailabilityView(
        doctor_id=doctor_id, start=first.isoformat(), end=end.isoformat(),
        next_available=slots[0].get("start") if slots else None,
        days=[DayView(date=d.isoformat(), free_slots=per_day.get(d.isoformat(), 0),
                      scheduled=any(_covers(s, d) for s in schedules)) for d in every_day],
        slots=[SlotView(**_slot_view(s)) for s in slots[:MAX_SLOTS_SHOWN]],
        schedules=[ScheduleView(**_schedule_view(s)) for s in schedules]).model_dump())

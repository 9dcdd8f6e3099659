"""Schedules: when a schedulable resource works, as a FHIR Schedule whose Slots follow it.

Mapping (/api field → FHIR Schedule):

    resource_id     → actor[0] (Practitioner/<id>, Location/<id> or Device/<id>, with its
                      name as display)
    name            → comment
    service_type    → serviceType[0].text
    active          → active
    valid_from      → planningHorizon.start (date; default: today in the time zone)
    valid_until     → planningHorizon.end (date, inclusive)
    time_zone, slot_minutes, buffer_minutes, horizon_days, working_hours (RFC 5545 RRULE
    picking the days, with a local start and end time), exceptions (local periods or
    whole days, with a reason)
                    → extension urn:healthplatform:extension:schedule-rules (complex; see
                      ``slots.rules_extension``)
    organization_id → owner label: the resource's organization
    conflicts       → the schedule's booked Slots tagged outside-working-hours (their
                      appointments need moving), with the appointment holding each

Writing a schedule writes its Slots for the horizon in the same unit of work
(:mod:`platform_api.scheduling.slots`); a change that would leave booked Slots outside the
new hours keeps them and reports them in ``conflicts`` (and the event
``platform.scheduling.schedule_conflict``). Deleting a schedule deletes its future free
Slots; one with booked future Slots is refused (409 ``SCHEDULE_HAS_BOOKINGS``).

Who: the Schedule's organization's members whose role writes scheduling resources
(``ORG:ADMIN``, ``ORG:DOCTOR``, ``ORG:NURSE``, ``ORG:RECEPTIONIST``; deleting:
``ORG:ADMIN``, ``ORG:RECEPTIONIST``) and platform administrators (the policy's
``schedule.write``, ``schedule.change``, ``schedule.delete``); reading likewise for the
roles that read them. Writing the Slots of a schedule is the platform's (an elevation
named ``schedule.write``): a doctor may change their schedule but not delete Slots.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Any

import orjson
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field, field_validator, model_validator

from fhir_server.access import CREATE, UPDATE
from fhir_server.caller import FhirUnit
from fhir_server.ids import new_id
from platform_api.envelope import ApiError, Envelope, conflict, created, ok
from platform_api.facade import ApiContext, Facade, Scope, api_context
from platform_api.scheduling import slots
from platform_api.scheduling.common import (
    CONFLICT_TAG,
    JSON,
    TimeZone,
    instant,
    local_id,
    now_utc,
    organization_of,
    owned_by,
    reference,
    version_of,
    zone,
)
from platform_api.scheduling.resources import display_name, load_resource, time_zone_of

DEFAULT_HORIZON_DAYS = 60


class WorkingHoursIn(BaseModel):
    rrule: str = Field(examples=["FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR"],
                       description="RFC 5545 RRULE choosing the days")
    start: time = Field(examples=["08:00"], description="Local start time")
    end: time = Field(examples=["13:00"], description="Local end time (before start: "
                      "the next day)")

    @field_validator("rrule")
    @classmethod
    def _rrule(cls, value: str) -> str:
        return slots.check_rrule(value)

    @model_validator(mode="after")
    def _span(self) -> WorkingHoursIn:
        if self.start == self.end:
            raise ValueError("start and end must differ")
        return self


class ExceptionIn(BaseModel):
    start: date | datetime = Field(examples=["2026-12-25"], description="A day (from its "
                                   "start) or a local date-time")
    end: date | datetime = Field(examples=["2026-12-26"], description="A day (to its end, "
                                 "inclusive) or a local date-time")
    reason: str | None = Field(default=None, max_length=200, examples=["Christmas Day"])


class ScheduleFields(BaseModel):
    name: str | None = Field(default=None, max_length=200, examples=["Weekday clinic"])
    service_type: str | None = Field(default=None, max_length=200,
                                     examples=["General consultation"])
    time_zone: TimeZone | None = Field(default=None, examples=["Africa/Nairobi"],
                                       description="IANA zone; default: the resource's")
    slot_minutes: int | None = Field(default=None, ge=5, le=480, examples=[30])
    buffer_minutes: int | None = Field(default=None, ge=0, le=240, examples=[5])
    horizon_days: int | None = Field(default=None, ge=1, le=366,
                                     description="How far ahead Slots exist")
    working_hours: list[WorkingHoursIn] | None = Field(default=None, min_length=1,
                                                       max_length=50)
    exceptions: list[ExceptionIn] | None = Field(default=None, max_length=500)
    valid_from: date | None = None
    valid_until: date | None = None
    active: bool | None = None


class ScheduleCreate(ScheduleFields):
    resource_id: str = Field(min_length=1, max_length=64)
    working_hours: list[WorkingHoursIn] = Field(min_length=1, max_length=50)


class ScheduleUpdate(ScheduleFields):
    pass


class WorkingHoursView(BaseModel):
    rrule: str
    start: str
    end: str


class ExceptionView(BaseModel):
    start: str
    end: str
    reason: str | None = None


class ConflictView(BaseModel):
    slot_id: str
    start: str
    end: str
    appointment_id: str | None = None


class ScheduleView(BaseModel):
    id: str
    resource_id: str | None = None
    resource_type: str | None = None
    resource_name: str | None = None
    organization_id: str | None = None
    name: str | None = None
    service_type: str | None = None
    active: bool
    time_zone: str | None = None
    slot_minutes: int | None = None
    buffer_minutes: int | None = None
    horizon_days: int | None = None
    working_hours: list[WorkingHoursView] = []
    exceptions: list[ExceptionView] = []
    valid_from: str | None = None
    valid_until: str | None = None
    conflicts: list[ConflictView] = Field(default=[], description="Booked slots outside "
                                          "the working hours: their appointments need "
                                          "moving")
    updated_at: str | None = None


# -- mapping ------------------------------------------------------------------------------
def _closure(item: JSON, tz: Any) -> slots.Closure:
    def moment(value: date | datetime, end: bool) -> datetime:
        if isinstance(value, datetime):
            return value.astimezone(tz) if value.tzinfo else value.replace(tzinfo=tz)
        day = value + timedelta(days=1) if end else value
        return datetime.combine(day, time(0), tz)

    start, end = moment(item["start"], False), moment(item["end"], True)
    if end <= start:
        raise ApiError(422, "VALIDATION_ERROR", "exceptions: end must come after start",
                       field="exceptions")
    return slots.Closure(start, end, item.get("reason"))


def merged_rules(payload: JSON, current: slots.Rules | None, resource_zone: str
                 ) -> slots.Rules:
    """The rules a create or update leaves: the payload's fields over the current ones."""
    tz_name = payload.get("time_zone") or (current.time_zone if current else resource_zone)
    tz = zone(tz_name)
    hours = tuple(slots.WorkingHours(h["rrule"], h["start"], h["end"])
                  for h in payload["working_hours"]) if payload.get(
        "working_hours") is not None else (current.hours if current else ())
    closures = tuple(_closure(e, tz) for e in payload["exceptions"]) if payload.get(
        "exceptions") is not None else (current.closures if current else ())
    valid_from = payload.get("valid_from") or (
        current.valid_from if current else now_utc().astimezone(tz).date())
    valid_until = payload["valid_until"] if "valid_until" in payload else (
        current.valid_until if current else None)
    if valid_until is not None and valid_until < valid_from:
        raise ApiError(422, "VALIDATION_ERROR", "valid_until: must not come before "
                       "valid_from", field="valid_until")

    def pick(key: str, default: int) -> int:
        value = payload.get(key)
        return int(value) if value is not None else (getattr(current, key) if current
                                                     else default)
    return slots.Rules(tz_name, pick("slot_minutes", 30), pick("buffer_minutes", 0),
                       pick("horizon_days", DEFAULT_HORIZON_DAYS), valid_from, valid_until,
                       hours, closures)


def schedule_to_fhir(payload: JSON, resource: JSON, existing: JSON | None) -> JSON:
    schedule: JSON = orjson.loads(orjson.dumps(existing)) if existing else {
        "resourceType": "Schedule", "active": True,
        "actor": [{"reference": reference(resource), "display": display_name(resource)}]}
    rules = merged_rules(payload, slots.rules_of(existing) if existing else None,
                         time_zone_of(resource))
    schedule["extension"] = [e for e in schedule.get("extension") or []
                             if e.get("url") != slots.RULES_EXTENSION]
    schedule["extension"].append(slots.rules_extension(rules))
    horizon: JSON = {"start": rules.valid_from.isoformat()}
    if rules.valid_until is not None:
        horizon["end"] = rules.valid_until.isoformat()
    schedule["planningHorizon"] = horizon
    if payload.get("active") is not None:
        schedule["active"] = payload["active"]
    if "name" in payload:
        schedule.pop("comment", None)
        if payload["name"]:
            schedule["comment"] = payload["name"]
    if "service_type" in payload:
        schedule.pop("serviceType", None)
        if payload["service_type"]:
            schedule["serviceType"] = [{"text": payload["service_type"]}]
    return owned_by(schedule, organization_of(resource))


def schedule_from_fhir(schedule: JSON, conflicts: list[JSON] | None = None) -> JSON:
    rules = slots.rules_of(schedule)
    actor = (schedule.get("actor") or [{}])[0]
    horizon = schedule.get("planningHorizon") or {}
    return ScheduleView(
        id=schedule["id"], resource_id=local_id(actor),
        resource_type=(actor.get("reference") or "/").split("/")[0] or None,
        resource_name=actor.get("display"), organization_id=organization_of(schedule),
        name=schedule.get("comment"),
        service_type=(schedule.get("serviceType") or [{}])[0].get("text"),
        active=schedule.get("active", True),
        time_zone=rules.time_zone if rules else None,
        slot_minutes=rules.slot_minutes if rules else None,
        buffer_minutes=rules.buffer_minutes if rules else None,
        horizon_days=rules.horizon_days if rules else None,
        working_hours=[WorkingHoursView(rrule=h.rrule, start=h.start.isoformat("minutes"),
                                        end=h.end.isoformat("minutes"))
                       for h in (rules.hours if rules else ())],
        exceptions=[ExceptionView(start=c.start.isoformat(), end=c.end.isoformat(),
                                  reason=c.reason) for c in (rules.closures if rules else ())],
        valid_from=horizon.get("start"), valid_until=horizon.get("end"),
        conflicts=[ConflictView(**c) for c in conflicts or []],
        updated_at=(schedule.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


async def schedule_views(ctx: ApiContext, schedules: list[JSON]) -> list[JSON]:
    """Views with their conflicts: one search of the page's tagged Slots, one of the
    appointments holding them."""
    if not schedules:
        return []
    fhir = ctx.fhir  # whoever reads the schedules reads their Slots and appointments
    tagged = await fhir.search("Slot", [
        ("schedule", ",".join(f"Schedule/{s['id']}" for s in schedules)),
        ("_tag", CONFLICT_TAG), ("start", f"ge{instant(now_utc())}"), ("_sort", "start")])
    holders = await slots.appointments_in(fhir, tagged)
    by_schedule: dict[str, list[JSON]] = {}
    for slot in tagged:
        by_schedule.setdefault(local_id(slot.get("schedule"), "Schedule") or "", []).append(
            {"slot_id": slot["id"], "start": slot["start"], "end": slot["end"],
             "appointment_id": holders.get(slot["id"])})
    return [schedule_from_fhir(s, by_schedule.get(s["id"], [])) for s in schedules]


class ResourceScope(Scope):
    """``/api/resources/{resource_id}/schedules``: the Schedules naming the resource."""

    param = "resource_id"

    async def enter(self, ctx: ApiContext, value: str) -> None:
        await load_resource(ctx, value)

    def criteria(self, value: str) -> list[tuple[str, str]]:
        return [("actor", value)]

    def contains(self, ctx: ApiContext, resource: JSON, value: str) -> bool:
        return any(local_id(a) == value for a in resource.get("actor") or [])



schedules = Facade(
    resource="Schedule", name="Schedule", create=ScheduleCreate, update=ScheduleUpdate,
    view=ScheduleView, from_fhir=schedule_from_fhir,
    views=schedule_views, tags=["scheduling"],
    summaries={"get": "A schedule, with the booked slots its hours no longer cover"},
)
resource_schedules = Facade(
    resource="Schedule", name="Schedule", create=ScheduleCreate, view=ScheduleView,
    from_fhir=schedule_from_fhir, views=schedule_views,
    scope=ResourceScope(), tags=["scheduling"],
    summaries={"list": "The schedules of a schedulable resource"},
)

router = APIRouter(tags=["scheduling"])


async def _write(ctx: ApiContext, resource: JSON, payload: JSON, schedule_id: str,
                 action: str) -> tuple[JSON, slots.Reconciled]:
    """Create or update the Schedule and its Slots in one unit (see ``slots.reconcile``);
    on update the payload applies to the latest version, checked for the caller."""
    ctx.authorize("schedule.write", organization_of(resource))
    fhir = ctx.elevate("schedule.write: generate and delete the schedule's Slots")

    async def stage(unit: FhirUnit) -> JSON:
        current = None if action == CREATE else await fhir.read_json("Schedule", schedule_id)
        if current is not None:  # as stored now (this runs again when a race was lost)
            ctx.authorize("schedule.change", organization_of(current))
        schedule = {**schedule_to_fhir(payload, resource, current), "id": schedule_id}
        if current is None:
            await unit.create(schedule, resource_id=schedule_id)
        else:
            await unit.update(schedule, if_match=version_of(current))
        return schedule

    _staged, result = await slots.reconcile(ctx.services, fhir, {"id": schedule_id},
                                            prelude=stage)
    return await fhir.read_json("Schedule", schedule_id), result


async def _answer(ctx: ApiContext, schedule: JSON, result: slots.Reconciled) -> JSON:
    holders = await slots.appointments_in(ctx.fhir, result.conflicts)
    view = schedule_from_fhir(schedule, [
        {"slot_id": s["id"], "start": s["start"], "end": s["end"],
         "appointment_id": holders.get(s["id"])} for s in result.conflicts])
    return {**view, "slots_created": result.created, "slots_removed": result.removed}


class ScheduleWritten(ScheduleView):
    slots_created: int = Field(description="Free slots this write added")
    slots_removed: int = Field(description="Free slots this write deleted")


@router.post("/api/schedules", status_code=201, response_model=Envelope[ScheduleWritten],
             summary="Create a schedule; its slots are generated for the horizon")
async def create_schedule(body: ScheduleCreate, ctx: ApiContext = Depends(api_context)
                          ) -> Any:
    resource = await load_resource(ctx, body.resource_id)
    payload = body.model_dump(exclude_unset=True)
    payload["working_hours"] = body.model_dump()["working_hours"]
    schedule, result = await _write(ctx, resource, payload, new_id(), CREATE)
    return created(await _answer(ctx, schedule, result))


schedules.mount(router, "/api/schedules", ops=("get",))
resource_schedules.mount(router, "/api/resources/{resource_id}/schedules", ops=("list",))


@router.put("/api/schedules/{schedule_id}", response_model=Envelope[ScheduleWritten],
            summary="Change a schedule (only the fields sent change); its slots follow, "
                    "booked ones are kept and reported as conflicts")
async def update_schedule(schedule_id: str, body: ScheduleUpdate,
                          ctx: ApiContext = Depends(api_context)) -> Any:
    current = await schedules.load(ctx, schedule_id)
    resource = await load_resource(ctx, local_id((current.get("actor") or [{}])[0]) or "")
    payload = body.model_dump(exclude_unset=True)
    if payload.get("working_hours") is not None:
        payload["working_hours"] = body.model_dump()["working_hours"]
    schedule, result = await _write(ctx, resource, payload, schedule_id, UPDATE)
    return ok(await _answer(ctx, schedule, result))


@router.delete("/api/schedules/{schedule_id}", response_model=Envelope[ScheduleView],
               summary="Delete a schedule and its future free slots (refused while some "
                       "are booked)")
async def delete_schedule(schedule_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    current = await schedules.load(ctx, schedule_id)
    ctx.authorize("schedule.delete", organization_of(current))
    try:  # those who may delete schedules delete Slots too (the role table): own rights
        await slots.delete_schedule(ctx.fhir, current)
    except slots.SlotsStillBooked as exc:
        raise conflict("SCHEDULE_HAS_BOOKINGS", f"{len(exc.slots)} future slots of this "
                       "schedule are booked; cancel or reschedule their appointments "
                       "first") from None
    return ok(schedule_from_fhir(current))

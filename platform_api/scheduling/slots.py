"""Slots: the bookable times a Schedule's working hours give, kept current as FHIR Slots.

A Schedule's rules (see :mod:`platform_api.scheduling.schedules`) say on which days its
working hours recur (an RFC 5545 RRULE, read by ``dateutil.rrule``), from when to when in
its IANA time zone, the slot length, the buffer left after each slot, and the exceptions
(holidays, leave) when nothing is offered. :func:`generate` turns them into slot times
for a window; :func:`reconcile` makes the stored Slots of the window match them:

    Slot.schedule → Schedule/<id>          Slot.status → free | busy (booked)
    Slot.start / Slot.end → UTC instants   Slot.id → <schedule id>-<local start YYYYMMDDHHMM
                                                      in UTC> (one id per time: two
                                                      processes generating the same
                                                      window cannot make two Slots)
    owner label → the resource's organization

- a wanted time with no Slot gets a free one; a free Slot no longer wanted is deleted;
- a **busy** Slot no longer wanted is never dropped: it keeps its appointment and is
  tagged ``urn:healthplatform:scheduling|outside-working-hours`` (a *conflict*, reported
  by the schedule and by the event ``platform.scheduling.schedule_conflict``) until the
  appointment is moved or cancelled; it loses the tag if the hours come back.

Every change is written against the version read (If-Match), so a booking that takes a
Slot while the schedule is being reconciled makes one of them try again; the window is
worked out afresh then. The rolling horizon (``horizon_days`` ahead of now) moves on with
:class:`SlotKeeper`, a pass over the active schedules every
``scheduling_upkeep_interval_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import orjson
from dateutil.rrule import rrulestr

from fhir_server.caller import CallerFhir, FhirUnit
from fhir_server.store import Condition
from platform_api.scheduling.common import (
    ATTEMPTS,
    CONFLICT_TAG,
    EXTENSION,
    JSON,
    RACE_ERRORS,
    SOURCE,
    has_tag,
    instant,
    kept_changing,
    local_id,
    now_utc,
    organization_of,
    owned_by,
    parse_instant,
    reference,
    version_of,
    with_tag,
    zone,
)
from platform_api.services import Services

log = logging.getLogger("healthplatform.scheduling")

RULES_EXTENSION = EXTENSION + "schedule-rules"
ALLOWED_FREQUENCIES = frozenset({"DAILY", "WEEKLY", "MONTHLY", "YEARLY"})
# Times come from the working hours' start and end; a rule only picks the days.
REFUSED_PARTS = frozenset({"BYHOUR", "BYMINUTE", "BYSECOND", "DTSTART"})
CONFLICT_TOPIC = "platform.scheduling.schedule_conflict"
BUSY = frozenset({"busy", "busy-tentative", "busy-unavailable"})


@dataclass(frozen=True)
class WorkingHours:
    rrule: str
    start: time
    end: time


@dataclass(frozen=True)
class Closure:
    """An exception: nothing is offered from ``start`` to ``end`` (aware, local)."""

    start: datetime
    end: datetime
    reason: str | None = None


@dataclass(frozen=True)
class Rules:
    time_zone: str
    slot_minutes: int
    buffer_minutes: int
    horizon_days: int
    valid_from: date
    valid_until: date | None = None
    hours: tuple[WorkingHours, ...] = ()
    closures: tuple[Closure, ...] = ()


def check_rrule(text: str) -> str:
    """An RRULE body (``FREQ=WEEKLY;BYDAY=MO,TU``) fit for working hours, else
    ValueError saying why."""
    body = text.strip().removeprefix("RRULE:")
    if not body or "\n" in body:
        raise ValueError("give one RRULE, e.g. FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR")
    parts = dict(p.partition("=")[::2] for p in body.upper().split(";") if p)
    if parts.get("FREQ") not in ALLOWED_FREQUENCIES:
        raise ValueError("FREQ must be DAILY, WEEKLY, MONTHLY or YEARLY")
    refused = REFUSED_PARTS & parts.keys()
    if refused:
        raise ValueError(f"{', '.join(sorted(refused))} cannot be used: the times are the "
                         "working hours' start and end")
    try:
        rrulestr(body, dtstart=datetime(2026, 1, 1))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a valid RFC 5545 RRULE: {exc}") from None
    return body


# -- the rules as FHIR: one complex extension of the Schedule ------------------------------
def rules_extension(rules: Rules) -> JSON:
    """``Schedule.extension[schedule-rules]``: what FHIR's Schedule has no element for
    (its ``planningHorizon`` holds ``valid_from`` / ``valid_until``)."""
    parts: list[JSON] = [
        {"url": "timeZone", "valueCode": rules.time_zone},
        {"url": "slotMinutes", "valuePositiveInt": rules.slot_minutes},
        {"url": "bufferMinutes", "valueUnsignedInt": rules.buffer_minutes},
        {"url": "horizonDays", "valuePositiveInt": rules.horizon_days},
    ]
    for hours in rules.hours:
        parts.append({"url": "workingHours", "extension": [
            {"url": "rrule", "valueString": hours.rrule},
            {"url": "start", "valueTime": hours.start.isoformat("seconds")},
            {"url": "end", "valueTime": hours.end.isoformat("seconds")}]})
    for closure in rules.closures:
        inner: list[JSON] = [{"url": "start", "valueDateTime": closure.start.isoformat()},
                             {"url": "end", "valueDateTime": closure.end.isoformat()}]
        if closure.reason:
            inner.append({"url": "reason", "valueString": closure.reason})
        parts.append({"url": "exception", "extension": inner})
    return {"url": RULES_EXTENSION, "extension": parts}


def _parts(extension: JSON) -> dict[str, list[JSON]]:
    found: dict[str, list[JSON]] = {}
    for part in extension.get("extension") or []:
        found.setdefault(part.get("url", ""), []).append(part)
    return found


def _value(parts: dict[str, list[JSON]], url: str, key: str, default: Any = None) -> Any:
    return (parts.get(url) or [{}])[0].get(key, default)


def rules_of(schedule: JSON) -> Rules | None:
    """The rules a Schedule carries (None: a Schedule written without them, e.g. by a
    FHIR client: its Slots are its writer's business)."""
    extension = next((e for e in schedule.get("extension") or []
                      if e.get("url") == RULES_EXTENSION), None)
    if extension is None:
        return None
    parts = _parts(extension)
    tz = zone(_value(parts, "timeZone", "valueCode", "UTC"))
    hours = []
    for item in parts.get("workingHours", []):
        inner = _parts(item)
        hours.append(WorkingHours(_value(inner, "rrule", "valueString"),
                                  time.fromisoformat(_value(inner, "start", "valueTime")),
                                  time.fromisoformat(_value(inner, "end", "valueTime"))))
    closures = []
    for item in parts.get("exception", []):
        inner = _parts(item)
        closures.append(Closure(
            datetime.fromisoformat(_value(inner, "start", "valueDateTime")).astimezone(tz),
            datetime.fromisoformat(_value(inner, "end", "valueDateTime")).astimezone(tz),
            _value(inner, "reason", "valueString")))
    horizon = schedule.get("planningHorizon") or {}
    return Rules(
        time_zone=tz.key, slot_minutes=int(_value(parts, "slotMinutes", "valuePositiveInt", 30)),
        buffer_minutes=int(_value(parts, "bufferMinutes", "valueUnsignedInt", 0)),
        horizon_days=int(_value(parts, "horizonDays", "valuePositiveInt", 60)),
        valid_from=date.fromisoformat(horizon.get("start", "2000-01-01")[:10]),
        valid_until=date.fromisoformat(horizon["end"][:10]) if horizon.get("end") else None,
        hours=tuple(hours), closures=tuple(closures))


# -- generating ----------------------------------------------------------------------------
def generate(rules: Rules, window_start: datetime, window_end: datetime
             ) -> list[tuple[datetime, datetime]]:
    """The slot times (UTC) the rules give that start within the window."""
    tz = zone(rules.time_zone)
    length = timedelta(minutes=rules.slot_minutes)
    step = length + timedelta(minutes=rules.buffer_minutes)
    first = max(rules.valid_from, window_start.astimezone(tz).date() - timedelta(days=1))
    last = window_end.astimezone(tz).date()
    if rules.valid_until is not None:
        last = min(last, rules.valid_until)
    closed = [(c.start.astimezone(UTC), c.end.astimezone(UTC)) for c in rules.closures]
    found: set[tuple[datetime, datetime]] = set()
    for hours in rules.hours:
        recurrence = rrulestr(hours.rrule, dtstart=datetime.combine(rules.valid_from,
                                                                    hours.start))
        days = recurrence.between(datetime.combine(first, time.min),
                                  datetime.combine(last, time.max), inc=True)
        for occurrence in days:
            day = occurrence.date()
            begins = datetime.combine(day, hours.start, tz).astimezone(UTC)
            end_day = day if hours.end > hours.start else day + timedelta(days=1)
            ends = datetime.combine(end_day, hours.end, tz).astimezone(UTC)
            moment = begins
            while moment + length <= ends:
                slot = (moment, moment + length)
                if window_start <= moment < window_end and not any(
                        s < slot[1] and slot[0] < e for s, e in closed):
                    found.add(slot)
                moment += step
    return _without_overlaps(sorted(found))


def _without_overlaps(times: list[tuple[datetime, datetime]]
                      ) -> list[tuple[datetime, datetime]]:
    kept: list[tuple[datetime, datetime]] = []
    for start, end in times:
        if not kept or start >= kept[-1][1]:
            kept.append((start, end))
    return kept


def slot_id(schedule_id: str, start: datetime) -> str:
    return f"{schedule_id}-{start.astimezone(UTC):%Y%m%d%H%M}"


def new_slot(schedule: JSON, start: datetime, end: datetime) -> JSON:
    slot: JSON = {"resourceType": "Slot", "id": slot_id(schedule["id"], start),
                  "schedule": {"reference": f"Schedule/{schedule['id']}"},
                  "status": "free", "start": instant(start), "end": instant(end)}
    if schedule.get("serviceType"):
        slot["serviceType"] = schedule["serviceType"]
    return owned_by(slot, organization_of(schedule))


# -- reconciling ---------------------------------------------------------------------------
@dataclass
class Reconciled:
    created: int = 0
    removed: int = 0
    conflicts: list[JSON] = field(default_factory=list)  # busy slots outside the hours
    new_conflicts: list[JSON] = field(default_factory=list)


async def schedule_slots(fhir: CallerFhir, schedule_id: str, since: datetime) -> list[JSON]:
    """Every Slot of a schedule starting at or after ``since`` (one search, all pages)."""
    return await fhir.search("Slot", [("schedule", f"Schedule/{schedule_id}"),
                                      ("start", f"ge{instant(since)}"), ("_sort", "start")])


Prelude = Callable[[FhirUnit], Awaitable[JSON]]


async def reconcile(services: Services, fhir: CallerFhir, schedule: JSON, *,
                    prelude: Prelude | None = None, horizon_end: datetime | None = None
                    ) -> tuple[JSON, Reconciled]:
    """Make the schedule's Slots from now on match its rules (see the module docstring),
    in one unit of work of ``fhir`` (the platform's rights, elevated by the caller: a
    doctor changes their schedule but may not delete Slots) with what ``prelude`` stages
    (the schedule's own create or update; it returns the schedule as it will be stored,
    and runs again, on fresh data, when the unit lost a race). An inactive schedule wants
    no free Slot."""
    for _attempt in range(ATTEMPTS):
        start = now_utc()
        try:
            async with fhir.unit() as unit:
                if prelude is not None:
                    schedule = await prelude(unit)
                rules = rules_of(schedule)
                end = horizon_end or start + timedelta(days=rules.horizon_days if rules
                                                       else 0)
                wanted = generate(rules, start, end) if rules and schedule.get(
                    "active", True) else []
                existing = {s["id"]: s for s in await schedule_slots(fhir, schedule["id"],
                                                                     start)}
                result = await _stage_differences(services, fhir, unit, schedule, wanted,
                                                  existing)
                await unit.commit()
        except RACE_ERRORS:
            continue
        return schedule, result
    raise kept_changing()


async def _stage_differences(services: Services, fhir: CallerFhir, unit: FhirUnit,
                             schedule: JSON, wanted: Sequence[tuple[datetime, datetime]],
                             existing: dict[str, JSON]) -> Reconciled:
    result = Reconciled()
    wanted_ids = {slot_id(schedule["id"], start): (start, end) for start, end in wanted}
    for sid, (start, end) in wanted_ids.items():
        current = existing.get(sid)
        if current is None:
            await _create_slot(services, fhir, unit, new_slot(schedule, start, end))
            result.created += 1
        elif current["status"] not in BUSY and current["end"] != instant(end):
            await unit.update({**current, "end": instant(end)}, if_match=version_of(current))
        elif current["status"] in BUSY and current["end"] != instant(end):
            await _mark_conflict(unit, current, result)
        elif has_tag(current, CONFLICT_TAG):
            await unit.update(with_tag(current, CONFLICT_TAG, present=False),
                              if_match=version_of(current))
    for sid, current in existing.items():
        if sid in wanted_ids:
            continue
        if current["status"] in BUSY:
            await _mark_conflict(unit, current, result)
        else:
            await unit.delete("Slot", sid, if_match=version_of(current))
            result.removed += 1
    if result.new_conflicts:
        unit.emit(CONFLICT_TOPIC, await _conflict_payload(fhir, schedule,
                                                          result.new_conflicts),
                  source_service=SOURCE)
    return result


async def _create_slot(services: Services, fhir: CallerFhir, unit: FhirUnit, slot: JSON
                       ) -> None:
    """A Slot at its time's id: created when the id was never used; over a deleted one
    only while nobody else brings it back first (a condition checked in the commit)."""
    stored = await services.store.read_current("Slot", slot["id"])
    if stored is None:
        await unit.create(slot, resource_id=slot["id"])
        return
    absent = await fhir.condition("Slot", [("_id", slot["id"])])
    await unit.update(slot, condition=Condition(absent, ()))


async def _mark_conflict(unit: FhirUnit, slot: JSON, result: Reconciled) -> None:
    result.conflicts.append(slot)
    if has_tag(slot, CONFLICT_TAG):
        return
    result.new_conflicts.append(slot)
    await unit.update(with_tag(slot, CONFLICT_TAG), if_match=version_of(slot))


async def appointments_in(fhir: CallerFhir, slots: Sequence[JSON]) -> dict[str, str]:
    """Slot id → the id of the appointment holding it (one search)."""
    if not slots:
        return {}
    found = await fhir.search("Appointment", [
        ("slot", ",".join(f"Slot/{s['id']}" for s in slots))])
    holders: dict[str, str] = {}
    for appointment in found:
        for ref in appointment.get("slot") or []:
            if (sid := local_id(ref, "Slot")) is not None:
                holders[sid] = appointment["id"]
    return holders


async def _conflict_payload(fhir: CallerFhir, schedule: JSON, slots: Sequence[JSON]) -> JSON:
    holders = await appointments_in(fhir, slots)
    return {"schedule_id": schedule["id"],
            "resource": (schedule.get("actor") or [{}])[0].get("reference"),
            "organization_id": organization_of(schedule),
            "conflicts": [{"slot_id": s["id"], "start": s["start"], "end": s["end"],
                           "appointment_id": holders.get(s["id"])} for s in slots]}


async def retire_actor(fhir: CallerFhir, actor: JSON, retired: JSON,
                       version: int | None) -> JSON:
    """Store the retired actor, delete its Schedules and their future free Slots, in one
    unit (a Slot booked meanwhile fails it: the caller's check runs again)."""
    for _attempt in range(ATTEMPTS):
        schedules = await fhir.search("Schedule", [("actor", reference(actor))])
        try:
            async with fhir.unit() as unit:
                staged = await unit.update(retired, if_match=version)
                for schedule in schedules:
                    await _drop_schedule(fhir, unit, schedule)
                await unit.commit()
        except RACE_ERRORS:
            continue
        assert staged.result is not None
        return orjson.loads(staged.result.body)  # type: ignore[no-any-return]
    raise kept_changing()


class SlotsStillBooked(Exception):
    def __init__(self, slots: list[JSON]):
        super().__init__(f"{len(slots)} future slots are booked")
        self.slots = slots


async def _drop_schedule(fhir: CallerFhir, unit: FhirUnit, schedule: JSON) -> None:
    future = await schedule_slots(fhir, schedule["id"], now_utc())
    booked = [s for s in future if s["status"] in BUSY]
    if booked:
        raise SlotsStillBooked(booked)
    for slot in future:
        await unit.delete("Slot", slot["id"], if_match=version_of(slot))
    await unit.delete("Schedule", schedule["id"], if_match=version_of(schedule))


async def delete_schedule(fhir: CallerFhir, schedule: JSON) -> None:
    """Delete a Schedule and its future free Slots (SlotsStillBooked when some are
    booked)."""
    for _attempt in range(ATTEMPTS):
        try:
            async with fhir.unit() as unit:
                await _drop_schedule(fhir, unit, schedule)
                await unit.commit()
        except RACE_ERRORS:
            fresh = await fhir.find_json("Schedule", schedule["id"])
            if fresh is None:
                return
            schedule = fresh
            continue
        return
    raise kept_changing()


# -- the rolling horizon ------------------------------------------------------------------------
class SlotKeeper:
    """Moves every active schedule's horizon on, every ``interval`` seconds (and once at
    start): the day that came into the horizon gets its Slots. It works for the platform
    itself (no caller): its rights are elevated once, when it is built."""

    def __init__(self, services: Services, interval: float):
        self.services, self.interval = services, interval
        self.fhir = services.policy.elevate(
            "slot upkeep: generate the Slots of every active schedule's horizon")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval > 0:
            self._task = asyncio.create_task(self._run(), name="scheduling-slot-keeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:  # the keeper must outlive one failed pass; say so loudly
                log.exception("slot upkeep failed")
            await asyncio.sleep(self.interval)

    async def run_once(self) -> int:
        """One pass; how many Slots were created."""
        made = 0
        schedules = await self.fhir.search("Schedule", [("active", "true")])
        for schedule in schedules:
            if rules_of(schedule) is not None:
                made += (await reconcile(self.services, self.fhir, schedule))[1].created
        return made


__all__ = [
    "RULES_EXTENSION",
    "Closure",
    "Reconciled",
    "Rules",
    "SlotKeeper",
    "SlotsStillBooked",
    "WorkingHours",
    "check_rrule",
    "delete_schedule",
    "generate",
    "new_slot",
    "parse_instant",
    "reconcile",
    "retire_actor",
    "rules_extension",
    "rules_of",
    "schedule_slots",
]

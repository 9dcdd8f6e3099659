"""SIU^S12-S15 (schedule notifications) → one transaction with an Appointment.

| v2 | FHIR | written as |
|---|---|---|
| PID (+PD1) | Patient | referenced, created when absent; participant (status accepted) |
| SCH (+TQ1, AIS, AIG, AIL, AIP) | Appointment | conditional update on the filler appointment id |
| AIL-3 | Location | referenced (created when absent); participant |
| (message) | Binary + Provenance | see ``provenance`` |

| v2 | Appointment | notes |
|---|---|---|
| SCH-2 (else SCH-1) | identifier | filler (placer) appointment id: the match key |
| SCH-25, else the event | status | table 0278; S12/S13/S14 booked, S15 cancelled |
| SCH-6 (S15) | cancelationReason | |
| SCH-7 | reasonCode | |
| SCH-8 | appointmentType | |
| TQ1-7/8, else SCH-11.4/.5, else AIS-4 (+AIS-7/8) | start / end | |
| SCH-9/10, AIS-7/8, or end - start | minutesDuration | |
| AIS-3 | serviceType | |
| AIP-3 / AIP-4 | participant actor (Practitioner) / type | logical reference |
| AIG-3 | participant actor (Device) | logical reference |
| AI*-12 | participant status | table 0278 → participationstatus |
| NTE after SCH | comment | |
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from hl7_gateway.parser import Segment
from hl7_gateway.v2_to_fhir.codes import mapped
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import (
    codeable,
    ei_identifier,
    fhir_datetime,
    first,
    number,
    practitioner_reference,
)
from hl7_gateway.v2_to_fhir.obx import following_notes
from hl7_gateway.v2_to_fhir.pid import add_patient
from hl7_gateway.v2_to_fhir.pv1 import add_location

__all__ = ["SIU_EVENTS", "map_siu"]

JSON = dict[str, Any]
SIU_EVENTS = {"S12": "booked", "S13": "booked", "S14": "booked", "S15": "cancelled"}
# Duration units (ISO+ / ANSI, as senders write them) → minutes.
_MINUTES = {"min": 1.0, "mins": 1.0, "minutes": 1.0, "m": 1.0, "h": 60.0, "hr": 60.0,
            "hour": 60.0, "hours": 60.0, "s": 1 / 60, "sec": 1 / 60, "d": 1440.0}


def _moment(seg: Segment | None, field_no: int, component: int, ctx: MappingContext
            ) -> str | None:
    if seg is None:
        return None
    value = seg.component(field_no, component).strip()
    return fhir_datetime(value, ctx.default_tz) if value else None


def _duration(amount: str, units: str) -> int | None:
    value = number(amount)
    factor = _MINUTES.get(units.strip().lower() or "min")
    if value is None or factor is None or value <= 0:
        return None
    return max(1, round(value * factor))


def _timing(appointment: JSON, sch: Segment, ctx: MappingContext) -> None:
    tq1, ais = ctx.message.segment("TQ1"), ctx.message.segment("AIS")
    start = _moment(tq1, 7, 1, ctx) or _moment(sch, 11, 4, ctx) or _moment(ais, 4, 1, ctx)
    end = _moment(tq1, 8, 1, ctx) or _moment(sch, 11, 5, ctx)
    minutes = _duration(sch.field(9), sch.component(10, 1)) or (
        _duration(ais.field(7), ais.component(8, 1)) if ais is not None else None)
    if start and end and "T" in start and "T" in end:
        span = datetime.fromisoformat(end) - datetime.fromisoformat(start)
        minutes = max(1, int(span.total_seconds() // 60)) if span.total_seconds() > 0 else minutes
    elif start and "T" in start and minutes:
        end = (datetime.fromisoformat(start) + timedelta(minutes=minutes)).isoformat()
    if start and "T" in start:
        appointment["start"] = datetime.fromisoformat(start).isoformat()
    if end and "T" in end:
        appointment["end"] = datetime.fromisoformat(end).isoformat()
    if minutes:
        appointment["minutesDuration"] = minutes


def _participant_status(seg: Segment) -> str:
    code = seg.component(12, 1).strip()
    return (mapped("participation_status", code) if code else None) or "accepted"


def _participants(ctx: MappingContext, patient: JSON) -> list[JSON]:
    found: list[JSON] = [{"actor": patient, "status": "accepted"}]
    for aip in ctx.message.segments("AIP"):
        actor = practitioner_reference(first(aip, 3), ctx.sender)
        if actor is not None:
            entry: JSON = {"actor": actor, "status": _participant_status(aip)}
            role = codeable(first(aip, 4), ctx.sender)
            if role:
                entry["type"] = [role]
            found.append(entry)
    for ail in ctx.message.segments("AIL"):
        place = add_location(ctx, first(ail, 3))
        if place is not None:
            found.append({"actor": place, "status": _participant_status(ail)})
    for aig in ctx.message.segments("AIG"):
        resource = first(aig, 3)
        if resource is not None and (resource.component(2) or resource.component(1)).strip():
            found.append({"actor": {"type": "Device", "display": (resource.component(2)
                                                                  or resource.component(1))},
                          "status": _participant_status(aig)})
    return found


def _appointment(sch: Segment, ctx: MappingContext, patient: JSON) -> JSON:
    code = sch.component(25, 1).strip()
    status = (mapped("appointment_status", code) if code else None) or SIU_EVENTS[ctx.event]
    appointment: JSON = {"resourceType": "Appointment", "status": status}
    identifiers = [i for n, kind in ((2, "filler-appointment"), (1, "placer-appointment"))
                   if (rep := first(sch, n)) is not None
                   and (i := ei_identifier(rep, ctx.sender, kind=kind))]
    if identifiers:
        appointment["identifier"] = identifiers
    if status == "cancelled":
        reason = codeable(first(sch, 6), ctx.sender)
        if reason:
            appointment["cancelationReason"] = reason
    reason = codeable(first(sch, 7), ctx.sender)
    if reason:
        appointment["reasonCode"] = [reason]
    kind = codeable(first(sch, 8), ctx.sender, default_table="0277")
    if kind:
        appointment["appointmentType"] = kind
    service = codeable(first(ctx.message.segment("AIS"), 3), ctx.sender)
    if service:
        appointment["serviceType"] = [service]
    _timing(appointment, sch, ctx)
    # SIU: SCH {TQ1} {NTE}: the appointment's notes follow its timing segments.
    anchor = sch
    for seg in ctx.following(sch):
        if seg.id != "TQ1":
            break
        anchor = seg
    notes = following_notes(ctx, anchor)
    if notes:
        appointment["comment"] = "\n".join(notes)
    appointment["participant"] = _participants(ctx, patient)
    return appointment


def map_siu(ctx: MappingContext) -> None:
    sch = ctx.message.segment("SCH")
    if sch is None:
        raise ctx.fail(None, None, f"SIU^{ctx.event} without an SCH segment", code=100)
    patient = add_patient(ctx, update=False)
    appointment = _appointment(sch, ctx, patient)
    identifiers = appointment.get("identifier", [])
    if not identifiers:
        raise ctx.fail(sch, 2, "neither a filler nor a placer appointment id")
    key = {"system": identifiers[0]["system"], "value": identifiers[0]["value"]}
    ctx.builder.upsert(f"Appointment:{key['system']}|{key['value']}", appointment, key)

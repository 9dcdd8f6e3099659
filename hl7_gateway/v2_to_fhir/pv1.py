"""PV1 (+ PV2) → Encounter, PV1-3 / PV1-6 → Location.

| v2 | Encounter | notes |
|---|---|---|
| PV1-2 | class | table 0004 → v3 ActCode: E EMER, I IMP, O AMB, P PRENC; |
|  |  | unknown → v3 NullFlavor UNK (class is required) |
| PV1-3 | location (status active) | PL → Location, matched by facility + point of care^room^bed |
| PV1-6 | location (status completed) | prior location (A02 transfers) |
| PV1-7 / 8 / 9 / 17 | participant ATND / REF / CON / ADM | logical Practitioner references |
| PV1-10 | serviceType | table 0069 |
| PV1-14 / PV1-36 | hospitalization.admitSource / dischargeDisposition | tables 0023 / 0112 |
| PV1-19 | identifier (type VN) | the match key; without it, patient + PV1-44; |
|  |  | without both, the stay (see below) |
| PV1-44 / PV1-45 | period.start / period.end | PV1-45 valued → status finished |
| PV2-3 | reasonCode | |
| (event) | status | chosen by the ADT mapper from the trigger event |

ADT messages create or replace the Encounter (conditional update on the visit number);
result and order messages only reference it, creating it when absent.

Which stored Encounter an ADT is about, as well as its data allows:

1. the visit number (PV1-19), when sent;
2. else the patient (PID-3) and the admit date/time (PV1-44): one patient is not admitted
   twice at the same instant;
3. else the stay: the patient's Encounter at the PV1-3 location in a status the event
   applies to (planned, arrived, triaged, in-progress, onleave, unknown; A13 also
   finished), then,
   for events about a stay already begun (A02, A03, A08, A11, A13), the patient's most
   recently updated such Encounter wherever it is (a transfer moved it); events that begin
   a stay (A01, A04, A05) never take one at another location. Nothing found: a new
   Encounter. ``hl7_gateway.stays`` does these lookups before the transaction.
"""

from __future__ import annotations

from typing import Any

from hl7_gateway.parser import Repetition, Segment
from hl7_gateway.v2_to_fhir.bundle import StayMatch
from hl7_gateway.v2_to_fhir.codes import local_system, mapped, table_coding
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import (
    codeable,
    cx_identifier,
    fhir_datetime,
    first,
    hd_system,
    practitioner_reference,
)

__all__ = ["ENCOUNTER", "StayRule", "add_encounter", "add_location", "encounter_status"]

JSON = dict[str, Any]
ENCOUNTER = "Encounter"
V3_ACT_CODE = "http://terminology.hl7.org/CodeSystem/v3-ActCode"
V3_NULL_FLAVOR = "http://terminology.hl7.org/CodeSystem/v3-NullFlavor"
PARTICIPATION = "http://terminology.hl7.org/CodeSystem/v3-ParticipationType"
PHYSICAL_TYPE = "http://terminology.hl7.org/CodeSystem/location-physical-type"
DIAGNOSIS_ROLE = "http://terminology.hl7.org/CodeSystem/diagnosis-role"
# (the Encounter statuses the event applies to, whether any location will do)
StayRule = tuple[tuple[str, ...], bool]


def encounter_status(pv1: Segment, default: str) -> str:
    """PV1-45 (discharge date) means the encounter is over whatever the event says."""
    return "finished" if pv1.component(45, 1).strip() else default


def _class(pv1: Segment) -> JSON:
    code = pv1.component(2, 1).strip()
    v3 = mapped("encounter_class", code) if code else None
    if v3 is None:
        return {"system": V3_NULL_FLAVOR, "code": "UNK", "display": "unknown"}
    return {"system": V3_ACT_CODE, "code": v3}


def _location_parts(rep: Repetition) -> list[str]:
    # PL-1 is an HD from v2.7 on: its namespace id (first subcomponent) names the unit.
    return [rep.subcomponent(1, 1).strip(), rep.component(2).strip(), rep.component(3).strip()]


def add_location(ctx: MappingContext, rep: Repetition | None) -> JSON | None:
    """Stage a Location for a PL value (point of care^room^bed^facility...)."""
    if rep is None:
        return None
    unit, room, bed = _location_parts(rep)
    building, floor = rep.component(7).strip(), rep.component(8).strip()
    if not (unit or room or bed):
        return None
    facility = rep.subcomponent(4, 1).strip()
    facility_system = hd_system(facility, rep.subcomponent(4, 2), rep.subcomponent(4, 3))
    value = "^".join([unit, room, bed]).rstrip("^")
    identifier = {"system": local_system(ctx.sender, "location", facility or "-"),
                  "value": value}
    name = ", ".join(p for p in (unit, building, floor, room, bed) if p)
    location: JSON = {"resourceType": "Location", "identifier": [identifier],
                      "status": "active", "mode": "instance",
                      "name": f"{name} ({facility})" if facility else name}
    kind = "bd" if bed else "ro" if room else "wa"
    location["physicalType"] = {"coding": [{"system": PHYSICAL_TYPE, "code": kind}]}
    if facility:
        location["managingOrganization"] = {"display": facility}
        if facility_system:
            location["managingOrganization"]["identifier"] = {"system": facility_system,
                                                              "value": facility}
    key = f"Location:{identifier['system']}|{value}"
    return ctx.builder.create(key, location, identifier)


def _participants(pv1: Segment, ctx: MappingContext) -> list[JSON]:
    found = []
    for field_no in (7, 8, 9, 17):
        code = mapped("encounter_participant", f"PV1-{field_no}")
        for rep in pv1.repetitions(field_no):
            who = practitioner_reference(rep, ctx.sender)
            if who is not None and code:
                found.append({"type": [{"coding": [{"system": PARTICIPATION, "code": code}]}],
                              "individual": who})
    return found


def _identifier(pv1: Segment, ctx: MappingContext, patient_key: JSON | None) -> JSON | None:
    visit = first(pv1, 19)
    if visit is not None:
        identifier = cx_identifier(visit, ctx.sender, type_code="VN")
        if identifier is not None:
            return identifier
    admitted = pv1.component(44, 1).strip()
    if admitted and patient_key is not None:
        # No visit number: one patient is not admitted twice at the same instant.
        return {"system": local_system(ctx.sender, "visit"),
                "value": f"{patient_key['value']}@{admitted}"}
    return None


def _period(pv1: Segment, ctx: MappingContext) -> JSON | None:
    period: JSON = {}
    for key, field_no in (("start", 44), ("end", 45)):
        value = pv1.component(field_no, 1).strip()
        if not value:
            continue
        moment = fhir_datetime(value, ctx.default_tz)
        if moment is None:
            ctx.warn(pv1, field_no, f"{value!r} is not a valid date/time; dropped")
        else:
            period[key] = moment
    return period or None


def _locations(pv1: Segment, ctx: MappingContext) -> list[JSON]:
    found = []
    for field_no, status in ((3, "active"), (6, "completed")):
        ref = add_location(ctx, first(pv1, field_no))
        if ref is not None:
            found.append({"location": ref, "status": status})
    return found


def _hospitalization(pv1: Segment, ctx: MappingContext) -> JSON | None:
    stay: JSON = {}
    source = codeable(first(pv1, 14), ctx.sender, default_table="0023")
    if source:
        stay["admitSource"] = source
    disposition = codeable(first(pv1, 36), ctx.sender, default_table="0112")
    if disposition:
        stay["dischargeDisposition"] = disposition
    return stay or None


def encounter_from_pv1(pv1: Segment, ctx: MappingContext, patient: JSON, status: str,
                       identifier: JSON | None, pv2: Segment | None = None) -> JSON:
    encounter: JSON = {"resourceType": "Encounter", "status": encounter_status(pv1, status),
                       "class": _class(pv1), "subject": patient}
    if identifier is not None:
        encounter["identifier"] = [identifier]
    service = first(pv1, 10)
    if service is not None and service.component(1).strip():
        coding = table_coding("0069", service.component(1))
        encounter["serviceType"] = {"coding": [coding]} if coding else {"text": service.text}
    participants = _participants(pv1, ctx)
    if participants:
        encounter["participant"] = participants
    period = _period(pv1, ctx)
    if period:
        encounter["period"] = period
    reason = codeable(first(pv2, 3), ctx.sender)
    if reason:
        encounter["reasonCode"] = [reason]
    stay = _hospitalization(pv1, ctx)
    if stay:
        encounter["hospitalization"] = stay
    locations = _locations(pv1, ctx)
    if locations:
        encounter["location"] = locations
    return encounter


def _current_location(ctx: MappingContext, encounter: JSON) -> JSON | None:
    """The identifier of the Location the Encounter is at (PV1-3), if any."""
    for place in encounter.get("location", []):
        entry = ctx.builder.entry_of(place["location"])
        if place.get("status") == "active" and entry is not None:
            return entry.identifier
    return None


def add_encounter(ctx: MappingContext, patient: JSON, patient_key: JSON | None, *,
                  status: str, update: bool, stay: StayRule | None = None) -> JSON | None:
    """Stage the Encounter of the message's PV1; None when there is no usable PV1.

    ``stay``: without a visit number or admit time, find the stay by that rule (module
    docstring) instead of creating an Encounter each message."""
    pv1 = ctx.message.segment("PV1")
    if pv1 is None or pv1.field_count < 2:
        return None
    identifier = _identifier(pv1, ctx, patient_key)
    if identifier is None and not update:
        return None  # a result without a visit number does not invent an encounter
    encounter = encounter_from_pv1(pv1, ctx, patient, status, identifier,
                                   ctx.message.segment("PV2"))
    if identifier is None and stay is not None and patient_key is not None:
        statuses, any_location = stay
        match = StayMatch(patient_key, _current_location(ctx, encounter), statuses,
                          any_location)
        return ctx.builder.stay(ENCOUNTER, encounter, match)
    if update:
        return ctx.builder.upsert(ENCOUNTER, encounter, identifier)
    return ctx.builder.create(ENCOUNTER, encounter, identifier)


def add_diagnosis(ctx: MappingContext, condition: JSON, dg1: Segment) -> None:
    """Link a Condition to the message's Encounter (DG1-6 → diagnosis.use)."""
    if not ctx.builder.has(ENCOUNTER):
        return
    entry: JSON = {"condition": condition}
    role = mapped("diagnosis_role", dg1.component(6, 1)) if dg1.component(6, 1) else None
    if role:
        entry["use"] = {"coding": [{"system": DIAGNOSIS_ROLE, "code": role}]}
    ctx.builder.get(ENCOUNTER).setdefault("diagnosis", []).append(entry)

"""PID (+ PD1) → Patient.

| v2 | Patient | notes |
|---|---|---|
| PID-2, PID-3 (all), PID-4 | identifier | PID-3's first id (else PID-2, PID-4) is the match key |
| PID-19 | identifier | type SS, system ``http://hl7.org/fhir/sid/us-ssn`` |
| PID-5, PID-9 | name | XPN → HumanName (PID-9 aliases get use ``usual`` unless typed) |
| PID-6 | extension patient-mothersMaidenName | family name of the first repetition |
| PID-7 | birthDate | a time part also goes to the patient-birthTime extension |
| PID-8 | gender | table 0001 → administrative-gender (A, N → other) |
| PID-11 | address | XAD → Address |
| PID-13 / PID-14 | telecom | home / work |
| PID-15 | communication.language | preferred |
| PID-16 | maritalStatus | table 0002 → v3 MaritalStatus |
| PID-24 / PID-25 | multipleBirthBoolean / multipleBirthInteger | |
| PID-29 / PID-30 | deceasedDateTime / deceasedBoolean | |
| PD1-4 | generalPractitioner | logical reference |

Patients are matched by identifier: ADT messages update the matching Patient (conditional
update, merged so links and identifiers from elsewhere survive); every other message only
creates it when absent (``ifNoneExist``) and never rewrites demographics.
"""

from __future__ import annotations

from typing import Any

from hl7_gateway.parser import Segment
from hl7_gateway.v2_to_fhir.codes import mapped, table_coding
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import (
    address,
    codeable,
    contact_point,
    cx_identifier,
    fhir_date,
    fhir_datetime,
    first,
    human_name,
    practitioner_reference,
)

__all__ = ["PATIENT", "add_patient", "patient_from_pid", "patient_match_identifier"]

JSON = dict[str, Any]
PATIENT = "Patient"
SSN_SYSTEM = "http://hl7.org/fhir/sid/us-ssn"
BIRTH_TIME = "http://hl7.org/fhir/StructureDefinition/patient-birthTime"
MOTHERS_MAIDEN_NAME = "http://hl7.org/fhir/StructureDefinition/patient-mothersMaidenName"
V3_MARITAL = "http://terminology.hl7.org/CodeSystem/v3-MaritalStatus"


def _identifiers(pid: Segment, ctx: MappingContext) -> list[JSON]:
    found: list[JSON] = []
    for field_no in (3, 2, 4):
        for rep in pid.repetitions(field_no):
            identifier = cx_identifier(rep, ctx.sender)
            if identifier is not None and identifier not in found:
                found.append(identifier)
    ssn = pid.component(19, 1).strip()
    if ssn:
        found.append({"type": {"coding": [table_coding("0203", "SS")]},
                      "system": SSN_SYSTEM, "value": ssn})
    return found


def patient_match_identifier(pid: Segment, ctx: MappingContext) -> JSON | None:
    """The identifier a Patient is matched by: PID-3's first id, else PID-2, else PID-4."""
    for field_no in (3, 2, 4):
        for rep in pid.repetitions(field_no):
            identifier = cx_identifier(rep, ctx.sender)
            if identifier is not None:
                return {"system": identifier["system"], "value": identifier["value"]}
    return None


def _names(pid: Segment, ctx: MappingContext) -> list[JSON]:
    names = [n for rep in pid.repetitions(5) if (n := human_name(rep, ctx.default_tz))]
    for rep in pid.repetitions(9):
        alias = human_name(rep, ctx.default_tz)
        if alias is not None:
            alias.setdefault("use", "usual")
            names.append(alias)
    return names


def _birth(patient: JSON, pid: Segment, ctx: MappingContext) -> None:
    value = pid.component(7, 1).strip()
    if not value:
        return
    date = fhir_date(value)
    if date is None:
        ctx.warn(pid, 7, f"{value!r} is not a valid date; birth date dropped")
        return
    patient["birthDate"] = date
    if len(value) > 8:
        moment = fhir_datetime(value, ctx.default_tz)
        if moment and "T" in moment:
            patient["_birthDate"] = {"extension": [{"url": BIRTH_TIME,
                                                    "valueDateTime": moment}]}


def _gender(patient: JSON, pid: Segment, ctx: MappingContext) -> None:
    code = pid.component(8, 1).strip()
    if not code:
        return
    gender = mapped("administrative_gender", code)
    if gender is None:
        ctx.warn(pid, 8, f"{code!r} is not a table 0001 code; gender dropped", code=103)
    else:
        patient["gender"] = gender


def _telecom(pid: Segment) -> list[JSON]:
    points = [p for rep in pid.repetitions(13) if (p := contact_point(rep, "home"))]
    points += [p for rep in pid.repetitions(14) if (p := contact_point(rep, "work"))]
    return points


def _marital_status(pid: Segment) -> JSON | None:
    code = pid.component(16, 1).strip()
    if not code:
        return None
    coding = [c for c in (table_coding("0002", code),) if c]
    v3 = mapped("marital_status", code)
    if v3:
        coding.insert(0, {"system": V3_MARITAL, "code": v3})
    return {"coding": coding} if coding else None


def _multiple_birth(patient: JSON, pid: Segment) -> None:
    order = pid.field(25).strip()
    if order.isdecimal():
        patient["multipleBirthInteger"] = int(order)
    elif pid.field(24).strip().upper() in {"Y", "N"}:
        patient["multipleBirthBoolean"] = pid.field(24).strip().upper() == "Y"


def _deceased(patient: JSON, pid: Segment, ctx: MappingContext) -> None:
    when = pid.component(29, 1).strip()
    if when:
        moment = fhir_datetime(when, ctx.default_tz)
        if moment:
            patient["deceasedDateTime"] = moment
            return
        ctx.warn(pid, 29, f"{when!r} is not a valid date/time; death date dropped")
    flag = pid.field(30).strip().upper()
    if flag in {"Y", "N"}:
        patient["deceasedBoolean"] = flag == "Y"


def patient_from_pid(pid: Segment, ctx: MappingContext, pd1: Segment | None = None) -> JSON:
    """The Patient that a PID (and optional PD1) segment describes."""
    patient: JSON = {"resourceType": "Patient", "active": True}
    identifiers = _identifiers(pid, ctx)
    if identifiers:
        patient["identifier"] = identifiers
    names = _names(pid, ctx)
    if names:
        patient["name"] = names
    mother = first(pid, 6)
    if mother is not None and mother.subcomponent(1, 1).strip():
        patient["extension"] = [{"url": MOTHERS_MAIDEN_NAME,
                                 "valueString": mother.subcomponent(1, 1).strip()}]
    telecom = _telecom(pid)
    if telecom:
        patient["telecom"] = telecom
    _gender(patient, pid, ctx)
    _birth(patient, pid, ctx)
    _deceased(patient, pid, ctx)
    addresses = [a for rep in pid.repetitions(11) if (a := address(rep, ctx.default_tz))]
    if addresses:
        patient["address"] = addresses
    marital = _marital_status(pid)
    if marital:
        patient["maritalStatus"] = marital
    _multiple_birth(patient, pid)
    language = codeable(first(pid, 15), ctx.sender)
    if language:
        patient["communication"] = [{"language": language, "preferred": True}]
    doctor = practitioner_reference(first(pd1, 4), ctx.sender)
    if doctor:
        patient["generalPractitioner"] = [doctor]
    return patient


def add_patient(ctx: MappingContext, *, update: bool) -> JSON:
    """Stage the message's Patient and return a reference to it.

    ``update`` (ADT) makes the message the source of truth for demographics; otherwise an
    existing Patient with the same identifier is referenced as it is.
    """
    pid = ctx.message.segment("PID")
    if pid is None:
        raise ctx.fail(None, None, "the message has no PID segment", code=100)
    patient = patient_from_pid(pid, ctx, ctx.message.segment("PD1"))
    key = patient_match_identifier(pid, ctx)
    if update:
        return ctx.builder.upsert(PATIENT, patient, key, merge=True)
    return ctx.builder.create(PATIENT, patient, key)

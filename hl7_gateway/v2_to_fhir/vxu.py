"""VXU^V04 (vaccination record update) → one transaction.

| v2 | FHIR | written as |
|---|---|---|
| PID (+PD1) | Patient | referenced, created when absent |
| NK1 | RelatedPerson | as in ADT |
| ORC + RXA (+RXR, OBX) | Immunization | conditional update on the filler order number (ORC-3) |
| (message) | Binary + Provenance | see ``provenance`` |

| v2 | Immunization | notes |
|---|---|---|
| ORC-3 (else ORC-2) | identifier | the match key; without one: patient + vaccine + date |
| RXA-3 | occurrenceDateTime | required |
| RXA-5 | vaccineCode | CVX / NDC |
| RXA-6 / RXA-7 | doseQuantity | 999 means unknown: omitted |
| RXA-9 | primarySource / reportOrigin | 00 new record: primary source; 01 historical: reported |
| RXA-10 / ORC-12 | performer (function AP / OP) | administering / ordering provider |
| RXA-15 / 16 / 17 | lotNumber / expirationDate / manufacturer | |
| RXA-18 | statusReason | refusal reason |
| RXA-20 | status | table 0322: CP, PA completed (PA also isSubpotent); RE, NA not-done |
| RXA-21 = D | status entered-in-error | |
| RXA-22 | recorded | |
| RXR-1 / RXR-2 | route / site | |
| OBX 64994-7 / 30963-3 | programEligibility / fundingSource | CDC IIS guide |
| OBX 69764-9, 30956-7, 29768-9, 29769-7 | education | VIS document, publication, presentation |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hl7_gateway.parser import Segment
from hl7_gateway.v2_to_fhir.codes import immunization_observation, mapped
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import (
    codeable,
    derived_identifier,
    ei_identifier,
    fhir_date,
    fhir_datetime,
    first,
    number,
    practitioner_reference,
    quantity,
)
from hl7_gateway.v2_to_fhir.nk1 import add_related_persons
from hl7_gateway.v2_to_fhir.pid import add_patient, patient_match_identifier

__all__ = ["map_vxu"]

JSON = dict[str, Any]
FUNCTION = "http://terminology.hl7.org/CodeSystem/v2-0443"
ORIGIN = "http://terminology.hl7.org/CodeSystem/immunization-origin"
# RXA-9 information source (CDC table NIP001) → immunization-origin, for historical records.
REPORT_ORIGIN = {"02": "provider", "03": "record", "04": "recall", "05": "record",
                 "06": "record", "07": "school", "08": "record"}


@dataclass
class _Group:
    orc: Segment | None = None
    rxa: Segment | None = None
    rxr: Segment | None = None
    observations: list[Segment] = field(default_factory=list)


def _groups(ctx: MappingContext) -> list[_Group]:
    groups: list[_Group] = []
    for seg in ctx.message:
        if seg.id == "ORC":
            groups.append(_Group(orc=seg))
        elif seg.id == "RXA":
            if not groups or groups[-1].rxa is not None:
                groups.append(_Group())
            groups[-1].rxa = seg
        elif groups and groups[-1].rxa is not None:
            if seg.id == "RXR" and groups[-1].rxr is None:
                groups[-1].rxr = seg
            elif seg.id == "OBX":
                groups[-1].observations.append(seg)
    return [g for g in groups if g.rxa is not None]


def _status(immunization: JSON, rxa: Segment) -> None:
    if rxa.component(21, 1).strip().upper() == "D":
        immunization["status"] = "entered-in-error"
        return
    completion = rxa.component(20, 1).strip().upper() or "CP"
    immunization["status"] = mapped("immunization_status", completion) or "completed"
    if completion == "PA":
        immunization["isSubpotent"] = True


def _source(immunization: JSON, rxa: Segment) -> None:
    source = rxa.component(9, 1).strip()
    if not source:
        return
    immunization["primarySource"] = source == "00"
    if source == "00":
        return
    origin: JSON = {"text": rxa.component(9, 2).strip() or source}
    if source in REPORT_ORIGIN:
        origin["coding"] = [{"system": ORIGIN, "code": REPORT_ORIGIN[source]}]
    immunization["reportOrigin"] = origin


def _dose(immunization: JSON, rxa: Segment, ctx: MappingContext) -> None:
    amount = number(rxa.field(6))
    if amount is not None and amount != 999:
        immunization["doseQuantity"] = quantity(amount, first(rxa, 7), ctx.sender)


def _performers(group: _Group, ctx: MappingContext) -> list[JSON]:
    found = []
    for seg, field_no, role in ((group.rxa, 10, "AP"), (group.orc, 12, "OP")):
        actor = practitioner_reference(first(seg, field_no), ctx.sender)
        if actor is not None:
            found.append({"function": {"coding": [{"system": FUNCTION, "code": role}]},
                          "actor": actor})
    return found


def _apply_observations(immunization: JSON, group: _Group, ctx: MappingContext) -> None:
    education: dict[str, JSON] = {}
    for obx in group.observations:
        target = immunization_observation(obx.component(3, 1).strip())
        value = first(obx, 5)
        if target is None or value is None:
            continue
        if target in {"programEligibility", "fundingSource"}:
            concept = codeable(value, ctx.sender)
            if concept is None:
                continue
            if target == "fundingSource":
                immunization["fundingSource"] = concept
            else:
                immunization.setdefault("programEligibility", []).append(concept)
            continue
        item = education.setdefault(obx.field(4).strip() or "1", {})
        element = target.removeprefix("education.")
        if element == "documentType":
            item["documentType"] = value.component(2) or value.component(1)
        elif element == "vaccineType":
            item.setdefault("documentType", value.component(2) or value.component(1))
        else:
            moment = fhir_datetime(value.component(1), ctx.default_tz)
            if moment:
                item[element] = moment
    entries = [e for e in education.values() if e.get("documentType")]
    if entries:
        immunization["education"] = entries


def _immunization(group: _Group, ctx: MappingContext, patient: JSON) -> JSON:
    rxa = group.rxa
    assert rxa is not None
    vaccine = codeable(first(rxa, 5), ctx.sender)
    if vaccine is None:
        raise ctx.fail(rxa, 5, "administered code is empty")
    when = rxa.component(3, 1).strip()
    occurred = fhir_datetime(when, ctx.default_tz) if when else None
    if occurred is None:
        raise ctx.fail(rxa, 3, f"{when!r} is not a valid administration date/time", code=102)
    immunization: JSON = {"resourceType": "Immunization", "status": "completed",
                          "vaccineCode": vaccine, "patient": patient,
                          "occurrenceDateTime": occurred}
    _status(immunization, rxa)
    _source(immunization, rxa)
    recorded = fhir_datetime(rxa.component(22, 1), ctx.default_tz) \
        if rxa.component(22, 1).strip() else None
    if recorded:
        immunization["recorded"] = recorded
    _dose(immunization, rxa, ctx)
    if rxa.component(15, 1).strip():
        immunization["lotNumber"] = rxa.component(15, 1).strip()
    expires = fhir_date(rxa.component(16, 1)) if rxa.component(16, 1).strip() else None
    if expires and len(expires) == 10:
        immunization["expirationDate"] = expires
    manufacturer = codeable(first(rxa, 17), ctx.sender)
    if manufacturer:
        coding = manufacturer.get("coding", [{}])[0]
        ref: JSON = {"type": "Organization",
                     "display": coding.get("display") or manufacturer.get("text", "")}
        if coding.get("code"):
            ref["identifier"] = {"system": coding.get("system", ""), "value": coding["code"]}
        immunization["manufacturer"] = {k: v for k, v in ref.items() if v}
    reason = codeable(first(rxa, 18), ctx.sender)
    if reason:
        immunization["statusReason"] = reason
    performers = _performers(group, ctx)
    if performers:
        immunization["performer"] = performers
    route = codeable(first(group.rxr, 1), ctx.sender, default_table="0162")
    if route:
        immunization["route"] = route
    site = codeable(first(group.rxr, 2), ctx.sender, default_table="0163")
    if site:
        immunization["site"] = site
    _apply_observations(immunization, group, ctx)
    return immunization


def map_vxu(ctx: MappingContext) -> None:
    patient = add_patient(ctx, update=False)
    pid = ctx.message.segment("PID")
    assert pid is not None
    patient_key = patient_match_identifier(pid, ctx)
    add_related_persons(ctx, patient, patient_key)
    groups = _groups(ctx)
    if not groups:
        raise ctx.fail(None, None, "VXU^V04 without an RXA segment", code=100)
    for n, group in enumerate(groups, 1):
        immunization = _immunization(group, ctx, patient)
        identifier = ei_identifier(first(group.orc, 3), ctx.sender, kind="filler-order") or \
            ei_identifier(first(group.orc, 2), ctx.sender, kind="placer-order")
        if identifier is None and patient_key is not None:
            vaccine = immunization["vaccineCode"].get("coding", [{}])[0]
            identifier = derived_identifier("immunization", patient_key["system"],
                                            patient_key["value"], vaccine.get("code", ""),
                                            immunization["occurrenceDateTime"])
        if identifier is not None:
            immunization["identifier"] = [identifier]
        ctx.builder.upsert(f"Immunization:{n}", immunization, identifier)

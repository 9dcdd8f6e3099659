"""NK1 → RelatedPerson.

| v2 | RelatedPerson | notes |
|---|---|---|
| (PID) | patient | |
| NK1-2 | name | XPN → HumanName |
| NK1-3 | relationship | table 0063 (MTH, SPO, CHD, ...) |
| NK1-7 | relationship | table 0131 contact role (C / EMC: emergency contact) |
| NK1-4 | address | |
| NK1-5 / NK1-6 | telecom | home / work |
| NK1-8 / NK1-9 | period | start / end |

v2 gives next of kin no id: the RelatedPerson is identified by a digest of the patient's
identifier and the relative's name, so a repeated ADT updates it instead of adding one.
"""

from __future__ import annotations

from typing import Any

from hl7_gateway.parser import Segment
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import (
    address,
    codeable,
    contact_point,
    derived_identifier,
    fhir_date,
    first,
    human_name,
)

__all__ = ["add_related_persons"]

JSON = dict[str, Any]


def _related_person(nk1: Segment, ctx: MappingContext, patient: JSON) -> JSON | None:
    names = [n for rep in nk1.repetitions(2) if (n := human_name(rep, ctx.default_tz))]
    if not names:
        return None
    person: JSON = {"resourceType": "RelatedPerson", "active": True, "patient": patient,
                    "name": names}
    relationship = [c for c in (codeable(first(nk1, 3), ctx.sender, default_table="0063"),
                                codeable(first(nk1, 7), ctx.sender, default_table="0131"))
                    if c]
    if relationship:
        person["relationship"] = relationship
    addresses = [a for rep in nk1.repetitions(4) if (a := address(rep, ctx.default_tz))]
    if addresses:
        person["address"] = addresses
    telecom = [p for rep in nk1.repetitions(5) if (p := contact_point(rep, "home"))]
    telecom += [p for rep in nk1.repetitions(6) if (p := contact_point(rep, "work"))]
    if telecom:
        person["telecom"] = telecom
    period = {k: d for k, n in (("start", 8), ("end", 9))
              if (d := fhir_date(nk1.component(n, 1))) and nk1.component(n, 1).strip()}
    if period:
        person["period"] = period
    return person


def add_related_persons(ctx: MappingContext, patient: JSON, patient_key: JSON | None) -> None:
    for nk1 in ctx.message.segments("NK1"):
        person = _related_person(nk1, ctx, patient)
        if person is None:
            continue
        name = person["name"][0]
        if patient_key is None:
            ctx.builder.post(f"RelatedPerson:{ctx.sequence_of(nk1)}", person)
            continue
        identifier = derived_identifier("related-person", patient_key["system"],
                                        patient_key["value"], name.get("family", ""),
                                        " ".join(name.get("given", [])))
        person["identifier"] = [identifier]
        ctx.builder.upsert(f"RelatedPerson:{identifier['value']}", person, identifier)

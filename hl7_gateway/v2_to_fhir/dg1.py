"""DG1 → Condition (+ Encounter.diagnosis).

| v2 | Condition | notes |
|---|---|---|
| (PID) | subject | |
| (PV1) | encounter | and Encounter.diagnosis[].condition |
| DG1-3 (else DG1-4) | code | CWE; DG1-4 is the description of v2.3 senders |
| DG1-5 | recordedDate | |
| DG1-6 | Encounter.diagnosis.use | table 0052 → diagnosis-role (A AD, F DD, W CC) |
| DG1-20 | identifier | diagnosis identifier (v2.5+): the match key |
| (fixed) | category encounter-diagnosis | |

Without DG1-20 the Condition is identified by a digest of patient + visit + code.
"""

from __future__ import annotations

from typing import Any

from hl7_gateway.parser import Segment
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import (
    codeable,
    derived_identifier,
    ei_identifier,
    fhir_datetime,
    first,
)
from hl7_gateway.v2_to_fhir.pv1 import ENCOUNTER, add_diagnosis

__all__ = ["add_conditions"]

JSON = dict[str, Any]
CATEGORY = "http://terminology.hl7.org/CodeSystem/condition-category"


def _condition(dg1: Segment, ctx: MappingContext, patient: JSON) -> JSON | None:
    code = codeable(first(dg1, 3), ctx.sender)
    if code is None and dg1.field(4).strip():
        code = {"text": dg1.field(4).strip()}
    if code is None:
        return None
    condition: JSON = {
        "resourceType": "Condition", "subject": patient, "code": code,
        "category": [{"coding": [{"system": CATEGORY, "code": "encounter-diagnosis"}]}],
    }
    if ctx.builder.has(ENCOUNTER):
        condition["encounter"] = ctx.builder.reference(ENCOUNTER)
    recorded = dg1.component(5, 1).strip()
    if recorded:
        moment = fhir_datetime(recorded, ctx.default_tz)
        if moment:
            condition["recordedDate"] = moment
        else:
            ctx.warn(dg1, 5, f"{recorded!r} is not a valid date/time; dropped")
    return condition


def add_conditions(ctx: MappingContext, patient: JSON, patient_key: JSON | None) -> list[JSON]:
    """Stage a Condition per DG1; returns references to them (for reasonReference)."""
    added = []
    for dg1 in ctx.message.segments("DG1"):
        condition = _condition(dg1, ctx, patient)
        if condition is None:
            ctx.warn(dg1, 3, "no diagnosis code or description; diagnosis dropped", code=101)
            continue
        identifier = ei_identifier(first(dg1, 20), ctx.sender, kind="diagnosis")
        if identifier is None and patient_key is not None:
            code = condition["code"].get("coding", [{}])[0]
            visit = ctx.builder.get(ENCOUNTER).get("identifier", [{}])[0].get("value", "") \
                if ctx.builder.has(ENCOUNTER) else ""
            identifier = derived_identifier("condition", patient_key["system"],
                                            patient_key["value"], visit,
                                            code.get("system", ""),
                                            code.get("code", condition["code"].get("text", "")))
        if identifier is not None:
            condition["identifier"] = [identifier]
        ref = ctx.builder.upsert(f"Condition:{ctx.sequence_of(dg1)}", condition, identifier)
        add_diagnosis(ctx, ref, dg1)
        added.append(ref)
    return added

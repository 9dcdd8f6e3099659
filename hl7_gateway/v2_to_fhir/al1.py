"""AL1 → AllergyIntolerance.

| v2 | AllergyIntolerance | notes |
|---|---|---|
| (PID) | patient | |
| AL1-2 | category, type | table 0127: DA medication, FA food, EA/AA/PA/LA environment; |
|  |  | MC (contraindication) → type intolerance |
| AL1-3 | code | CWE |
| AL1-4 | criticality | table 0128: SV high, MO/MI low, U unable-to-assess |
| AL1-5 | reaction.manifestation.text | each repetition |
| AL1-6 | onsetDateTime | |
| (fixed) | clinicalStatus active | as the IG does: v2 sends the patient's current allergies |

Identified by a digest of patient + allergen, so a repeated ADT updates the allergy.
"""

from __future__ import annotations

from typing import Any

from hl7_gateway.parser import Segment
from hl7_gateway.v2_to_fhir.codes import mapped
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import codeable, derived_identifier, fhir_datetime, first

__all__ = ["add_allergies"]

JSON = dict[str, Any]
CLINICAL = "http://terminology.hl7.org/CodeSystem/allergyintolerance-clinical"


def _allergy(al1: Segment, ctx: MappingContext, patient: JSON) -> JSON | None:
    code = codeable(first(al1, 3), ctx.sender)
    if code is None:
        return None
    allergy: JSON = {
        "resourceType": "AllergyIntolerance", "patient": patient, "code": code,
        "clinicalStatus": {"coding": [{"system": CLINICAL, "code": "active"}]},
    }
    kind = al1.component(2, 1).strip()
    category = mapped("allergy_category", kind) if kind else None
    if category:
        allergy["category"] = [category]
    if kind:
        allergy["type"] = "intolerance" if kind.upper() == "MC" else "allergy"
    severity = al1.component(4, 1).strip()
    criticality = mapped("allergy_criticality", severity) if severity else None
    if criticality:
        allergy["criticality"] = criticality
    manifestations = [{"text": rep.text.strip()} for rep in al1.repetitions(5)
                      if rep.text.strip()]
    if manifestations:
        allergy["reaction"] = [{"manifestation": manifestations}]
    onset = al1.component(6, 1).strip()
    if onset:
        moment = fhir_datetime(onset, ctx.default_tz)
        if moment:
            allergy["onsetDateTime"] = moment
        else:
            ctx.warn(al1, 6, f"{onset!r} is not a valid date; onset dropped")
    return allergy


def add_allergies(ctx: MappingContext, patient: JSON, patient_key: JSON | None) -> None:
    for al1 in ctx.message.segments("AL1"):
        allergy = _allergy(al1, ctx, patient)
        if allergy is None:
            ctx.warn(al1, 3, "no allergen code; allergy dropped", code=101)
            continue
        if patient_key is None:
            ctx.builder.post(f"AllergyIntolerance:{ctx.sequence_of(al1)}", allergy)
            continue
        allergen = first(al1, 3)
        assert allergen is not None
        identifier = derived_identifier("allergy", patient_key["system"], patient_key["value"],
                                        allergen.component(3), allergen.component(1) or
                                        allergen.component(2))
        allergy["identifier"] = [identifier]
        ctx.builder.upsert(f"AllergyIntolerance:{identifier['value']}", allergy, identifier)

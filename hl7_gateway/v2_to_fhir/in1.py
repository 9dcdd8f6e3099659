"""IN1 → Coverage.

| v2 | Coverage | notes |
|---|---|---|
| (PID) | beneficiary | |
| IN1-2 | class (type plan) | health plan id |
| IN1-3 / IN1-4 | payor | logical Reference(Organization): id IN1-3, name IN1-4 |
| IN1-12 / IN1-13 | period | plan effective / expiration date |
| IN1-15 | type | plan type |
| IN1-16 / IN1-17 | subscriber / relationship | SEL: the patient; 0063 → subscriber-relationship |
| IN1-36 | identifier, subscriberId | policy number: the match key |
| IN1-49 | subscriberId | insured's id, when IN1-36 is empty |

A Coverage is matched by its policy number when IN1-36 is sent; otherwise by a digest of
patient + plan + company, so repeated messages update it.
"""

from __future__ import annotations

from typing import Any

from hl7_gateway.parser import Segment
from hl7_gateway.v2_to_fhir.codes import local_system, mapped
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import (
    codeable,
    derived_identifier,
    fhir_date,
    first,
    person_name_text,
)

__all__ = ["add_coverages"]

JSON = dict[str, Any]
RELATIONSHIP = "http://terminology.hl7.org/CodeSystem/subscriber-relationship"
COVERAGE_CLASS = "http://terminology.hl7.org/CodeSystem/coverage-class"


def _payor(in1: Segment, ctx: MappingContext) -> JSON:
    company_id = in1.component(3, 1).strip()
    name = in1.component(4, 1).strip() or in1.component(2, 2).strip() or in1.component(2, 1)
    payor: JSON = {"type": "Organization", "display": name.strip() or company_id or "unknown"}
    if company_id:
        payor["identifier"] = {"system": local_system(ctx.sender, "insurance-company"),
                               "value": company_id}
    return payor


def _period(in1: Segment) -> JSON | None:
    period = {k: d for k, n in (("start", 12), ("end", 13))
              if in1.component(n, 1).strip() and (d := fhir_date(in1.component(n, 1)))}
    return period or None


def _subscriber(coverage: JSON, in1: Segment, patient: JSON) -> None:
    relation = in1.component(17, 1).strip()
    code = mapped("subscriber_relationship", relation) if relation else None
    if code:
        coverage["relationship"] = {"coding": [{"system": RELATIONSHIP, "code": code}]}
    if code == "self":
        coverage["subscriber"] = patient
        return
    insured = first(in1, 16)
    if insured is not None:
        name = person_name_text(insured.subcomponent(1, 1), insured.component(2),
                                insured.component(3))
        if name:
            coverage["subscriber"] = {"type": "RelatedPerson", "display": name}


def _coverage(in1: Segment, ctx: MappingContext, patient: JSON) -> JSON:
    coverage: JSON = {"resourceType": "Coverage", "status": "active", "beneficiary": patient,
                      "payor": [_payor(in1, ctx)]}
    plan = in1.component(2, 1).strip()
    if plan:
        plan_class: JSON = {"type": {"coding": [{"system": COVERAGE_CLASS, "code": "plan"}]},
                            "value": plan}
        if in1.component(2, 2).strip():
            plan_class["name"] = in1.component(2, 2).strip()
        coverage["class"] = [plan_class]
    plan_type = codeable(first(in1, 15), ctx.sender, default_table="0086")
    if plan_type:
        coverage["type"] = plan_type
    period = _period(in1)
    if period:
        coverage["period"] = period
    _subscriber(coverage, in1, patient)
    member_id = in1.component(36, 1).strip() or in1.component(49, 1).strip()
    if member_id:
        coverage["subscriberId"] = member_id
    return coverage


def add_coverages(ctx: MappingContext, patient: JSON, patient_key: JSON | None) -> None:
    for in1 in ctx.message.segments("IN1"):
        coverage = _coverage(in1, ctx, patient)
        policy = in1.component(36, 1).strip()
        if policy:
            identifier = {"system": local_system(ctx.sender, "policy",
                                                 in1.component(3, 1) or "-"),
                          "value": policy}
        elif patient_key is not None:
            identifier = derived_identifier("coverage", patient_key["system"],
                                            patient_key["value"], in1.component(2, 1),
                                            in1.component(3, 1), in1.component(4, 1))
        else:
            ctx.builder.post(f"Coverage:{ctx.sequence_of(in1)}", coverage)
            continue
        coverage["identifier"] = [identifier]
        ctx.builder.upsert(f"Coverage:{identifier['system']}|{identifier['value']}",
                           coverage, identifier)

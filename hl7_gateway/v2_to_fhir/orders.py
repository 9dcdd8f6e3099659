"""ORM^O01 and OML^O21 (orders) → one transaction.

| v2 | FHIR | written as |
|---|---|---|
| PID (+PD1) | Patient | referenced, created when absent |
| PV1 | Encounter | referenced by visit number, created when absent |
| NK1 / IN1 / AL1 | RelatedPerson / Coverage / AllergyIntolerance | as in ADT |
| DG1 | Condition | ServiceRequest.reasonReference |
| ORC + OBR (+TQ1) | ServiceRequest | conditional update on the placer (else filler) number, |
|  |  | merged: an order placed through /api/labs keeps what it had |
| OBX in the order | Observation | ServiceRequest.supportingInfo (ask-at-order-entry answers) |
| SPM | Specimen | ServiceRequest.specimen |
| (message) | Binary + Provenance | see ``provenance`` |

ORC-1 (order control) and ORC-5 (order status) give the ServiceRequest status, so a
cancel (CA) or discontinue (DC) message revokes the order it names.
"""

from __future__ import annotations

from typing import Any

from hl7_gateway.v2_to_fhir.al1 import add_allergies
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.dg1 import add_conditions
from hl7_gateway.v2_to_fhir.in1 import add_coverages
from hl7_gateway.v2_to_fhir.nk1 import add_related_persons
from hl7_gateway.v2_to_fhir.obr import OrderGroup, order_groups, order_identifiers, service_request
from hl7_gateway.v2_to_fhir.oru import add_observation
from hl7_gateway.v2_to_fhir.pid import add_patient, patient_match_identifier
from hl7_gateway.v2_to_fhir.pv1 import add_encounter
from hl7_gateway.v2_to_fhir.spm import add_specimen

__all__ = ["map_order"]

JSON = dict[str, Any]


def _map_group(ctx: MappingContext, group: OrderGroup, base: JSON, reasons: list[JSON]
               ) -> None:
    placer, filler = order_identifiers(group, ctx)
    order_id = placer or filler
    anchor = group.orc or group.obr
    assert anchor is not None
    if order_id is None:
        raise ctx.fail(anchor, 2, "the order has neither a placer nor a filler order number")
    request = service_request(group, ctx, base["subject"], default_status="active")
    if "encounter" in base:
        request["encounter"] = base["encounter"]
    if reasons:
        request["reasonReference"] = reasons
    key = f"ServiceRequest:{order_id['system']}|{order_id['value']}"
    ref = ctx.builder.upsert(key, request, order_id, merge=True)
    answers = [a for obx in group.observations
               if (a := add_observation(ctx, obx, {**base, "basedOn": [ref]}, order_id,
                                        effective=None, category=None))]
    if answers:
        request["supportingInfo"] = answers
    specimens = [add_specimen(ctx, spm, {"subject": base["subject"], "request": [ref]},
                              order_id["value"]) for spm, _ in group.specimens]
    if specimens:
        request["specimen"] = specimens


def map_order(ctx: MappingContext) -> None:
    patient = add_patient(ctx, update=False)
    pid = ctx.message.segment("PID")
    assert pid is not None
    patient_key = patient_match_identifier(pid, ctx)
    encounter = add_encounter(ctx, patient, patient_key, status="unknown", update=False)
    base: JSON = {"subject": patient}
    if encounter is not None:
        base["encounter"] = encounter
    add_related_persons(ctx, patient, patient_key)
    add_coverages(ctx, patient, patient_key)
    add_allergies(ctx, patient, patient_key)
    reasons = add_conditions(ctx, patient, patient_key)
    _, groups = order_groups(ctx.message)
    if not groups:
        raise ctx.fail(None, None, f"{ctx.message.message_type}^{ctx.event} without an "
                       "ORC or OBR segment", code=100)
    for group in groups:
        _map_group(ctx, group, base, reasons)

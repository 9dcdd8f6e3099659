"""ORU^R01 (unsolicited observation results) → one transaction.

| v2 | FHIR | written as |
|---|---|---|
| PID (+PD1) | Patient | referenced, created when absent (results never rewrite demographics) |
| PV1 | Encounter | referenced by visit number, created when absent |
| ORC + OBR | ServiceRequest | referenced by placer number (/api/labs orders), created when absent |
| OBR | DiagnosticReport | conditional update on the filler order number |
| OBX | Observation | conditional update on filler number + OBX-3 (+ OBX-4): a correction |
|  |  | (OBX-11 C) updates the same Observation |
| SPM | Specimen | conditional update on SPM-2 |
| OBX before any OBR | Observation | patient-level observations (v2.8 PATIENT_OBSERVATION) |
| (message) | Binary + Provenance | see ``provenance`` |

Each DiagnosticReport becomes a ``platform.lab.result_received`` event once committed
(see :func:`result_events`).
"""

from __future__ import annotations

from typing import Any

from hl7_gateway.parser import Segment
from hl7_gateway.v2_to_fhir.codes import local_system
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.obr import (
    OrderGroup,
    diagnostic_report,
    order_groups,
    order_identifiers,
    report_key,
    service_request,
)
from hl7_gateway.v2_to_fhir.obx import observation_from_obx, obx_has_content
from hl7_gateway.v2_to_fhir.pid import add_patient, patient_match_identifier
from hl7_gateway.v2_to_fhir.pv1 import add_encounter
from hl7_gateway.v2_to_fhir.spm import add_specimen

__all__ = ["LAB_CATEGORY", "add_observation", "map_oru"]

JSON = dict[str, Any]
LAB_CATEGORY = {"coding": [{
    "system": "http://terminology.hl7.org/CodeSystem/observation-category",
    "code": "laboratory", "display": "Laboratory"}]}
FINISHED = frozenset({"final", "corrected", "amended", "appended"})


def add_observation(ctx: MappingContext, obx: Segment, links: JSON, key: JSON, *,
                    effective: str | None, category: JSON | None) -> JSON | None:
    """Stage one OBX as an Observation identified by ``key`` + OBX-3 (+ OBX-4).

    An OBX whose value says what was observed nowhere (OBX-3 empty, OBX-3 is required:
    HL7 v2.5.1 7.4.2.3) is not stored; the other results of the message are, and the
    acknowledgement names this one (an error at OBX-3). One without a value either
    carries nothing and is skipped with a warning."""
    if not obx_has_content(obx):
        ctx.warn(obx, 3, "OBX has neither an identifier nor a value; skipped", code=101)
        return None
    if not (obx.component(3, 1).strip() or obx.component(3, 2).strip()):
        ctx.skip(obx, 3, "observation identifier is empty: this result was not stored, "
                 "the message's other results were")
        return None
    observation = observation_from_obx(obx, ctx, links, effective=effective, category=category)
    code = obx.component(3, 1).strip() or obx.component(3, 2).strip()
    value = "^".join(p for p in (key["value"], code, obx.field(4).strip()) if p)
    builder_key = f"Observation:{key['system']}|{value}"
    if ctx.builder.has(builder_key):
        # The same test twice in one order without a sub-id: OBX-1 tells them apart.
        value += f"^{obx.field(1).strip() or ctx.sequence_of(obx)}"
        builder_key = f"Observation:{key['system']}|{value}"
    identifier = {"system": key["system"], "value": value}
    observation["identifier"] = [identifier]
    return ctx.builder.upsert(builder_key, observation, identifier)


def _links(base: JSON, **more: Any) -> JSON:
    return {**base, **{k: v for k, v in more.items() if v}}


def _map_group(ctx: MappingContext, group: OrderGroup, base: JSON) -> None:
    obr = group.obr
    assert obr is not None
    placer, filler = order_identifiers(group, ctx)
    key = report_key(filler, placer, ctx, obr)
    report = diagnostic_report(group, ctx, base)  # status first: the order's status needs it
    based_on = None
    order_id = placer or filler
    if order_id is not None:
        default = "completed" if report["status"] in FINISHED else "active"
        request = service_request(group, ctx, base["subject"], default_status=default)
        based_on = [ctx.builder.create(f"ServiceRequest:{order_id['system']}|"
                                       f"{order_id['value']}", request, order_id)]
        report["basedOn"] = based_on
    effective = report.get("effectiveDateTime") or report.get("effectivePeriod", {}).get("start")
    results, specimens = [], []
    for obx in group.observations:
        ref = add_observation(ctx, obx, _links(base, basedOn=based_on), key,
                              effective=effective, category=LAB_CATEGORY)
        results.append(ref)
    for spm, observations in group.specimens:
        specimen = add_specimen(ctx, spm, _links({"subject": base["subject"]},
                                                 request=based_on), key["value"])
        specimens.append(specimen)
        for obx in observations:
            results.append(add_observation(
                ctx, obx, _links(base, basedOn=based_on, specimen=specimen), key,
                effective=effective, category=LAB_CATEGORY))
    if specimens:
        report["specimen"] = specimens
        for ref in results:
            if ref is not None:
                ctx.builder.resolve(ref).setdefault("specimen", specimens[0])
    found = [r for r in results if r is not None]
    if found:
        report["result"] = found
    ctx.builder.upsert(f"DiagnosticReport:{key['system']}|{key['value']}", report, key)


def map_oru(ctx: MappingContext) -> None:
    patient = add_patient(ctx, update=False)
    pid = ctx.message.segment("PID")
    assert pid is not None
    patient_key = patient_match_identifier(pid, ctx)
    encounter = add_encounter(ctx, patient, patient_key, status="unknown", update=False)
    base = _links({"subject": patient}, encounter=encounter)
    loose, groups = order_groups(ctx.message)
    groups = [g for g in groups if g.obr is not None]
    if not groups:
        raise ctx.fail(None, None, "ORU^R01 without an OBR segment", code=100)
    patient_key_obs = {"system": local_system(ctx.sender, "patient-observation"),
                       "value": ctx.control_id}
    for obx in loose:
        add_observation(ctx, obx, base, patient_key_obs, effective=None, category=None)
    for group in groups:
        _map_group(ctx, group, base)

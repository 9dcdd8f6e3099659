"""ADT (admit, discharge, transfer) → one transaction.

| v2 | FHIR | written as |
|---|---|---|
| PID (+PD1) | Patient | conditional update on PID-3, merged into the stored Patient |
| PV1 (+PV2) | Encounter (+ Location) | conditional update on the visit number (else see |
|  |  | ``pv1``: patient + admit time, else the patient's stay) |
| NK1 | RelatedPerson | see ``nk1`` |
| IN1 | Coverage | see ``in1`` |
| AL1 | AllergyIntolerance | see ``al1`` |
| DG1 | Condition + Encounter.diagnosis | see ``dg1`` |
| OBX | Observation (subject, encounter) | conditional update on the stay + OBX-3 (+ OBX-14); |
|  |  | vital signs (height, weight...) get category vital-signs |
| MRG (A40) | Patient (merged-away record) | inactive, link replaced-by; survivor: link replaces |
| (message) | Binary + Provenance | see ``provenance`` |

Encounter.status by trigger event (PV1-45 valued always means finished):

| event | meaning | status |
|---|---|---|
| A01 | admit | in-progress |
| A02 | transfer | in-progress (PV1-6 becomes a completed location) |
| A03 | discharge | finished |
| A04 | register an outpatient | arrived |
| A05 | pre-admit | planned |
| A08 | update patient information | in-progress if PV1-44 is valued, else unknown |
| A11 | cancel admit | cancelled |
| A13 | cancel discharge | in-progress |
| A28 / A31 | add / update person | no Encounter (person-level events) |
| A40 | merge patient | no Encounter |

An ADT's OBX segments (HL7 v2.5.1 3.3.1: ``[{OBX}]`` after PV1/PV2, the admission height
and weight, say) become Observations of the patient in the stay. Each is identified by
the stay (its visit number, else patient and admit time, else the message) and OBX-3
(plus OBX-14 when sent): an A08 that repeats the admission weight corrects it, a weight
measured at another time is another Observation. The R4 vital signs profiles require
category ``vital-signs`` for their codes (generated from the R4 profiles into
``v2_maps.json``), so those get it.
"""

from __future__ import annotations

from typing import Any

from hl7_gateway.parser import Segment
from hl7_gateway.v2_to_fhir.al1 import add_allergies
from hl7_gateway.v2_to_fhir.codes import local_system, vital_sign_profile
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import cx_identifier, human_name
from hl7_gateway.v2_to_fhir.dg1 import add_conditions
from hl7_gateway.v2_to_fhir.in1 import add_coverages
from hl7_gateway.v2_to_fhir.nk1 import add_related_persons
from hl7_gateway.v2_to_fhir.oru import add_observation
from hl7_gateway.v2_to_fhir.pid import (
    PATIENT,
    add_patient,
    patient_from_pid,
    patient_match_identifier,
)
from hl7_gateway.v2_to_fhir.pv1 import ENCOUNTER, StayRule, add_encounter

__all__ = ["ADT_EVENTS", "map_adt"]

JSON = dict[str, Any]
OBSERVATION_CATEGORY = "http://terminology.hl7.org/CodeSystem/observation-category"
VITAL_SIGNS = {"coding": [{"system": OBSERVATION_CATEGORY, "code": "vital-signs",
                           "display": "Vital Signs"}]}
LOINC_NAMES = frozenset({"LN", "LOINC"})

# Trigger event → Encounter.status; None: the event is about the person, not a visit.
ADT_EVENTS: dict[str, str | None] = {
    "A01": "in-progress", "A02": "in-progress", "A03": "finished", "A04": "arrived",
    "A05": "planned", "A08": "in-progress", "A11": "cancelled", "A13": "in-progress",
    "A28": None, "A31": None, "A40": None,
}


# Without a visit number or admit time, the Encounter statuses an event may find its stay
# in, and whether it may be at another location than PV1-3 (see ``pv1``): an event about a
# stay already begun follows the patient; one that begins a stay does not take another's.
# "unknown": what an A08 that came first (no admit time to tell) created.
OPEN = ("planned", "arrived", "triaged", "in-progress", "onleave", "unknown")
STAY_RULES: dict[str, StayRule] = {
    "A01": (OPEN, False), "A04": (OPEN, False), "A05": (OPEN, False),
    "A02": (OPEN, True), "A03": (OPEN, True), "A08": (OPEN, True), "A11": (OPEN, True),
    "A13": (("finished", *OPEN), True),
}


def _visit_status(ctx: MappingContext) -> str | None:
    status = ADT_EVENTS[ctx.event]
    pv1 = ctx.message.segment("PV1")
    if ctx.event == "A08" and (pv1 is None or not pv1.component(44, 1).strip()):
        return "unknown"
    return status


def _prior_patient(mrg: Segment, ctx: MappingContext, survivor: JSON) -> tuple[JSON, JSON]:
    identifiers = [i for rep in mrg.repetitions(1) if (i := cx_identifier(rep, ctx.sender))]
    if not identifiers:
        raise ctx.fail(mrg, 1, "prior patient identifier list is empty")
    prior: JSON = {"resourceType": "Patient", "active": False, "identifier": identifiers,
                   "link": [{"other": survivor, "type": "replaced-by"}]}
    names = [n for rep in mrg.repetitions(7) if (n := human_name(rep, ctx.default_tz))]
    if names:
        prior["name"] = names
    key = {"system": identifiers[0]["system"], "value": identifiers[0]["value"]}
    return prior, key


def _map_merge(ctx: MappingContext) -> None:
    """A40: every PID/MRG pair merges the MRG patient into the PID patient."""
    pairs = list(zip(ctx.message.segments("PID"), ctx.message.segments("MRG"), strict=False))
    if not pairs:
        raise ctx.fail(None, None, "ADT^A40 needs a PID and an MRG segment", code=100)
    for n, (pid, mrg) in enumerate(pairs):
        survivor_key = f"{PATIENT}:{n}" if n else PATIENT
        survivor = patient_from_pid(pid, ctx)
        ref = ctx.builder.upsert(survivor_key, survivor, patient_match_identifier(pid, ctx),
                                 merge=True)
        prior, prior_id = _prior_patient(mrg, ctx, ref)
        if prior_id == patient_match_identifier(pid, ctx):
            raise ctx.fail(mrg, 1, "the prior patient is the surviving patient", code=205)
        prior_ref = ctx.builder.upsert(f"{PATIENT}:prior:{n}", prior, prior_id, merge=True)
        survivor["link"] = [{"other": prior_ref, "type": "replaces"}]


def map_adt(ctx: MappingContext) -> None:
    if ctx.event == "A40":
        _map_merge(ctx)
        return
    patient = add_patient(ctx, update=True)
    pid = ctx.message.segment("PID")
    assert pid is not None
    patient_key = patient_match_identifier(pid, ctx)
    status = _visit_status(ctx)
    encounter = None
    if status is not None:
        encounter = add_encounter(ctx, patient, patient_key, status=status, update=True,
                                  stay=STAY_RULES.get(ctx.event))
    add_related_persons(ctx, patient, patient_key)
    add_coverages(ctx, patient, patient_key)
    add_allergies(ctx, patient, patient_key)
    add_conditions(ctx, patient, patient_key)
    _add_observations(ctx, patient, encounter)


def _stay_key(ctx: MappingContext) -> str:
    """What identifies the stay the message's observations belong to."""
    if ctx.builder.has(ENCOUNTER):
        identifier = ctx.builder.entries[ENCOUNTER].identifier
        if identifier is not None:
            return str(identifier["value"])
    return f"message-{ctx.control_id}"


def _category(obx: Segment) -> JSON | None:
    code, system = obx.component(3, 1).strip(), obx.component(3, 3).strip().upper()
    if system in LOINC_NAMES and vital_sign_profile(code):
        return VITAL_SIGNS
    return None


def _add_observations(ctx: MappingContext, patient: JSON, encounter: JSON | None) -> None:
    observations = ctx.message.segments("OBX")
    if not observations:
        return
    links: JSON = {"subject": patient, **({"encounter": encounter} if encounter else {})}
    system = local_system(ctx.sender, "adt-observation")
    stay = _stay_key(ctx)
    for obx in observations:
        when = obx.component(14, 1).strip()
        key = {"system": system, "value": f"{stay}@{when}" if when else stay}
        add_observation(ctx, obx, links, key, effective=None, category=_category(obx))

"""The Patients area of the spec (``spec/platform-api.md``, Patients), one module per group
of resources, each giving its FHIR mapping field by field in its docstring:

- ``profiles``: patient profiles and an organization's patients → Patient;
- ``clinical_records``: visits → Encounter, their notes → DocumentReference, who made each
  version → Provenance;
- ``vitals``: vital signs → Observations of the FHIR vital signs profiles in a panel;
- ``observations``: any Observation;
- ``prescriptions``: MedicationRequest (draft, signed, cancelled), DetectedIssue;
- ``eprescriptions``: a signed MedicationRequest dispatched to a pharmacy → Task,
  MedicationDispense;
- ``immunizations``: Immunization, ImmunizationRecommendation (the schedule, from a table
  of data), AdverseEvent (AEFI);
- ``imaging``: imaging orders → ServiceRequest;
- ``allergies``: AllergyIntolerance;
- ``journey``: the patient's timeline, and journey events → Observation;
- ``consent``: Consent (grant, request, approve, revoke), which the access policy reads;
- ``data_rights``: erasure requests → Task, erasure, export (Patient/$everything).

Lab results and lab orders are the labs area's (``platform_api.labs``). ``router`` holds
every route of the area.
"""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.patients import (
    allergies,
    clinical_records,
    consent,
    data_rights,
    eprescriptions,
    imaging,
    immunizations,
    journey,
    observations,
    prescriptions,
    profiles,
    vitals,
)

router = APIRouter()
for module in (profiles, clinical_records, vitals, observations, prescriptions,
               eprescriptions, immunizations, imaging, allergies, journey, consent,
               data_rights):
    router.include_router(module.router)

__all__ = ["router"]

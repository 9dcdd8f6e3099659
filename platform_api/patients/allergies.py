"""Patients area, allergies: a patient's allergies and intolerances ⇄ FHIR
AllergyIntolerance.

Mapping (/api field → FHIR AllergyIntolerance):
    patient_id (path)    → patient (Patient/<id>)
    substance            → code.text, with ``code`` / ``system`` as code.coding[0] (SNOMED CT
                           by default; RxNorm for a medicine, e.g. 7980 penicillin G)
    category             → category[0] (food | medication | environment | biologic)
    type                 → type (allergy | intolerance)
    criticality          → criticality (low | high | unable-to-assess)
    clinical_status      → clinicalStatus (allergyintolerance-clinical: active | inactive |
                           resolved; default active)
    verification_status  → verificationStatus (allergyintolerance-verification: unconfirmed
                           | confirmed | refuted | entered-in-error; default confirmed)
    reaction, severity   → reaction[0].manifestation[0].text, reaction[0].severity (mild |
                           moderate | severe)
    onset                → onsetDateTime; notes → note[0].text
    recorded_by          → recorder (the user); recorded_at → recordedDate

A create refuses (409 ``ALLERGY_EXISTS``) a second active allergy with the same coded
substance for the patient (``code`` given). The list is the patient's, newest first.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from platform_api.facade import ApiContext, Facade, PatientScope, SearchParam, Unique
from platform_api.patients.shared import (
    JSON,
    SNOMED,
    coding,
    concept,
    concept_text,
    fhir_datetime,
    first_coding,
    first_note,
    local_id,
    user_of,
    user_reference,
)

CLINICAL = "http://terminology.hl7.org/CodeSystem/allergyintolerance-clinical"
VERIFICATION = "http://terminology.hl7.org/CodeSystem/allergyintolerance-verification"
Category = Literal["food", "medication", "environment", "biologic"]
ClinicalStatus = Literal["active", "inactive", "resolved"]


class AllergyCreate(BaseModel):
    substance: str = Field(min_length=1, max_length=200, examples=["Penicillin"])
    code: str | None = Field(default=None, max_length=64, examples=["764146007"])
    system: str = Field(default=SNOMED, max_length=200)
    category: Category = Field(examples=["medication"])
    type: Literal["allergy", "intolerance"] = "allergy"
    criticality: Literal["low", "high", "unable-to-assess"] | None = None
    clinical_status: ClinicalStatus = "active"
    verification_status: Literal["unconfirmed", "confirmed", "refuted",
                                 "entered-in-error"] = "confirmed"
    reaction: str | None = Field(default=None, max_length=200, examples=["Urticaria"])
    severity: Literal["mild", "moderate", "severe"] | None = None
    onset: date | datetime | None = None
    notes: str | None = Field(default=None, max_length=2000)


class AllergyView(BaseModel):
    id: str
    patient_id: str | None = None
    substance: str | None = None
    code: str | None = None
    system: str | None = None
    category: str | None = None
    type: str | None = None
    criticality: str | None = None
    clinical_status: str | None = None
    verification_status: str | None = None
    reaction: str | None = None
    severity: str | None = None
    onset: str | None = None
    notes: str | None = None
    recorded_by: str | None = None
    recorded_at: str | None = None


class AllergyQuery(BaseModel):
    clinical_status: Annotated[ClinicalStatus | None, SearchParam("clinical-status")] = None
    category: Annotated[Category | None, SearchParam("category")] = None


def allergy_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    substance: JSON = {"text": payload["substance"]}
    if payload.get("code"):
        substance["coding"] = [coding(payload.get("system") or SNOMED, payload["code"],
                                      payload["substance"])]
    allergy: JSON = {
        "resourceType": "AllergyIntolerance",
        "clinicalStatus": concept(CLINICAL, payload.get("clinical_status", "active")),
        "verificationStatus": concept(VERIFICATION,
                                      payload.get("verification_status", "confirmed")),
        "type": payload.get("type", "allergy"), "category": [payload["category"]],
        "code": substance, "patient": {"reference": f"Patient/{ctx.path['patient_id']}"},
        "recordedDate": now_instant(), "recorder": user_reference(ctx.principal),
    }
    if payload.get("criticality"):
        allergy["criticality"] = payload["criticality"]
    if payload.get("onset"):
        allergy["onsetDateTime"] = fhir_datetime(payload["onset"])
    if payload.get("reaction") or payload.get("severity"):
        reaction: JSON = {"manifestation": [{"text": payload.get("reaction") or "Reaction"}]}
        if payload.get("severity"):
            reaction["severity"] = payload["severity"]
        allergy["reaction"] = [reaction]
    if payload.get("notes"):
        allergy["note"] = [{"text": payload["notes"]}]
    return allergy


def allergy_view(allergy: JSON) -> JSON:
    code = first_coding(allergy.get("code"))
    reaction = (allergy.get("reaction") or [{}])[0]
    return AllergyView(
        id=allergy["id"], patient_id=local_id(allergy.get("patient"), "Patient"),
        substance=concept_text(allergy.get("code")), code=code.get("code"),
        system=code.get("system"), category=(allergy.get("category") or [None])[0],
        type=allergy.get("type"), criticality=allergy.get("criticality"),
        clinical_status=first_coding(allergy.get("clinicalStatus")).get("code"),
        verification_status=first_coding(allergy.get("verificationStatus")).get("code"),
        reaction=concept_text((reaction.get("manifestation") or [None])[0]),
        severity=reaction.get("severity"), onset=allergy.get("onsetDateTime"),
        notes=first_note(allergy),
        recorded_by=user_of(allergy.get("recorder")) or (allergy.get("recorder") or {}).get(
            "display"),
        recorded_at=allergy.get("recordedDate"),
    ).model_dump()


def _same_substance(allergy: JSON) -> list[tuple[str, str]]:
    code = first_coding(allergy.get("code"))
    if not code.get("code"):
        return []  # uncoded: free text is no reliable match
    return [("patient", allergy["patient"]["reference"]),
            ("code", f"{code['system']}|{code['code']}"),
            ("clinical-status", f"{CLINICAL}|active")]


allergies = Facade(
    resource="AllergyIntolerance", name="Allergy", create=AllergyCreate, view=AllergyView,
    query=AllergyQuery, to_fhir=allergy_to_fhir, from_fhir=allergy_view,
    scope=PatientScope("patient"), sort="-date", tags=["allergies"],
    unique=Unique(_same_substance, "ALLERGY_EXISTS",
                  "The patient already has an active allergy to this substance"),
    summaries={"list": "A patient's allergies and intolerances",
               "create": "Record an allergy or intolerance (FHIR AllergyIntolerance)"},
)

router = APIRouter(tags=["allergies"])
allergies.mount(router, "/api/patients/{patient_id}/allergies", ops=("list", "create"))

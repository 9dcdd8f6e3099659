"""Patients area, observations: any measurement or assertion about a patient ⇄ FHIR
Observation (any category: what labs, vitals, FHIR clients and HL7v2 feeds wrote shows
here too).

Mapping (/api field → FHIR Observation):
    patient_id     → subject (Patient/<id>)
    category       → category[0] (observation-category: vital-signs, laboratory, exam,
                     social-history, imaging, procedure, survey, therapy, activity)
    code, system   → code.coding[0] (system default LOINC), name → its display and
                     code.text
    value, unit    → a number: valueQuantity (``unit`` a UCUM code); text: valueString;
                     true/false: valueBoolean
    reference_low,
    reference_high → referenceRange[0].low / .high (same unit)
    interpretation → interpretation[0] (v3-ObservationInterpretation: N, H, L, HH, LL, A,
                     POS, NEG...)
    status         → status (default final), moves by ``OBSERVATION_STATUS``; changing the
                     value of a final observation makes it amended (FHIR's meaning)
    effective_at   → effectiveDateTime (default: now)
    encounter_id   → encounter; notes → note[0].text
    recorded_by    → performer[0] (the user)

Lists: ``patient_id``, ``category``, ``code`` (``system|code`` or a code), ``status`` as
FHIR search parameters; without ``patient_id`` the caller's own (see ``shared``); newest
first. ``PATCH`` changes the fields sent; ``DELETE`` leaves a versioned tombstone.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from platform_api.envelope import ApiError
from platform_api.facade import ApiContext, Facade, SearchParam, StatusTable
from platform_api.patients.shared import (
    JSON,
    LOINC,
    UCUM,
    MineQuery,
    coding,
    concept,
    concept_text,
    deep_copy,
    fhir_datetime,
    first_coding,
    first_note,
    known_patient,
    local_id,
    mine,
    subject_of,
    user_of,
    user_reference,
)

CATEGORY_SYSTEM = "http://terminology.hl7.org/CodeSystem/observation-category"
INTERPRETATION = "http://terminology.hl7.org/CodeSystem/v3-ObservationInterpretation"
Category = Literal["vital-signs", "laboratory", "exam", "social-history", "imaging",
                   "procedure", "survey", "therapy", "activity"]
ObservationStatus = Literal["registered", "preliminary", "final", "amended", "corrected",
                            "cancelled", "entered-in-error"]
OBSERVATION_STATUS = StatusTable.of(
    registered=("preliminary", "final", "cancelled", "entered-in-error"),
    preliminary=("final", "cancelled", "entered-in-error"),
    final=("amended", "corrected", "entered-in-error"),
    amended=("amended", "corrected", "entered-in-error"),
    corrected=("amended", "corrected", "entered-in-error"),
    cancelled=(),
    entered_in_error=(),
)
Value = float | bool | str


class ObservationCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    category: Category = "exam"
    code: str = Field(min_length=1, max_length=64, examples=["29463-7"])
    system: str = Field(default=LOINC, max_length=200)
    name: str | None = Field(default=None, max_length=200, examples=["Body weight"])
    value: Value | None = Field(default=None, examples=[64.5])
    unit: str | None = Field(default=None, max_length=40, examples=["kg"],
                             description="UCUM code of a numeric value's unit")
    reference_low: float | None = None
    reference_high: float | None = None
    interpretation: str | None = Field(default=None, max_length=10, examples=["N"])
    status: ObservationStatus = "final"
    effective_at: datetime | None = None
    encounter_id: str | None = Field(default=None, max_length=64)
    notes: str | None = Field(default=None, max_length=2000)


class ObservationUpdate(BaseModel):
    name: str | None = Field(default=None, max_length=200)
    value: Value | None = None
    unit: str | None = Field(default=None, max_length=40)
    reference_low: float | None = None
    reference_high: float | None = None
    interpretation: str | None = Field(default=None, max_length=10)
    status: ObservationStatus | None = None
    effective_at: datetime | None = None
    notes: str | None = Field(default=None, max_length=2000)


class ObservationView(BaseModel):
    id: str
    patient_id: str | None = None
    category: str | None = None
    code: str | None = None
    system: str | None = None
    name: str | None = None
    value: Value | None = None
    unit: str | None = None
    reference_low: float | None = None
    reference_high: float | None = None
    interpretation: str | None = None
    status: str
    effective_at: str | None = None
    encounter_id: str | None = None
    recorded_by: str | None = None
    notes: str | None = None
    updated_at: str | None = None


class ObservationQuery(MineQuery):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64, description="A patient's observations (default: your own)")
    category: Annotated[Category | None, SearchParam("category")] = None
    code: Annotated[str | None, SearchParam("code")] = Field(
        None, max_length=200, description="system|code or a code")
    status: Annotated[ObservationStatus | None, SearchParam("status")] = None


# -- mapping ------------------------------------------------------------------------------------
VALUE_KEYS = ("valueQuantity", "valueString", "valueBoolean", "valueCodeableConcept",
              "valueInteger", "valueDateTime")


def _set_value(observation: JSON, value: Value | None, unit: str | None) -> None:
    for key in VALUE_KEYS:
        observation.pop(key, None)
    if isinstance(value, bool):
        observation["valueBoolean"] = value
    elif isinstance(value, int | float):
        found: JSON = {"value": value}
        if unit:
            found.update({"unit": unit, "system": UCUM, "code": unit})
        observation["valueQuantity"] = found
    elif isinstance(value, str):
        observation["valueString"] = value


def _set_range(observation: JSON, low: float | None, high: float | None, unit: str | None
               ) -> None:
    if low is None and high is None:
        return
    bound = {"unit": unit, "system": UCUM, "code": unit} if unit else {}
    found: JSON = {}
    if low is not None:
        found["low"] = {"value": low, **bound}
    if high is not None:
        found["high"] = {"value": high, **bound}
    observation["referenceRange"] = [found]


def observation_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    """The Observation; on update the fields sent change (a changed value of a final
    observation makes it amended; an explicit status moves through the table)."""
    if existing is None:
        observation: JSON = {
            "resourceType": "Observation", "status": payload.get("status", "final"),
            "category": [concept(CATEGORY_SYSTEM, payload.get("category", "exam"))],
            "code": {"coding": [coding(payload.get("system") or LOINC, payload["code"],
                                       payload.get("name"))]},
            "subject": subject_of(payload),
            "effectiveDateTime": fhir_datetime(payload.get("effective_at") or now_instant()),
            "performer": [user_reference(ctx.principal)],
        }
        if payload.get("encounter_id"):
            observation["encounter"] = {"reference": f"Encounter/{payload['encounter_id']}"}
    else:
        observation = deep_copy(existing)
        target = payload.get("status")
        if target is None and "value" in payload and observation.get("status") in (
                "final", "amended", "corrected"):
            target = "amended"
        if target is not None and not (target == observation["status"] == "amended"):
            observation = OBSERVATION_STATUS.move(observation, target)
    if payload.get("name"):
        observation["code"]["text"] = payload["name"]
    if "value" in payload:
        unit = payload.get("unit") or (observation.get("valueQuantity") or {}).get("code")
        _set_value(observation, payload["value"], unit)
    elif payload.get("unit") and "valueQuantity" in observation:
        observation["valueQuantity"].update({"unit": payload["unit"], "system": UCUM,
                                             "code": payload["unit"]})
    _set_range(observation, payload.get("reference_low"), payload.get("reference_high"),
               payload.get("unit"))
    if payload.get("interpretation"):
        observation["interpretation"] = [concept(INTERPRETATION, payload["interpretation"])]
    if payload.get("effective_at") and existing is not None:
        observation["effectiveDateTime"] = fhir_datetime(payload["effective_at"])
    if "notes" in payload:
        observation.pop("note", None)
        if payload["notes"]:
            observation["note"] = [{"text": payload["notes"]}]
    return observation


def _value(observation: JSON) -> tuple[Value | None, str | None]:
    if "valueQuantity" in observation:
        found = observation["valueQuantity"]
        return found.get("value"), found.get("code") or found.get("unit")
    for key in ("valueString", "valueBoolean", "valueInteger", "valueDateTime"):
        if key in observation:
            return observation[key], None
    if "valueCodeableConcept" in observation:
        return concept_text(observation["valueCodeableConcept"]), None
    return None, None


def observation_view(observation: JSON) -> JSON:
    value, unit = _value(observation)
    code = first_coding(observation.get("code"))
    reference = (observation.get("referenceRange") or [{}])[0]
    performer = (observation.get("performer") or [None])[0]
    return ObservationView(
        id=observation["id"], patient_id=local_id(observation.get("subject"), "Patient"),
        category=first_coding((observation.get("category") or [None])[0]).get("code"),
        code=code.get("code"), system=code.get("system"),
        name=concept_text(observation.get("code")), value=value, unit=unit,
        reference_low=(reference.get("low") or {}).get("value"),
        reference_high=(reference.get("high") or {}).get("value"),
        interpretation=first_coding((observation.get("interpretation") or [None])[0]).get(
            "code"),
        status=observation["status"], effective_at=observation.get("effectiveDateTime"),
        encounter_id=local_id(observation.get("encounter"), "Encounter"),
        recorded_by=user_of(performer) or (performer or {}).get("display"),
        notes=first_note(observation),
        updated_at=(observation.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


async def _checked(ctx: ApiContext, payload: JSON) -> JSON:
    value = payload.get("value")
    if payload.get("unit") and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ApiError(422, "VALIDATION_ERROR", "unit: only a numeric value has a unit",
                       field="unit")
    return await known_patient(ctx, payload)


observations = Facade(
    resource="Observation", name="Observation", create=ObservationCreate,
    update=ObservationUpdate, view=ObservationView, query=ObservationQuery,
    to_fhir=observation_to_fhir, from_fhir=observation_view, statuses=OBSERVATION_STATUS,
    prepare=_checked, list_criteria=mine("subject", "performer"), sort="-date",
    tags=["observations"],
    summaries={"create": "Record an observation (a FHIR Observation of any category)",
               "list": "Your observations (role=patient / clinician), or a patient's "
                       "(patient_id), by category, code and status, newest first",
               "get": "An observation",
               "update": "Change an observation (fields sent; a changed final value is "
                         "amended)",
               "delete": "Delete an observation (a versioned tombstone)"},
)

router = APIRouter(tags=["observations"])
observations.mount(router, "/api/observations", update_method="PATCH")


"""Notifiable case reports (``POST /api/public-health/cases``) for the WHO IDSR priority
diseases (:mod:`.knowledge`, ``data/idsr_diseases.json``): a FHIR **Condition** with its
**Encounter** and **Observations**, written in one unit of work; the answer carries the
case as a FHIR ``collection`` **Bundle** (Patient, Condition, Encounter, Observations),
the shape a case is sent on to a surveillance system in.

Mapping (/api field → FHIR):

    patient_id      → Condition.subject (the caller must see the patient: 404 / 403)
    disease         → Condition.code: urn:healthplatform:idsr-disease#<key> and the
                      disease's ICD-10 codes (http://hl7.org/fhir/sid/icd-10); category
                      encounter-diagnosis and urn:healthplatform:condition-category#
                      notifiable-case
    classification  → extension case-classification (suspected | probable | confirmed |
                      discarded) and verificationStatus (provisional, provisional,
                      confirmed, refuted)
    outcome         → extension case-outcome (alive | died | unknown); died also sets the
                      new Encounter's hospitalization.dischargeDisposition exp
    onset_date      → Condition.onsetDateTime;  (now) → recordedDate; the caller →
                      recorder (urn:healthplatform:user identifier)
    symptoms        → Condition.evidence[].code.text
    observations    → Observation (status final, LOINC code, valueQuantity with a UCUM
                      unit or valueString; category vital-signs | laboratory | exam), each
                      in Condition.evidence[].detail
    encounter_id    → Condition.encounter (one of the patient's); without it a new
                      Encounter (class AMB, or IMP when ``admitted``; reasonCode the
                      disease, diagnosis the Condition, serviceProvider the facility)
    facility_id     → the owner label of everything written (default: the caller's
                      organization that owns the patient; for a patient seen with their
                      consent, the caller's organization)
    notes           → Condition.note

**One case per patient and disease episode**: a report for a patient who already has a
case of the disease (not discarded) whose onset lies within the disease's
``episode_days`` of this one (no limit for HIV, leprosy) updates that case — its
classification, outcome, evidence and notes — and answers 200 with ``deduplicated:
true``; otherwise a new case is created (201). Two identical reports racing are one case:
the create is conditional on the Condition identifier
``urn:healthplatform:idsr-case|<patient>:<disease>:<onset date>``.

Events: ``platform.public_health.case_reported`` (a new case; ``reporting`` says whether
the disease is immediately notifiable) and ``platform.public_health.case_updated``, with
ids and codes only (no names).
"""

from __future__ import annotations

from datetime import date
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field, field_validator

from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.ownership import owner_labels, with_owners
from fhir_server.store import StoreError
from platform_api.envelope import ApiError, Envelope, ErrorEnvelope, created, ok
from platform_api.facade import (
    ApiContext,
    api_context,
    create_unique,
    is_duplicate,
    require_organization,
    until_stable,
)
from platform_api.public_health.knowledge import Disease, diseases
from platform_api.sessions.common import (
    LOINC,
    check_patient_and_encounter,
    concept,
    extension,
    local_id,
    ref,
    set_extension,
    user_of,
    user_reference,
)

JSON = dict[str, Any]
DISEASE_SYSTEM = "urn:healthplatform:idsr-disease"
CASE_CATEGORY = "urn:healthplatform:condition-category"
CASE_IDENTIFIER = "urn:healthplatform:idsr-case"
ICD10 = "http://hl7.org/fhir/sid/icd-10"
CONDITION_CATEGORY = "http://terminology.hl7.org/CodeSystem/condition-category"
VERIFICATION = "http://terminology.hl7.org/CodeSystem/condition-ver-status"
CLINICAL = "http://terminology.hl7.org/CodeSystem/condition-clinical"
OBSERVATION_CATEGORY = "http://terminology.hl7.org/CodeSystem/observation-category"
ACT_CODE = "http://terminology.hl7.org/CodeSystem/v3-ActCode"
DISCHARGE = "http://terminology.hl7.org/CodeSystem/discharge-disposition"
UCUM = "http://unitsofmeasure.org"
CASE_CRITERIA = (("category", f"{CASE_CATEGORY}|notifiable-case"),)
VERIFIED_AS = {"suspected": "provisional", "probable": "provisional",
               "confirmed": "confirmed", "discarded": "refuted"}
TOPIC = "platform.public_health.case_"

Classification = Literal["suspected", "probable", "confirmed", "discarded"]
Outcome = Literal["alive", "died", "unknown"]


class CaseObservation(BaseModel):
    code: str = Field(min_length=1, max_length=32, description="LOINC code",
                      examples=["8310-5"])
    display: str | None = Field(default=None, max_length=200, examples=["Body temperature"])
    value: float | str = Field(examples=[39.2])
    unit: str | None = Field(default=None, max_length=32, description="UCUM unit",
                             examples=["Cel"])
    category: Literal["vital-signs", "laboratory", "exam"] = "laboratory"

    @field_validator("value")
    @classmethod
    def _text_is_short(cls, value: float | str) -> float | str:
        if isinstance(value, str) and not 0 < len(value) <= 500:
            raise ValueError("a text value has 1 to 500 characters")
        return value


class CaseReport(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    disease: str = Field(min_length=1, max_length=64, examples=["cholera"],
                         description="An IDSR priority disease key (data/idsr_diseases.json)")
    classification: Classification = "suspected"
    outcome: Outcome = "alive"
    onset_date: date
    encounter_id: str | None = Field(default=None, min_length=1, max_length=64)
    admitted: bool = False
    facility_id: str | None = Field(default=None, min_length=1, max_length=64)
    symptoms: list[str] = Field(default_factory=list, max_length=30)
    observations: list[CaseObservation] = Field(default_factory=list, max_length=30)
    notes: str | None = Field(default=None, max_length=4000)

    @field_validator("disease")
    @classmethod
    def _known_disease(cls, value: str) -> str:
        if value not in diseases():
            raise ValueError(f"not an IDSR priority disease of this platform: {value!r} "
                             "(see data/idsr_diseases.json)")
        return value

    @field_validator("onset_date")
    @classmethod
    def _not_in_future(cls, value: date) -> date:
        if value > date.today():
            raise ValueError("the onset date is in the future")
        return value

    @field_validator("symptoms")
    @classmethod
    def _short_symptoms(cls, value: list[str]) -> list[str]:
        if any(not 0 < len(s.strip()) <= 200 for s in value):
            raise ValueError("each symptom has 1 to 200 characters")
        return [s.strip() for s in value]


class CaseView(BaseModel):
    id: str
    patient_id: str | None
    encounter_id: str | None
    facility_id: str | None
    disease: str | None
    disease_name: str | None
    reporting: str | None
    icd10: list[str]
    classification: str | None
    outcome: str | None
    onset_date: str | None
    epi_week: str | None
    reported_at: str | None
    reported_by: str | None
    symptoms: list[str]
    observation_ids: list[str]
    deduplicated: bool = False
    bundle: dict[str, Any] = Field(description="The case as a FHIR collection Bundle "
                                   "(Patient, Condition, Encounter, Observations)")


def disease_of(condition: JSON) -> Disease | None:
    """The IDSR disease of a case: its platform coding, else (a notifiable-case Condition
    written on /fhir or by HL7v2 with ICD-10 alone) the disease whose ICD-10 codes
    its code begins with."""
    codings = (condition.get("code") or {}).get("coding") or []
    key = next((c.get("code") for c in codings if c.get("system") == DISEASE_SYSTEM), None)
    return disease_named(key, [c.get("code") for c in codings if c.get("system") == ICD10])


def disease_named(key: str | None, icd10: list[Any] | None) -> Disease | None:
    """The disease of a case's IDSR key, else of the first of its ICD-10 codes that some
    disease's codes begin."""
    if key is not None:
        return diseases().get(key)
    for value in icd10 or ():
        code = str(value or "").upper()
        found = next((d for d in diseases().values()
                      if code and any(code.startswith(prefix) for prefix in d.icd10)), None)
        if found is not None:
            return found
    return None


def onset_of(condition: JSON) -> date | None:
    onset = condition.get("onsetDateTime")
    return date.fromisoformat(onset[:10]) if isinstance(onset, str) and len(onset) >= 10 \
        else None


def epi_week(day: date) -> str:
    """The ISO week (Monday to Sunday), DHIS2's weekly period: ``2026W47``."""
    year, week, _ = day.isocalendar()
    return f"{year}W{week}"


def case_counts(condition: JSON) -> bool:
    """Whether a case counts in reports (a discarded case does not)."""
    return extension(condition, "case-classification") != "discarded"


def _condition(report: CaseReport, disease: Disease, encounter_id: str, ctx: ApiContext,
               facility: str) -> JSON:
    condition: JSON = {
        "resourceType": "Condition",
        "identifier": [{"system": CASE_IDENTIFIER, "value":
                        f"{report.patient_id}:{disease.key}:{report.onset_date.isoformat()}"}],
        "clinicalStatus": concept(CLINICAL, "active"),
        "category": [concept(CONDITION_CATEGORY, "encounter-diagnosis"),
                     concept(CASE_CATEGORY, "notifiable-case", "Notifiable case")],
        "code": {"coding": [{"system": DISEASE_SYSTEM, "code": disease.key,
                             "display": disease.name},
                            *({"system": ICD10, "code": c} for c in disease.icd10)],
                 "text": disease.name},
        "subject": ref("Patient", report.patient_id),
        "encounter": ref("Encounter", encounter_id),
        "onsetDateTime": report.onset_date.isoformat(),
        "recordedDate": now_instant(),
        "recorder": user_reference(ctx.principal),
    }
    return with_owners(condition, {facility})


def _apply(condition: JSON, report: CaseReport, observation_ids: list[str],
           fields: set[str]) -> JSON:
    """The report's classification, outcome, evidence and notes on ``condition`` (on an
    update only what the report says)."""
    if "classification" in fields:
        set_extension(condition, "case-classification", "valueCode", report.classification)
        condition["verificationStatus"] = concept(VERIFICATION,
                                                  VERIFIED_AS[report.classification])
    if "outcome" in fields:
        set_extension(condition, "case-outcome", "valueCode", report.outcome)
    evidence = list(condition.get("evidence") or [])
    known = {(e.get("code") or [{}])[0].get("text") for e in evidence}
    evidence += [{"code": [{"text": s}]} for s in report.symptoms if s not in known]
    evidence += [{"detail": [ref("Observation", i)]} for i in observation_ids]
    if evidence:
        condition["evidence"] = evidence
    if report.notes:
        condition["note"] = [*(condition.get("note") or []),
                             {"text": report.notes, "time": now_instant()}]
    return condition


def _encounter(report: CaseReport, encounter_id: str, condition_id: str, disease: Disease,
               facility: str) -> JSON:
    encounter: JSON = {
        "resourceType": "Encounter", "id": encounter_id, "status": "in-progress",
        "class": {"system": ACT_CODE, "code": "IMP" if report.admitted else "AMB",
                  "display": "inpatient encounter" if report.admitted else "ambulatory"},
        "subject": ref("Patient", report.patient_id),
        "period": {"start": now_instant()},
        "reasonCode": [{"text": disease.name}],
        "diagnosis": [{"condition": ref("Condition", condition_id)}],
        "serviceProvider": ref("Organization", facility),
    }
    if report.outcome == "died":
        encounter["hospitalization"] = {"dischargeDisposition": concept(DISCHARGE, "exp",
                                                                        "Expired")}
    return with_owners(encounter, {facility})


def _observation(item: CaseObservation, report: CaseReport, encounter_id: str,
                 facility: str) -> JSON:
    observation: JSON = {
        "resourceType": "Observation", "status": "final",
        "category": [concept(OBSERVATION_CATEGORY, item.category)],
        "code": {"coding": [{"system": LOINC, "code": item.code,
                             **({"display": item.display} if item.display else {})}],
                 **({"text": item.display} if item.display else {})},
        "subject": ref("Patient", report.patient_id),
        "encounter": ref("Encounter", encounter_id),
        "effectiveDateTime": now_instant(),
    }
    if isinstance(item.value, str):
        observation["valueString"] = item.value
    else:
        observation["valueQuantity"] = {"value": item.value, **(
            {"unit": item.unit, "system": UCUM, "code": item.unit} if item.unit else {})}
    return with_owners(observation, {facility})


async def _facility(ctx: ApiContext, report: CaseReport, patient: JSON) -> str:
    """The organization the case is reported by: the one named (the caller must be a
    member), else the caller's organization that owns the patient, else (a patient seen
    with their consent) the caller's one organization."""
    if report.facility_id:
        await require_organization(ctx, report.facility_id)
        return report.facility_id
    mine = ctx.organizations_for("organization.work-in")  # None: a platform administrator
    owners = sorted(o for o in owner_labels(patient) if mine is None or o in mine)
    if not owners and mine is not None:
        owners = sorted(mine)
    if len(owners) == 1:
        return owners[0]
    raise ApiError(422, "FACILITY_REQUIRED", "Say which facility reports the case (the "
                   "patient's records belong to none or several of yours)",
                   field="facility_id")


async def _same_episode(ctx: ApiContext, report: CaseReport, disease: Disease
                        ) -> JSON | None:
    """The patient's case of the disease this report belongs to, if any (the nearest
    onset within the episode)."""
    found = await ctx.fhir.search("Condition", [
        ("patient", f"Patient/{report.patient_id}"), *CASE_CRITERIA,
        ("code", f"{DISEASE_SYSTEM}|{disease.key}")])
    nearest: tuple[int, JSON] | None = None
    for condition in found:
        onset = onset_of(condition)
        if onset is None or not case_counts(condition):
            continue
        gap = abs((onset - report.onset_date).days)
        if disease.episode_days is not None and gap > disease.episode_days:
            continue
        if nearest is None or gap < nearest[0]:
            nearest = (gap, condition)
    return nearest[1] if nearest else None


def _event(condition: JSON, disease: Disease) -> JSON:
    return {"case_id": condition["id"],
            "patient_id": local_id(condition.get("subject"), "Patient"),
            "disease": disease.key, "reporting": disease.reporting,
            "classification": extension(condition, "case-classification"),
            "outcome": extension(condition, "case-outcome"),
            "onset_date": condition.get("onsetDateTime"),
            "facility_id": next(iter(sorted(owner_labels(condition))), None)}


def _body(staged: Any) -> JSON:
    assert staged.result is not None
    return orjson.loads(staged.result.body)  # type: ignore[no-any-return]


async def _create(ctx: ApiContext, report: CaseReport, disease: Disease, facility: str
                  ) -> tuple[JSON, JSON | None, list[JSON]]:
    encounter_id = report.encounter_id or new_id()
    condition_id = new_id()
    observations = [{**_observation(o, report, encounter_id, facility), "id": new_id()}
                    for o in report.observations]
    condition = _apply(_condition(report, disease, encounter_id, ctx, facility), report,
                       [o["id"] for o in observations], {"classification", "outcome"})
    unit = ctx.fhir.unit()  # its own: a report may be tried again after a race
    async with unit:
        new_encounter = None
        if report.encounter_id is None:
            new_encounter = await unit.create(_encounter(report, encounter_id, condition_id,
                                                         disease, facility),
                                              resource_id=encounter_id)
        # two identical reports at once: the second finds the first (not discarded)
        staged = await create_unique(unit, condition, [
            ("identifier", f"{CASE_IDENTIFIER}|{condition['identifier'][0]['value']}"),
            ("verification-status:not", f"{VERIFICATION}|refuted")],
            resource_id=condition_id)
        written = [await unit.create(o, resource_id=o["id"]) for o in observations]
        unit.after_writes(lambda staging: staging.emit(
            TOPIC + "reported", _event(_body(staged), disease), source_service="public_health"))
        await unit.commit()
    return (_body(staged), _body(new_encounter) if new_encounter else None,
            [_body(w) for w in written])


async def _update(ctx: ApiContext, report: CaseReport, disease: Disease, current: JSON,
                  facility: str) -> tuple[JSON, list[JSON]]:
    encounter_id = local_id(current.get("encounter"), "Encounter") or report.encounter_id
    assert encounter_id is not None
    observations = [{**_observation(o, report, encounter_id, facility), "id": new_id()}
                    for o in report.observations]
    changed = _apply(orjson.loads(orjson.dumps(current)), report,
                     [o["id"] for o in observations], report.model_fields_set)
    unit = ctx.fhir.unit()  # its own: a report may be tried again after a race
    async with unit:
        written = [await unit.create(o, resource_id=o["id"]) for o in observations]
        staged = await unit.update(changed, if_match=int(current["meta"]["versionId"]))
        unit.after_writes(lambda staging: staging.emit(
            TOPIC + "updated", _event(_body(staged), disease), source_service="public_health"))
        await unit.commit()
    return _body(staged), [_body(w) for w in written]


async def _bundle(ctx: ApiContext, condition: JSON, encounter: JSON | None) -> JSON:
    """The case as a FHIR collection Bundle: Patient, Condition, Encounter, Observations."""
    patient = await ctx.fhir.find_json("Patient", str(local_id(condition.get("subject"),
                                                                "Patient")))
    encounter_id = local_id(condition.get("encounter"), "Encounter")
    if encounter is None and encounter_id:
        encounter = await ctx.fhir.find_json("Encounter", encounter_id)
    observations = [await ctx.fhir.find_json("Observation", i)
                    for i in observation_ids(condition)]
    resources = [r for r in (patient, condition, encounter, *observations) if r]
    base = ctx.services.settings.public_base_url
    return {"resourceType": "Bundle", "type": "collection", "timestamp": now_instant(),
            "entry": [{"fullUrl": f"{base}/fhir/{r['resourceType']}/{r['id']}",
                       "resource": r} for r in resources]}


def observation_ids(condition: JSON) -> list[str]:
    return [i for e in condition.get("evidence") or [] for d in e.get("detail") or []
            if (i := local_id(d, "Observation"))]


def case_view(condition: JSON, bundle: JSON, deduplicated: bool = False) -> JSON:
    disease = disease_of(condition)
    onset = onset_of(condition)
    return CaseView(
        id=condition["id"], patient_id=local_id(condition.get("subject"), "Patient"),
        encounter_id=local_id(condition.get("encounter"), "Encounter"),
        facility_id=next(iter(sorted(owner_labels(condition))), None),
        disease=disease.key if disease else None, disease_name=disease.name if disease
        else None, reporting=disease.reporting if disease else None,
        icd10=[c["code"] for c in condition["code"]["coding"] if c.get("system") == ICD10],
        classification=extension(condition, "case-classification"),
        outcome=extension(condition, "case-outcome"),
        onset_date=onset.isoformat() if onset else None,
        epi_week=epi_week(onset) if onset else None,
        reported_at=condition.get("recordedDate"),
        reported_by=user_of(condition.get("recorder")),
        symptoms=[c.get("text") for e in condition.get("evidence") or []
                  for c in e.get("code") or [] if c.get("text")],
        observation_ids=observation_ids(condition), deduplicated=deduplicated,
        bundle=bundle).model_dump()


router = APIRouter(tags=["public-health"])


@router.post("/api/public-health/cases", status_code=201, response_model=Envelope[CaseView],
             summary="Report a notifiable case (IDSR priority disease): Condition, "
                     "Encounter and Observations; a report in the same disease episode "
                     "updates the patient's case (200)",
             responses={200: {"model": Envelope[CaseView],
                              "description": "The report joined the patient's case of the "
                                             "same disease episode (deduplicated)"},
                        404: {"model": ErrorEnvelope, "description": "NOT_FOUND: the "
                              "patient, encounter or facility named does not exist"},
                        409: {"model": ErrorEnvelope, "description": "CASE_ALREADY_REPORTED:"
                              " the same case was being reported at the same moment"}})
async def report_case(body: CaseReport, ctx: ApiContext = Depends(api_context)) -> Any:
    disease = diseases()[body.disease]
    await check_patient_and_encounter(ctx, body.model_dump())
    patient = await ctx.fhir.read_json("Patient", body.patient_id)
    facility = await _facility(ctx, body, patient)

    async def join_episode() -> JSON:
        """The patient's case of this episode with the report applied (read again when
        another writer changed it meanwhile), or ``{}`` when there is none."""
        current = await _same_episode(ctx, body, disease)
        if current is None:
            return {}
        return (await _update(ctx, body, disease, current, facility))[0]

    for _attempt in range(2):
        joined = await until_stable(join_episode)
        if joined:
            return ok(case_view(joined, await _bundle(ctx, joined, None), True))
        try:
            condition, encounter, _ = await _create(ctx, body, disease, facility)
        except StoreError as error:
            if not is_duplicate(error):
                raise
            continue  # reported at the same moment: it joins that case
        return created(case_view(condition, await _bundle(ctx, condition, encounter)))
    raise ApiError(409, "CASE_ALREADY_REPORTED", "This case was reported at the same time")


__all__ = ["CASE_CRITERIA", "DISEASE_SYSTEM", "CaseView", "case_counts", "disease_of",
           "epi_week", "onset_of", "router"]

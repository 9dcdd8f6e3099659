"""``POST /api/ai/risk-stratification``: validated risk scores computed from the
patient's FHIR record, each naming the inputs it used and those it is missing.

The record is read as the caller (the access policy decides what they may see): the
Patient (age, sex), Conditions (by ICD-10 prefix or SNOMED CT code), active
MedicationRequests and MedicationStatements (by RxNorm code or name), laboratory and
social-history Observations, and the vital signs NEWS2 uses (:func:`platform_api.cds.
patient_news2`, the same reading as ``/api/cds/early-warning-score``). Code lists and
coefficients are data (``data/risk_knowledge.json``).

Scores:

- **NEWS2** (Royal College of Physicians 2017), reused from :mod:`cds_hooks.news2`;
- **qSOFA** (Seymour et al., JAMA 2016): respiratory rate ≥ 22, systolic ≤ 100 mmHg,
  altered mentation (ACVPU other than alert); 2 or more: high risk of a poor outcome
  if infection is suspected;
- **CHA2DS2-VASc** (Lip et al., Chest 2010): stroke risk in atrial fibrillation;
- **HAS-BLED** (Pisters et al., Chest 2010): bleeding risk on anticoagulation; labile
  INR from the INR results of the last 6 months (time in range 2-3 below 60 %);
- **Framingham general CVD** (D'Agostino et al., Circulation 2008): 10-year
  cardiovascular risk from age, sex, total and HDL cholesterol, systolic pressure and
  its treatment, smoking and diabetes (ages 30-74).

A measurement that is absent (age, a vital sign, a cholesterol, the smoking status, INR
history) is **missing**: the score's value is then null (``partial`` says what the
measured items add up to). A condition or medication the record does not hold counts as
absent and is shown as "not recorded" among the components, so a reader sees what the
score assumed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from platform_api.ai.common import (
    PATIENT_ID,
    Basis,
    InputUsed,
    Support,
    answered,
    converted,
    data_file,
    instant,
    patient_for,
)
from platform_api.cds import patient_news2
from platform_api.envelope import Envelope, ok
from platform_api.facade import ApiContext, api_context
from platform_api.sessions.common import LOINC, SNOMED

JSON = dict[str, Any]
ScoreName = Literal["news2", "qsofa", "cha2ds2-vasc", "has-bled", "framingham-cvd"]
SCORES: tuple[ScoreName, ...] = ("news2", "qsofa", "cha2ds2-vasc", "has-bled",
                                 "framingham-cvd")
ICD10 = ("http://hl7.org/fhir/sid/icd-10", "http://hl7.org/fhir/sid/icd-10-cm")
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"
NOT_RECORDED = "not recorded"


def knowledge() -> JSON:
    return data_file("risk_knowledge.json")


# --- the patient's record ---------------------------------------------------------------------
@dataclass
class Reading:
    value: Any
    reference: str | None
    when: str | None = None


@dataclass
class Record:
    patient: JSON
    conditions: list[JSON]
    medications: list[JSON]
    observations: list[JSON]
    news2: JSON
    today: date = field(default_factory=lambda: datetime.now(UTC).date())

    @property
    def age(self) -> int | None:
        born = self.patient.get("birthDate")
        if not isinstance(born, str) or len(born) < 10:
            return None
        birth = date.fromisoformat(born[:10])
        return self.today.year - birth.year - (
            (self.today.month, self.today.day) < (birth.month, birth.day))

    @property
    def sex(self) -> str | None:
        gender = self.patient.get("gender")
        return gender if gender in ("female", "male") else None

    def condition(self, key: str) -> str | None:
        """The reference of a Condition of the list ``key`` (None when none matches)."""
        spec = knowledge()["conditions"][key]
        for condition in self.conditions:
            status = _code(condition.get("verificationStatus"))
            if status in ("refuted", "entered-in-error"):
                continue
            for coding in (condition.get("code") or {}).get("coding") or []:
                code = str(coding.get("code") or "")
                if (coding.get("system") in ICD10 and any(
                        code.startswith(p) for p in spec["icd10"])) or (
                        coding.get("system") == SNOMED and code in spec["snomed"]):
                    return f"Condition/{condition['id']}"
        return None

    def medication(self, key: str) -> str | None:
        spec = knowledge()["medications"][key]
        for medication in self.medications:
            concept = medication.get("medicationCodeableConcept") or {}
            codes = {str(c.get("code")) for c in concept.get("coding") or []
                     if c.get("system") == RXNORM}
            words = " ".join([concept.get("text") or "", *(
                c.get("display") or "" for c in concept.get("coding") or [])]).lower()
            if codes & set(spec["rxnorm"]) or any(w in words for w in spec["words"]):
                return f"{medication['resourceType']}/{medication['id']}"
        return None

    def readings(self, key: str) -> list[Reading]:
        """The values of an observation kind, newest first, in its unit."""
        spec = knowledge()["observations"][key]
        found = []
        for observation in self.observations:
            codes = {c.get("code") for c in (observation.get("code") or {}).get("coding")
                     or [] if c.get("system") == LOINC}
            if not codes & set(spec["loinc"]):
                continue
            reference = f"Observation/{observation['id']}"
            when = observation.get("effectiveDateTime") or observation.get("issued")
            if "unit" not in spec:
                found.append(Reading(observation.get("valueCodeableConcept"), reference, when))
                continue
            quantity = observation.get("valueQuantity") or {}
            value, unit = quantity.get("value"), quantity.get("unit") or quantity.get("code")
            if not isinstance(value, int | float):
                continue
            in_unit = converted(float(value), unit, spec)
            if in_unit is not None:
                found.append(Reading(in_unit, reference, when))
        return found

    def latest(self, key: str) -> Reading | None:
        found = self.readings(key)
        return found[0] if found else None

    def vital(self, name: str) -> Reading | None:
        sub = (self.news2.get("subscores") or {}).get(name)
        if sub is None:
            return None
        return Reading(sub["value"], None, self.news2.get("measured_at"))


def _code(concept: JSON | None) -> str | None:
    return next((c.get("code") for c in (concept or {}).get("coding") or []), None)


async def read_record(ctx: ApiContext, patient: JSON) -> Record:
    subject = ("subject", f"Patient/{patient['id']}")
    conditions = await ctx.fhir.search("Condition", [subject])
    medications = [*await ctx.fhir.search("MedicationRequest", [subject, ("status", "active")]),
                   *await ctx.fhir.search("MedicationStatement",
                                          [subject, ("status", "active")])]
    codes = sorted({f"{LOINC}|{c}" for spec in knowledge()["observations"].values()
                    for c in spec["loinc"]})
    observations = await ctx.fhir.search("Observation", [
        subject, ("code", ",".join(codes)), ("_sort", "-date")])
    return Record(patient, conditions, medications, observations,
                  await patient_news2(ctx, patient["id"]))


# --- the scores -----------------------------------------------------------------------------------
class ComponentView(BaseModel):
    name: str
    points: float
    value: Any = None
    reference: str | None = None


class ScoreView(BaseModel):
    name: str
    title: str
    value: float | None = Field(description="null while an input is missing")
    partial: float = Field(description="What the inputs found add up to")
    complete: bool
    risk: str | None = None
    interpretation: str | None = None
    components: list[ComponentView]
    missing: list[str]
    source: str


@dataclass
class Tally:
    components: list[ComponentView] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def add(self, name: str, points: float, value: Any = None, reference: str | None = None
            ) -> None:
        self.components.append(ComponentView(name=name, points=points, value=value,
                                             reference=reference))

    def condition(self, record: Record, key: str, points: float = 1) -> bool:
        found = record.condition(key)
        self.add(knowledge()["conditions"][key]["display"], points if found else 0,
                 "recorded" if found else NOT_RECORDED, found)
        return found is not None

    @property
    def partial(self) -> float:
        return sum(c.points for c in self.components)

    def view(self, name: str, title: str, source: str, risk: str | None,
             interpretation: str | None, value: float | None = None) -> JSON:
        complete = not self.missing
        return ScoreView(
            name=name, title=title, value=(value if value is not None else self.partial)
            if complete else None, partial=self.partial, complete=complete, risk=risk,
            interpretation=interpretation, components=self.components, missing=self.missing,
            source=source).model_dump()


def news2_score(record: Record) -> JSON:
    result = record.news2
    tally = Tally(missing=list(result["missing"]))
    for name, sub in (result.get("subscores") or {}).items():
        tally.add(name, sub["score"], sub["value"])
    return tally.view("news2", "NEWS2 early warning score", result["based_on"],
                      result["risk"], result["response"])


def qsofa(record: Record) -> JSON:
    tally = Tally()
    for name, label, test in (
            ("respiration_rate", "respiratory rate >= 22/min", lambda v: v >= 22),
            ("systolic_bp", "systolic blood pressure <= 100 mmHg", lambda v: v <= 100),
            ("consciousness", "altered mentation (not alert)", lambda v: v != "alert")):
        reading = record.vital(name)
        if reading is None:
            tally.missing.append(name)
            continue
        tally.add(label, 1 if test(reading.value) else 0, reading.value)
    high = tally.partial >= 2
    return tally.view(
        "qsofa", "qSOFA", "Seymour CW et al., JAMA 2016;315:762-774",
        "high" if high else ("low" if not tally.missing else None),
        "2 or more: high risk of a poor outcome if infection is suspected; assess for "
        "sepsis" if high else None)


def cha2ds2_vasc(record: Record) -> JSON:
    tally = Tally()
    tally.condition(record, "heart_failure")
    tally.condition(record, "hypertension")
    age, sex = record.age, record.sex
    if age is None:
        tally.missing.append("age")
    else:
        tally.add("age", 2 if age >= 75 else 1 if age >= 65 else 0, age)
    tally.condition(record, "diabetes")
    tally.condition(record, "stroke_tia_thromboembolism", 2)
    tally.condition(record, "vascular_disease")
    if sex is None:
        tally.missing.append("sex")
    else:
        tally.add("sex category (female)", 1 if sex == "female" else 0, sex)
    score, risk, said = tally.partial, None, None
    if not tally.missing:
        beyond_sex = score - (1 if sex == "female" else 0)  # female sex alone is low risk
        risk = "low" if beyond_sex <= 0 else "moderate" if beyond_sex == 1 else "high"
        said = {"high": "Oral anticoagulation is recommended (if atrial fibrillation)",
                "moderate": "Oral anticoagulation should be considered (if atrial "
                            "fibrillation)",
                "low": "No antithrombotic therapy for stroke prevention is indicated"}[risk]
        if record.condition("atrial_fibrillation") is None:
            said += "; no atrial fibrillation is recorded: the score applies to it"
    return tally.view("cha2ds2-vasc", "CHA2DS2-VASc",
                      "Lip GYH et al., Chest 2010;137:263-272", risk, said)


def has_bled(record: Record) -> JSON:
    rules, tally = knowledge()["has_bled"], Tally()
    sbp = record.vital("systolic_bp")
    if sbp is None:
        tally.missing.append("systolic_bp")
    else:
        tally.add("uncontrolled hypertension (systolic > 160 mmHg)",
                  1 if sbp.value > rules["uncontrolled_sbp"] else 0, sbp.value)
    creatinine = record.latest("creatinine") or record.latest("creatinine_molar")
    renal = record.condition("renal_disease") or (
        creatinine.reference if creatinine and creatinine.value >=
        rules["renal_creatinine_mg_dl"] else None)
    tally.add("abnormal renal function", 1 if renal else 0,
              "recorded" if renal else NOT_RECORDED, renal)
    tally.condition(record, "liver_disease")
    tally.condition(record, "stroke_tia_thromboembolism")
    tally.condition(record, "bleeding")
    labile = labile_inr(record, rules)
    if labile is None:
        tally.missing.append(f"INR history ({rules['inr_min_values']} or more results "
                             f"in {rules['inr_months']} months)")
    else:
        tally.add("labile INR (time in range < 60 %)", 1 if labile[0] else 0,
                  round(labile[1], 2))
    age = record.age
    if age is None:
        tally.missing.append("age")
    else:
        tally.add("elderly (> 65)", 1 if age > 65 else 0, age)
    drug = record.medication("antiplatelet_or_nsaid")
    tally.add("antiplatelet or NSAID", 1 if drug else 0,
              "recorded" if drug else NOT_RECORDED, drug)
    tally.condition(record, "alcohol_excess")
    high = tally.partial >= 3
    return tally.view(
        "has-bled", "HAS-BLED", "Pisters R et al., Chest 2010;138:1093-1100",
        "high" if high else ("low" if not tally.missing else None),
        "3 or more: high bleeding risk; address modifiable factors and review regularly"
        if high else None)


def labile_inr(record: Record, rules: JSON) -> tuple[bool, float] | None:
    """(labile, fraction of INR results in range) over the last months; None with too
    few results."""
    since = datetime.now(UTC) - timedelta(days=30 * rules["inr_months"])
    values = [r.value for r in record.readings("inr")
              if r.when and _after(r.when, since)]
    if len(values) < rules["inr_min_values"]:
        return None
    low, high = rules["inr_target"]
    in_range = sum(1 for v in values if low <= v <= high) / len(values)
    return in_range < rules["labile_ttr_below"], in_range


def _after(text: str, moment: datetime) -> bool:
    when = instant(text)
    return when is not None and when >= moment


def framingham(record: Record) -> JSON:
    spec, tally = knowledge()["framingham"], Tally()
    age, sex = record.age, record.sex
    low, high = spec["age_range"]
    if age is None or not low <= age <= high:
        tally.missing.append(f"age {low}-{high}" + (f" (is {age})" if age is not None else ""))
    if sex is None:
        tally.missing.append("sex")
    inputs: dict[str, float] = {}
    for key, label in (("total_cholesterol", "total cholesterol"),
                       ("hdl_cholesterol", "HDL cholesterol")):
        reading = record.latest(key)
        if reading is None:
            tally.missing.append(label)
        else:
            inputs[key] = reading.value
            tally.add(f"{label} (mg/dL)", 0, round(reading.value, 1), reading.reference)
    sbp = record.vital("systolic_bp")
    if sbp is None:
        tally.missing.append("systolic_bp")
    treated = record.medication("antihypertensive")
    smoker = smoking(record)
    if smoker is None:
        tally.missing.append("smoking status")
    diabetic = record.condition("diabetes")
    if tally.missing or age is None or sex is None or sbp is None or smoker is None:
        return tally.view("framingham-cvd", "Framingham 10-year cardiovascular risk (%)",
                          spec["source"], None, None)
    beta = spec[sex]
    total = (beta["ln_age"] * math.log(age)
             + beta["ln_total_cholesterol"] * math.log(inputs["total_cholesterol"])
             + beta["ln_hdl"] * math.log(inputs["hdl_cholesterol"])
             + beta["ln_sbp_treated" if treated else "ln_sbp_untreated"] * math.log(sbp.value)
             + beta["smoker"] * smoker[0] + beta["diabetes"] * (1 if diabetic else 0))
    risk = 100 * (1 - beta["baseline_survival"] ** math.exp(total - beta["mean"]))
    tally.add("age", 0, age)
    tally.add("systolic blood pressure", 0, sbp.value)
    tally.add("treated for hypertension", 0, "recorded" if treated else NOT_RECORDED, treated)
    tally.add("current smoker", 0, bool(smoker[0]), smoker[1])
    tally.add("diabetes", 0, "recorded" if diabetic else NOT_RECORDED, diabetic)
    band = next(name for limit, name in spec["bands"] if risk < limit)
    return tally.view("framingham-cvd", "Framingham 10-year cardiovascular risk (%)",
                      spec["source"], band, f"{risk:.1f} % risk of a cardiovascular event "
                      "in 10 years", value=round(risk, 1))


def smoking(record: Record) -> tuple[int, str | None] | None:
    """(1 current smoker / 0 not, the Observation) from the latest smoking status."""
    reading = record.latest("smoking")
    if reading is None:
        return None
    codes = {c.get("code") for c in (reading.value or {}).get("coding") or []}
    if codes & set(knowledge()["current_smoker_snomed"]):
        return 1, reading.reference
    if codes & set(knowledge()["non_smoker_snomed"]):
        return 0, reading.reference
    return None


CALCULATORS: dict[str, Callable[[Record], JSON]] = {
    "news2": news2_score, "qsofa": qsofa, "cha2ds2-vasc": cha2ds2_vasc,
    "has-bled": has_bled, "framingham-cvd": framingham}


# --- the route ------------------------------------------------------------------------------------
class RiskRequest(BaseModel):
    patient_id: str = PATIENT_ID
    scores: list[ScoreName] | None = Field(default=None, min_length=1, description="Default: "
                                           "all of them")


class RiskView(BaseModel):
    patient_id: str
    scores: list[ScoreView]
    support: Support


router = APIRouter(tags=["ai"])


@router.post("/api/ai/risk-stratification", response_model=Envelope[RiskView],
             summary="Validated risk scores (NEWS2, qSOFA, CHA2DS2-VASc, HAS-BLED, "
                     "Framingham CVD) from the patient's record, with inputs used and missing")
async def risk_stratification(body: RiskRequest,
                              ctx: ApiContext = Depends(api_context)) -> Any:
    ctx.authorize("ai.decision-support")
    patient = await patient_for(ctx, body.patient_id)
    assert patient is not None
    record = await read_record(ctx, patient)
    wanted = list(dict.fromkeys(body.scores or SCORES))
    scores = [CALCULATORS[name](record) for name in wanted]
    references = sorted({c["reference"] for s in scores for c in s["components"]
                         if c["reference"]} | {f"Observation/{o.split('/')[-1]}"
                                               for o in record.news2.get("observations", [])})
    support = Support(
        based_on=[Basis(kind="score", name=s["title"], source=s["source"]) for s in scores],
        inputs=[InputUsed(name=f"{s['name']}: {c['name']}", value=c["value"],
                          reference=c["reference"]) for s in scores for c in s["components"]],
        missing=[f"{s['name']}: {m}" for s in scores for m in s["missing"]])
    summary = ", ".join(f"{s['name']} {s['value'] if s['value'] is not None else 'incomplete'}"
                        for s in scores)
    return ok(await answered(ctx, "risk-stratification",
                             {"patient_id": body.patient_id, "scores": scores}, support,
                             patient=patient, records=references, summary=summary))


__all__ = ["CALCULATORS", "Record", "read_record", "router"]

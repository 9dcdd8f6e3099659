"""``POST /api/ai/lab-interpretation``: a lab result read against its reference range,
the critical limits, the patient's previous values and the patterns of its panel.
Rule-based; the rules are data (``data/lab_knowledge.json``, the panic table of
:mod:`cds_hooks.panic_values`).

Request (spec): ``patient_id``, ``lab_result_id`` — a **DiagnosticReport** (its result
Observations are the panel) or an **Observation** (the panel: the patient's laboratory
Observations within a day of it, the latest of each code). Everything is read as the
caller (the access policy: 403 for a record they may not see).

For each result (a LOINC-coded ``valueQuantity``):

- **reference range**: the laboratory's own (``Observation.referenceRange``) when given,
  else the table's adult interval (by the patient's sex where it differs); flag low /
  normal / high;
- **critical**: the panic table (the same limits that raise critical-result Flags);
- **delta check**: the previous result of the same code (before this one), flagged when
  the change passes the table's absolute or relative limit;

and across the panel the table's **patterns** (microcytic, macrocytic and normocytic
anaemia, pancytopenia) and **acute kidney injury by the KDIGO creatinine criteria** (a
rise of ≥ 0.3 mg/dL within 48 hours, or to ≥ 1.5 times the lowest value of the previous 7
days; stage 2 from 2.0 times, stage 3 from 3.0 times or 4.0 mg/dL), with the creatinine values
used. No previous creatinine: the KDIGO check is named in ``missing``, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Literal, NoReturn

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from cds_hooks.panic_values import panic_table
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
from platform_api.envelope import ApiError, Envelope, ok
from platform_api.facade import ApiContext, api_context
from platform_api.sessions.common import LOINC, local_id

JSON = dict[str, Any]
Flag = Literal["low", "normal", "high", "unknown"]
RESULT_STATUSES = "final,amended,corrected,preliminary"
PANEL_WINDOW = timedelta(hours=24)


def knowledge() -> JSON:
    return data_file("lab_knowledge.json")


@cache
def analytes() -> dict[str, JSON]:
    return {entry["loinc"]: entry for entry in knowledge()["analytes"]}


# --- one result -------------------------------------------------------------------------------
class PreviousView(BaseModel):
    observation_id: str
    value: float
    unit: str | None = None
    effective: str | None = None


class ResultView(BaseModel):
    observation_id: str
    code: str | None = None
    display: str | None = None
    value: float | None = None
    unit: str | None = None
    effective: str | None = None
    reference_low: float | None = None
    reference_high: float | None = None
    reference_source: str | None = Field(default=None, description="laboratory | table")
    flag: Flag
    critical: bool | None = Field(default=None, description="null: no critical limit known")
    critical_limit: float | None = None
    previous: PreviousView | None = None
    delta: float | None = Field(default=None, description="value - previous (same unit)")
    delta_exceeded: bool | None = None


@dataclass
class Result:
    observation: JSON
    code: str | None
    value: float | None
    unit: str | None

    @property
    def id(self) -> str:
        return str(self.observation["id"])

    @property
    def effective(self) -> str | None:
        return self.observation.get("effectiveDateTime") or (
            self.observation.get("effectivePeriod") or {}).get("start") or \
            self.observation.get("issued")


def result_of(observation: JSON) -> Result:
    code = next((c.get("code") for c in (observation.get("code") or {}).get("coding") or []
                 if c.get("system") == LOINC), None)
    quantity = observation.get("valueQuantity") or {}
    value = quantity.get("value")
    return Result(observation, code, float(value) if isinstance(value, int | float) else None,
                  quantity.get("unit") or quantity.get("code"))


def reference_range(result: Result, sex: str | None) -> tuple[float | None, float | None,
                                                              str | None]:
    """(low, high, source): the laboratory's range, else the table's (by sex)."""
    for given in result.observation.get("referenceRange") or []:
        low, high = (given.get("low") or {}).get("value"), (given.get("high") or {}).get("value")
        if low is not None or high is not None:
            return low, high, "laboratory"
    entry = analytes().get(result.code or "")
    if entry is None or result.value is None or converted(result.value, result.unit,
                                                          entry) is None:
        return None, None, None
    interval = entry.get("range") or entry.get(sex or "") or None
    if interval is None:  # a sex-specific interval and the sex is unknown: the widest
        interval = [min(entry["female"][0], entry["male"][0]),
                    max(entry["female"][1], entry["male"][1])]
    factor = converted(1.0, result.unit, entry) or 1.0
    return interval[0] / factor, interval[1] / factor, "table"


def flag_of(value: float | None, low: float | None, high: float | None) -> Flag:
    if value is None or (low is None and high is None):
        return "unknown"
    if low is not None and value < low:
        return "low"
    if high is not None and value > high:
        return "high"
    return "normal"


def delta_exceeded(result: Result, previous: Result) -> tuple[float | None, bool | None]:
    entry = analytes().get(result.code or "")
    if result.value is None or previous.value is None:
        return None, None
    prior = previous.value if previous.unit == result.unit or entry is None else (
        _in_unit_of(previous, result, entry))
    if prior is None:
        return None, None
    delta = round(result.value - prior, 6)
    limit = (entry or {}).get("delta")
    if not limit:
        return delta, None
    if "absolute" in limit:
        factor = converted(1.0, result.unit, entry or {}) or 1.0
        return delta, abs(delta) * factor >= limit["absolute"]
    return delta, prior != 0 and abs(delta) / abs(prior) >= limit["relative"]


def _in_unit_of(previous: Result, result: Result, entry: JSON) -> float | None:
    assert previous.value is not None
    in_table = converted(previous.value, previous.unit, entry)
    factor = converted(1.0, result.unit, entry)
    return in_table / factor if in_table is not None and factor else None


# --- across the panel ---------------------------------------------------------------------------
class PatternView(BaseModel):
    code: str
    name: str
    evidence: list[str] = Field(description="The results that meet its criteria")
    suggestion: str
    stage: int | None = None
    based_on: str


def _holds(condition: JSON, result: Result, flag: Flag) -> bool:
    entry = analytes().get(result.code or "")
    value = converted(result.value, result.unit, entry) if (
        entry and result.value is not None) else None
    if "flag" in condition:
        return flag == condition["flag"]
    if value is None:
        return False
    return ((condition.get("below") is None or value < condition["below"])
            and (condition.get("above") is None or value > condition["above"])
            and (condition.get("from") is None or value >= condition["from"])
            and (condition.get("to") is None or value <= condition["to"]))


def panel_patterns(panel: list[tuple[Result, Flag]]) -> list[JSON]:
    by_analyte = {analytes()[r.code]["analyte"]: (r, f) for r, f in panel
                  if r.code in analytes()}
    found = []
    for pattern in knowledge()["patterns"]:
        met = [by_analyte.get(c["analyte"]) for c in pattern["all"]]
        if all(m is not None and _holds(c, *m) for c, m in zip(pattern["all"], met,
                                                               strict=True)):
            found.append(PatternView(
                code=pattern["code"], name=pattern["name"], suggestion=pattern["suggestion"],
                evidence=[f"Observation/{m[0].id}" for m in met if m is not None],
                based_on=f"lab_knowledge.json {knowledge()['version']}").model_dump())
    return found


def kdigo_aki(current: Result, history: list[Result]) -> tuple[JSON | None, bool]:
    """The KDIGO AKI finding of a creatinine result against the patient's creatinine of
    the previous 7 days (``history``); second: whether there was any to compare with."""
    rules = knowledge()["kdigo"]
    entry = analytes()[current.code or ""]
    now = converted(current.value or 0.0, current.unit, entry)
    moment = instant(current.effective)
    if now is None or moment is None:
        return None, False
    earlier: list[tuple[datetime, float, Result]] = []
    for result in history:
        when, other = instant(result.effective), analytes().get(result.code or "")
        value = converted(result.value, result.unit, other) if (
            other and result.value is not None) else None
        if when is not None and value is not None and timedelta(0) < moment - when \
                <= timedelta(days=7):
            earlier.append((when, value, result))
    if not earlier:
        return None, False
    baseline = min(earlier, key=lambda e: e[1])
    recent = [e for e in earlier if moment - e[0] <= timedelta(hours=48)]
    rise_48h = now - min(e[1] for e in recent) if recent else None
    ratio = now / baseline[1] if baseline[1] > 0 else 0.0
    if ratio < rules["relative_rise_7d"] and (rise_48h is None
                                              or rise_48h < rules["absolute_rise_48h"]):
        return None, True
    stage = 3 if ratio >= rules["stage_3"] or now >= rules["stage_3_level"] else \
        2 if ratio >= rules["stage_2"] else 1
    said = (f"creatinine {now:.2f} mg/dL, {ratio:.1f} times the 7-day baseline "
            f"{baseline[1]:.2f} mg/dL" + (f", +{rise_48h:.2f} mg/dL within 48 h"
                                          if rise_48h is not None else ""))
    return PatternView(
        code="aki-kdigo", name=f"Acute kidney injury (KDIGO stage {stage})", stage=stage,
        evidence=[f"Observation/{current.id}", f"Observation/{baseline[2].id}"],
        suggestion=f"Meets the KDIGO creatinine criteria ({said}): review fluid status, "
                   "nephrotoxic drugs and urine output; repeat creatinine.",
        based_on="KDIGO AKI guideline 2012, creatinine criteria").model_dump(), True


# --- reading the record --------------------------------------------------------------------------
class LabInterpretationRequest(BaseModel):
    patient_id: str = PATIENT_ID
    lab_result_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9\-.]{1,64}$",
                               description="A DiagnosticReport or an Observation")


class LabInterpretationView(BaseModel):
    patient_id: str
    lab_result_id: str
    lab_result_type: str
    results: list[ResultView]
    patterns: list[PatternView]
    summary: str
    support: Support


async def _panel(ctx: ApiContext, patient_id: str, result_id: str) -> tuple[str, JSON,
                                                                          list[JSON]]:
    report = await ctx.fhir.find_json("DiagnosticReport", result_id)
    if report is not None:
        if local_id(report.get("subject"), "Patient") != patient_id:
            _mismatch()
        members = [await ctx.fhir.find_json("Observation", local_id(r, "Observation") or "")
                   for r in report.get("result") or [] if local_id(r, "Observation")]
        return "DiagnosticReport", report, [m for m in members if m]
    observation = await ctx.fhir.find_json("Observation", result_id)
    if observation is None:
        raise ApiError(404, "LAB_RESULT_NOT_FOUND", "No DiagnosticReport or Observation "
                       f"{result_id}", field="lab_result_id")
    if local_id(observation.get("subject"), "Patient") != patient_id:
        _mismatch()
    moment = instant(result_of(observation).effective)
    if moment is None:
        return "Observation", observation, [observation]
    nearby = await ctx.fhir.search("Observation", [
        ("subject", f"Patient/{patient_id}"), ("status", RESULT_STATUSES),
        ("date", f"ge{(moment - PANEL_WINDOW).isoformat()}"),
        ("date", f"le{(moment + PANEL_WINDOW).isoformat()}"), ("_sort", "-date")])
    latest: dict[str | None, JSON] = {result_of(observation).code: observation}
    for other in nearby:
        if other.get("valueQuantity") and not _is_vital(other):
            latest.setdefault(result_of(other).code, other)
    return "Observation", observation, list(latest.values())


def _is_vital(observation: JSON) -> bool:
    return any(c.get("code") == "vital-signs" for concept in observation.get("category") or []
               for c in concept.get("coding") or [])


def _mismatch() -> NoReturn:
    raise ApiError(422, "LAB_RESULT_PATIENT_MISMATCH", "The lab result is not this "
                   "patient's", field="lab_result_id")


async def _previous(ctx: ApiContext, patient_id: str, result: Result) -> Result | None:
    if result.code is None or result.effective is None:
        return None
    earlier = await ctx.fhir.search("Observation", [
        ("subject", f"Patient/{patient_id}"), ("code", f"{LOINC}|{result.code}"),
        ("status", RESULT_STATUSES), ("date", f"lt{result.effective}"), ("_sort", "-date"),
        ("_count", "1")])
    found = [result_of(o) for o in earlier if o["id"] != result.id and o.get("valueQuantity")]
    return found[0] if found else None


async def _creatinine_history(ctx: ApiContext, patient_id: str, result: Result
                              ) -> list[Result]:
    moment = instant(result.effective)
    assert moment is not None
    codes = [f"{LOINC}|{code}" for code, e in analytes().items()
             if e["analyte"] == knowledge()["kdigo"]["analyte"]]
    found = await ctx.fhir.search("Observation", [
        ("subject", f"Patient/{patient_id}"), ("code", ",".join(codes)),
        ("status", RESULT_STATUSES), ("date", f"ge{(moment - timedelta(days=7)).isoformat()}"),
        ("date", f"lt{result.effective}")])
    return [result_of(o) for o in found if o["id"] != result.id]


async def interpret(ctx: ApiContext, body: LabInterpretationRequest) -> JSON:
    patient = await patient_for(ctx, body.patient_id)
    assert patient is not None
    kind, record, members = await _panel(ctx, body.patient_id, body.lab_result_id)
    table = panic_table(ctx.services.settings.cds_panic_values_file)
    sex = patient.get("gender") if patient.get("gender") in ("female", "male") else None
    views, panel, inputs, missing, records = [], [], [], [], [f"{kind}/{record['id']}"]
    patterns: list[JSON] = []
    for observation in members:
        result = result_of(observation)
        low, high, source = reference_range(result, sex)
        flag = flag_of(result.value, low, high)
        finding = table.check(result.code, result.value, result.unit) if (
            result.code and result.value is not None) else None
        previous = await _previous(ctx, body.patient_id, result)
        delta, exceeded = delta_exceeded(result, previous) if previous else (None, None)
        views.append(ResultView(
            observation_id=result.id, code=result.code,
            display=(observation.get("code") or {}).get("text") or (
                analytes().get(result.code or "") or {}).get("display"),
            value=result.value, unit=result.unit, effective=result.effective,
            reference_low=low, reference_high=high, reference_source=source, flag=flag,
            critical=finding.critical if finding and finding.comparable else None,
            critical_limit=finding.threshold if finding else None,
            previous=PreviousView(observation_id=previous.id, value=previous.value or 0.0,
                                  unit=previous.unit, effective=previous.effective)
            if previous else None, delta=delta, delta_exceeded=exceeded).model_dump())
        panel.append((result, flag))
        records.append(f"Observation/{result.id}")
        inputs.append(InputUsed(name=str(result.code or observation.get("code", {})
                                         .get("text")), value=result.value, unit=result.unit,
                                reference=f"Observation/{result.id}"))
        if previous:
            records.append(f"Observation/{previous.id}")
        if (analytes().get(result.code or "") or {}).get("analyte") == \
                knowledge()["kdigo"]["analyte"] and result.value is not None:
            aki, compared = kdigo_aki(result, await _creatinine_history(
                ctx, body.patient_id, result))
            if aki:
                patterns.append(aki)
            if not compared:
                missing.append("creatinine of the previous 7 days (KDIGO AKI check)")
    patterns = panel_patterns(panel) + patterns
    summary = _summary(views, patterns)
    support = Support(based_on=[
        Basis(kind="rule", name="reference ranges, delta checks and panel patterns",
              version=knowledge()["version"], source=knowledge()["source"]),
        Basis(kind="rule", name="critical limits (panic values)", source=table.source)],
        inputs=inputs, missing=missing)
    answer = {"patient_id": body.patient_id, "lab_result_id": body.lab_result_id,
              "lab_result_type": kind, "results": views, "patterns": patterns,
              "summary": summary}
    return await answered(ctx, "lab-interpretation", answer, support, patient=patient,
                          records=records, summary=summary)


def _summary(views: list[JSON], patterns: list[JSON]) -> str:
    critical = [v for v in views if v["critical"]]
    abnormal = [v for v in views if v["flag"] in ("low", "high")]
    parts = [f"{len(critical)} critical" if critical else "",
             f"{len(abnormal)} of {len(views)} outside the reference range",
             *(p["name"] for p in patterns)]
    return "; ".join(p for p in parts if p)


router = APIRouter(tags=["ai"])


@router.post("/api/ai/lab-interpretation", response_model=Envelope[LabInterpretationView],
             summary="Interpret a lab result: reference range, critical limits, delta "
                     "check against previous values, panel patterns (rule-based)")
async def lab_interpretation(body: LabInterpretationRequest,
                             ctx: ApiContext = Depends(api_context)) -> Any:
    ctx.authorize("ai.decision-support")
    return ok(await interpret(ctx, body))


__all__ = ["LabInterpretationView", "interpret", "kdigo_aki", "panel_patterns", "router"]

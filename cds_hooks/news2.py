"""NEWS2 early warning score (Royal College of Physicians, 2017), tables as data
(``data/news2.json``: chart 1's bands for each parameter, SpO2 scales 1 and 2, chart 3's
thresholds and chart 4's responses).

``score(vitals)`` gives the sub-score of each of the seven parameters, the total, the
clinical risk band (low 0-4, low-medium when one parameter scores 3, medium 5-6, high
7+) and the response it calls for. A parameter that was not measured is **named in
``missing``, never guessed**: the total and band are then absent (``partial_total`` says
what the parameters measured add up to, so a partial 7 is still visibly alarming).

``vitals_from_observations`` takes the latest value of each parameter from vital-sign
Observations (LOINC codes of the data file; systolic pressure also inside a blood
pressure panel's components), ignoring what is older than ``max_age`` (a week-old pulse
is not a current one) and what is not final/amended/corrected/preliminary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from functools import cache
from importlib import resources
from typing import Any, Literal

import orjson

from cds_hooks.cards import CdsService, Indicator, Invocation, card, source
from cds_hooks.models import Action, Card, CdsResponse
from cds_hooks.prefetch import bundle_resources

JSON = dict[str, Any]
PARAMETERS = ("respiration_rate", "spo2", "air_or_oxygen", "systolic_bp", "pulse",
              "consciousness", "temperature")
Consciousness = Literal["alert", "confusion", "voice", "pain", "unresponsive"]
USABLE_STATUSES = frozenset({"final", "amended", "corrected", "preliminary"})
ACVPU_WORDS = (("unresponsive", "unresponsive"), ("pain", "pain"), ("voice", "voice"),
               ("verbal", "voice"), ("confus", "confusion"), ("alert", "alert"))


@cache
def tables() -> JSON:
    return orjson.loads(resources.files("cds_hooks.data").joinpath("news2.json").read_bytes())  # type: ignore[no-any-return]


@dataclass
class Vitals:
    respiration_rate: float | None = None
    spo2: float | None = None
    on_oxygen: bool | None = None
    systolic_bp: float | None = None
    pulse: float | None = None
    consciousness: str | None = None
    temperature: float | None = None
    based_on: list[str] = field(default_factory=list)  # Observation references used
    measured_at: str | None = None  # the latest of the values' times


@dataclass
class SubScore:
    parameter: str
    value: Any
    score: int


@dataclass
class News2Result:
    scale: int
    subscores: dict[str, SubScore]
    missing: list[str]

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def partial_total(self) -> int:
        return sum(s.score for s in self.subscores.values())

    @property
    def total(self) -> int | None:
        return self.partial_total if self.complete else None

    @property
    def band(self) -> str | None:
        if not self.complete:
            return None
        return band_of(self.partial_total, any(s.score == 3 for s in self.subscores.values()))

    def as_dict(self) -> JSON:
        band = self.band
        response = tables()["responses"][band] if band else None
        return {
            "score": self.total, "partial_total": self.partial_total,
            "complete": self.complete, "missing": self.missing, "spo2_scale": self.scale,
            "subscores": {p: {"value": s.value, "score": s.score}
                          for p, s in self.subscores.items()},
            "risk": band, "monitoring": response["monitoring"] if response else None,
            "response": response["response"] if response else None,
            "based_on": "NEWS2, Royal College of Physicians 2017",
        }


def band_of(total: int, single_three: bool) -> str:
    """Chart 3: 7+ high, 5-6 medium, a 3 in one parameter low-medium, else low."""
    if total >= 7:
        return "high"
    if total >= 5:
        return "medium"
    return "low-medium" if single_three else "low"


def _banded(value: float, bands: Iterable[list[Any]], precision: int) -> int:
    rounded = Decimal(str(value)).quantize(Decimal(1).scaleb(-precision),
                                           rounding=ROUND_HALF_UP)
    for low, high, points in bands:
        if (low is None or rounded >= Decimal(str(low))) and \
                (high is None or rounded <= Decimal(str(high))):
            return int(points)
    raise ValueError(f"{value} falls in no band")  # the bands cover every number


def score(vitals: Vitals, scale: int = 1) -> News2Result:
    """Sub-scores of what was measured; ``missing`` names the rest."""
    params = tables()["parameters"]
    subscores: dict[str, SubScore] = {}
    missing: list[str] = []

    def banded(name: str, value: float | None, bands: list[list[Any]] | None = None) -> None:
        if value is None:
            missing.append(name)
            return
        spec = params[name]
        subscores[name] = SubScore(name, value, _banded(value, bands or spec["bands"],
                                                        int(spec.get("precision", 0))))

    banded("respiration_rate", vitals.respiration_rate)
    if scale == 2:
        if vitals.spo2 is not None and vitals.on_oxygen is None and vitals.spo2 >= 93:
            missing.append("spo2")  # scale 2 scores 93+ by whether oxygen is given
        else:
            banded("spo2", vitals.spo2, params["spo2"]["scale_2_oxygen" if vitals.on_oxygen
                                                      else "scale_2_air"])
    else:
        banded("spo2", vitals.spo2, params["spo2"]["scale_1"])
    if vitals.on_oxygen is None:
        missing.append("air_or_oxygen")
    else:
        state = "oxygen" if vitals.on_oxygen else "air"
        subscores["air_or_oxygen"] = SubScore("air_or_oxygen", state,
                                              params["air_or_oxygen"]["scores"][state])
    banded("systolic_bp", vitals.systolic_bp)
    banded("pulse", vitals.pulse)
    if vitals.consciousness is None:
        missing.append("consciousness")
    else:
        subscores["consciousness"] = SubScore(
            "consciousness", vitals.consciousness,
            params["consciousness"]["scores"][vitals.consciousness])
    banded("temperature", vitals.temperature)
    return News2Result(scale, subscores, sorted(missing, key=PARAMETERS.index))


# -- from Observations ---------------------------------------------------------------------
def _codes(concept: JSON | None) -> set[str]:
    return {str(c.get("code")) for c in (concept or {}).get("coding") or []
            if c.get("system") == "http://loinc.org"}


def _when(observation: JSON) -> str:
    return str(observation.get("effectiveDateTime")
               or (observation.get("effectivePeriod") or {}).get("end")
               or (observation.get("effectivePeriod") or {}).get("start")
               or observation.get("effectiveInstant") or observation.get("issued") or "")


def _quantity(holder: JSON) -> float | None:
    value = (holder.get("valueQuantity") or {}).get("value")
    return float(value) if isinstance(value, int | float) else None


def consciousness_level(observation: JSON) -> str | None:
    concept = observation.get("valueCodeableConcept") or {}
    texts = [concept.get("text"), observation.get("valueString"),
             *(c.get("display") for c in concept.get("coding") or [])]
    for text in (t.lower() for t in texts if isinstance(t, str)):
        for word, level in ACVPU_WORDS:
            if word in text:
                return level
    return None


def _parse_instant(text: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else None


def _value_of(parameter: str, observation: JSON, codes: set[str]) -> Any:
    params = tables()["parameters"]
    if parameter == "systolic_bp" and codes & set(params["systolic_bp"]["panels"]):
        for component in observation.get("component") or []:
            if _codes(component.get("code")) & set(params["systolic_bp"]["loinc"]):
                return _quantity(component)
        return None
    if parameter == "consciousness":
        return consciousness_level(observation)
    if parameter == "air_or_oxygen":
        value = _quantity(observation)
        if value is None:
            return None
        fraction = codes & set(params["air_or_oxygen"]["oxygen_fraction_loinc"])
        return value > 21 if fraction else value > 0
    return _quantity(observation)


def _parameter_codes() -> Mapping[str, set[str]]:
    params = tables()["parameters"]
    found = {name: set(spec.get("loinc", [])) | set(spec.get("panels", []))
             for name, spec in params.items() if name != "air_or_oxygen"}
    found["air_or_oxygen"] = set(params["air_or_oxygen"]["oxygen_flow_loinc"]) | set(
        params["air_or_oxygen"]["oxygen_fraction_loinc"])
    return found


def vitals_from_observations(observations: Iterable[JSON], *, now: datetime,
                             max_age: timedelta) -> Vitals:
    """The latest usable value of each parameter, not older than ``max_age``."""
    latest: dict[str, tuple[str, Any, str]] = {}
    oldest = now - max_age
    by_parameter = _parameter_codes()
    for observation in observations:
        if observation.get("resourceType") != "Observation" \
                or observation.get("status") not in USABLE_STATUSES:
            continue
        when = _when(observation)
        instant = _parse_instant(when)
        if instant is None or instant < oldest:
            continue
        codes = _codes(observation.get("code"))
        for parameter, wanted in by_parameter.items():
            if not codes & wanted:
                continue
            value = _value_of(parameter, observation, codes)
            if value is not None and (parameter not in latest or when > latest[parameter][0]):
                latest[parameter] = (when, value, f"Observation/{observation.get('id')}")
    vitals = Vitals(
        respiration_rate=_get(latest, "respiration_rate"), spo2=_get(latest, "spo2"),
        on_oxygen=_get(latest, "air_or_oxygen"), systolic_bp=_get(latest, "systolic_bp"),
        pulse=_get(latest, "pulse"), consciousness=_get(latest, "consciousness"),
        temperature=_get(latest, "temperature"))
    vitals.based_on = sorted({ref for _, _, ref in latest.values()})
    vitals.measured_at = max((when for when, _, _ in latest.values()), default=None)
    return vitals


def _get(latest: Mapping[str, tuple[str, Any, str]], parameter: str) -> Any:
    found = latest.get(parameter)
    return found[1] if found else None


def spo2_scale(conditions: Iterable[JSON]) -> int:
    """2 when an active Condition says the patient's SpO2 target is 88-92%."""
    wanted = set(tables()["scale_2_conditions"]["codes"])
    for condition in conditions:
        status = ((condition.get("clinicalStatus") or {}).get("coding") or [{}])[0].get("code")
        if status not in (None, "active", "recurrence", "relapse"):
            continue
        for coding in (condition.get("code") or {}).get("coding") or []:
            if f"{coding.get('system')}|{coding.get('code')}" in wanted:
                return 2
    return 1


# -- the CDS service (patient-view, encounter-start, encounter-discharge) --------------------
RISK_INDICATOR: dict[str | None, Indicator] = {
    "high": "critical", "medium": "warning", "low-medium": "warning", "low": "info"}
RISK_PROBABILITY = {"high": "high", "medium": "moderate", "low-medium": "moderate",
                    "low": "low"}


def assess(inv: Invocation) -> tuple[News2Result, Vitals]:
    vitals = vitals_from_observations(bundle_resources(inv.prefetch.get("vitals")),
                                      now=inv.now, max_age=inv.vitals_max_age)
    scale = spo2_scale(bundle_resources(inv.prefetch.get("conditions")))
    return score(vitals, scale), vitals


def _detail(result: News2Result, vitals: Vitals, max_age: timedelta) -> str:
    names = tables()["parameters"]
    rows = "\n".join(f"| {names[p]['display']} | {s.value} | {s.score} |"
                     for p, s in result.subscores.items())
    lines = [f"| parameter | value | score |\n|---|---|---|\n{rows}"]
    if result.missing:
        lines.append("**Not measured in the last "
                     f"{int(max_age.total_seconds() // 3600)} hours:** "
                     + ", ".join(names[p]["display"] for p in result.missing))
    if result.band:
        response = tables()["responses"][result.band]
        lines.append(f"**{response['monitoring']} monitoring.** {response['response']}")
    lines.append(f"*SpO2 scale {result.scale}; latest measurement {vitals.measured_at}; "
                 "NEWS2, Royal College of Physicians 2017.*")
    return "\n\n".join(lines)


def news2_card(result: News2Result, vitals: Vitals, max_age: timedelta) -> Card | None:
    if not result.subscores:
        return None  # nothing measured recently: nothing to say
    if result.complete:
        if result.total == 0:
            return None
        summary = f"NEWS2 {result.total}: {result.band} clinical risk"
        indicator = RISK_INDICATOR[result.band]
    else:
        summary = (f"NEWS2 incomplete (partial score {result.partial_total}): "
                   f"{', '.join(result.missing)} not measured")
        indicator = "warning" if result.partial_total >= 5 else "info"
    return card(summary, indicator, source(SERVICE_TITLE), detail=_detail(result, vitals, max_age))


def risk_assessment(inv: Invocation, result: News2Result, vitals: Vitals) -> JSON:
    """A RiskAssessment recording the score (the encounter-start system action)."""
    assessment: JSON = {
        "resourceType": "RiskAssessment", "status": "final",
        "subject": {"reference": f"Patient/{inv.context.patientId}"},
        "occurrenceDateTime": vitals.measured_at,
        "method": {"text": "NEWS2 (Royal College of Physicians 2017)"},
        "basis": [{"reference": ref} for ref in vitals.based_on],
        "prediction": [{"outcome": {"text": "Clinical deterioration"},
                        "qualitativeRisk": {"coding": [{
                            "system": "http://terminology.hl7.org/CodeSystem/risk-probability",
                            "code": RISK_PROBABILITY[result.band or "low"]}]}}],
        "note": [{"text": f"NEWS2 total {result.total} ({result.band} clinical risk)"}],
    }
    if inv.context.encounterId:
        assessment["encounter"] = {"reference": f"Encounter/{inv.context.encounterId}"}
    return assessment


async def news2_service(inv: Invocation) -> CdsResponse:
    result, vitals = assess(inv)
    found = news2_card(result, vitals, inv.vitals_max_age)
    actions = None
    if inv.request.hook == "encounter-start" and result.complete:
        actions = [Action(type="create", description="Record the NEWS2 score of the "
                          "encounter's start", resource=risk_assessment(inv, result, vitals))]
    return CdsResponse(cards=[found] if found else [], systemActions=actions)


SERVICE_TITLE = "NEWS2 early warning score"
SERVICE = CdsService(
    id="news2", hooks=("patient-view", "encounter-start", "encounter-discharge"),
    title=SERVICE_TITLE,
    description="National Early Warning Score 2 (RCP 2017) from the patient's latest "
                "vital signs: total, sub-scores, clinical risk and the response it calls "
                "for; parameters not measured recently are named, not guessed. On "
                "encounter-start it also returns a system action recording the score as a "
                "RiskAssessment.",
    prefetch={
        "vitals": "Observation?patient={{context.patientId}}&category=vital-signs"
                  "&_sort=-date&_count=100",
        "conditions": "Condition?patient={{context.patientId}}&code="
                      + ",".join(tables()["scale_2_conditions"]["codes"]),
    },
    usage_requirements="Vital-sign Observations coded with LOINC (respiration rate, SpO2, "
                       "inhaled oxygen, systolic pressure, pulse, level of responsiveness, "
                       "temperature) by prefetch or FHIR access (else 412).",
    run=news2_service)

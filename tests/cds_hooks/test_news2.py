"""NEWS2 (RCP 2017) against hand-computed examples from chart 1 (scoring), chart 3
(thresholds) and the SpO2 scale 2 rows; missing parameters are named, never guessed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cds_hooks.news2 import Vitals, score, spo2_scale, vitals_from_observations

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def vitals(**values: object) -> Vitals:
    normal: dict[str, object] = {"respiration_rate": 16, "spo2": 97, "on_oxygen": False,
                                 "systolic_bp": 125, "pulse": 72, "consciousness": "alert",
                                 "temperature": 36.8}
    normal.update(values)
    return Vitals(**normal)  # type: ignore[arg-type]


# (case, vitals, SpO2 scale, total, risk): each sub-score worked out by hand from chart 1.
EXAMPLES = [
    ("all normal", vitals(), 1, 0, "low"),
    # RR 24 → 2, SpO2 95 → 1, oxygen → 2, SBP 105 → 1, pulse 115 → 2, alert → 0, 38.5 → 1
    ("septic on oxygen", vitals(respiration_rate=24, spo2=95, on_oxygen=True, systolic_bp=105,
                                pulse=115, temperature=38.5), 1, 9, "high"),
    # new confusion alone scores 3: an urgent ward-based response
    ("new confusion", vitals(consciousness="confusion"), 1, 3, "low-medium"),
    # RR 22 → 2, SpO2 94 → 1, SBP 108 → 1, pulse 95 → 1
    ("deteriorating", vitals(respiration_rate=22, spo2=94, systolic_bp=108, pulse=95), 1, 5,
     "medium"),
    # RR 21 → 2, pulse 91 → 1, temperature 38.1 → 1
    ("fever", vitals(respiration_rate=21, pulse=91, temperature=38.1), 1, 4, "low"),
    # scale 2, on air: SpO2 90 is in the 88-92 target → 0
    ("COPD on target", vitals(spo2=90), 2, 0, "low"),
    # scale 2, on oxygen: 94 → 1, plus oxygen 2
    # (a total of 3 with no single 3 is low, not low-medium)
    ("COPD on oxygen above target", vitals(spo2=94, on_oxygen=True), 2, 3, "low"),
    # scale 2, on oxygen: 97 → 3, plus oxygen 2
    ("COPD over-oxygenated", vitals(spo2=97, on_oxygen=True), 2, 5, "medium"),
    # scale 2: 85 → 2 whatever the oxygen; scale 1 would give 3
    ("COPD hypoxic", vitals(spo2=85), 2, 2, "low"),
    ("hypoxic on scale 1", vitals(spo2=85), 1, 3, "low-medium"),
    # RR 8 → 3, SBP 90 → 3, pulse 40 → 3, unresponsive → 3, 35.0 → 3
    ("peri-arrest", vitals(respiration_rate=8, systolic_bp=90, pulse=40,
                           consciousness="unresponsive", temperature=35.0), 1, 15, "high"),
]


@pytest.mark.parametrize("case,given,scale,total,risk", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_news2_matches_the_hand_computed_examples(case: str, given: Vitals, scale: int,
                                                  total: int, risk: str) -> None:
    result = score(given, scale)
    assert (result.total, result.band) == (total, risk)
    assert result.as_dict()["response"]


@pytest.mark.parametrize("parameter,value,points", [
    ("respiration_rate", 9, 1), ("respiration_rate", 11, 1), ("respiration_rate", 12, 0),
    ("respiration_rate", 20, 0), ("respiration_rate", 25, 3),
    ("spo2", 91, 3), ("spo2", 92, 2), ("spo2", 93, 2), ("spo2", 96, 0),
    ("systolic_bp", 91, 2), ("systolic_bp", 100, 2), ("systolic_bp", 110, 1),
    ("systolic_bp", 111, 0), ("systolic_bp", 219, 0), ("systolic_bp", 220, 3),
    ("pulse", 41, 1), ("pulse", 50, 1), ("pulse", 51, 0), ("pulse", 90, 0), ("pulse", 110, 1),
    ("pulse", 111, 2), ("pulse", 130, 2), ("pulse", 131, 3),
    ("temperature", 35.1, 1), ("temperature", 36.0, 1), ("temperature", 36.1, 0),
    ("temperature", 38.0, 0), ("temperature", 39.0, 1), ("temperature", 39.1, 2),
    # charted to one decimal: 36.04 is 36.0 (1), 36.05 is 36.1 (0)
    ("temperature", 36.04, 1), ("temperature", 36.05, 0),
])
def test_each_band_edge_of_chart_1(parameter: str, value: float, points: int) -> None:
    assert score(vitals(**{parameter: value})).subscores[parameter].score == points


def test_missing_parameters_are_named_and_no_total_is_guessed() -> None:
    result = score(Vitals(respiration_rate=26, pulse=135))
    assert result.missing == ["spo2", "air_or_oxygen", "systolic_bp", "consciousness",
                              "temperature"]
    assert (result.total, result.band, result.partial_total) == (None, None, 6)
    body = result.as_dict()
    assert body["score"] is None and body["complete"] is False and body["risk"] is None


def test_scale_2_above_target_without_knowing_the_oxygen_is_missing_not_guessed() -> None:
    result = score(vitals(spo2=95, on_oxygen=None), 2)
    assert "spo2" in result.missing and "air_or_oxygen" in result.missing


def _observation(code: str, value: float | None, when: datetime, *, unit: str = "/min",
                 **extra: object) -> dict[str, object]:
    observation: dict[str, object] = {
        "resourceType": "Observation", "id": f"{code}-{when:%H%M}", "status": "final",
        "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/"
                                  "observation-category", "code": "vital-signs"}]}],
        "code": {"coding": [{"system": "http://loinc.org", "code": code}]},
        "subject": {"reference": "Patient/amina"}, "effectiveDateTime": when.isoformat()}
    if value is not None:
        observation["valueQuantity"] = {"value": value, "unit": unit}
    observation.update(extra)
    return observation


def test_vitals_come_from_the_latest_recent_observations() -> None:
    hour_ago, two_days_ago = NOW - timedelta(hours=1), NOW - timedelta(days=2)
    observations = [
        _observation("9279-1", 14, NOW - timedelta(hours=3)),
        _observation("9279-1", 23, hour_ago),  # the latest respiration rate wins
        _observation("8867-4", 88, two_days_ago),  # too old: the pulse is missing
        _observation("59408-5", 93, hour_ago, unit="%"),
        _observation("3151-8", 2, hour_ago, unit="L/min"),  # 2 L/min: on oxygen
        _observation("85354-6", None, hour_ago, component=[
            {"code": {"coding": [{"system": "http://loinc.org", "code": "8480-6"}]},
             "valueQuantity": {"value": 98, "unit": "mm[Hg]"}},
            {"code": {"coding": [{"system": "http://loinc.org", "code": "8462-4"}]},
             "valueQuantity": {"value": 60, "unit": "mm[Hg]"}}]),
        _observation("67775-7", None, hour_ago,
                     valueCodeableConcept={"text": "Responds to voice"}),
        _observation("8310-5", 38.2, hour_ago, unit="Cel", status="entered-in-error"),
    ]
    found = vitals_from_observations(observations, now=NOW, max_age=timedelta(hours=24))
    assert (found.respiration_rate, found.spo2, found.on_oxygen, found.systolic_bp,
            found.consciousness) == (23, 93, True, 98, "voice")
    assert found.pulse is None and found.temperature is None
    result = score(found)
    assert result.missing == ["pulse", "temperature"]
    # RR 23 → 2, SpO2 93 → 2, oxygen → 2, SBP 98 → 2, voice → 3
    assert result.partial_total == 11


def test_scale_2_comes_from_an_active_hypercapnic_respiratory_failure() -> None:
    failure = {"resourceType": "Condition", "clinicalStatus": {"coding": [{"code": "active"}]},
               "code": {"coding": [{"system": "http://hl7.org/fhir/sid/icd-10-cm",
                                    "code": "J96.12"}]}}
    resolved = {**failure, "clinicalStatus": {"coding": [{"code": "resolved"}]}}
    assert spo2_scale([failure]) == 2
    assert spo2_scale([resolved]) == 1
    assert spo2_scale([]) == 1

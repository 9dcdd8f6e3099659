"""Syndromes of encounters from reasons, diagnoses and vital signs
(platform_api/public_health/syndromes.py)."""

from __future__ import annotations

from platform_api.public_health.syndromes import findings_of, mentions, syndromes_of

ICD10 = "http://hl7.org/fhir/sid/icd-10"


def _encounter(reason: str | None = None, klass: str = "AMB") -> dict:
    encounter: dict = {"resourceType": "Encounter", "class": {"code": klass}}
    if reason:
        encounter["reasonCode"] = [{"text": reason}]
    return encounter


def _temperature(value: float, unit: str = "Cel") -> dict:
    return {"resourceType": "Observation",
            "code": {"coding": [{"system": "http://loinc.org", "code": "8310-5"}]},
            "valueQuantity": {"value": value, "unit": unit, "code": unit}}


def _diagnosis(code: str, display: str = "") -> dict:
    return {"resourceType": "Condition",
            "code": {"coding": [{"system": ICD10, "code": code, "display": display}]}}


def test_ili_needs_fever_and_cough_and_sari_an_admission():
    assert syndromes_of(findings_of(_encounter("Cough for three days"), [],
                                    [_temperature(38.6)])) == ["fever", "ili"]
    assert set(syndromes_of(findings_of(_encounter("fever and cough", "IMP"), [], []))) == {
        "fever", "ili", "sari"}
    assert syndromes_of(findings_of(_encounter("Cough"), [], [_temperature(37.2)])) == []


def test_fahrenheit_is_converted():
    assert syndromes_of(findings_of(_encounter(), [], [_temperature(101.3, "[degF]")])) == [
        "fever"]
    assert syndromes_of(findings_of(_encounter(), [], [_temperature(99.5, "[degF]")])) == []


def test_diagnoses_count_by_icd10_prefix():
    found = syndromes_of(findings_of(_encounter(), [_diagnosis("A09.0")], []))
    assert found == ["acute-watery-diarrhoea"]
    assert syndromes_of(findings_of(_encounter(), [_diagnosis("A03.9", "Shigellosis")],
                                    [])) == ["bloody-diarrhoea"]


def test_negated_mentions_do_not_count():
    assert not mentions("No fever, mild headache", ("fever",))
    assert not mentions("patient denies cough", ("cough",))
    assert mentions("no vomiting; fever since Monday", ("fever",))
    assert mentions("Fever. No cough", ("fever",)) and not mentions("Fever. No cough",
                                                                    ("cough",))
    assert syndromes_of(findings_of(_encounter("Rash, no fever"), [], [])) == []
    assert syndromes_of(findings_of(_encounter("fever with maculopapular rash"), [], [])) \
        == ["fever", "fever-rash"]

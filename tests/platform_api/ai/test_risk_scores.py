"""POST /api/ai/risk-stratification: validated scores from the patient's FHIR record,
with the inputs used and those missing."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from tests.platform_api.ai.conftest import LOINC, data, lab, refusal, vital, write

URL = "/api/ai/risk-stratification"
ICD10 = "http://hl7.org/fhir/sid/icd-10"


def minutes_ago(minutes: float) -> str:
    return (datetime.now(UTC) - timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def condition(world, system: str, code: str, patient_id: str) -> dict:
    return await write(world, {
        "resourceType": "Condition", "subject": {"reference": f"Patient/{patient_id}"},
        "clinicalStatus": {"coding": [{
            "system": "http://terminology.hl7.org/CodeSystem/condition-clinical",
            "code": "active"}]},
        "code": {"coding": [{"system": system, "code": code}]}})


async def sick_vitals(world) -> None:
    await vital(world, "9279-1", 24, "/min", minutes_ago(30))
    await vital(world, "8480-6", 95, "mm[Hg]", minutes_ago(30))
    await write(world, {
        "resourceType": "Observation", "status": "final",
        "category": [{"coding": [{"code": "vital-signs", "system":
                                  "http://terminology.hl7.org/CodeSystem/observation-category"}]}],
        "code": {"coding": [{"system": LOINC, "code": "67775-7"}]},
        "subject": {"reference": f"Patient/{world.patient_id}"},
        "effectiveDateTime": minutes_ago(30), "valueCodeableConcept": {"text": "Confusion"}})


async def test_qsofa_and_news2_from_vital_signs(clinic):
    await sick_vitals(clinic)
    answer = data(await clinic.post("doctor", URL, {"patient_id": clinic.patient_id,
                                                    "scores": ["qsofa", "news2"]}))
    qsofa, news2 = answer["scores"]
    assert qsofa["value"] == 3 and qsofa["complete"] and qsofa["risk"] == "high"
    assert news2["value"] is None and "spo2" in news2["missing"]
    assert news2["partial"] >= 3 + 3  # confusion and a systolic of 95 score 3 each
    assert "news2: spo2" in answer["support"]["missing"]
    assert {b["kind"] for b in answer["support"]["based_on"]} == {"score"}
    event = data(await clinic.get("admin",
                                  f"/api/clinical/audit/{answer['support']['audit_event_id']}"))
    assert event["subtype"] == "ai-risk-stratification"


async def test_cha2ds2_vasc_and_has_bled_from_conditions_and_medications(clinic):
    pid = clinic.patient_id  # a woman of 38
    hypertension = await condition(clinic, ICD10, "I10", pid)
    await condition(clinic, ICD10, "I48.0", pid)
    diabetes = await condition(clinic, "http://snomed.info/sct", "44054006", pid)
    aspirin = await write(clinic, {
        "resourceType": "MedicationRequest", "status": "active", "intent": "order",
        "medicationCodeableConcept": {"text": "Aspirin 75 mg tablet"},
        "subject": {"reference": f"Patient/{pid}"}})
    await vital(clinic, "8480-6", 172, "mm[Hg]", minutes_ago(20))
    answer = data(await clinic.post("doctor", URL, {"patient_id": pid,
                                                    "scores": ["cha2ds2-vasc", "has-bled"]}))
    cha, bled = answer["scores"]
    assert cha["value"] == 3 and cha["risk"] == "high"  # H + D + female
    refs = {c["reference"] for c in cha["components"] if c["reference"]}
    assert refs == {f"Condition/{hypertension['id']}", f"Condition/{diabetes['id']}"}
    assert any(c["value"] == "not recorded" for c in cha["components"])
    assert "no atrial fibrillation" not in cha["interpretation"]
    # HAS-BLED: uncontrolled hypertension + aspirin; INR history missing
    assert bled["value"] is None and bled["partial"] == 2
    assert bled["missing"] == ["INR history (3 or more results in 6 months)"]
    assert f"MedicationRequest/{aspirin['id']}" in {c["reference"] for c in bled["components"]}
    for days, inr in ((60, 1.6), (30, 3.8), (5, 2.4)):
        await lab(clinic, "6301-6", inr, "{INR}", minutes_ago(days * 24 * 60))
    bled = data(await clinic.post("doctor", URL, {"patient_id": pid,
                                                  "scores": ["has-bled"]}))["scores"][0]
    assert bled["value"] == 3 and bled["risk"] == "high"  # labile: 1 of 3 in range


async def test_framingham_matches_the_published_example(clinic):
    # D'Agostino 2008: a woman of 61, TC 180, HDL 47, untreated SBP 124, smoker,
    # not diabetic: 10.48 %
    born = date.today().replace(year=date.today().year - 61) - timedelta(days=10)
    patient = data(await clinic.post("admin", f"/api/organizations/{clinic.org_id}/patients",
                                     {"first_name": "Grace", "last_name": "Wambui",
                                      "date_of_birth": born.isoformat(), "gender": "female",
                                      "mrn": "KCC-0061"}), 201)
    clinic.patient_id = patient["id"]
    await lab(clinic, "2093-3", 180, "mg/dL", minutes_ago(600))
    await lab(clinic, "2085-9", 47 / 38.67, "mmol/L", minutes_ago(600))
    await vital(clinic, "8480-6", 124, "mm[Hg]", minutes_ago(10))
    body = {"patient_id": patient["id"], "scores": ["framingham-cvd"]}
    incomplete = data(await clinic.post("doctor", URL, body))["scores"][0]
    assert incomplete["value"] is None and incomplete["missing"] == ["smoking status"]
    await write(clinic, {
        "resourceType": "Observation", "status": "final",
        "code": {"coding": [{"system": LOINC, "code": "72166-2"}]},
        "subject": {"reference": f"Patient/{patient['id']}"},
        "effectiveDateTime": minutes_ago(600),
        "valueCodeableConcept": {"coding": [{"system": "http://snomed.info/sct",
                                             "code": "449868002"}]}})
    score = data(await clinic.post("doctor", URL, body))["scores"][0]
    assert score["value"] == pytest.approx(10.5) and score["risk"] == "intermediate"
    assert score["complete"] and "10.5 %" in score["interpretation"]


async def test_refusals(clinic):
    body = {"patient_id": clinic.patient_id}
    assert refusal(await clinic.post("billing", URL, body)) == (403, "CLINICAL_ROLE_REQUIRED")
    assert (await clinic.post("other_admin", URL, body)).status_code == 403
    assert refusal(await clinic.post("doctor", URL, {"patient_id": "unknown"})) == (
        404, "NOT_FOUND")
    wrong = await clinic.post("doctor", URL, {**body, "scores": ["apache-ii"]})
    assert refusal(wrong) == (422, "VALIDATION_ERROR")
    # with nothing recorded every score says what it misses
    answer = data(await clinic.post("nurse", URL, body))
    assert [s["name"] for s in answer["scores"]] == [
        "news2", "qsofa", "cha2ds2-vasc", "has-bled", "framingham-cvd"]
    assert answer["scores"][2]["complete"]  # age and sex are known; conditions absent
    assert not answer["scores"][4]["complete"]

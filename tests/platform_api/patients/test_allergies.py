"""Allergies: FHIR AllergyIntolerance in a patient's record, duplicates refused, access."""

from __future__ import annotations

PENICILLIN = {"substance": "Penicillin", "code": "764146007", "category": "medication",
              "criticality": "high", "reaction": "Urticaria", "severity": "moderate",
              "onset": "2019-06-01"}


async def test_an_allergy_is_an_allergy_intolerance(clinic):
    url = f"/api/patients/{clinic.patient_id}/allergies"
    created = await clinic.client.post(url, json=PENICILLIN, headers=clinic.nurse["headers"])
    assert created.status_code == 201, created.text
    allergy = created.json()["data"]
    assert (allergy["substance"], allergy["clinical_status"], allergy["verification_status"]) \
        == ("Penicillin", "active", "confirmed")
    fhir = (await clinic.fhir(f"AllergyIntolerance/{allergy['id']}")).json()
    assert fhir["code"]["coding"][0] == {"system": "http://snomed.info/sct",
                                         "code": "764146007", "display": "Penicillin"}
    assert fhir["patient"] == {"reference": f"Patient/{clinic.patient_id}"}
    assert fhir["reaction"][0] == {"manifestation": [{"text": "Urticaria"}],
                                   "severity": "moderate"}
    assert fhir["clinicalStatus"]["coding"][0]["code"] == "active"
    assert fhir["category"] == ["medication"] and fhir["criticality"] == "high"
    listing = (await clinic.client.get(url, headers=clinic.patient["headers"])).json()
    assert [a["id"] for a in listing["data"]] == [allergy["id"]]
    assert listing["meta"]["total"] == 1


async def test_a_second_active_allergy_to_the_same_substance_is_409(clinic):
    url = f"/api/patients/{clinic.patient_id}/allergies"
    await clinic.client.post(url, json=PENICILLIN, headers=clinic.doctor["headers"])
    again = await clinic.client.post(url, json=PENICILLIN, headers=clinic.doctor["headers"])
    assert again.status_code == 409 and again.json()["error"]["code"] == "ALLERGY_EXISTS"
    uncoded = {"substance": "Groundnuts", "category": "food"}
    for _ in range(2):
        assert (await clinic.client.post(url, json=uncoded, headers=clinic.doctor[
            "headers"])).status_code == 201
    food = (await clinic.client.get(f"{url}?category=food", headers=clinic.doctor[
        "headers"])).json()
    assert food["meta"]["total"] == 2


async def test_validation_and_access(clinic):
    url = f"/api/patients/{clinic.patient_id}/allergies"
    bad = await clinic.client.post(url, json={**PENICILLIN, "category": "pets"},
                                   headers=clinic.doctor["headers"])
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "category"
    assert (await clinic.client.post(url, json=PENICILLIN, headers=clinic.patient[
        "headers"])).status_code == 403
    assert (await clinic.client.get(url, headers=clinic.outsider["headers"])).status_code == 403
    assert (await clinic.client.post(url, json=PENICILLIN, headers=clinic.outsider[
        "headers"])).status_code == 403
    assert (await clinic.client.get("/api/patients/unknown/allergies", headers=clinic.doctor[
        "headers"])).status_code == 404

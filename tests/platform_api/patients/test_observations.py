"""Observations of any category: create, read, amend, delete, filter, and who may do what."""

from __future__ import annotations

WEIGHT = {"category": "exam", "code": "29463-7", "name": "Body weight", "value": 64.5,
          "unit": "kg", "effective_at": "2026-03-01T09:15:00Z"}
SMOKING = {"category": "social-history", "code": "72166-2", "name": "Tobacco smoking status",
           "value": "Never smoker"}


async def create(clinic, body, who=None):
    response = await clinic.client.post("/api/observations", json={
        "patient_id": clinic.patient_id, **body}, headers=(who or clinic.doctor)["headers"])
    assert response.status_code == 201, response.text
    return response.json()["data"]


async def test_an_observation_maps_to_fhir_and_back(clinic):
    weight = await create(clinic, {**WEIGHT, "reference_low": 50, "reference_high": 80,
                                   "interpretation": "N", "notes": "Weighed without shoes"})
    assert (weight["value"], weight["unit"], weight["status"]) == (64.5, "kg", "final")
    fhir = (await clinic.fhir(f"Observation/{weight['id']}")).json()
    assert fhir["code"]["coding"][0] == {"system": "http://loinc.org", "code": "29463-7",
                                         "display": "Body weight"}
    assert fhir["valueQuantity"] == {"value": 64.5, "unit": "kg",
                                     "system": "http://unitsofmeasure.org", "code": "kg"}
    assert fhir["category"][0]["coding"][0]["code"] == "exam"
    assert fhir["referenceRange"][0]["low"]["value"] == 50
    assert fhir["effectiveDateTime"].startswith("2026-03-01T09:15:00")
    smoking = await create(clinic, SMOKING)
    assert smoking["value"] == "Never smoker"
    assert (await clinic.fhir(f"Observation/{smoking['id']}")).json()["valueString"] == \
        "Never smoker"


async def test_changing_a_final_value_amends_it_and_status_moves_follow_the_table(clinic):
    weight = await create(clinic, WEIGHT)
    url = f"/api/observations/{weight['id']}"
    amended = await clinic.client.patch(url, json={"value": 63.9},
                                        headers=clinic.nurse["headers"])
    assert amended.status_code == 200, amended.text
    assert (amended.json()["data"]["value"], amended.json()["data"]["status"]) == (63.9,
                                                                                   "amended")
    assert amended.json()["data"]["unit"] == "kg"
    erroneous = await clinic.client.patch(url, json={"status": "entered-in-error"},
                                          headers=clinic.nurse["headers"])
    assert erroneous.json()["data"]["status"] == "entered-in-error"
    back = await clinic.client.patch(url, json={"status": "final"},
                                     headers=clinic.nurse["headers"])
    assert back.status_code == 409 and back.json()["error"]["code"] == "INVALID_TRANSITION"


async def test_lists_filter_by_category_code_and_patient(clinic):
    await create(clinic, WEIGHT)
    smoking = await create(clinic, SMOKING)
    url = f"/api/observations?patient_id={clinic.patient_id}"
    everything = (await clinic.client.get(url, headers=clinic.doctor["headers"])).json()
    assert everything["meta"]["total"] == 2
    social = (await clinic.client.get(f"{url}&category=social-history",
                                      headers=clinic.doctor["headers"])).json()
    assert [o["id"] for o in social["data"]] == [smoking["id"]]
    coded = (await clinic.client.get(f"{url}&code=http://loinc.org|29463-7",
                                     headers=clinic.doctor["headers"])).json()
    assert coded["meta"]["total"] == 1
    # What a FHIR client wrote shows up through /api.
    posted = await clinic.client.post("/fhir/Observation", json={
        "resourceType": "Observation", "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": "8302-2",
                             "display": "Body height"}]},
        "subject": {"reference": f"Patient/{clinic.patient_id}"},
        "valueQuantity": {"value": 168, "unit": "cm", "system": "http://unitsofmeasure.org",
                          "code": "cm"}},
        headers={**clinic.doctor["headers"], "Content-Type": "application/fhir+json"})
    assert posted.status_code == 201, posted.text
    height = await clinic.client.get(f"/api/observations/{posted.json()['id']}",
                                     headers=clinic.patient["headers"])
    assert (height.json()["data"]["value"], height.json()["data"]["unit"]) == (168, "cm")
    own = (await clinic.client.get("/api/observations", headers=clinic.patient["headers"])
           ).json()
    assert own["meta"]["total"] == 3


async def test_bad_payloads_are_422_naming_the_field(clinic):
    for body, field in (({**WEIGHT, "category": "gossip"}, "category"),
                        ({"category": "exam", "name": "x"}, "code"),
                        ({**SMOKING, "unit": "kg"}, "unit")):
        response = await clinic.client.post("/api/observations", json={
            "patient_id": clinic.patient_id, **body}, headers=clinic.doctor["headers"])
        assert response.status_code == 422, body
        assert response.json()["error"]["field"] == field


async def test_access_by_role_membership_and_consent(clinic):
    weight = await create(clinic, WEIGHT)
    url = f"/api/observations/{weight['id']}"
    assert (await clinic.client.get(url, headers=clinic.patient["headers"])).status_code == 200
    assert (await clinic.client.patch(url, json={"value": 1}, headers=clinic.patient[
        "headers"])).status_code == 403
    assert (await clinic.client.get(url, headers=clinic.receptionist["headers"])
            ).status_code == 403
    assert (await clinic.client.get(url, headers=clinic.outsider["headers"])).status_code == 403
    assert (await clinic.client.get(f"/api/observations?patient_id={clinic.patient_id}",
                                    headers=clinic.outsider["headers"])).status_code == 403
    assert (await clinic.client.delete(url, headers=clinic.nurse["headers"])).status_code == 403
    assert (await clinic.client.delete(url, headers=clinic.doctor["headers"])).status_code == 200
    assert (await clinic.client.get(url, headers=clinic.doctor["headers"])).status_code == 404

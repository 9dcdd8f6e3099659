"""The care journey: the patient's resources as one timeline in clinical time, journey
events recorded as Observations, and what each role sees of it."""

from __future__ import annotations

FHIR = {"Content-Type": "application/fhir+json"}


async def test_the_timeline_merges_the_record_in_clinical_time(clinic):
    doctor = clinic.doctor["headers"]
    visit = await clinic.client.post("/api/clinical-records", json={
        "patient_id": clinic.patient_id, "encounter_type": "consultation",
        "chief_complaint": "Cough", "notes": "Chest clear", "date": "2026-01-05T09:00:00Z"},
        headers=doctor)
    vitals = await clinic.client.post("/api/vitals", json={
        "patient_id": clinic.patient_id, "heart_rate": 76,
        "effective_at": "2026-01-05T09:10:00Z"}, headers=clinic.nurse["headers"])
    referral = await clinic.client.post(f"/api/patients/{clinic.patient_id}/journey", json={
        "event_type": "referral", "title": "Referred to Kenyatta National Hospital",
        "description": "Chest X-ray shows a mass; oncology review",
        "occurred_at": "2026-02-10T11:00:00Z"}, headers=doctor)
    assert referral.status_code == 201, referral.text
    event = referral.json()["data"]
    assert (event["kind"], event["event_type"], event["title"]) == (
        "journey_event", "referral", "Referred to Kenyatta National Hospital")
    # An older immunization written by a FHIR client lands in its place in time.
    await clinic.client.post("/fhir/Immunization", json={
        "resourceType": "Immunization", "status": "completed",
        "vaccineCode": {"coding": [{"system": "http://hl7.org/fhir/sid/cvx", "code": "140"}],
                        "text": "Influenza, seasonal"},
        "patient": {"reference": f"Patient/{clinic.patient_id}"},
        "occurrenceDateTime": "2025-11-20"}, headers={**doctor, **FHIR})
    journey = await clinic.client.get(f"/api/patients/{clinic.patient_id}/journey",
                                      headers=doctor)
    assert journey.status_code == 200, journey.text
    body = journey.json()
    assert [(e["kind"], e["date"][:10]) for e in body["data"]] == [
        ("journey_event", "2026-02-10"), ("vitals", "2026-01-05"), ("visit", "2026-01-05"),
        ("immunization", "2025-11-20")]
    assert body["meta"]["total"] == 4
    assert body["data"][1]["id"] == f"Observation/{vitals.json()['data']['id']}"
    assert body["data"][2]["title"] == "consultation" and body["data"][2]["detail"] == "Cough"
    assert body["data"][2]["resource_id"] == visit.json()["data"]["id"]
    second = (await clinic.client.get(f"/api/patients/{clinic.patient_id}/journey"
                                      "?limit=2&page=2", headers=doctor)).json()
    assert [e["kind"] for e in second["data"]] == ["visit", "immunization"]
    only = (await clinic.client.get(f"/api/patients/{clinic.patient_id}/journey"
                                    "?kind=visit&kind=immunization", headers=doctor)).json()
    assert [e["kind"] for e in only["data"]] == ["visit", "immunization"]
    # The journey event is an Observation a FHIR client can find.
    found = (await clinic.fhir(f"Observation?subject=Patient/{clinic.patient_id}&category="
                               "urn:healthplatform:observation-category|care-journey")).json()
    assert found["total"] == 1


async def test_each_role_sees_what_it_may_and_outsiders_nothing(clinic):
    await clinic.client.post("/api/clinical-records", json={
        "patient_id": clinic.patient_id, "encounter_type": "consultation",
        "chief_complaint": "Cough", "notes": "Chest clear"}, headers=clinic.doctor["headers"])
    await clinic.client.post("/api/observations", json={
        "patient_id": clinic.patient_id, "code": "29463-7", "value": 64, "unit": "kg"},
        headers=clinic.doctor["headers"])
    url = f"/api/patients/{clinic.patient_id}/journey"
    front_desk = (await clinic.client.get(url, headers=clinic.receptionist["headers"])).json()
    assert [e["kind"] for e in front_desk["data"]] == ["visit"]  # no results for the desk
    own = (await clinic.client.get(url, headers=clinic.patient["headers"])).json()
    assert own["meta"]["total"] == 2
    assert (await clinic.client.get(url, headers=clinic.outsider["headers"])).status_code == 403
    refused = await clinic.client.post(url, json={"event_type": "milestone", "title": "x"},
                                       headers=clinic.patient["headers"])
    assert refused.status_code == 403
    bad = await clinic.client.post(url, json={"event_type": "party", "title": "x"},
                                   headers=clinic.doctor["headers"])
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "event_type"
    bad_kind = await clinic.client.get(f"{url}?kind=gossip", headers=clinic.doctor["headers"])
    assert bad_kind.status_code == 422
    assert (await clinic.client.get("/api/patients/unknown/journey", headers=clinic.doctor[
        "headers"])).status_code == 404

"""Notifiable case reports: POST /api/public-health/cases."""

from __future__ import annotations

import asyncio

from tests.platform_api.public_health.helpers import Clinic, data, days_ago, refusal, report


async def test_a_case_is_written_as_condition_encounter_and_observations(clinic: Clinic):
    events = clinic.recorded("platform.public_health.case_reported")
    case = data(await report(clinic, classification="suspected", admitted=True,
                             symptoms=["profuse watery diarrhoea", "vomiting"],
                             observations=[{"code": "8310-5", "display": "Body temperature",
                                            "value": 37.9, "unit": "Cel",
                                            "category": "vital-signs"},
                                           {"code": "6463-4", "display": "Stool culture",
                                            "value": "Vibrio cholerae O1"}]), 201)
    assert case["disease"] == "cholera" and case["icd10"] == ["A00"]
    assert case["reporting"] == "immediate" and case["deduplicated"] is False
    assert case["facility_id"] == clinic.org_id and case["epi_week"]
    assert case["reported_by"] == clinic.user_id("doctor")
    kinds = [e["resource"]["resourceType"] for e in case["bundle"]["entry"]]
    assert case["bundle"]["type"] == "collection"
    assert kinds == ["Patient", "Condition", "Encounter", "Observation", "Observation"]

    condition = (await clinic.get("doctor", f"/fhir/Condition/{case['id']}")).json()
    assert condition["verificationStatus"]["coding"][0]["code"] == "provisional"
    assert condition["subject"]["reference"] == f"Patient/{clinic.patient_id}"
    assert {e["code"][0]["text"] for e in condition["evidence"] if "code" in e} == {
        "profuse watery diarrhoea", "vomiting"}
    encounter = (await clinic.get("doctor", f"/fhir/Encounter/{case['encounter_id']}")).json()
    assert encounter["class"]["code"] == "IMP"
    assert encounter["diagnosis"][0]["condition"]["reference"] == f"Condition/{case['id']}"
    temperature = (await clinic.get(
        "doctor", f"/fhir/Observation/{case['observation_ids'][0]}")).json()
    assert temperature["valueQuantity"] == {"value": 37.9, "unit": "Cel",
                                            "system": "http://unitsofmeasure.org",
                                            "code": "Cel"}
    await clinic.drain()
    assert [e["payload"]["case_id"] for e in events] == [case["id"]]
    assert "Amina" not in str(events)  # ids and codes, no names


async def test_a_second_report_in_the_same_episode_updates_the_case(clinic: Clinic):
    updates = clinic.recorded("platform.public_health.case_updated")
    first = data(await report(clinic, onset_date=days_ago(5)), 201)
    second = data(await report(clinic, who="nurse", onset_date=days_ago(3),
                               classification="confirmed", outcome="died",
                               observations=[{"code": "6463-4", "value": "V. cholerae"}]))
    assert second["id"] == first["id"] and second["deduplicated"] is True
    assert second["classification"] == "confirmed" and second["outcome"] == "died"
    assert len(second["observation_ids"]) == 1
    # a report that does not say the classification leaves it as it is
    third = data(await report(clinic, onset_date=days_ago(4)))
    assert third["classification"] == "confirmed"
    await clinic.drain()
    assert len(updates) == 2
    listed = (await clinic.get("doctor", "/fhir/Condition",
                               patient=f"Patient/{clinic.patient_id}")).json()
    assert listed["total"] == 1


async def test_a_report_outside_the_episode_is_a_new_case(clinic: Clinic):
    first = data(await report(clinic, onset_date=days_ago(40)), 201)
    again = data(await report(clinic, onset_date=days_ago(1)), 201)  # cholera: 14 days
    assert again["id"] != first["id"]
    other = data(await report(clinic, disease="measles", onset_date=days_ago(1)), 201)
    assert other["id"] not in (first["id"], again["id"])


async def test_a_discarded_case_does_not_absorb_a_new_report(clinic: Clinic):
    first = data(await report(clinic, classification="discarded"), 201)
    second = data(await report(clinic), 201)
    assert second["id"] != first["id"]


async def test_an_existing_encounter_is_used(clinic: Clinic):
    made = await clinic.client.post("/fhir/Encounter", headers=clinic.h("doctor"), json={
        "resourceType": "Encounter", "status": "in-progress",
        "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                  "code": "AMB"}, "subject": {"reference": f"Patient/{clinic.patient_id}"}})
    encounter_id = made.json()["id"]
    case = data(await report(clinic, encounter_id=encounter_id), 201)
    assert case["encounter_id"] == encounter_id
    assert [e["resource"]["id"] for e in case["bundle"]["entry"]
            if e["resource"]["resourceType"] == "Encounter"] == [encounter_id]


async def test_bad_reports_are_refused_naming_the_field(clinic: Clinic):
    response = await report(clinic, disease="common-cold")
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"] == "disease"
    response = await report(clinic, onset_date="2999-01-01")
    assert response.json()["error"]["field"] == "onset_date"
    response = await report(clinic, classification="maybe")
    assert response.json()["error"]["field"] == "classification"
    response = await report(clinic, observations=[{"code": "8310-5"}])
    assert refusal(response)[0] == 422
    assert refusal(await report(clinic, patient_id="no-such-patient")) == (404, "NOT_FOUND")
    assert refusal(await report(clinic, encounter_id="no-such-encounter")) == (404,
                                                                               "NOT_FOUND")


async def test_who_may_report(clinic: Clinic):
    assert refusal(await report(clinic, who="stranger"))[0] == 403
    assert refusal(await report(clinic, who="other_admin"))[0] == 403
    assert refusal(await report(clinic, who="receptionist"))[0] == 403  # no Condition
    assert refusal(await report(clinic, who="billing"))[0] == 403
    data(await report(clinic, who="nurse"), 201)
    data(await report(clinic, who="admin", disease="measles"), 201)
    response = await clinic.client.post("/api/public-health/cases", json={})
    assert response.status_code == 401


async def test_the_facility_is_the_patients_organization_or_one_named(clinic: Clinic):
    case = data(await report(clinic, who="platform_admin"), 201)
    assert case["facility_id"] == clinic.org_id  # the patient's one organization
    assert refusal(await report(clinic, who="doctor", facility_id=clinic.other_org_id))[0] \
        == 403
    assert refusal(await report(clinic, who="doctor", facility_id="no-such-org")) == (
        404, "NOT_FOUND")


async def test_identical_reports_at_the_same_moment_are_one_case(clinic: Clinic):
    answers = await asyncio.gather(*(report(clinic, onset_date=days_ago(3))
                                     for _ in range(3)))
    assert sorted(a.status_code for a in answers) == [200, 200, 201], [
        a.text for a in answers]
    assert len({a.json()["data"]["id"] for a in answers}) == 1
    listed = (await clinic.get("doctor", "/fhir/Condition",
                               patient=f"Patient/{clinic.patient_id}")).json()
    assert listed["total"] == 1


async def test_another_clinic_reports_with_the_patients_consent(clinic: Clinic):
    assert refusal(await report(clinic, who="other_admin"))[0] == 403
    consent = await clinic.client.post("/fhir/Consent", headers=clinic.h("admin"), json={
        "resourceType": "Consent", "status": "active",
        "scope": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/consentscope",
                              "code": "patient-privacy"}]},
        "category": [{"coding": [{"system": "http://loinc.org", "code": "59284-0"}]}],
        "patient": {"reference": f"Patient/{clinic.patient_id}"},
        "policyRule": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                                   "code": "OPTIN"}]},
        "provision": {"type": "permit", "actor": [{
            "role": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-RoleClass",
                                 "code": "PROV"}]},
            "reference": {"reference": f"Organization/{clinic.other_org_id}"}}]}})
    assert consent.status_code == 201, consent.text
    case = data(await report(clinic, who="other_admin"), 201)
    assert case["facility_id"] == clinic.other_org_id  # the reporting clinic's case

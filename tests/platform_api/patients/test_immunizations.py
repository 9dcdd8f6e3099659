"""Immunizations: a schedule generated from the WHO table with country overrides, doses
given, what is missed, and adverse events following immunization."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from platform_api.patients.immunizations import after, recommendation, schedule_for

FHIR = {"Content-Type": "application/fhir+json"}


@pytest.fixture
async def infant(clinic):
    """Baraka, 16 weeks old today, registered by the clinic (Kenya)."""
    birth = date.today() - timedelta(weeks=16)
    response = await clinic.client.post(f"/api/organizations/{clinic.org_id}/patients", json={
        "first_name": "Baraka", "last_name": "Otieno", "date_of_birth": birth.isoformat(),
        "gender": "male", "mrn": "KCC-0002"}, headers=clinic.admin["headers"])
    assert response.status_code == 201, response.text
    return response.json()["data"]["id"]


def test_the_table_is_the_who_schedule_with_country_overrides():
    _who, series = schedule_for(None)
    keys = [s.key for s in series]
    assert {"bcg", "opv", "ipv", "penta", "pcv", "rota", "mr", "hpv"} <= set(keys)
    assert "yf" not in keys  # yellow fever only where it is endemic
    authority, kenya = schedule_for("KE")
    assert "Kenya" in authority and "yf" in [s.key for s in kenya]
    assert [d.age for d in next(s for s in kenya if s.key == "hpv").doses] == ["P10Y"]
    south_africa = {s.key: s for s in schedule_for("ZA")[1]}
    assert "penta" not in south_africa and "hexavalent" in south_africa
    assert len(south_africa["hexavalent"].doses) == 4
    assert after(date(2024, 1, 31), "P1M") == date(2024, 2, 29)
    assert after(date(2024, 1, 1), "P6W") == date(2024, 2, 12)


def test_hpv_is_for_girls_and_due_dates_follow_the_birth_date():
    patient = {"id": "p1", "birthDate": "2015-03-10", "gender": "male"}
    boy = recommendation(patient, "KE", date(2026, 1, 1))
    assert "hpv" not in {e["series"] for e in boy["recommendation"]}
    girl = recommendation({**patient, "gender": "female"}, "KE", date(2026, 1, 1))
    hpv = next(e for e in girl["recommendation"] if e["series"] == "hpv")
    assert hpv["dateCriterion"][0] == {"code": {"coding": [{
        "system": "http://loinc.org", "code": "30980-7", "display": "Date vaccine due"}]},
        "value": "2025-03-10"}
    assert hpv["vaccineCode"][0]["coding"][0] == {"system": "http://hl7.org/fhir/sid/cvx",
                                                  "code": "137",
                                                  "display": "HPV, unspecified formulation"}


async def test_generate_administer_and_missed(clinic, infant):
    base = f"/api/patients/{infant}/immunizations"
    generated = await clinic.client.post(f"{base}/generate", json={},
                                         headers=clinic.nurse["headers"])
    assert generated.status_code == 201, generated.text
    schedule = generated.json()["data"]
    assert "Kenya" in schedule["authority"]  # the clinic's country
    fhir = (await clinic.fhir(f"ImmunizationRecommendation/{schedule['id']}")).json()
    assert fhir["identifier"] == [{"system": "urn:healthplatform:immunization-schedule",
                                   "value": infant}]
    penta1 = next(e for e in fhir["recommendation"]
                  if e["series"] == "penta" and e["doseNumberPositiveInt"] == 1)
    assert penta1["forecastStatus"]["coding"][0]["code"] == "overdue"
    # BCG at birth and the first pentavalent dose, given now.
    for code in ("19", "198"):
        given = await clinic.client.post(f"{base}/administer", json={
            "vaccine_code": code, "lot_number": "EJ1685", "site": "LT", "route": "IM",
            "dose_ml": 0.5}, headers=clinic.nurse["headers"])
        assert given.status_code == 201, given.text
    penta = given.json()["data"]
    assert (penta["series"], penta["dose_number"]) == ("penta", 1)
    immunization = (await clinic.fhir(f"Immunization/{penta['id']}")).json()
    assert immunization["vaccineCode"]["coding"][0]["code"] == "198"
    assert immunization["protocolApplied"][0]["seriesDosesPositiveInt"] == 3
    assert immunization["site"]["coding"][0]["code"] == "LT"
    after_dose = (await clinic.fhir(f"ImmunizationRecommendation/{schedule['id']}")).json()
    penta1 = next(e for e in after_dose["recommendation"]
                  if e["series"] == "penta" and e["doseNumberPositiveInt"] == 1)
    assert penta1["forecastStatus"]["coding"][0]["code"] == "complete"
    assert penta1["supportingImmunization"] == [{"reference": f"Immunization/{penta['id']}"}]
    listing = (await clinic.client.get(f"{base}?limit=100", headers=clinic.doctor["headers"])
               ).json()
    by_dose = {(i["series"], i["dose_number"]): i["status"] for i in listing["data"]}
    assert by_dose[("bcg", 1)] == "given" and by_dose[("penta", 1)] == "given"
    assert by_dose[("penta", 2)] == "overdue"  # due at 10 weeks, 4 weeks late
    assert by_dose[("penta", 3)] == "due"  # due at 14 weeks
    assert by_dose[("mr", 1)] == "upcoming"
    assert by_dose[("hepb-birth", 1)] == "expired"  # the birth dose's window closed
    assert listing["meta"]["total"] == len(listing["data"])
    missed = (await clinic.client.get(f"{base}/missed?limit=100", headers=clinic.doctor[
        "headers"])).json()
    missed_doses = {(i["series"], i["dose_number"]) for i in missed["data"]}
    assert ("penta", 2) in missed_doses and ("hepb-birth", 1) in missed_doses
    assert ("penta", 1) not in missed_doses and ("penta", 3) not in missed_doses
    assert {i["status"] for i in missed["data"]} == {"overdue", "expired"}


async def test_doses_recorded_through_fhir_count_by_vaccine_code(clinic, infant):
    base = f"/api/patients/{infant}/immunizations"
    await clinic.client.post(f"{base}/generate", json={"country": "KE"},
                             headers=clinic.doctor["headers"])
    birth = date.today() - timedelta(weeks=16)
    written = await clinic.client.post("/fhir/Immunization", json={
        "resourceType": "Immunization", "status": "completed",
        "vaccineCode": {"coding": [{"system": "http://hl7.org/fhir/sid/cvx", "code": "178"}]},
        "patient": {"reference": f"Patient/{infant}"},
        "occurrenceDateTime": (birth + timedelta(weeks=6)).isoformat()},
        headers={**clinic.doctor["headers"], **FHIR})
    assert written.status_code == 201, written.text
    listing = (await clinic.client.get(f"{base}?limit=100", headers=clinic.doctor["headers"])
               ).json()
    opv = {i["dose_number"]: i["status"] for i in listing["data"] if i["series"] == "opv"}
    # Given at 6 weeks, past the birth dose's window: it is the 6-week dose.
    assert opv[2] == "given" and opv[1] == "expired"


async def test_aefi_is_an_adverse_event_linked_to_the_immunization(clinic, infant):
    base = f"/api/patients/{infant}/immunizations"
    given = (await clinic.client.post(f"{base}/administer", json={"vaccine_code": "198"},
                                      headers=clinic.nurse["headers"])).json()["data"]
    reported = await clinic.client.post(f"{base}/aefi", json={
        "immunization_id": given["id"], "reaction": "Fever", "reaction_code": "386661006",
        "onset": "2026-03-02T18:00:00Z", "severity": "moderate", "serious": False,
        "outcome": "recovering"}, headers=clinic.nurse["headers"])
    assert reported.status_code == 201, reported.text
    event = (await clinic.fhir(f"AdverseEvent/{reported.json()['data']['id']}")).json()
    assert event["suspectEntity"] == [{"instance": {"reference": f"Immunization/{given['id']}"}}]
    assert event["event"]["coding"][0]["code"] == "386661006"
    assert event["severity"]["coding"][0]["code"] == "moderate"
    assert event["seriousness"]["coding"][0]["code"] == "Non-serious"
    immunization = (await clinic.fhir(f"Immunization/{given['id']}")).json()
    assert immunization["reaction"][0]["reported"] is True
    events = await clinic.events("platform.immunization.aefi_reported")
    assert [(e["immunization_id"], e["severity"]) for e in events] == [
        (given["id"], "moderate")]
    other = await clinic.client.post(f"/api/patients/{clinic.patient_id}/immunizations/aefi",
                                     json={"immunization_id": given["id"], "reaction": "Fever",
                                           "onset": "2026-03-02T18:00:00Z",
                                           "severity": "mild"},
                                     headers=clinic.nurse["headers"])
    assert other.status_code == 404  # not that patient's immunization


async def test_validation_and_access(clinic, infant):
    base = f"/api/patients/{infant}/immunizations"
    assert (await clinic.client.post(f"{base}/generate", json={"country": "Kenya"},
                                     headers=clinic.nurse["headers"])).status_code == 422
    unknown = await clinic.client.post(f"{base}/administer", json={"vaccine_code": "999"},
                                       headers=clinic.nurse["headers"])
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "vaccine_name"
    bad_series = await clinic.client.post(f"{base}/administer", json={
        "vaccine_code": "198", "series": "smallpox"}, headers=clinic.nurse["headers"])
    assert bad_series.status_code == 422 and bad_series.json()["error"]["field"] == "series"
    for method, path, body in (("POST", "/generate", {}),
                               ("POST", "/administer", {"vaccine_code": "19"}),
                               ("GET", "", None), ("GET", "/missed", None)):
        response = await clinic.client.request(method, f"{base}{path}", json=body,
                                               headers=clinic.outsider["headers"])
        assert response.status_code == 403, path
    # The patient reads their schedule but records nothing.
    own = f"/api/patients/{clinic.patient_id}/immunizations"
    assert (await clinic.client.get(own, headers=clinic.patient["headers"])).status_code == 200
    assert (await clinic.client.post(f"{own}/administer", json={"vaccine_code": "19"},
                                     headers=clinic.patient["headers"])).status_code == 403
    assert (await clinic.client.get("/api/patients/unknown/immunizations",
                                    headers=clinic.doctor["headers"])).status_code == 404

"""Service requests (ServiceRequest) with their status table, diagnostic reports
(DiagnosticReport) signed by a doctor or the lab, and imaging studies (ImagingStudy)."""

from __future__ import annotations

from typing import Any

from tests.platform_api.clinic import Clinic, refusal

FHIR = {"Content-Type": "application/fhir+json"}
MALARIA_SMEAR = {"code": "32700-7", "system": "http://loinc.org",
                 "display": "Malaria smear microscopy"}


async def order(clinic: Clinic, who: str = "doctor", **extra: Any) -> Any:
    return await clinic.post(who, "/api/service-requests", {
        "patient_id": clinic.patient_id, "category": "laboratory", "code": MALARIA_SMEAR,
        "priority": "urgent", "reason": "Fever for 3 days", **extra})


async def test_a_doctor_orders_a_service_and_moves_its_status(clinic: Clinic):
    created = await order(clinic)
    assert created.status_code == 201, created.text
    request = created.json()["data"]
    assert request["status"] == "active" and request["category"] == "laboratory"
    assert request["code"]["code"] == "32700-7"
    assert request["requester"]["user_id"] == clinic.user_id("doctor")
    fhir = (await clinic.get("doctor", f"/fhir/ServiceRequest/{request['id']}")).json()
    assert fhir["intent"] == "order" and fhir["category"][0]["coding"][0]["code"] == "108252007"
    url = f"/api/service-requests/{request['id']}/status"
    held = await clinic.client.put(url, json={"status": "on-hold", "reason": "Patient left "
                                              "before the sample was taken"},
                                   headers=clinic.h("nurse"))
    assert held.status_code == 200, held.text
    assert held.json()["data"]["notes"][-1].startswith("Status on-hold: Patient left")
    assert (await clinic.client.put(url, json={"status": "completed"},
                                    headers=clinic.h("doctor"))).status_code == 409
    await clinic.client.put(url, json={"status": "active"}, headers=clinic.h("doctor"))
    done = await clinic.client.put(url, json={"status": "completed"},
                                   headers=clinic.h("doctor"))
    assert done.json()["data"]["status"] == "completed"
    again = await clinic.client.put(url, json={"status": "active"}, headers=clinic.h("doctor"))
    assert refusal(again) == (409, "INVALID_TRANSITION")
    assert refusal(await clinic.client.put(url, json={"status": "cancelled"},
                                           headers=clinic.h("doctor"))) == (422,
                                                                            "VALIDATION_ERROR")
    assert refusal(await clinic.client.put("/api/service-requests/nothing/status",
                                           json={"status": "revoked"},
                                           headers=clinic.h("doctor"))) == (404, "NOT_FOUND")


async def test_service_requests_are_listed_for_who_may_see_them(clinic: Clinic):
    await order(clinic)
    await order(clinic, who="nurse", category="imaging", code={"display": "Chest X-ray"})
    everything = (await clinic.get("admin", "/api/service-requests")).json()
    assert everything["meta"]["total"] == 2
    mine = (await clinic.get("doctor", "/api/service-requests", mine="true")).json()
    assert [r["code"]["display"] for r in mine["data"]] == ["Malaria smear microscopy"]
    imaging = (await clinic.get("doctor", "/api/service-requests", category="imaging")).json()
    assert [r["category"] for r in imaging["data"]] == ["imaging"]
    by_patient = (await clinic.get("doctor", "/api/service-requests",
                                   patient_id=clinic.patient_id, status="active")).json()
    assert by_patient["meta"]["total"] == 2
    assert (await clinic.get("other_admin", "/api/service-requests")).json()["data"] == []


async def test_service_requests_are_refused_to_the_wrong_people(clinic: Clinic):
    assert refusal(await order(clinic, who="billing")) == (403, "FORBIDDEN")
    assert refusal(await order(clinic, who="other_admin")) == (403, "FORBIDDEN")
    assert refusal(await order(clinic, patient_id="nobody")) == (404, "NOT_FOUND")
    bad = await order(clinic, category="astrology")
    assert refusal(bad) == (422, "VALIDATION_ERROR") and bad.json()["error"]["field"] == \
        "category"


async def smear_result(clinic: Clinic) -> str:
    created = await clinic.client.post("/fhir/Observation", headers={**clinic.h("lab"), **FHIR},
                                       json={"resourceType": "Observation", "status": "final",
                                             "code": {"coding": [{"system": "http://loinc.org",
                                                                  "code": "32700-7"}]},
                                             "subject": {"reference":
                                                         f"Patient/{clinic.patient_id}"},
                                             "valueString": "P. falciparum seen"})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


async def report(clinic: Clinic, who: str = "lab", **extra: Any) -> Any:
    return await clinic.post(who, "/api/diagnostic-reports", {
        "patient_id": clinic.patient_id, "code": MALARIA_SMEAR, "category": "laboratory",
        "conclusion": "Plasmodium falciparum seen, 2% parasitaemia",
        "conclusion_codes": ["61462000"], **extra})


async def test_a_report_is_written_then_signed_once_by_a_clinician(clinic: Clinic):
    observation = await smear_result(clinic)
    request = (await order(clinic)).json()["data"]
    written = await report(clinic, result_ids=[observation], service_request_ids=[request["id"]])
    assert written.status_code == 201, written.text
    data = written.json()["data"]
    assert data["status"] == "preliminary" and data["result_ids"] == [observation]
    assert data["service_request_ids"] == [request["id"]]
    sign = f"/api/diagnostic-reports/{data['id']}/sign"
    for who in ("nurse", "admin", "platform_admin"):
        assert refusal(await clinic.post(who, sign)) == (403, "FORBIDDEN"), who
    signed = await clinic.post("doctor", sign)
    assert signed.status_code == 200, signed.text
    assert signed.json()["data"]["status"] == "final"
    assert signed.json()["data"]["signed_by"][0]["user_id"] == clinic.user_id("doctor")
    assert signed.json()["data"]["issued_at"] is not None
    assert refusal(await clinic.post("lab", sign)) == (409, "INVALID_TRANSITION")
    listed = (await clinic.get("doctor", "/api/diagnostic-reports",
                               service_request_id=request["id"])).json()
    assert [r["status"] for r in listed["data"]] == ["final"]


async def test_reports_refer_only_to_the_patients_own_records(clinic: Clinic):
    wrong = await report(clinic, result_ids=["no-such-observation"])
    assert refusal(wrong) == (422, "VALIDATION_ERROR")
    assert wrong.json()["error"]["field"] == "result_ids"
    assert refusal(await report(clinic, who="billing")) == (403, "FORBIDDEN")
    assert refusal(await report(clinic, conclusion_codes=["malaria"])) == (422,
                                                                           "VALIDATION_ERROR")


async def test_an_imaging_study_is_registered_and_made_available(clinic: Clinic):
    request = (await order(clinic, category="imaging", code={"display": "Chest X-ray"})
               ).json()["data"]
    created = await clinic.post("doctor", "/api/imaging-studies", {
        "patient_id": clinic.patient_id, "modality": "CR", "description": "Chest X-ray PA",
        "service_request_id": request["id"], "number_of_series": 1, "number_of_instances": 2,
        "study_uid": "1.2.840.113619.2.55.3.604688119"})
    assert created.status_code == 201, created.text
    study = created.json()["data"]
    assert study["status"] == "registered" and study["modality"] == "CR"
    fhir = (await clinic.get("doctor", f"/fhir/ImagingStudy/{study['id']}")).json()
    assert fhir["identifier"][0] == {"system": "urn:dicom:uid",
                                     "value": "urn:oid:1.2.840.113619.2.55.3.604688119"}
    url = f"/api/imaging-studies/{study['id']}/status"
    available = await clinic.client.put(url, json={"status": "available"},
                                        headers=clinic.h("nurse"))
    assert available.json()["data"]["status"] == "available"
    assert refusal(await clinic.client.put(url, json={"status": "registered"},
                                           headers=clinic.h("nurse"))) == (
        409, "INVALID_TRANSITION")
    listed = (await clinic.get("doctor", "/api/imaging-studies",
                               service_request_id=request["id"])).json()
    assert [s["id"] for s in listed["data"]] == [study["id"]]
    assert (await clinic.get("doctor", "/api/imaging-studies", status="cancelled")).json()[
        "data"] == []
    assert refusal(await clinic.post("doctor", "/api/imaging-studies", {
        "patient_id": clinic.patient_id, "modality": "XRAY", "description": "x"})) == (
        422, "VALIDATION_ERROR")
    assert refusal(await clinic.post("billing", "/api/imaging-studies", {
        "patient_id": clinic.patient_id, "modality": "US", "description": "Obstetric scan"})
                   ) == (403, "FORBIDDEN")

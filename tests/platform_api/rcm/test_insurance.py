"""The insurance marketplace: plans (InsurancePlan) an insurer publishes, enrolment (a
Coverage once the eligibility rules are met) and the caller's policies."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import make_clinic_admin, register_and_login
from tests.platform_api.clinic import Clinic, refusal
from tests.platform_api.rcm.conftest import data

ELIGIBILITY = "urn:healthplatform:insurance-plan-eligibility"


def plan_body(insurer_id: str, name: str = "Afya Bora Family", **extra: Any) -> dict[str, Any]:
    return {
        "resourceType": "InsurancePlan", "status": "active", "name": name,
        "type": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/"
                              "insurance-plan-type", "code": "medical"}]}],
        "period": {"start": "2026-01-01", "end": "2027-12-31"},
        "ownedBy": {"reference": f"Organization/{insurer_id}", "display": "Jubilee Insurance"},
        "coverageArea": [{"display": "Kenya"}],
        "network": [{"display": "Jubilee Kenya hospital network"}],
        "coverage": [{"type": {"text": "Outpatient"}, "benefit": [
            {"type": {"text": "Consultations"},
             "limit": [{"value": {"value": 12, "unit": "visits"}}]}]}],
        "plan": [{"type": {"coding": [{"code": "individual"}]},
                  "generalCost": [{"cost": {"value": 2500, "currency": "KES"}}]},
                 {"type": {"coding": [{"code": "family"}]},
                  "generalCost": [{"cost": {"value": 6800.5, "currency": "KES"}}]}],
        "extension": [{"url": ELIGIBILITY, "extension": [
            {"url": "minAge", "valueUnsignedInt": 18}, {"url": "maxAge", "valueUnsignedInt": 65},
            {"url": "country", "valueCode": "KE"}]}],
        **extra}


async def publish(clinic: Clinic, **extra: Any) -> tuple[str, str]:
    insurer = await make_clinic_admin(clinic.client, name="Jubilee Insurance",
                                      first_name="Grace", last_name="Wambui")
    clinic.people["insurer"] = insurer
    plan = await clinic.post("insurer", "/fhir/InsurancePlan",
                             plan_body(insurer["org_id"], **extra))
    assert plan.status_code == 201, plan.text
    return insurer["org_id"], str(plan.json()["id"])


async def member(clinic: Clinic, born: str = "1990-05-05", country: str | None = "KE"
                 ) -> str:
    person = await register_and_login(clinic.client, first_name="Wanjiru", last_name="Kamau")
    clinic.people["member"] = person
    # The address through /api alone: what enrolment reads (Patient.address.country).
    address = {"address": {"line": ["Kenyatta Avenue 4"], "city": "Nakuru",
                           "district": "Nakuru East", "country": country}} if country else {}
    created = data(await clinic.post("member", "/api/patients", {
        "first_name": "Wanjiru", "last_name": "Kamau", "date_of_birth": born,
        "gender": "female", **address}), 201)
    return str(created["id"])


async def test_plans_show_benefits_premiums_networks_and_rules(clinic: Clinic):
    insurer_id, plan_id = await publish(clinic)
    retired = await clinic.post("insurer", "/fhir/InsurancePlan",
                                plan_body(insurer_id, name="Old plan", status="retired"))
    assert retired.status_code == 201
    listed = await clinic.get("stranger", "/api/rcm/marketplace/plans")
    [plan] = listed.json()["data"]
    assert listed.json()["meta"]["total"] == 1
    assert plan["id"] == plan_id and plan["insurer_id"] == insurer_id
    assert plan["options"] == [
        {"type": "individual", "premium": "2500.00", "currency": "KES"},
        {"type": "family", "premium": "6800.50", "currency": "KES"}]
    assert plan["benefits"] == [{"coverage": "Outpatient", "benefit": "Consultations",
                                 "limit": "12 visits"}]
    assert plan["networks"] == ["Jubilee Kenya hospital network"]
    assert plan["eligibility"] == {"min_age": 18, "max_age": 65, "countries": ["KE"]}
    assert data(await clinic.get("billing", "/api/rcm/marketplace/plans",
                                 type="dental")) == []


async def test_a_patient_enrols_themselves_and_sees_their_policy(clinic: Clinic):
    events = clinic.recorded("platform.rcm.coverage_enrolled")
    insurer_id, plan_id = await publish(clinic)
    patient_id = await member(clinic)
    policy = data(await clinic.post("member", "/api/rcm/marketplace/enroll", {
        "plan_id": plan_id, "option": "family", "start": "2026-12-01"}), 201)
    assert policy["patient_id"] == patient_id and policy["plan_id"] == plan_id
    assert (policy["premium"], policy["option"], policy["status"]) == ("6800.50", "family",
                                                                       "active")
    assert policy["start"] == "2026-12-01" and policy["end"] == "2027-12-31"
    assert policy["member_number"].startswith("M-")
    mine = await clinic.get("member", "/api/rcm/marketplace/policies")
    assert [p["id"] for p in mine.json()["data"]] == [policy["id"]]
    # the insurer administers it; the clinic does not see it
    coverage = (await clinic.get("insurer", f"/fhir/Coverage/{policy['id']}")).json()
    assert coverage["payor"][0]["reference"] == f"Organization/{insurer_id}"
    assert data(await clinic.get("billing", "/api/rcm/marketplace/policies")) == []
    again = await clinic.post("member", "/api/rcm/marketplace/enroll", {"plan_id": plan_id})
    assert refusal(again) == (409, "ALREADY_ENROLLED")
    await clinic.drain()
    assert [e["payload"]["id"] for e in events] == [policy["id"]]


async def test_eligibility_rules_refuse_with_the_rule_named(clinic: Clinic):
    _insurer, plan_id = await publish(clinic)

    async def enroll(who: str, **body: Any) -> httpx.Response:
        return await clinic.post(who, "/api/rcm/marketplace/enroll", {"plan_id": plan_id,
                                                                      **body})
    await member(clinic, born="1950-01-01")
    too_old = await enroll("member")
    assert refusal(too_old) == (422, "NOT_ELIGIBLE")
    assert too_old.json()["error"]["message"].startswith("age:")
    await member(clinic, country="UG")
    assert "country:" in (await enroll("member")).json()["error"]["message"]
    await member(clinic, country=None)
    assert "address country is needed" in (await enroll("member")).json()["error"]["message"]
    await member(clinic)
    late = await enroll("member", start="2028-02-01")
    assert refusal(late) == (422, "NOT_ELIGIBLE") and late.json()["error"]["field"] == "start"
    assert (await enroll("member", option="platinum")).json()["error"]["field"] == "option"
    unknown = await clinic.post("member", "/api/rcm/marketplace/enroll",
                                {"plan_id": "0190a1b2-0000-7000-8000-000000000000"})
    assert refusal(unknown) == (404, "NOT_FOUND")
    nobody = await clinic.post("stranger", "/api/rcm/marketplace/enroll", {"plan_id": plan_id})
    assert refusal(nobody) == (422, "VALIDATION_ERROR")


async def test_staff_enrol_a_patient_they_see(clinic: Clinic):
    _insurer, plan_id = await publish(clinic)
    patient = (await clinic.get("admin", f"/fhir/Patient/{clinic.patient_id}")).json()
    patient["address"] = [{"country": "KE"}]
    assert (await clinic.client.put(f"/fhir/Patient/{clinic.patient_id}", json=patient,
                                    headers=clinic.h("admin"))).status_code == 200
    body = {"plan_id": plan_id, "patient_id": clinic.patient_id,
            "organization_id": clinic.org_id}
    assert refusal(await clinic.post("nurse", "/api/rcm/marketplace/enroll", body)) == (
        403, "FORBIDDEN")
    assert refusal(await clinic.post("other_admin", "/api/rcm/marketplace/enroll", body)
                   )[0] == 403
    unnamed = await clinic.post("billing", "/api/rcm/marketplace/enroll",
                                {**body, "organization_id": None})
    assert unnamed.json()["error"]["field"] == "organization_id"
    policy = data(await clinic.post("billing", "/api/rcm/marketplace/enroll", body), 201)
    assert policy["option"] == "individual" and policy["premium"] == "2500.00"
    theirs = await clinic.get("receptionist", "/api/rcm/marketplace/policies",
                              patient_id=clinic.patient_id)
    assert [p["id"] for p in theirs.json()["data"]] == [policy["id"]]
    assert refusal(await clinic.get("other_admin", "/api/rcm/marketplace/policies",
                                    patient_id=clinic.patient_id))[0] == 403

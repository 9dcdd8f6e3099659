"""Consent: a patient grants, a clinician requests, the patient approves or revokes; access
to the patient's record through /api follows it from the next request."""

from __future__ import annotations

from tests.conftest import make_admin, register_and_login

FHIR = {"Content-Type": "application/fhir+json"}


async def vitals_of_patient(clinic, who):
    return await clinic.client.get(f"/api/vitals?patient_id={clinic.patient_id}",
                                   headers=who["headers"])


async def test_a_grant_opens_the_record_and_a_revocation_closes_it_at_once(clinic):
    await clinic.client.post("/api/vitals", json={"patient_id": clinic.patient_id,
                                                  "heart_rate": 80},
                             headers=clinic.nurse["headers"])
    assert (await vitals_of_patient(clinic, clinic.outsider)).status_code == 403
    granted = await clinic.client.post("/api/consent/grant", json={
        "grantee_type": "organization", "grantee_id": clinic.outsider_org_id,
        "purpose": "treatment", "note": "Second opinion"}, headers=clinic.patient["headers"])
    assert granted.status_code == 201, granted.text
    consent = granted.json()["data"]
    assert (consent["status"], consent["grantee_name"], consent["purpose"]) == (
        "active", "Mathare North Health Centre", "treatment")
    opened = await vitals_of_patient(clinic, clinic.outsider)
    assert opened.status_code == 200 and opened.json()["meta"]["total"] == 1
    fhir = (await clinic.fhir(f"Consent/{consent['id']}")).json()
    assert fhir["provision"]["actor"][0]["reference"]["reference"] == \
        f"Organization/{clinic.outsider_org_id}"
    assert fhir["provision"]["type"] == "permit"
    assert fhir["category"][0]["coding"][0]["code"] == "59284-0"
    again = await clinic.client.post("/api/consent/grant", json={
        "grantee_type": "organization", "grantee_id": clinic.outsider_org_id},
        headers=clinic.patient["headers"])
    assert again.status_code == 409 and again.json()["error"]["code"] == "CONSENT_EXISTS"
    revoked = await clinic.client.post(f"/api/consent/{consent['id']}/revoke",
                                       headers=clinic.patient["headers"])
    assert revoked.status_code == 200 and revoked.json()["data"]["status"] == "inactive"
    # The very next request is refused.
    assert (await vitals_of_patient(clinic, clinic.outsider)).status_code == 403
    twice = await clinic.client.post(f"/api/consent/{consent['id']}/revoke",
                                     headers=clinic.patient["headers"])
    assert twice.status_code == 409 and twice.json()["error"]["code"] == "INVALID_TRANSITION"
    events = await clinic.events("platform.consent.granted")
    assert [(e["consent_id"], e["status"]) for e in events] == [(consent["id"], "active")]
    assert [e["status"] for e in await clinic.events("platform.consent.revoked")] == [
        "inactive"]


async def test_a_clinician_requests_and_the_patient_approves(clinic):
    asked = await clinic.client.post("/api/consent/request", json={
        "patient_id": clinic.patient_id, "note": "Referral for a cardiology review"},
        headers=clinic.outsider["headers"])
    assert asked.status_code == 201, asked.text
    request = asked.json()["data"]
    assert (request["status"], request["requested_by"], request["grantee_id"]) == (
        "proposed", clinic.outsider["user"]["id"], clinic.outsider_org_id)
    # A request opens nothing yet; the requester follows it.
    assert (await vitals_of_patient(clinic, clinic.outsider)).status_code == 403
    theirs = (await clinic.client.get("/api/consent", headers=clinic.outsider["headers"])
              ).json()
    assert [c["id"] for c in theirs["data"]] == [request["id"]]
    # The patient sees it among their consents and approves it.
    mine = (await clinic.client.get("/api/consent", headers=clinic.patient["headers"])).json()
    assert [c["id"] for c in mine["data"]] == [request["id"]]
    url = f"/api/consent/{request['id']}"
    assert (await clinic.client.post(f"{url}/approve", headers=clinic.outsider["headers"])
            ).status_code == 403
    approved = await clinic.client.post(f"{url}/approve", headers=clinic.patient["headers"])
    assert approved.status_code == 200, approved.text
    assert approved.json()["data"]["status"] == "active"
    assert approved.json()["data"]["granted_at"] is not None
    assert (await vitals_of_patient(clinic, clinic.outsider)).status_code == 200
    again = await clinic.client.post("/api/consent/request", json={
        "patient_id": clinic.patient_id}, headers=clinic.outsider["headers"])
    assert again.status_code == 409 and again.json()["error"]["code"] == "CONSENT_EXISTS"
    assert [e["status"] for e in await clinic.events("platform.consent.requested")] == [
        "proposed"]


async def test_a_declined_request_is_rejected(clinic):
    asked = (await clinic.client.post("/api/consent/request", json={
        "patient_id": clinic.patient_id}, headers=clinic.outsider["headers"])).json()["data"]
    declined = await clinic.client.post(f"/api/consent/{asked['id']}/revoke",
                                        headers=clinic.patient["headers"])
    assert declined.json()["data"]["status"] == "rejected"
    late = await clinic.client.post(f"/api/consent/{asked['id']}/approve",
                                    headers=clinic.patient["headers"])
    assert late.status_code == 409 and late.json()["error"]["code"] == "INVALID_TRANSITION"


async def test_a_practitioner_granted_consent_may_read(app, clinic):
    admin = await make_admin(app, clinic.client)
    practitioner = await clinic.client.post("/fhir/Practitioner", json={
        "resourceType": "Practitioner", "name": [{"family": "Okafor", "given": ["Chidi"]}],
        "identifier": [{"system": "urn:healthplatform:user",
                        "value": clinic.outsider["user"]["id"]}]},
        headers={**admin["headers"], **FHIR})
    assert practitioner.status_code == 201, practitioner.text
    granted = await clinic.client.post("/api/consent/grant", json={
        "grantee_type": "practitioner", "grantee_id": practitioner.json()["id"]},
        headers=clinic.patient["headers"])
    assert granted.status_code == 201 and granted.json()["data"]["grantee_name"] == \
        "Chidi Okafor"
    assert (await vitals_of_patient(clinic, clinic.outsider)).status_code == 200


async def test_who_may_grant_request_and_decide(clinic):
    stranger = await register_and_login(clinic.client, first_name="Kwame", last_name="Mensah")
    no_profile = await clinic.client.post("/api/consent/grant", json={
        "grantee_type": "organization", "grantee_id": clinic.outsider_org_id},
        headers=stranger["headers"])
    assert no_profile.status_code == 404
    unknown = await clinic.client.post("/api/consent/grant", json={
        "grantee_type": "organization", "grantee_id": "no-such-org"},
        headers=clinic.patient["headers"])
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "grantee_id"
    bad_type = await clinic.client.post("/api/consent/grant", json={
        "grantee_type": "neighbour", "grantee_id": clinic.outsider_org_id},
        headers=clinic.patient["headers"])
    assert bad_type.status_code == 422 and bad_type.json()["error"]["field"] == "grantee_type"
    # A nurse may not ask on the clinic's behalf; a user of no organization cannot ask.
    assert (await clinic.client.post("/api/consent/request", json={
        "patient_id": clinic.patient_id}, headers=clinic.nurse["headers"])).status_code == 422
    assert (await clinic.client.post("/api/consent/request", json={
        "patient_id": clinic.patient_id, "organization_id": clinic.org_id},
        headers=clinic.nurse["headers"])).status_code == 403
    assert (await clinic.client.post("/api/consent/request", json={
        "patient_id": "no-such-patient"}, headers=clinic.outsider["headers"])).status_code == 404
    asked = (await clinic.client.post("/api/consent/request", json={
        "patient_id": clinic.patient_id}, headers=clinic.outsider["headers"])).json()["data"]
    # Someone else can neither read nor decide it.
    url = f"/api/consent/{asked['id']}"
    assert (await clinic.client.get(url, headers=stranger["headers"])).status_code == 403
    assert (await clinic.client.post(f"{url}/approve", headers=stranger["headers"])
            ).status_code == 403
    assert (await clinic.client.get(url, headers=clinic.patient["headers"])).status_code == 200
    assert (await clinic.client.get("/api/consent/unknown", headers=clinic.patient[
        "headers"])).status_code == 404

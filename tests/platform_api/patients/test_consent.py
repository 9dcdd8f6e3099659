"""Consent: a patient grants, a clinician requests, the patient approves or revokes; access
to the patient's record through /api follows it from the next request."""

from __future__ import annotations

import pytest

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
    assert (request["status"], request["requested_by"], request["grantee_id"],
            request["grantee_name"]) == ("proposed", clinic.outsider["user"]["id"],
                                         clinic.outsider_org_id, "Mathare North Health Centre")
    # A request opens nothing yet; the requester follows it.
    assert (await vitals_of_patient(clinic, clinic.outsider)).status_code == 403
    theirs = (await clinic.client.get("/api/consent", headers=clinic.outsider["headers"])
              ).json()
    assert [c["id"] for c in theirs["data"]] == [request["id"]]
    # The patient sees it among their consents and approves it.
    mine = (await clinic.client.get("/api/consent", headers=clinic.patient["headers"])).json()
    assert [(c["id"], c["status"]) for c in mine["data"]] == [(request["id"], "proposed")]
    url = f"/api/consent/{request['id']}"
    assert (await clinic.client.post(f"{url}/approve", headers=clinic.outsider["headers"])
            ).status_code == 403
    approved = await clinic.client.post(f"{url}/approve", headers=clinic.patient["headers"])
    assert approved.status_code == 200, approved.text
    consent = approved.json()["data"]
    assert (consent["id"], consent["status"], consent["requested_by"], consent["note"]) == (
        request["id"], "active", clinic.outsider["user"]["id"],
        "Referral for a cardiology review")
    assert consent["granted_at"] is not None
    assert (await vitals_of_patient(clinic, clinic.outsider)).status_code == 200
    # The request became the Consent (one item, the same id), now active.
    theirs = (await clinic.client.get("/api/consent", headers=clinic.outsider["headers"])
              ).json()
    assert [(c["id"], c["status"]) for c in theirs["data"]] == [(request["id"], "active")]
    again = await clinic.client.post("/api/consent/request", json={
        "patient_id": clinic.patient_id}, headers=clinic.outsider["headers"])
    assert again.status_code == 409 and again.json()["error"]["code"] == "CONSENT_EXISTS"
    assert [e["status"] for e in await clinic.events("platform.consent.requested")] == [
        "proposed"]
    assert [(e["consent_id"], e["status"], e["by"]) for e in await clinic.events(
        "platform.consent.granted")] == [(request["id"], "active", clinic.patient["user"]["id"])]


async def test_a_declined_request_is_rejected_and_may_be_asked_again(clinic):
    asked = (await clinic.client.post("/api/consent/request", json={
        "patient_id": clinic.patient_id}, headers=clinic.outsider["headers"])).json()["data"]
    twice = await clinic.client.post("/api/consent/request", json={
        "patient_id": clinic.patient_id}, headers=clinic.outsider["headers"])
    assert twice.status_code == 409 and twice.json()["error"]["code"] == "CONSENT_EXISTS"
    declined = await clinic.client.post(f"/api/consent/{asked['id']}/revoke",
                                        headers=clinic.patient["headers"])
    assert declined.json()["data"]["status"] == "rejected"
    late = await clinic.client.post(f"/api/consent/{asked['id']}/approve",
                                    headers=clinic.patient["headers"])
    assert late.status_code == 409 and late.json()["error"]["code"] == "INVALID_TRANSITION"
    # The clinic learns the answer, and may ask again.
    seen = (await clinic.client.get(f"/api/consent/{asked['id']}",
                                    headers=clinic.outsider["headers"])).json()["data"]
    assert seen["status"] == "rejected"
    anew = await clinic.client.post("/api/consent/request", json={
        "patient_id": clinic.patient_id}, headers=clinic.outsider["headers"])
    assert anew.status_code == 201 and anew.json()["data"]["id"] != asked["id"]
    declines = await clinic.client.get("/api/consent?status=rejected",
                                       headers=clinic.outsider["headers"])
    assert [c["id"] for c in declines.json()["data"]] == [asked["id"]]
    assert [e["status"] for e in await clinic.events("platform.consent.revoked")] == [
        "rejected"]


async def test_a_consent_request_names_only_what_the_asker_may_see(clinic):
    """Issue 31, result 3: asking for consent neither discloses another clinic's patient
    (the answer and the asker's list never carry their name; an unknown patient id gets
    the same answer) nor writes anything in that clinic's record before the patient acts;
    once the patient accepts, the asker sees them and the Consent is in the record."""
    name = ("Amina", "Odhiambo")
    asked = await clinic.client.post("/api/consent/request", json={
        "patient_id": clinic.patient_id}, headers=clinic.outsider["headers"])
    unknown = await clinic.client.post("/api/consent/request", json={
        "patient_id": "no-such-patient"}, headers=clinic.outsider["headers"])
    assert (asked.status_code, unknown.status_code) == (201, 201)
    request, stray = asked.json()["data"], unknown.json()["data"]
    assert not any(part in asked.text for part in name)
    assert request["patient_name"] is None

    def shape(view):
        return {k: v for k, v in view.items()
                if k not in ("id", "patient_id", "updated_at")}
    assert shape(request) == shape(stray)  # nothing tells the two apart
    listed = await clinic.client.get("/api/consent", headers=clinic.outsider["headers"])
    assert listed.json()["meta"]["total"] == 2
    assert not any(part in listed.text for part in name)
    one = await clinic.client.get(f"/api/consent/{request['id']}",
                                  headers=clinic.outsider["headers"])
    assert one.status_code == 200 and not any(part in one.text for part in name)
    # Nothing in the clinic's record: no Consent, and the request is not the clinic's.
    record = (await clinic.fhir(f"Consent?patient=Patient/{clinic.patient_id}")).json()
    assert record["total"] == 0
    clinics = await clinic.client.get(f"/api/consent?patient_id={clinic.patient_id}",
                                      headers=clinic.admin["headers"])
    assert clinics.status_code == 200 and clinics.json()["meta"]["total"] == 0
    assert (await clinic.client.get(f"/api/consent/{request['id']}",
                                    headers=clinic.doctor["headers"])).status_code == 403
    # The patient acts: now the asker sees the patient, and the record holds the Consent.
    accepted = await clinic.client.post(f"/api/consent/{request['id']}/approve",
                                        headers=clinic.patient["headers"])
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["data"]["patient_name"] == "Amina Odhiambo"
    record = (await clinic.fhir(f"Consent?patient=Patient/{clinic.patient_id}")).json()
    assert [e["resource"]["id"] for e in record["entry"]] == [request["id"]]
    patient = await clinic.client.get(f"/api/patients/{clinic.patient_id}",
                                      headers=clinic.outsider["headers"])
    assert patient.status_code == 200
    # The unknown id's request stays the asker's own, and nobody can accept it.
    assert (await clinic.client.post(f"/api/consent/{stray['id']}/approve",
                                     headers=clinic.patient["headers"])).status_code == 403


@pytest.mark.parametrize(("who", "status"), [
    ("admin", 201), ("doctor", 201), ("receptionist", 201), ("nurse", 403),
    ("patient", 403)])
async def test_who_may_ask_for_consent(clinic, who, status):
    """``consent.request``: the roles that may create a Consent, for their organization."""
    asked = await clinic.client.post("/api/consent/request", json={
        "patient_id": "a-patient-elsewhere", "organization_id": clinic.org_id},
        headers=getattr(clinic, who)["headers"])
    assert asked.status_code == status, asked.text
    if status == 403:
        assert asked.json()["error"]["code"] == "FORBIDDEN"


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


async def test_a_request_for_no_real_patient_is_nobodys(clinic):
    """A user without a patient profile lists no requests, whatever id a clinic typed."""
    stranger = await register_and_login(clinic.client, first_name="Kwame", last_name="Mensah")
    for patient_id in ("none", "no-such-patient"):
        asked = await clinic.client.post("/api/consent/request", json={
            "patient_id": patient_id}, headers=clinic.outsider["headers"])
        assert asked.status_code == 201
    theirs = await clinic.client.get("/api/consent?role=patient",
                                     headers=stranger["headers"])
    assert theirs.status_code == 200 and theirs.json()["meta"]["total"] == 0
    asker = await clinic.client.get("/api/consent", headers=clinic.outsider["headers"])
    assert asker.json()["meta"]["total"] == 2

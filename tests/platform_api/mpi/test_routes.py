"""The master patient index routes: matching by demographics, candidates and their review,
links by hand and undone, the golden record, and who may use them."""

from __future__ import annotations

from dataclasses import replace

from tests.hl7_gateway.messages import adt
from tests.platform_api.area_operations import (
    assert_credentials_needed,
    assert_served_and_documented,
)
from tests.platform_api.clinic import Clinic, refusal
from tests.platform_api.mpi.conftest import data, fhir_patient, register

ADMIN = "platform_admin"
AREA = "Master patient index (platform administrators only)"


async def test_every_operation_of_the_area_is_served_and_documented(client):
    await assert_served_and_documented(client, AREA, 10)


async def test_every_route_of_the_area_needs_credentials(client):
    assert await assert_credentials_needed(client, AREA) == []


async def test_only_platform_administrators_may_use_the_index(clinic: Clinic, app):
    await app.state.services.auth.set_roles(clinic.user_id("nurse"), ["APP:ADMIN"])
    login = await clinic.client.post("/api/auth/login", json={
        "email": clinic.people["nurse"]["user"]["email"], "password": "correct horse battery"})
    app_admin = {"Authorization": f"Bearer {login.json()['data']['token']}"}
    body = {"first_name": "Amina", "last_name": "Odhiambo"}
    for who in ("admin", "doctor", "receptionist", "stranger"):  # ORG:ADMIN too
        assert refusal(await clinic.post(who, "/api/mpi/match", body)) == (403, "FORBIDDEN")
        assert refusal(await clinic.get(who, "/api/mpi/candidates")) == (403, "FORBIDDEN")
    assert (await clinic.post(ADMIN, "/api/mpi/match", body)).status_code == 200
    response = await clinic.client.post("/api/mpi/match", json=body, headers=app_admin)
    assert response.status_code == 200, response.text


async def test_match_ranks_candidates_with_score_grade_and_fields(clinic: Clinic):
    # Amina Odhiambo 1988-04-12 (the clinic's patient), and someone else born the same day
    await register(clinic, first_name="Baraka", last_name="Mwangi", date_of_birth="1988-04-12",
                   gender="male")
    found = data(await clinic.post(ADMIN, "/api/mpi/match", {
        "first_name": "Aminah", "last_name": "Odhiambo", "date_of_birth": "1988-04-12",
        "gender": "female"}))["candidates"]
    assert found[0]["patient_id"] == clinic.patient_id
    assert found[0]["grade"] in ("certain", "probable")
    assert {"family", "birth_date", "sex"} <= set(found[0]["agreed"])
    # Aminah / Amina agree in part, and say so
    assert found[0]["partial"] == ["given"] and found[0]["levels"]["given"] == "close"
    assert all(c["patient_id"] != clinic.patient_id for c in found[1:])
    assert all(c["score"] < found[0]["score"] for c in found[1:])


async def test_match_finds_swapped_names_and_transposed_birth_dates(clinic: Clinic):
    found = data(await clinic.post(ADMIN, "/api/mpi/match", {
        "first_name": "Odhiambo", "last_name": "Amina", "date_of_birth": "1988-12-04",
        "gender": "female"}))["candidates"]
    assert found and found[0]["patient_id"] == clinic.patient_id
    assert found[0]["names_swapped"] is True


async def test_a_disagreeing_national_id_counts_strongly_against(clinic: Clinic, app):
    app.state.services.settings.mpi_national_id_systems.append("urn:oid:2.16.404.1.1")
    nid = {"system": "urn:oid:2.16.404.1.1", "value": "29384756"}
    pid = await fhir_patient(clinic, {"name": [{"family": "Kiprop", "given": ["Daniel"]}],
                                      "birthDate": "1979-03-02", "gender": "male",
                                      "identifier": [nid]})
    same = data(await clinic.post(ADMIN, "/api/mpi/match", {
        "first_name": "Dan", "last_name": "Kiprop", "national_id": "29384756"}))["candidates"]
    assert same[0]["patient_id"] == pid and same[0]["grade"] == "certain"
    other = data(await clinic.post(ADMIN, "/api/mpi/match", {
        "first_name": "Daniel", "last_name": "Kiprop", "date_of_birth": "1979-03-02",
        "gender": "male", "national_id": "55501234"}))["candidates"]
    assert all(c["patient_id"] != pid for c in other)  # below "possible"


async def test_match_without_anything_to_match_is_422(clinic: Clinic):
    response = await clinic.post(ADMIN, "/api/mpi/match", {"gender": "female"})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    response = await clinic.post(ADMIN, "/api/mpi/match", {"last_name": "X", "limit": 0})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"] == "limit"


async def test_a_certain_duplicate_is_linked_in_the_background(clinic: Clinic):
    linked = clinic.recorded("platform.mpi.patients_linked")
    # the same woman registered again at Kibera, with a phone the first record lacks
    twin = await register(clinic, first_name="Amina", last_name="Odhiambo",
                          date_of_birth="1988-04-12", gender="female", phone="+254712345678")
    await clinic.drain()
    assert len(linked) == 1
    payload = linked[0]["payload"]
    assert (payload["golden_id"], payload["other_id"]) == (clinic.patient_id, twin)
    assert payload["source"] == "automatic" and payload["grade"] == "certain"
    record = data(await clinic.get(ADMIN, f"/api/mpi/patients/{twin}/fhir"))
    assert record["id"] == clinic.patient_id
    assert record["link"] == [{"other": {"reference": f"Patient/{twin}"}, "type": "replaces"}]
    merged = (await clinic.client.get(f"/fhir/Patient/{twin}", headers=clinic.h(ADMIN))).json()
    assert merged["link"] == [{"other": {"reference": f"Patient/{clinic.patient_id}"},
                               "type": "replaced-by"}]
    assert merged["telecom"][0]["value"] == "+254712345678"  # the record itself is whole
    assert merged["active"] is False  # merged away: not in use (as an HL7 A40 leaves it)
    audit = (await clinic.client.get("/fhir/AuditEvent", params={"entity": f"Patient/{twin}"},
                                     headers=clinic.h(ADMIN))).json()
    assert [e["resource"]["subtype"][0]["code"] for e in audit["entry"]
            if e["resource"]["subtype"][0]["system"] == "urn:healthplatform:mpi"] == ["link"]
    shown = data(await clinic.get(ADMIN, f"/api/mpi/matches/{payload['id']}"))
    assert shown["decided_by"] == "mpi-matcher" and shown["score"] >= 0.99
    assert "birth_date" in shown["agreed"]


async def test_review_accepts_a_candidate_into_a_link_and_remembers_a_rejection(
        clinic: Clinic, app):
    reviewed = clinic.recorded("platform.mpi.candidate_reviewed")
    # same names at another clinic, a birth date one keystroke off (day digits swapped,
    # the month): certain, but across organizations a candidate for review
    cousin = await register(clinic, "other_admin", first_name="Amina", last_name="Odhiambo",
                            date_of_birth="1988-04-21", gender="female")
    namesake = await register(clinic, "other_admin", first_name="Amina",
                              last_name="Odhiambo", date_of_birth="1988-05-12",
                              gender="female")
    await clinic.drain()
    candidates = {c["other_id"]: c for c in data(await clinic.get(ADMIN, "/api/mpi/candidates"))}
    assert {cousin, namesake} <= set(candidates)
    assert all(c["hold"] == "different organizations" for c in candidates.values())
    assert candidates[cousin]["levels"]["birth_date"] == "typo"
    accept = candidates[cousin]
    done = data(await clinic.client.patch(f"/api/mpi/links/{accept['id']}/review", json={
        "decision": "accept", "reason": "same mother's name"}, headers=clinic.h(ADMIN)))
    assert done["status"] == "linked" and done["decided_by"] == clinic.user_id(ADMIN)
    links = data(await clinic.get(ADMIN, f"/api/mpi/links/{cousin}"))
    assert links["golden_id"] == accept["golden_id"] == clinic.patient_id
    assert links["links"][0]["status"] == "linked"
    again = await clinic.client.patch(f"/api/mpi/links/{accept['id']}/review",
                                      json={"decision": "reject"}, headers=clinic.h(ADMIN))
    assert refusal(again) == (409, "NOT_A_CANDIDATE")
    rejected = data(await clinic.client.patch(
        f"/api/mpi/links/{candidates[namesake]['id']}/review", json={"decision": "reject"},
        headers=clinic.h(ADMIN)))
    assert rejected["status"] == "rejected"
    await clinic.drain()
    assert [e["payload"]["status"] for e in reviewed] == ["rejected"]
    # compared again (as after a change), the rejected pair is not proposed again
    await app.state.services.extras["mpi"].compare(namesake)
    assert data(await clinic.get(ADMIN, "/api/mpi/candidates")) == []
    shown = data(await clinic.get(ADMIN, f"/api/mpi/matches/{candidates[namesake]['id']}"))
    assert shown["status"] == "rejected"
    assert [h["status"] for h in shown["history"]] == ["candidate", "rejected"]


async def test_link_by_hand_and_unlink_make_both_records_whole_again(clinic: Clinic):
    unlinked = clinic.recorded("platform.mpi.patients_unlinked")
    other = await register(clinic, "other_admin", first_name="Kwame", last_name="Mensah",
                           date_of_birth="1975-09-30", gender="male")
    body = {"patient_id": clinic.patient_id, "other_patient_id": other, "reason": "test"}
    made = await clinic.post(ADMIN, "/api/mpi/links", body)
    decision = data(made, 201)
    assert decision["link_type"] == "seealso" and decision["source"] == "manual"
    assert refusal(await clinic.post(ADMIN, "/api/mpi/link", body)) == (409, "ALREADY_LINKED")
    shown = data(await clinic.get(ADMIN, f"/api/mpi/matches/{decision['id']}"))
    assert shown["status"] == "linked" and shown["decided_by"] == clinic.user_id(ADMIN)
    listed = data(await clinic.get(ADMIN, "/api/mpi/matches", patient_id=other))
    assert [m["id"] for m in listed] == [decision["id"]]
    undone = data(await clinic.post(ADMIN, f"/api/mpi/matches/{decision['id']}/unlink",
                                    {"reason": "different people"}))
    assert undone["status"] == "unlinked"
    for pid in (clinic.patient_id, other):
        patient = (await clinic.client.get(f"/fhir/Patient/{pid}", headers=clinic.h(ADMIN))).json()
        assert "link" not in patient
    await clinic.drain()
    assert [e["payload"]["id"] for e in unlinked] == [decision["id"]]
    again = await clinic.post(ADMIN, f"/api/mpi/matches/{decision['id']}/unlink", {})
    assert refusal(again) == (409, "INVALID_TRANSITION")


async def test_links_refuse_unknown_patients_and_self_links(clinic: Clinic):
    unknown = "01a2e0c0-0000-7000-8000-000000000000"
    response = await clinic.post(ADMIN, "/api/mpi/link", {
        "patient_id": clinic.patient_id, "other_patient_id": unknown})
    assert refusal(response) == (404, "NOT_FOUND")
    response = await clinic.post(ADMIN, "/api/mpi/link", {
        "patient_id": clinic.patient_id, "other_patient_id": clinic.patient_id})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert refusal(await clinic.get(ADMIN, f"/api/mpi/matches/{unknown}")) == (404, "NOT_FOUND")
    assert refusal(await clinic.get(ADMIN, f"/api/mpi/links/{unknown}")) == (404, "NOT_FOUND")
    response = await clinic.client.patch(f"/api/mpi/links/{unknown}/review",
                                         json={"decision": "maybe"}, headers=clinic.h(ADMIN))
    assert refusal(response) == (422, "VALIDATION_ERROR")


async def test_patients_from_hl7_and_fhir_updates_are_compared_too(clinic: Clinic, app):
    # the gateway's Patients belong to no clinic: let links cross organizations here
    mpi = app.state.services.extras["mpi"]
    mpi.rules = replace(mpi.rules, across_organizations=True)
    linked = clinic.recorded("platform.mpi.patients_linked")
    registered = await register(clinic, first_name="Grace", last_name="Achieng",
                                date_of_birth="1980-04-12", gender="female")
    await clinic.drain()
    response = await clinic.client.post(
        "/api/lab/hl7-ingest", content=adt("A04", "REG-1"),
        headers={**clinic.h(ADMIN), "Content-Type": "x-application/hl7-v2+er7"})
    assert response.status_code == 200 and response.json()["data"]["ack_code"] == "AA"
    await clinic.drain()
    assert [(e["payload"]["golden_id"], e["payload"]["source"]) for e in linked] == [
        (registered, "automatic")]
    from_hl7 = linked[0]["payload"]["other_id"]
    assert from_hl7 != registered
    # a FHIR update that makes another record agree is compared when it is written
    other = await fhir_patient(clinic, {"name": [{"family": "Mensah", "given": ["Kwame"]}],
                                        "gender": "male"})
    await clinic.drain()
    assert len(linked) == 1
    stored = (await clinic.client.get(f"/fhir/Patient/{other}", headers=clinic.h(ADMIN))).json()
    response = await clinic.client.put(f"/fhir/Patient/{other}", headers=clinic.h(ADMIN), json={
        **stored, "name": [{"family": "Achieng", "given": ["Grace"]}], "gender": "female",
        "birthDate": "1980-04-12"})
    assert response.status_code == 200, response.text
    await clinic.drain()
    assert [e["payload"]["other_id"] for e in linked[1:]] == [other]

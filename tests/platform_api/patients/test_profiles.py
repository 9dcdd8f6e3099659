"""Patients area: /api profiles map to FHIR Patient and back; organization context."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.conftest import register_and_login

PROFILE = {"first_name": "Amina", "last_name": "Odhiambo", "date_of_birth": "1988-04-12",
           "gender": "female", "phone": "+254712345678", "email": "amina@example.org"}


async def test_create_profile_is_readable_through_fhir(client, user):
    response = await client.post("/api/patients", json=PROFILE, headers=user["headers"])
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["success"] is True
    data = body["data"]
    assert {k: data[k] for k in PROFILE} == PROFILE
    fhir = (await client.get(f"/fhir/Patient/{data['id']}", headers=user["headers"])).json()
    assert fhir["name"][0] == {"use": "official", "family": "Odhiambo", "given": ["Amina"]}
    assert fhir["birthDate"] == "1988-04-12" and fhir["gender"] == "female"
    assert {"system": "phone", "value": "+254712345678", "use": "mobile"} in fhir["telecom"]
    assert {"system": "urn:healthplatform:user", "value": user["user"]["id"]} in fhir[
        "identifier"]


async def test_me_and_get_by_id(client, user):
    created = (await client.post("/api/patients", json=PROFILE,
                                 headers=user["headers"])).json()["data"]
    me = await client.get("/api/patients/me", headers=user["headers"])
    assert me.status_code == 200 and me.json()["data"]["id"] == created["id"]
    by_id = await client.get(f"/api/patients/{created['id']}", headers=user["headers"])
    assert by_id.json()["data"]["created_at"] is not None


async def test_second_profile_for_the_same_user_is_409(client, user):
    await client.post("/api/patients", json=PROFILE, headers=user["headers"])
    again = await client.post("/api/patients", json=PROFILE, headers=user["headers"])
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "PROFILE_EXISTS"


async def test_me_without_profile_is_404_envelope(client, user):
    response = await client.get("/api/patients/me", headers=user["headers"])
    assert response.status_code == 404
    assert response.json() == {"success": False, "error": {
        "code": "NOT_FOUND", "message": "Patient profile not found"}}


async def test_validation_error_names_the_field(client, user):
    response = await client.post("/api/patients", json={**PROFILE, "phone": "0712 345678"},
                                 headers=user["headers"])
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR" and error["field"] == "phone"
    missing = await client.post("/api/patients", json={"first_name": "Amina"},
                                headers=user["headers"])
    assert missing.json()["error"]["field"] in {"last_name", "date_of_birth", "gender"}


async def test_update_changes_only_sent_fields_and_keeps_fhir_data(client, user):
    created = (await client.post("/api/patients", json=PROFILE,
                                 headers=user["headers"])).json()["data"]
    # A FHIR client adds data the /api payload does not know about.
    fhir = (await client.get(f"/fhir/Patient/{created['id']}", headers=user["headers"])).json()
    fhir["maritalStatus"] = {"text": "Married"}
    await client.put(f"/fhir/Patient/{created['id']}", json=fhir,
                     headers={**user["headers"], "Content-Type": "application/fhir+json"})
    updated = await client.post(f"/api/patients/{created['id']}",
                                json={"phone": "+254700000001"}, headers=user["headers"])
    assert updated.status_code == 200
    assert updated.json()["data"]["phone"] == "+254700000001"
    assert updated.json()["data"]["last_name"] == "Odhiambo"
    after = (await client.get(f"/fhir/Patient/{created['id']}", headers=user["headers"])).json()
    assert after["maritalStatus"] == {"text": "Married"}
    assert after["meta"]["versionId"] == "3"


async def test_data_written_through_fhir_is_readable_through_api(client, admin):
    fhir = await client.post("/fhir/Patient", json={
        "resourceType": "Patient", "name": [{"family": "Mensah", "given": ["Kwame"]}],
        "gender": "male", "birthDate": "1975-09-30"},
        headers={**admin["headers"], "Content-Type": "application/fhir+json"})
    view = (await client.get(f"/api/patients/{fhir.json()['id']}",
                             headers=admin["headers"])).json()["data"]
    assert (view["first_name"], view["last_name"], view["gender"]) == ("Kwame", "Mensah", "male")


async def test_other_users_cannot_read_a_profile(client, user):
    created = (await client.post("/api/patients", json=PROFILE,
                                 headers=user["headers"])).json()["data"]
    stranger = await register_and_login(client, first_name="Kofi", last_name="Boateng")
    response = await client.get(f"/api/patients/{created['id']}", headers=stranger["headers"])
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "FORBIDDEN"
    assert (await client.post(f"/api/patients/{created['id']}", json={"gender": "male"},
                              headers=stranger["headers"])).status_code == 403


async def test_routes_need_a_token(client):
    response = await client.get("/api/patients/me")
    assert response.status_code == 401
    assert response.json()["success"] is False


async def _organization(client, owner: dict[str, Any]) -> str:
    response = await client.post("/api/organizations", json={
        "name": "Kibera Community Clinic", "type": "clinic", "country": "KE"},
        headers=owner["headers"])
    assert response.status_code == 201, response.text
    return response.json()["data"]["id"]


async def test_organization_registers_lists_and_finds_by_mrn(client):
    doctor = await register_and_login(client, first_name="Wanjiru", last_name="Kamau",
                                      role="DOCTOR")
    org_id = await _organization(client, doctor)
    url = f"/api/organizations/{org_id}/patients"
    first = await client.post(url, json={**PROFILE, "mrn": "KCC-0001"}, headers=doctor["headers"])
    assert first.status_code == 201, first.text
    assert first.json()["data"]["mrn"] == "KCC-0001"
    generated = await client.post(url, json={**PROFILE, "first_name": "Baraka"},
                                  headers=doctor["headers"])
    assert generated.json()["data"]["mrn"].startswith("MRN")
    duplicate = await client.post(url, json={**PROFILE, "mrn": "KCC-0001"},
                                  headers=doctor["headers"])
    assert duplicate.status_code == 409
    listing = (await client.get(url, params={"limit": 1}, headers=doctor["headers"])).json()
    assert listing["meta"] == {"page": 1, "limit": 1, "total": 2}
    assert len(listing["data"]) == 1
    found = (await client.get(f"{url}/search", params={"mrn": "KCC-0001"},
                              headers=doctor["headers"])).json()
    assert [p["first_name"] for p in found["data"]] == ["Amina"]
    none = (await client.get(f"{url}/search", params={"mrn": "nope"},
                             headers=doctor["headers"])).json()
    assert none["data"] == [] and none["meta"]["total"] == 0
    detail = await client.get(f"{url}/{first.json()['data']['id']}", headers=doctor["headers"])
    assert detail.json()["data"]["organization_id"] == org_id
    fhir = (await client.get(f"/fhir/Patient/{first.json()['data']['id']}",
                             headers=doctor["headers"])).json()
    assert fhir["managingOrganization"] == {"reference": f"Organization/{org_id}"}
    mrn = next(i for i in fhir["identifier"] if i["system"].endswith(":mrn"))
    assert mrn["value"] == "KCC-0001" and mrn["type"]["coding"][0]["code"] == "MR"
    # A member of the organization may open the patient's profile too.
    profile = await client.get(f"/api/patients/{first.json()['data']['id']}",
                               headers=doctor["headers"])
    assert profile.status_code == 200


async def test_an_address_is_written_viewed_and_replaced(client):
    doctor = await register_and_login(client, first_name="Wanjiru", last_name="Kamau",
                                      role="DOCTOR")
    org_id = await _organization(client, doctor)
    address = {"line": ["Plot 12, Ngong Road"], "city": "Nairobi", "district": "Kibra",
               "country": "ke"}
    created = await client.post(f"/api/organizations/{org_id}/patients",
                                json={**PROFILE, "address": address}, headers=doctor["headers"])
    assert created.status_code == 201, created.text
    patient = created.json()["data"]
    assert patient["address"] == {**address, "country": "KE"}
    fhir = (await client.get(f"/fhir/Patient/{patient['id']}", headers=doctor["headers"])
            ).json()
    assert fhir["address"] == [{"use": "home", "line": ["Plot 12, Ngong Road"],
                                "city": "Nairobi", "district": "Kibra", "country": "KE"}]
    url = f"/api/patients/{patient['id']}"
    moved = await client.post(url, json={"address": {"city": "Kisumu", "country": "KE"}},
                             headers=doctor["headers"])
    assert moved.status_code == 200, moved.text
    assert moved.json()["data"]["address"] == {"line": [], "city": "Kisumu",
                                               "district": None, "country": "KE"}
    viewed = (await client.get(url, headers=doctor["headers"])).json()["data"]
    assert viewed["address"]["city"] == "Kisumu" and viewed["phone"] == PROFILE["phone"]
    bad = await client.post(url, json={"address": {"country": "Kenya"}},
                           headers=doctor["headers"])
    assert bad.status_code == 422 and "country" in bad.json()["error"]["field"]


async def test_parallel_registrations_all_get_distinct_server_assigned_mrns(app, client):
    doctor = await register_and_login(client, first_name="Wanjiru", last_name="Kamau",
                                      role="DOCTOR")
    org_id = await _organization(client, doctor)
    url = f"/api/organizations/{org_id}/patients"
    # A number given by hand is skipped by the counter, not a 409 for a later patient.
    taken = await client.post(url, json={**PROFILE, "mrn": "MRN0000002"},
                              headers=doctor["headers"])
    assert taken.status_code == 201, taken.text
    responses = await asyncio.gather(*(
        client.post(url, json={**PROFILE, "first_name": f"Child{n}"},
                    headers=doctor["headers"]) for n in range(20)))
    assert [r.status_code for r in responses] == [201] * 20, [r.text for r in responses]
    mrns = sorted(r.json()["data"]["mrn"] for r in responses)
    assert len(set(mrns)) == 20 and "MRN0000002" not in mrns
    assert mrns[0] == "MRN0000001" and mrns[-1] == "MRN0000021"
    counter = await app.state.services.store.get_document(
        "mrn_counters", org_id)
    assert counter["last"] == 21


async def test_lists_and_searches_give_each_patient_its_creation_instant_from_one_query(
        app, client, clinic_admin):
    """created_at is version 1's lastUpdated: for a page, one store question for the
    patients updated since, no read per patient."""
    url = f"/api/organizations/{clinic_admin['org_id']}/patients"
    h = clinic_admin["headers"]
    registered = {}
    for mrn, first_name in (("KCC-0101", "Amina"), ("KCC-0102", "Baraka"),
                            ("KCC-0103", "Njeri")):
        created = await client.post(url, json={**PROFILE, "first_name": first_name,
                                               "mrn": mrn}, headers=h)
        registered[created.json()["data"]["id"]] = created.json()["data"]["created_at"]
    for patient_id in list(registered)[:2]:  # later versions, written through FHIR
        fhir = (await client.get(f"/fhir/Patient/{patient_id}", headers=h)).json()
        await client.put(f"/fhir/Patient/{patient_id}", json={**fhir, "active": False},
                         headers={**h, "Content-Type": "application/fhir+json"})
    await app.state.services.bus.drain()  # what consumers (the MPI) read happens first
    store = app.state.services.store
    asked: list[list[str]] = []
    reads: list[tuple[str, ...]] = []
    created_instants, read = store.created_instants, store.read

    async def counting_created_instants(resource_type, ids):
        asked.append(list(ids))
        return await created_instants(resource_type, ids)

    async def counting_read(*args, **kwargs):
        reads.append(args)
        return await read(*args, **kwargs)

    store.created_instants, store.read = counting_created_instants, counting_read
    listing = (await client.get(url, headers=h)).json()["data"]
    assert {p["id"]: p["created_at"] for p in listing} == registered
    assert all(p["updated_at"] != p["created_at"] for p in listing
               if p["id"] in list(registered)[:2])
    assert len(asked) == 1 and sorted(asked[0]) == sorted(list(registered)[:2])
    assert [args for args in reads if args[0] == "Patient"] == []  # no vread of version 1
    found = (await client.get(f"{url}/search", params={"mrn": "KCC-0101"},
                              headers=h)).json()["data"]
    assert found[0]["created_at"] == registered[found[0]["id"]] is not None


async def test_non_members_are_refused_and_admins_allowed(client, admin):
    owner = await register_and_login(client, first_name="Wanjiru", last_name="Kamau")
    org_id = await _organization(client, owner)
    outsider = await register_and_login(client, first_name="Kofi", last_name="Boateng")
    url = f"/api/organizations/{org_id}/patients"
    assert (await client.get(url, headers=outsider["headers"])).status_code == 403
    assert (await client.post(url, json=PROFILE, headers=outsider["headers"])).status_code == 403
    assert (await client.get(url, headers=admin["headers"])).status_code == 200
    assert (await client.get("/api/organizations/unknown/patients",
                             headers=admin["headers"])).status_code == 404


async def test_pagination_parameters_are_validated(client, user):
    org_id = await _organization(client, user)
    response = await client.get(f"/api/organizations/{org_id}/patients?limit=1000",
                                headers=user["headers"])
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "limit"


async def store_unvalidated(app: Any, body: dict[str, Any]) -> None:
    """Write a record as a store older than today's validation could have kept it."""
    services = app.state.services
    async with services.store.unit_of_work() as uow:
        uow.create(body["resourceType"], body["id"], body,
                   index=services.fhir.indexer(body))
        await uow.commit()


async def test_a_record_stored_with_wrongly_shaped_elements_is_shown_without_them(
        app, client, admin, clinic_admin):
    org_id = clinic_admin["org_id"]
    await store_unvalidated(app, {
        "resourceType": "Patient", "id": "legacy-amina",
        "meta": {"security": [{"system": "urn:healthplatform:organization", "code": org_id}]},
        "name": [["Amina", "Odhiambo"], {"use": "official", "family": "Odhiambo",
                                         "given": ["Amina"]}],
        "telecom": ["+254712345678", {"system": "email", "value": "amina@example.org"}],
        "identifier": [1, {"system": f"urn:healthplatform:organization:{org_id}:mrn",
                           "value": "KCC-0042"}],
        "managingOrganization": f"Organization/{org_id}",
        "gender": "female", "birthDate": "1988-04-12"})
    for path, headers in (("/api/patients/legacy-amina", admin["headers"]),
                          (f"/api/organizations/{org_id}/patients/legacy-amina",
                           clinic_admin["headers"])):
        response = await client.get(path, headers=headers)
        assert response.status_code == 200, (path, response.text)
        view = response.json()["data"]
        assert (view["first_name"], view["last_name"]) == ("Amina", "Odhiambo")
        assert view["email"] == "amina@example.org" and view["phone"] is None
        assert view["mrn"] == "KCC-0042"
    listed = await client.get(f"/api/organizations/{org_id}/patients",
                              headers=clinic_admin["headers"])
    assert listed.status_code == 200
    assert [p["id"] for p in listed.json()["data"]] == ["legacy-amina"]

"""Schedulable resources: doctors, rooms and equipment as FHIR actors of the
organization's directory, tagged schedulable."""

from __future__ import annotations

from platform_api.scheduling.common import RESOURCE_TAG
from tests.conftest import register_and_login
from tests.platform_api.scheduling.conftest import (
    booking,
    data,
    make_resource,
    refusal,
    tomorrow,
)


async def test_a_room_is_a_location_and_equipment_a_device(client, clinic) -> None:
    headers, org_id = clinic["admin"]["headers"], clinic["org_id"]
    room = await make_resource(client, headers, org_id, type="room",
                               name="Consultation Room 2", description="Ground floor")
    scanner = await make_resource(client, headers, org_id, type="equipment",
                                  name="Ultrasound scanner", time_zone="UTC")
    assert (room["type"], room["fhir_reference"].split("/")[0]) == ("room", "Location")
    assert (scanner["type"], scanner["fhir_reference"].split("/")[0]) == ("equipment", "Device")
    location = (await client.get(f"/fhir/{room['fhir_reference']}", headers=headers)).json()
    assert location["name"] == "Consultation Room 2"
    assert location["physicalType"]["coding"][0]["code"] == "ro"
    assert location["managingOrganization"]["reference"] == f"Organization/{org_id}"
    assert {"system": RESOURCE_TAG, "code": "room"} in location["meta"]["tag"]
    device = (await client.get(f"/fhir/{scanner['fhir_reference']}", headers=headers)).json()
    assert device["deviceName"][0]["name"] == "Ultrasound scanner"


async def test_a_doctor_is_a_practitioner_linked_to_the_account(client, clinic) -> None:
    doctor = clinic["doctor"]
    assert doctor["fhir_reference"] == f"Practitioner/{doctor['id']}"
    assert (doctor["time_zone"], doctor["active"]) == ("Africa/Nairobi", True)
    practitioner = (await client.get(f"/fhir/Practitioner/{doctor['id']}",
                                     headers=clinic["admin"]["headers"])).json()
    assert practitioner["name"][0] == {"use": "official", "text": "Dr. Wanjiru Kamau",
                                       "prefix": ["Dr."], "given": ["Wanjiru"],
                                       "family": "Kamau"}
    assert {"system": "urn:healthplatform:user",
            "value": clinic["doctor_user"]["user"]["id"]} in practitioner["identifier"]


async def test_list_is_one_search_over_the_three_types_with_filters(client, clinic) -> None:
    headers, org_id = clinic["admin"]["headers"], clinic["org_id"]
    await make_resource(client, headers, org_id, type="room", name="Room 1")
    await make_resource(client, headers, org_id, type="equipment", name="ECG machine")
    listed = await client.get(f"/api/resources?organization_id={org_id}&limit=2",
                              headers=headers)
    assert listed.json()["meta"] == {"page": 1, "limit": 2, "total": 3}
    rooms = await client.get(f"/api/resources?organization_id={org_id}&type=room",
                             headers=headers)
    assert [r["name"] for r in data(rooms)] == ["Room 1"]
    # the directory is for every signed-in user: a patient chooses a doctor from it
    patient = await register_and_login(client, first_name="Juma", last_name="Hassan")
    seen = await client.get(f"/api/resources?organization_id={org_id}",
                            headers=patient["headers"])
    assert seen.json()["meta"]["total"] == 3
    assert (await client.get("/api/resources")).status_code == 401


async def test_only_the_organizations_administrators_write_resources(client, clinic,
                                                                     other_clinic) -> None:
    org_id = clinic["org_id"]
    body = {"type": "room", "name": "Room 9", "organization_id": org_id}
    for who in (clinic["doctor_user"], clinic["receptionist"], other_clinic["admin"]):
        assert refusal(await client.post("/api/resources", headers=who["headers"],
                                         json=body)) == (403, "FORBIDDEN")
    doctor_id = clinic["doctor"]["id"]
    assert refusal(await client.put(f"/api/resources/{doctor_id}",
                                    headers=clinic["nurse"]["headers"],
                                    json={"name": "Dr. W. Kamau"})) == (403, "FORBIDDEN")
    assert refusal(await client.delete(f"/api/resources/{doctor_id}",
                                       headers=other_clinic["admin"]["headers"])
                   ) == (403, "FORBIDDEN")


async def test_update_changes_only_the_fields_sent(client, clinic) -> None:
    doctor_id, headers = clinic["doctor"]["id"], clinic["admin"]["headers"]
    updated = data(await client.put(f"/api/resources/{doctor_id}", headers=headers,
                                    json={"description": "Maternal health"}))
    assert (updated["name"], updated["description"]) == ("Dr. Wanjiru Kamau",
                                                         "Maternal health")
    fetched = data(await client.get(f"/api/resources/{doctor_id}",
                                    headers=clinic["receptionist"]["headers"]))
    assert fetched == {**updated, "updated_at": fetched["updated_at"]}
    bad = await client.put(f"/api/resources/{doctor_id}", headers=headers,
                           json={"time_zone": "Africa/Atlantis"})
    assert refusal(bad) == (422, "VALIDATION_ERROR")
    assert bad.json()["error"]["field"] == "time_zone"


async def test_validation_and_unknown_ids(client, clinic) -> None:
    headers = clinic["admin"]["headers"]
    wrong = await client.post("/api/resources", headers=headers,
                              json={"type": "ward", "name": "Ward 3",
                                    "organization_id": clinic["org_id"]})
    assert (refusal(wrong), wrong.json()["error"]["field"]) == ((422, "VALIDATION_ERROR"),
                                                                "type")
    assert refusal(await client.get("/api/resources/no-such-resource", headers=headers)
                   ) == (404, "NOT_FOUND")
    # a Practitioner that is no schedulable resource is not one
    plain = await client.post("/fhir/Practitioner", headers=headers, json={
        "resourceType": "Practitioner", "name": [{"family": "Njoroge"}]})
    assert refusal(await client.get(f"/api/resources/{plain.json()['id']}", headers=headers)
                   ) == (404, "NOT_FOUND")


async def test_an_existing_practitioner_becomes_schedulable(client, clinic) -> None:
    headers, org_id = clinic["admin"]["headers"], clinic["org_id"]
    profile = (await client.post("/fhir/Practitioner", headers=headers, json={
        "resourceType": "Practitioner", "name": [{"family": "Njoroge", "given": ["Peter"]}]}
    )).json()
    made = data(await client.post("/api/resources", headers=headers, json={
        "type": "doctor", "name": "Dr. Peter Njoroge", "organization_id": org_id,
        "practitioner_id": profile["id"]}), 201)
    assert made["id"] == profile["id"]
    again = await client.post("/api/resources", headers=headers, json={
        "type": "doctor", "name": "Dr. Peter Njoroge", "organization_id": org_id,
        "practitioner_id": profile["id"]})
    assert refusal(again) == (409, "RESOURCE_EXISTS")


async def test_delete_retires_it_unless_appointments_are_upcoming(client, clinic) -> None:
    headers, doctor_id = clinic["admin"]["headers"], clinic["doctor"]["id"]
    booked = data(await client.post("/api/appointments", json=booking(doctor_id, tomorrow())),
                  201)
    assert refusal(await client.delete(f"/api/resources/{doctor_id}", headers=headers)
                   ) == (409, "RESOURCE_HAS_APPOINTMENTS")
    data(await client.post(f"/api/appointments/{booked['id']}/cancel", headers=headers,
                           json={"reason": "Doctor on leave"}))
    retired = data(await client.delete(f"/api/resources/{doctor_id}", headers=headers))
    assert retired["active"] is False
    assert refusal(await client.get(f"/api/resources/{doctor_id}", headers=headers)
                   ) == (404, "NOT_FOUND")
    schedule_id = clinic["schedule"]["id"]
    assert (await client.get(f"/fhir/Schedule/{schedule_id}", headers=headers)
            ).status_code == 410
    # the Practitioner stays: the cancelled appointment still names it
    assert (await client.get(f"/fhir/Practitioner/{doctor_id}", headers=headers)
            ).status_code == 200
    slots = (await client.get(f"/fhir/Slot?schedule=Schedule/{schedule_id}&status=free",
                              headers=headers)).json()
    assert slots.get("total", len(slots.get("entry", []))) == 0


async def test_resource_routes_answer_envelopes_in_openapi(client) -> None:
    schema = (await client.get("/openapi.json")).json()
    post = schema["paths"]["/api/resources"]["post"]
    assert "ResourceCreate" in str(post["requestBody"])
    assert "ResourceView" in str(post["responses"]["201"])

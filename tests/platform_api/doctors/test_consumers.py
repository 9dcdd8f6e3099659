"""The Doctors area's event consumers: registration as DOCTOR makes the profile
(platform.auth.user_created), membership links it to the organization
(platform.organization.member_added / member_removed); each idempotent on the event id,
from the full and the short envelope."""

from __future__ import annotations

import uuid
from typing import Any

from tests.conftest import register_and_login
from tests.platform_api.clinic import Clinic

NOW = "2026-11-25T08:00:00+00:00"


def envelope(topic: str, payload: dict[str, Any], *, short: bool = False,
             event_id: str | None = None) -> dict[str, Any]:
    event = {"id": event_id or str(uuid.uuid4()), "topic": topic, "timestamp": NOW,
             "payload": payload}
    if not short:
        event["source_service"] = "auth"
    return event


async def profiles_of(clinic: Clinic, user_id: str) -> list[dict[str, Any]]:
    found = (await clinic.client.get("/fhir/Practitioner", headers=clinic.h("platform_admin"),
                                     params={"identifier": f"urn:healthplatform:user|{user_id}"}
                                     )).json()
    return [e["resource"] for e in found.get("entry", [])]


async def test_registering_as_a_doctor_creates_a_pending_profile(clinic: Clinic):
    user = await register_and_login(clinic.client, first_name="Kwame", last_name="Mensah",
                                    role="DOCTOR")
    await clinic.drain()
    mine = await clinic.client.get("/api/doctors/me", headers=user["headers"])
    assert mine.status_code == 200, mine.text
    profile = mine.json()["data"]
    assert profile["display_name"] == "Dr. Kwame Mensah"
    assert profile["verification"]["status"] == "pending"
    assert profile["email"] == user["user"]["email"]
    patient = await register_and_login(clinic.client, first_name="Esi", last_name="Owusu")
    await clinic.drain()
    assert await profiles_of(clinic, patient["user"]["id"]) == []


async def test_user_created_is_idempotent_and_reads_the_short_envelope(clinic: Clinic):
    bus = clinic.app.state.services.bus
    user = await register_and_login(clinic.client, first_name="Chidi", last_name="Okafor")
    payload = {"user_id": user["user"]["id"], "email": user["user"]["email"],
               "registration_role": "DOCTOR"}  # the short form: no names
    event = envelope("platform.auth.user_created", payload, short=True)
    assert await bus.deliver(event) is True
    assert await bus.deliver(event) is True  # the same event again
    again = envelope("platform.auth.user_created", payload)  # another id, same user
    assert await bus.deliver(again) is True
    [profile] = await profiles_of(clinic, user["user"]["id"])
    assert profile["name"][0]["given"] == ["Chidi"] and profile["name"][0]["family"] == "Okafor"
    receipts = await clinic.app.state.services.store.find_documents("event_receipts", {})
    assert [r["id"] for r in receipts] == [f"doctors.user_created:{event['id']}"]


async def test_an_event_for_an_unknown_user_becomes_a_dead_letter(clinic: Clinic):
    bus = clinic.app.state.services.bus
    event = envelope("platform.auth.user_created", {
        "user_id": "no-such-user", "email": "ghost@kliniki.example",
        "registration_role": "DOCTOR"}, short=True)
    assert await bus.deliver(event) is False
    letters = await clinic.app.state.services.store.find_documents("dead_letters", {})
    assert [letter["event_id"] for letter in letters] == [event["id"]]


async def test_membership_events_link_and_unlink_the_doctor(clinic: Clinic):
    bus = clinic.app.state.services.bus
    user = await register_and_login(clinic.client, first_name="Amani", last_name="Mushi",
                                    role="DOCTOR")
    await clinic.drain()
    doctor_id = (await clinic.client.get("/api/doctors/me", headers=user["headers"])
                 ).json()["data"]["id"]
    member = {"organization_id": clinic.org_id, "user_id": user["user"]["id"],
              "role": "ORG:DOCTOR"}
    added = envelope("platform.organization.member_added", member, short=True)
    for _ in range(2):
        assert await bus.deliver(added) is True
    assert await bus.deliver(envelope("platform.organization.member_added", member)) is True
    roles = (await clinic.client.get("/fhir/PractitionerRole", headers=clinic.h("admin"),
                                     params={"practitioner": f"Practitioner/{doctor_id}",
                                             "organization": f"Organization/{clinic.org_id}"})
             ).json()
    assert roles["total"] == 1  # the organization's own record of its doctor
    removed = envelope("platform.organization.member_removed", member)
    assert await bus.deliver(removed) is True
    assert await bus.deliver(removed) is True
    gone = (await clinic.client.get("/fhir/PractitionerRole", headers=clinic.h("admin"),
                                    params={"organization": f"Organization/{clinic.org_id}"})
            ).json()
    assert gone["total"] == 0
    # A member without a doctor profile: nothing to link.
    nurse = {"organization_id": clinic.org_id, "user_id": clinic.user_id("nurse"),
             "role": "ORG:NURSE"}
    assert await bus.deliver(envelope("platform.organization.member_added", nurse)) is True
    assert await profiles_of(clinic, clinic.user_id("nurse")) == []

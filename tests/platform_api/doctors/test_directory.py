"""The public doctor directory: verified doctors only, found by name (prefix, then
sound), specialty, organization, city, language and availability on a date, shown
without contact details or anything the doctor did not publish; availability from the
standard Schedule and Slot resources."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import httpx
import pytest

from platform_api.policy.roles import ORG_DOCTOR
from tests.conftest import add_member, register_and_login
from tests.platform_api.clinic import Clinic, refusal

FHIR = {"Content-Type": "application/fhir+json"}
CARDIOLOGY = {"code": "394579002", "display": "Cardiology"}
PAEDIATRICS = {"code": "394537008", "display": "Paediatric specialty"}
PRIVATE = ("phone", "email", "license_number", "license_authority", "user_id",
           "verification")


async def doctor(clinic: Clinic, first: str, last: str, *, verified: bool = True,
                 member: bool = False, **profile: Any) -> str:
    """A doctor's profile; ``member``: of the clinic (an invitation accepted) before the
    profile is made, so it practises there at once."""
    user = await register_and_login(clinic.client, first_name=first, last_name=last)
    if member:
        await add_member(clinic.app, clinic.org_id, user, ORG_DOCTOR)
    created = await clinic.client.post("/api/doctors", headers=user["headers"], json={
        "first_name": first, "last_name": last, "title": "Dr.", "license_number": f"L-{last}",
        "license_authority": "KMPDC", "phone": "+254700111222",
        "email": f"{first.lower()}@kliniki.example", **profile})
    assert created.status_code == 201, created.text
    doctor_id = str(created.json()["data"]["id"])
    if verified:
        approved = await clinic.client.patch(f"/api/doctors/{doctor_id}/verify", json={
            "decision": "approve"}, headers=clinic.h("platform_admin"))
        assert approved.status_code == 200, approved.text
    return doctor_id


@pytest.fixture
async def doctors(clinic: Clinic) -> dict[str, str]:
    ids = {
        "wanjiru": await doctor(clinic, "Wanjiru", "Kamau", member=True,
                                specialties=[CARDIOLOGY],
                                languages=["sw", "en"], city="Nairobi", gender="female",
                                biography="Heart failure clinic on Tuesdays."),
        "mohamed": await doctor(clinic, "Mohamed", "Abdi", specialties=[PAEDIATRICS],
                                languages=["so", "sw"], city="Mombasa"),
        "private": await doctor(clinic, "Wambui", "Njoroge", specialties=[CARDIOLOGY],
                                city="Nairobi", languages=["sw"], published=[]),
        "pending": await doctor(clinic, "Wangari", "Maathai", verified=False,
                                specialties=[CARDIOLOGY], city="Nairobi"),
    }
    return ids


async def search(clinic: Clinic, **params: Any) -> dict[str, Any]:
    found = await clinic.client.get("/api/doctors/search", params=params)  # no token
    assert found.status_code == 200, found.text
    return found.json()  # type: ignore[no-any-return]


def names(found: dict[str, Any]) -> list[str]:
    return [d["display_name"] for d in found["data"]]


async def test_anyone_finds_verified_doctors_by_name_prefix_or_sound(clinic: Clinic,
                                                                    doctors: dict[str, str]):
    everyone = await search(clinic)
    assert names(everyone) == ["Dr. Mohamed Abdi", "Dr. Wanjiru Kamau", "Dr. Wambui Njoroge"]
    assert everyone["meta"]["total"] == 3  # the pending doctor is not public
    assert names(await search(clinic, name="wa")) == ["Dr. Wanjiru Kamau",
                                                       "Dr. Wambui Njoroge"]
    assert names(await search(clinic, name="Wanjiru Kam")) == ["Dr. Wanjiru Kamau"]
    assert names(await search(clinic, name="Muhammad")) == ["Dr. Mohamed Abdi"]  # sounds
    assert names(await search(clinic, name="Maathai")) == []


async def test_public_views_never_show_contact_details_or_what_is_unpublished(
        clinic: Clinic, doctors: dict[str, str]):
    found = await search(clinic, name="wanjiru")
    [view] = found["data"]
    assert not set(PRIVATE) & set(view)
    assert view["languages"] == ["sw", "en"] and view["city"] == "Nairobi"
    assert view["gender"] is None  # not published by default
    assert view["biography"] == "Heart failure clinic on Tuesdays."
    assert [o["name"] for o in view["organizations"]] == ["Kibera Community Clinic"]
    private = (await clinic.client.get(f"/api/doctors/{doctors['private']}")).json()["data"]
    assert private["city"] is None and private["languages"] is None
    assert private["specialties"][0]["code"] == "394579002"  # always public
    assert "+254700111222" not in str(private)


async def test_filters_only_find_what_doctors_publish(clinic: Clinic, doctors: dict[str, str]):
    assert names(await search(clinic, specialty="394579002")) == [
        "Dr. Wanjiru Kamau", "Dr. Wambui Njoroge"]
    assert names(await search(clinic, specialty="paediatric")) == ["Dr. Mohamed Abdi"]
    # Dr. Njoroge practises in Nairobi and speaks Swahili, but publishes neither.
    assert names(await search(clinic, city="nairobi")) == ["Dr. Wanjiru Kamau"]
    assert names(await search(clinic, language="sw")) == ["Dr. Mohamed Abdi",
                                                          "Dr. Wanjiru Kamau"]
    assert names(await search(clinic, organization_id=clinic.org_id)) == ["Dr. Wanjiru Kamau"]
    bad = await clinic.client.get("/api/doctors/search", params={"language": "Swahili!"})
    assert refusal(bad) == (422, "VALIDATION_ERROR") and bad.json()["error"]["field"] == \
        "language"
    paged = await search(clinic, limit=1, page=2)
    assert paged["meta"] == {"page": 2, "limit": 1, "total": 3} and len(paged["data"]) == 1


async def schedule(clinic: Clinic, doctor_id: str, *slots: tuple[str, str, str],
                   horizon: tuple[str, str] | None = None) -> str:
    """A Schedule of the doctor (written by the clinic over /fhir, as the Scheduling
    area would) and its Slots (start, end, status)."""
    h = {**clinic.h("admin"), **FHIR}
    body: dict[str, Any] = {"resourceType": "Schedule", "active": True,
                            "actor": [{"reference": f"Practitioner/{doctor_id}"}],
                            "serviceType": [{"text": "Cardiology consultation"}]}
    if horizon:
        body["planningHorizon"] = {"start": horizon[0], "end": horizon[1]}
    created = await clinic.client.post("/fhir/Schedule", json=body, headers=h)
    assert created.status_code == 201, created.text
    schedule_id = created.json()["id"]
    for start, end, status in slots:
        slot = await clinic.client.post("/fhir/Slot", headers=h, json={
            "resourceType": "Slot", "schedule": {"reference": f"Schedule/{schedule_id}"},
            "status": status, "start": start, "end": end})
        assert slot.status_code == 201, slot.text
    return str(schedule_id)


def day(offset: int) -> date:
    return date.today() + timedelta(days=offset)


def at(offset: int, time: str) -> str:
    return f"{day(offset).isoformat()}T{time}:00Z"


async def test_doctors_available_on_a_date_have_a_free_slot_that_day(clinic: Clinic,
                                                                    doctors: dict[str, str]):
    await schedule(clinic, doctors["wanjiru"], (at(1, "09:00"), at(1, "09:30"), "free"),
                   (at(2, "09:00"), at(2, "09:30"), "busy"))
    await schedule(clinic, doctors["mohamed"], (at(2, "10:00"), at(2, "10:30"), "free"))
    await schedule(clinic, doctors["pending"], (at(1, "11:00"), at(1, "11:30"), "free"))
    assert names(await search(clinic, available_on=day(1).isoformat())) == [
        "Dr. Wanjiru Kamau"]
    assert names(await search(clinic, available_on=day(2).isoformat())) == ["Dr. Mohamed Abdi"]
    assert names(await search(clinic, available_on=day(2).isoformat(), city="nairobi")) == []
    assert (await search(clinic, available_on=day(9).isoformat()))["meta"]["total"] == 0


async def test_availability_sums_up_free_slots_and_schedules(clinic: Clinic,
                                                              doctors: dict[str, str]):
    await schedule(clinic, doctors["wanjiru"], (at(1, "09:00"), at(1, "09:30"), "free"),
                   (at(1, "09:30"), at(1, "10:00"), "free"),
                   (at(1, "10:00"), at(1, "10:30"), "busy"),
                   (at(3, "14:00"), at(3, "14:30"), "free"),
                   horizon=(day(0).isoformat(), day(4).isoformat()))
    answer = await clinic.client.get(f"/api/doctors/{doctors['wanjiru']}/availability",
                                     params={"from": day(0).isoformat(), "days": 7})
    assert answer.status_code == 200, answer.text
    summary = answer.json()["data"]
    assert summary["next_available"].startswith(day(1).isoformat())
    assert [(d["free_slots"], d["scheduled"]) for d in summary["days"]] == [
        (0, True), (2, True), (0, True), (1, True), (0, True), (0, False), (0, False)]
    assert len(summary["slots"]) == 3
    assert summary["schedules"][0]["service_types"] == ["Cardiology consultation"]
    pending = await clinic.client.get(f"/api/doctors/{doctors['pending']}/availability")
    assert refusal(pending) == (404, "NOT_FOUND")
    too_long = await clinic.client.get(f"/api/doctors/{doctors['wanjiru']}/availability",
                                       params={"days": 400})
    assert refusal(too_long) == (422, "VALIDATION_ERROR")


async def test_a_public_profile_is_for_verified_doctors_only(clinic: Clinic,
                                                             doctors: dict[str, str]):
    client: httpx.AsyncClient = clinic.client
    shown = await client.get(f"/api/doctors/{doctors['mohamed']}")
    assert shown.status_code == 200 and shown.json()["data"]["verified"] is True
    assert refusal(await client.get(f"/api/doctors/{doctors['pending']}")) == (404, "NOT_FOUND")
    assert refusal(await client.get("/api/doctors/nobody")) == (404, "NOT_FOUND")

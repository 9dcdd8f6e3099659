"""Rooms and wards with their beds, as FHIR Location (beds partOf their room, with an
operational status)."""

from __future__ import annotations

from tests.platform_api.clinic import Clinic, refusal


def rooms_url(clinic: Clinic) -> str:
    return f"/api/organizations/{clinic.org_id}/rooms"


async def test_the_admin_creates_a_ward_with_its_beds(clinic: Clinic):
    created = await clinic.post("admin", rooms_url(clinic), {
        "name": "Maternity Ward", "kind": "ward", "description": "Second floor, east wing",
        "beds": ["M2", "M1", "M3"]})
    assert created.status_code == 201, created.text
    ward = created.json()["data"]
    assert ward["name"] == "Maternity Ward" and ward["kind"] == "ward"
    assert [b["name"] for b in ward["beds"]] == ["M1", "M2", "M3"]
    assert ward["beds_total"] == 3 and ward["beds_free"] == 3
    assert {b["status"] for b in ward["beds"]} == {"free"}
    bed = (await clinic.get("admin", f"/fhir/Location/{ward['beds'][0]['id']}")).json()
    assert bed["partOf"]["reference"] == f"Location/{ward['id']}"
    assert bed["operationalStatus"]["code"] == "U"
    assert bed["physicalType"]["coding"][0]["code"] == "bd"
    assert {"system": "urn:healthplatform:organization", "code": clinic.org_id} in bed["meta"][
        "security"]


async def test_members_list_rooms_with_their_beds(clinic: Clinic):
    await clinic.post("admin", rooms_url(clinic), {"name": "Paediatric Ward", "beds": ["P1"]})
    await clinic.post("admin", rooms_url(clinic), {"name": "Consultation 2", "kind": "room"})
    listed = (await clinic.get("nurse", rooms_url(clinic))).json()
    assert listed["meta"]["total"] == 2
    assert [(r["name"], r["beds_total"]) for r in listed["data"]] == [
        ("Consultation 2", 0), ("Paediatric Ward", 1)]
    wards = (await clinic.get("nurse", rooms_url(clinic), kind="ward")).json()
    assert [r["name"] for r in wards["data"]] == ["Paediatric Ward"]
    assert refusal(await clinic.get("stranger", rooms_url(clinic))) == (403, "FORBIDDEN")
    mathare = (await clinic.get("other_admin", f"/api/organizations/{clinic.other_org_id}"
                                "/rooms")).json()
    assert mathare["data"] == []


async def test_rooms_are_created_by_the_admin_with_valid_beds_only(clinic: Clinic):
    assert refusal(await clinic.post("nurse", rooms_url(clinic), {"name": "Store"})) == (
        403, "FORBIDDEN")
    assert refusal(await clinic.post("stranger", rooms_url(clinic), {"name": "Store"})) == (
        403, "FORBIDDEN")
    twice = await clinic.post("admin", rooms_url(clinic), {"name": "Ward B", "beds": ["B1", "b1"]})
    assert refusal(twice) == (422, "VALIDATION_ERROR") and twice.json()["error"]["field"] == "beds"
    kind = await clinic.post("admin", rooms_url(clinic), {"name": "Ward B", "kind": "garage"})
    assert refusal(kind) == (422, "VALIDATION_ERROR")
    assert refusal(await clinic.post("admin", "/api/organizations/nowhere/rooms",
                                     {"name": "Ward B"})) == (404, "NOT_FOUND")

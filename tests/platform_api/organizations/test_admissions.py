"""Admissions as inpatient FHIR Encounters with their bed history: admit to a free bed,
transfer, discharge with a disposition; an occupied bed is refused, also when two
admissions race for it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.platform_api.clinic import Clinic, refusal


@pytest.fixture
async def ward(clinic: Clinic) -> dict[str, Any]:
    created = await clinic.post("admin", f"/api/organizations/{clinic.org_id}/rooms", {
        "name": "Medical Ward", "beds": ["A1", "A2", "A3"]})
    assert created.status_code == 201, created.text
    data = created.json()["data"]
    return {"id": data["id"], **{b["name"]: b["id"] for b in data["beds"]}}


async def new_patient(clinic: Clinic, first: str, last: str, mrn: str) -> str:
    created = await clinic.post("admin", f"/api/organizations/{clinic.org_id}/patients", {
        "first_name": first, "last_name": last, "date_of_birth": "1990-06-15",
        "gender": "male", "mrn": mrn})
    return str(created.json()["data"]["id"])


def admissions_url(clinic: Clinic, *rest: str) -> str:
    return "/".join([f"/api/organizations/{clinic.org_id}/admissions", *rest])


async def admit(clinic: Clinic, who: str, patient_id: str, bed_id: str) -> Any:
    return await clinic.post(who, admissions_url(clinic), {
        "patient_id": patient_id, "bed_id": bed_id, "reason": "Severe malaria with anaemia"})


async def beds(clinic: Clinic) -> dict[str, str]:
    rooms = (await clinic.get("nurse", f"/api/organizations/{clinic.org_id}/rooms")).json()
    return {b["name"]: b["status"] for r in rooms["data"] for b in r["beds"]}


async def test_a_nurse_admits_a_patient_to_a_free_bed(clinic: Clinic, ward: dict[str, Any]):
    admitted = await admit(clinic, "nurse", clinic.patient_id, ward["A1"])
    assert admitted.status_code == 201, admitted.text
    stay = admitted.json()["data"]
    assert stay["status"] == "in-progress" and stay["bed_id"] == ward["A1"]
    assert stay["bed_name"] == "A1" and stay["patient_id"] == clinic.patient_id
    assert await beds(clinic) == {"A1": "occupied", "A2": "free", "A3": "free"}
    encounter = (await clinic.get("doctor", f"/fhir/Encounter/{stay['id']}")).json()
    assert encounter["class"]["code"] == "IMP"
    assert encounter["location"][0]["location"]["reference"] == f"Location/{ward['A1']}"
    assert encounter["serviceProvider"]["reference"] == f"Organization/{clinic.org_id}"
    listed = (await clinic.get("receptionist", admissions_url(clinic), status="in-progress")
              ).json()
    assert [a["id"] for a in listed["data"]] == [stay["id"]] and listed["meta"]["total"] == 1
    one = await clinic.get("doctor", admissions_url(clinic, stay["id"]))
    assert one.json()["data"]["reason"] == "Severe malaria with anaemia"


async def test_an_occupied_bed_and_a_second_admission_are_refused(clinic: Clinic,
                                                                 ward: dict[str, Any]):
    assert (await admit(clinic, "nurse", clinic.patient_id, ward["A1"])).status_code == 201
    other = await new_patient(clinic, "Juma", "Hassan", "KCC-0002")
    assert refusal(await admit(clinic, "nurse", other, ward["A1"])) == (409, "BED_OCCUPIED")
    assert refusal(await admit(clinic, "nurse", clinic.patient_id, ward["A2"])) == (
        409, "ALREADY_ADMITTED")
    assert await beds(clinic) == {"A1": "occupied", "A2": "free", "A3": "free"}
    assert refusal(await admit(clinic, "nurse", other, "no-such-bed")) == (404, "NOT_FOUND")
    assert refusal(await admit(clinic, "nurse", other, ward["id"])) == (404, "NOT_FOUND")


async def test_two_admissions_racing_for_one_bed_admit_one(clinic: Clinic,
                                                          ward: dict[str, Any]):
    patients = [await new_patient(clinic, "Juma", "Hassan", "KCC-0002"),
                await new_patient(clinic, "Kipchoge", "Rotich", "KCC-0003"),
                await new_patient(clinic, "Wairimu", "Ndungu", "KCC-0004")]
    answers = await asyncio.gather(*(admit(clinic, who, p, ward["A2"]) for who, p in zip(
        ("nurse", "doctor", "receptionist"), patients, strict=True)))
    assert sorted(a.status_code for a in answers) == [201, 409, 409]
    assert {a.json()["error"]["code"] for a in answers if a.status_code == 409} == {
        "BED_OCCUPIED"}
    on_bed = (await clinic.get("admin", "/fhir/Encounter",
                               location=f"Location/{ward['A2']}")).json()
    assert on_bed["total"] == 1
    assert (await beds(clinic))["A2"] == "occupied"


async def test_a_transfer_moves_the_patient_and_keeps_the_bed_history(clinic: Clinic,
                                                                     ward: dict[str, Any]):
    stay = (await admit(clinic, "nurse", clinic.patient_id, ward["A1"])).json()["data"]
    url = admissions_url(clinic, stay["id"], "transfer")
    assert refusal(await clinic.post("nurse", url, {"bed_id": ward["A1"]})) == (409, "SAME_BED")
    other = await new_patient(clinic, "Juma", "Hassan", "KCC-0002")
    await admit(clinic, "nurse", other, ward["A3"])
    assert refusal(await clinic.post("nurse", url, {"bed_id": ward["A3"]})) == (
        409, "BED_OCCUPIED")
    moved = await clinic.post("doctor", url, {"bed_id": ward["A2"], "reason": "Closer to the "
                                              "nursing station"})
    assert moved.status_code == 200, moved.text
    data = moved.json()["data"]
    assert data["bed_id"] == ward["A2"]
    assert [(b["bed_name"], b["end"] is not None) for b in data["beds"]] == [
        ("A1", True), ("A2", False)]
    assert await beds(clinic) == {"A1": "free", "A2": "occupied", "A3": "occupied"}
    assert refusal(await clinic.post("billing", url, {"bed_id": ward["A1"]})) == (
        403, "FORBIDDEN")


async def test_a_discharge_records_the_disposition_and_frees_the_bed(clinic: Clinic,
                                                                    ward: dict[str, Any]):
    seen = clinic.recorded("platform.organization.*")
    stay = (await admit(clinic, "nurse", clinic.patient_id, ward["A1"])).json()["data"]
    url = admissions_url(clinic, stay["id"], "discharge")
    bad = await clinic.post("doctor", url, {"disposition": "teleported"})
    assert refusal(bad) == (422, "VALIDATION_ERROR")
    assert bad.json()["error"]["field"] == "disposition"
    done = await clinic.post("doctor", url, {"disposition": "home", "note": "Review in two "
                                             "weeks at the outpatient clinic"})
    assert done.status_code == 200, done.text
    data = done.json()["data"]
    assert data["status"] == "finished" and data["disposition"] == "home"
    assert data["discharged_at"] is not None and data["bed_id"] is None
    assert (await beds(clinic))["A1"] == "free"
    assert refusal(await clinic.post("doctor", url, {"disposition": "home"})) == (
        409, "INVALID_TRANSITION")
    assert refusal(await clinic.post("doctor", admissions_url(clinic, stay["id"], "transfer"),
                                     {"bed_id": ward["A2"]})) == (409, "INVALID_TRANSITION")
    # The bed is free again: the patient can come back to it.
    assert (await admit(clinic, "nurse", clinic.patient_id, ward["A1"])).status_code == 201
    await clinic.drain()
    events = [e for e in seen if ".patient_" in e["topic"]]
    assert [e["topic"].rsplit(".", 1)[1] for e in events] == [
        "patient_admitted", "patient_discharged", "patient_admitted"]
    assert events[1]["payload"]["disposition"] == "home"


async def test_who_may_admit(clinic: Clinic, ward: dict[str, Any]):
    assert refusal(await admit(clinic, "billing", clinic.patient_id, ward["A1"])) == (
        403, "FORBIDDEN")
    assert refusal(await admit(clinic, "stranger", clinic.patient_id, ward["A1"])) == (
        403, "FORBIDDEN")
    assert refusal(await admit(clinic, "other_admin", clinic.patient_id, ward["A1"])) == (
        403, "FORBIDDEN")
    assert (await beds(clinic))["A1"] == "free"
    assert refusal(await clinic.get("stranger", admissions_url(clinic))) == (403, "FORBIDDEN")

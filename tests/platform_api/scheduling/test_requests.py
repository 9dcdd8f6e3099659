"""Appointment requests: a patient asks, staff approve into a booking or reject with a
reason (Appointment proposed/pending, AppointmentResponse)."""

from __future__ import annotations

from typing import Any

from tests.conftest import register_and_login
from tests.platform_api.scheduling.conftest import at, booking, data, refusal, tomorrow

JSON = dict[str, Any]


async def patient_with_record(client, first_name: str = "Fatuma", last_name: str = "Ali"
                              ) -> JSON:
    patient = await register_and_login(client, first_name=first_name, last_name=last_name)
    record = data(await client.post("/api/patients", headers=patient["headers"], json={
        "first_name": first_name, "last_name": last_name, "date_of_birth": "1990-02-14",
        "gender": "female", "phone": "+254722000111"}), 201)
    return {**patient, "patient_id": record["id"]}


async def test_a_patient_asks_for_a_time_and_staff_approve_it(client, clinic, app) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    patient = await patient_with_record(client)
    asked = data(await client.post("/api/appointment-requests", headers=patient["headers"],
                                   json={"resource_id": doctor_id, "start_time": at(day, 10),
                                         "end_time": at(day, 10, 30),
                                         "reason": "Follow-up of hypertension"}), 201)
    assert (asked["status"], asked["request_status"], asked["request"]) == (
        "pending", "pending", True)
    assert asked["patient_id"] == patient["patient_id"]
    receptionist = clinic["receptionist"]["headers"]
    listed = await client.get("/api/appointment-requests?status=pending",
                              headers=receptionist)
    assert [r["id"] for r in data(listed)] == [asked["id"]]
    # the time is not taken by asking: a booking may still get it first
    free = data(await client.get(f"/api/appointments/availability?resource_id={doctor_id}"
                                 f"&date={day}", headers=patient["headers"]))
    assert at(day, 10) in [s["start_utc"] for s in free["slots"]]
    approved = data(await client.post(f"/api/appointment-requests/{asked['id']}/approve",
                                      headers=receptionist, json={}))
    assert (approved["status"], approved["request_status"]) == ("booked", "approved")
    headers = clinic["admin"]["headers"]
    responses = (await client.get(f"/fhir/AppointmentResponse?appointment=Appointment/"
                                  f"{asked['id']}", headers=headers)).json()
    assert [e["resource"]["participantStatus"] for e in responses["entry"]] == ["accepted"]
    slot = (await client.get(f"/fhir/Slot/{approved['slot_ids'][0]}", headers=headers)).json()
    assert slot["status"] == "busy"
    again = await client.post(f"/api/appointment-requests/{asked['id']}/approve",
                              headers=receptionist, json={})
    assert refusal(again) == (409, "INVALID_TRANSITION")
    # now the patient's own appointment: they see it, move it and cancel it
    mine = data(await client.get("/api/appointments", headers=patient["headers"]))
    assert [a["id"] for a in mine] == [asked["id"]]
    assert refusal(await client.patch(f"/api/appointments/{asked['id']}/status",
                                      headers=patient["headers"], json={"status": "arrived"})
                   ) == (403, "FORBIDDEN")
    data(await client.post(f"/api/appointments/{asked['id']}/reschedule",
                           headers=patient["headers"],
                           json={"start_time": at(day, 11), "end_time": at(day, 11, 30)}))
    data(await client.post(f"/api/appointments/{asked['id']}/cancel",
                           headers=patient["headers"], json={"reason": "Feeling better"}))


async def test_a_preferred_period_is_approved_at_a_chosen_time(client, clinic) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    patient = await patient_with_record(client, "Neema", "Mrema")
    asked = data(await client.post("/api/appointment-requests", headers=patient["headers"],
                                   json={"resource_id": doctor_id,
                                         "preferred_start": at(day, 8),
                                         "preferred_end": at(day, 12)}), 201)
    assert (asked["status"], asked["preferred_start"]) == ("proposed", at(day, 8))
    assert asked["start_time"] is None
    url = f"/api/appointment-requests/{asked['id']}/approve"
    nurse = clinic["nurse"]["headers"]
    needs_time = await client.post(url, headers=nurse, json={})
    assert refusal(needs_time) == (422, "VALIDATION_ERROR")
    data(await client.post("/api/appointments", json=booking(doctor_id, day, 9)), 201)
    taken = await client.post(url, headers=nurse, json={"start_time": at(day, 9),
                                                        "end_time": at(day, 9, 30)})
    assert refusal(taken) == (409, "SLOT_UNAVAILABLE")
    approved = data(await client.post(url, headers=nurse, json={
        "start_time": at(day, 9, 30), "end_time": at(day, 10)}))
    assert (approved["status"], approved["start_time"]) == ("booked", at(day, 9, 30))


async def test_staff_reject_with_a_reason(client, clinic, app) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    patient = await patient_with_record(client, "Baraka", "Otieno")
    asked = data(await client.post("/api/appointment-requests", headers=patient["headers"],
                                   json={"resource_id": doctor_id, "start_time": at(day, 8),
                                         "end_time": at(day, 8, 30)}), 201)
    url = f"/api/appointment-requests/{asked['id']}/reject"
    doctor = clinic["doctor_user"]["headers"]
    assert refusal(await client.post(url, headers=doctor, json={})) == (
        422, "VALIDATION_ERROR")
    rejected = data(await client.post(url, headers=doctor, json={
        "reason": "Dr. Kamau is on leave that week"}))
    assert (rejected["status"], rejected["request_status"]) == ("cancelled", "rejected")
    assert rejected["cancellation_reason"] == "Dr. Kamau is on leave that week"
    responses = (await client.get(f"/fhir/AppointmentResponse?appointment=Appointment/"
                                  f"{asked['id']}", headers=clinic["admin"]["headers"])).json()
    response = responses["entry"][0]["resource"]
    assert (response["participantStatus"], response["comment"]) == (
        "declined", "Dr. Kamau is on leave that week")
    assert refusal(await client.post(url, headers=doctor, json={"reason": "again"})) == (
        409, "INVALID_TRANSITION")
    listed = await client.get("/api/appointment-requests?status=rejected", headers=doctor)
    assert [r["id"] for r in data(listed)] == [asked["id"]]


async def test_who_may_ask_approve_and_see_requests(client, clinic, other_clinic) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    no_record = await register_and_login(client, first_name="Juma", last_name="Hassan")
    asked = await client.post("/api/appointment-requests", headers=no_record["headers"],
                              json={"resource_id": doctor_id, "start_time": at(day, 8),
                                    "end_time": at(day, 8, 30)})
    assert refusal(asked) == (409, "PATIENT_PROFILE_REQUIRED")
    patient = await patient_with_record(client)
    made = data(await client.post("/api/appointment-requests", headers=patient["headers"],
                                  json={"resource_id": doctor_id, "start_time": at(day, 8),
                                        "end_time": at(day, 8, 30)}), 201)
    # the patient may not approve their own request; another clinic may not either
    for who in (patient["headers"], other_clinic["admin"]["headers"]):
        assert refusal(await client.post(f"/api/appointment-requests/{made['id']}/approve",
                                         headers=who, json={})) == (403, "FORBIDDEN")
    assert (await client.get("/api/appointment-requests",
                             headers=other_clinic["admin"]["headers"])).json()["meta"][
        "total"] == 0
    # staff ask for a patient of theirs; a stranger's patient is not theirs to ask for
    org_patient = data(await client.post(
        f"/api/organizations/{clinic['org_id']}/patients",
        headers=clinic["receptionist"]["headers"], json={
            "first_name": "Grace", "last_name": "Achieng", "date_of_birth": "1975-06-30",
            "gender": "female"}), 201)
    for_patient = await client.post("/api/appointment-requests",
                                    headers=clinic["receptionist"]["headers"], json={
                                        "resource_id": doctor_id,
                                        "patient_id": org_patient["id"],
                                        "preferred_start": at(day, 8),
                                        "preferred_end": at(day, 12)})
    assert for_patient.status_code == 201
    other = await client.post("/api/appointment-requests",
                              headers=other_clinic["admin"]["headers"], json={
                                  "resource_id": doctor_id, "patient_id": org_patient["id"],
                                  "preferred_start": at(day, 8), "preferred_end": at(day, 12)})
    assert refusal(other) == (403, "FORBIDDEN")
    half = await client.post("/api/appointment-requests", headers=patient["headers"],
                             json={"resource_id": doctor_id, "start_time": at(day, 8)})
    assert refusal(half) == (422, "VALIDATION_ERROR")
    assert (await client.get("/api/appointment-requests")).status_code == 401


async def test_a_request_for_a_taken_time_is_refused(client, clinic) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    data(await client.post("/api/appointments", json=booking(doctor_id, day, 8)), 201)
    patient = await patient_with_record(client)
    asked = await client.post("/api/appointment-requests", headers=patient["headers"],
                              json={"resource_id": doctor_id, "start_time": at(day, 8),
                                    "end_time": at(day, 8, 30)})
    assert refusal(asked) == (409, "SLOT_UNAVAILABLE")

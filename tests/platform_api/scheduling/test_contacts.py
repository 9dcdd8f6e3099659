"""Booking without signing in never reveals nor uses a registered patient (issue 31,
result 1): the answer is the same whether the phone or e-mail is known or not, and the
booking holds the contact until the clinic's staff confirm whom it is for; a signed-in
patient booking for themselves books as their own Patient; e-mail addresses are compared
whatever their case."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import register_and_login
from tests.platform_api.scheduling.conftest import booking, data, refusal, tomorrow
from tests.platform_api.scheduling.test_requests import patient_with_record

JSON = dict[str, Any]
# A patient the clinic registered: nobody without an account may learn she is theirs.
ZAWADI = {"first_name": "Zawadi", "last_name": "Secretname", "date_of_birth": "1991-07-03",
          "gender": "female", "phone": "+254711222333", "email": "Zawadi.Secret@example.org"}
# What differs between any two bookings whoever they are for.
PER_BOOKING = ("id", "start_time", "end_time", "slot_ids", "created_at", "updated_at")


async def registered_patient(client, clinic) -> JSON:
    return data(await client.post(f"/api/organizations/{clinic['org_id']}/patients",  # type: ignore[no-any-return]
                                  headers=clinic["admin"]["headers"], json=ZAWADI), 201)


def confirm(client, appointment_id: str, headers: dict[str, str], **body: Any) -> Any:
    return client.post(f"/api/appointments/{appointment_id}/confirm-patient", headers=headers,
                       json=body)


async def test_booking_with_a_patients_phone_or_email_reveals_and_uses_nobody(client, clinic
                                                                             ) -> None:
    zawadi = await registered_patient(client, clinic)
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    contacts = {"known phone": {"patient_phone": "+254711222333", "patient_email": None},
                "known e-mail": {"patient_email": "zawadi.secret@example.org",
                                 "patient_phone": None},
                "unknown phone": {"patient_phone": "+254700000001", "patient_email": None},
                "unknown e-mail": {"patient_email": "nobody@example.org",
                                   "patient_phone": None}}
    answers = {}
    for hour, (what, contact) in zip((8, 9, 10, 11), contacts.items(), strict=True):
        response = await client.post("/api/appointments", json=booking(
            doctor_id, day, hour, patient_name="Juma Wanjiku", **contact))
        assert response.status_code == 201, what
        assert "Secretname" not in response.text and zawadi["id"] not in response.text
        answers[what] = response.json()
    # the same answer, field for field, whether the contact is a patient's or not
    shapes = {what: list(a["data"]) for what, a in answers.items()}
    assert len({tuple(s) for s in shapes.values()}) == 1
    views = {what: {k: v for k, v in a["data"].items()
                    if k not in (*PER_BOOKING, "patient_contact")}
             for what, a in answers.items()}
    assert all(v == views["unknown phone"] for v in views.values())
    assert views["known phone"]["patient_id"] is None
    assert views["known phone"]["patient_name"] == "Juma Wanjiku"
    assert answers["known e-mail"]["data"]["patient_contact"]["email"] == \
        "zawadi.secret@example.org"
    # nothing was booked in her name
    headers = clinic["admin"]["headers"]
    hers = await client.get(f"/fhir/Appointment?patient=Patient/{zawadi['id']}",
                            headers=headers)
    assert hers.json()["total"] == 0
    # the allowed case beside it: the clinic's staff, who see their patients anyway, are
    # shown that the contact matches Zawadi (her e-mail in another case too) and confirm
    receptionist = clinic["receptionist"]["headers"]
    for what in ("known phone", "known e-mail"):
        matched = await confirm(client, answers[what]["data"]["id"], receptionist)
        assert refusal(matched) == (409, "PATIENT_MATCHES")
        assert zawadi["id"] in matched.json()["error"]["message"]
    linked = data(await confirm(client, answers["known phone"]["data"]["id"], receptionist,
                                patient_id=zawadi["id"]))
    assert (linked["patient_id"], linked["patient_name"], linked["patient_confirmed"]) == (
        zawadi["id"], "Zawadi Secretname", True)
    assert (await client.get(f"/fhir/Appointment?patient=Patient/{zawadi['id']}",
                             headers=headers)).json()["total"] == 1
    # a confirmed booking is confirmed once
    assert refusal(await confirm(client, linked["id"], receptionist)) == (
        409, "PATIENT_CONFIRMED")
    # a contact nobody has is registered as a new patient of the clinic
    fresh = data(await confirm(client, answers["unknown e-mail"]["data"]["id"], receptionist))
    assert fresh["patient_id"] not in (None, zawadi["id"])
    assert fresh["patient_name"] == "Juma Wanjiku"


async def test_a_signed_in_patient_books_for_themselves(client, clinic) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    patient = await patient_with_record(client)
    # their record's phone: for themselves
    mine = data(await client.post("/api/appointments", headers=patient["headers"],
                                  json=booking(doctor_id, day, 9, patient_email=None,
                                               patient_phone="+254722000111")), 201)
    assert (mine["patient_id"], mine["patient_name"], mine["patient_confirmed"]) == (
        patient["patient_id"], "Fatuma Ali", True)
    # their account's e-mail, in capitals: the same person
    shouted = patient["user"]["email"].upper()
    again = data(await client.post("/api/appointments", headers=patient["headers"],
                                   json=booking(doctor_id, day, 10, patient_email=shouted,
                                                patient_phone=None)), 201)
    assert again["patient_id"] == patient["patient_id"]
    listed = data(await client.get("/api/appointments", headers=patient["headers"]))
    assert {a["id"] for a in listed} == {mine["id"], again["id"]}
    # someone else's contact, signed in or not: held as a contact, nobody's record
    other = data(await client.post("/api/appointments", headers=patient["headers"],
                                   json=booking(doctor_id, day, 11)), 201)
    assert (other["patient_id"], other["patient_confirmed"]) == (None, False)
    # a signed-in user without a patient record books for the contact too
    stranger = await register_and_login(client, first_name="Juma", last_name="Hassan")
    held = data(await client.post("/api/appointments", headers=stranger["headers"],
                                  json=booking(doctor_id, day, 8, patient_email=stranger[
                                      "user"]["email"])), 201)
    assert (held["patient_id"], held["patient_confirmed"]) == (None, False)


@pytest.mark.parametrize("who", ["admin", "doctor_user", "nurse", "receptionist"])
async def test_the_organizations_staff_confirm_whom_a_booking_is_for(client, clinic, who
                                                                      ) -> None:
    made = data(await client.post("/api/appointments", json=booking(
        clinic["doctor"]["id"], tomorrow())), 201)
    confirmed = data(await confirm(client, made["id"], clinic[who]["headers"]))
    assert confirmed["patient_confirmed"] is True and confirmed["patient_id"]


async def test_nobody_else_confirms_whom_a_booking_is_for(client, clinic, other_clinic
                                                          ) -> None:
    made = data(await client.post("/api/appointments", json=booking(
        clinic["doctor"]["id"], tomorrow())), 201)
    assert (await confirm(client, made["id"], {})).status_code == 401
    stranger = await register_and_login(client, first_name="Juma", last_name="Hassan")
    for headers in (other_clinic["admin"]["headers"], stranger["headers"]):
        assert refusal(await confirm(client, made["id"], headers)) == (403, "FORBIDDEN")
    # the contact's own account is not enough either: the clinic confirms
    booker = await register_and_login(client, email="amina.odhiambo@example.org")
    assert refusal(await confirm(client, made["id"], booker["headers"])) == (
        403, "FORBIDDEN")
    # a patient the confirming staff may not see cannot be named
    outsider = data(await client.post(
        f"/api/organizations/{other_clinic['org_id']}/patients",
        headers=other_clinic["admin"]["headers"], json={**ZAWADI, "phone": "+254799000000"}),
        201)
    assert refusal(await confirm(client, made["id"], clinic["receptionist"]["headers"],
                                 patient_id=outsider["id"])) == (403, "FORBIDDEN")
    still = data(await client.get(f"/api/appointments/{made['id']}",
                                  headers=clinic["admin"]["headers"]))
    assert still["patient_confirmed"] is False

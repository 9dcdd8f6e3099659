"""Appointments: public booking (one winner when bookings race, in one app, across two
apps and across two server processes on one store), availability, status moves,
reschedule, cancel, the day's board, confirmation e-mails, and who may do what."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time as clock
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.settings import Settings
from tests.conftest import make_clinic_admin, make_settings, register_and_login
from tests.platform_api.scheduling.conftest import (
    at,
    booked_clinic,
    booking,
    data,
    make_resource,
    make_schedule,
    refusal,
    served,
    tomorrow,
)
from tests.platform_api.test_auth_email import Inbox, free_port

JSON = dict[str, Any]


# -- booking -----------------------------------------------------------------------------------
async def test_booking_a_free_slot_answers_201_booked(client, clinic) -> None:
    doctor, day = clinic["doctor"], tomorrow()
    made = data(await client.post("/api/appointments", json=booking(doctor["id"], day)), 201)
    assert (made["status"], made["start_time"], made["end_time"]) == (
        "booked", at(day, 9), at(day, 9, 30))
    assert (made["resource_id"], made["patient_name"]) == (doctor["id"], "Amina Odhiambo")
    assert made["organization_id"] == clinic["org_id"]
    # without signing in, the booking holds the contact given, no Patient
    assert (made["patient_id"], made["patient_confirmed"]) == (None, False)
    assert made["patient_contact"] == {"name": "Amina Odhiambo",
                                       "email": "amina.odhiambo@example.org",
                                       "phone": "+254712345678"}
    headers = clinic["admin"]["headers"]
    appointment = (await client.get(f"/fhir/Appointment/{made['id']}", headers=headers)).json()
    assert appointment["status"] == "booked"
    assert appointment["reasonCode"] == [{"text": "Antenatal check-up"}]
    assert appointment["participant"][0]["actor"] == {"reference": "#contact",
                                                      "display": "Amina Odhiambo"}
    assert appointment["contained"][0]["resourceType"] == "Patient"
    slot = (await client.get(f"/fhir/Slot/{made['slot_ids'][0]}", headers=headers)).json()
    assert slot["status"] == "busy"
    # the receptionist confirms it: the contact becomes a Patient of the organization
    confirmed = data(await client.post(f"/api/appointments/{made['id']}/confirm-patient",
                                       headers=clinic["receptionist"]["headers"], json={}))
    assert (confirmed["patient_confirmed"], confirmed["patient_contact"]) == (True, None)
    patient = (await client.get(f"/fhir/Patient/{confirmed['patient_id']}",
                                headers=headers)).json()
    assert patient["managingOrganization"]["reference"] == f"Organization/{clinic['org_id']}"
    assert {"system": "email", "value": "amina.odhiambo@example.org"} in patient["telecom"]
    appointment = (await client.get(f"/fhir/Appointment/{made['id']}", headers=headers)).json()
    assert "contained" not in appointment
    assert appointment["participant"][0]["actor"]["reference"] == f"Patient/{patient['id']}"


async def test_a_taken_time_is_409(client, clinic) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    data(await client.post("/api/appointments", json=booking(doctor_id, day)), 201)
    again = await client.post("/api/appointments", json=booking(
        doctor_id, day, patient_name="Otieno Were", patient_email="otieno@example.org"))
    assert refusal(again) == (409, "SLOT_UNAVAILABLE")
    # the same contact by phone only, another time: held as given again (no Patient)
    second = data(await client.post("/api/appointments", json=booking(
        doctor_id, day, 10, patient_email=None)), 201)
    assert (second["patient_id"], second["patient_contact"]["phone"]) == (None,
                                                                          "+254712345678")
    # two slots at once
    long = data(await client.post("/api/appointments", json=booking(
        doctor_id, day, 10, 30, length=60, patient_name="Neema Mrema",
        patient_email="neema@example.org", patient_phone=None)), 201)
    assert len(long["slot_ids"]) == 2
    # a time no slot starts at, outside the hours, or in the past
    for body in (booking(doctor_id, day, 9, 10), booking(doctor_id, day, 15),
                 booking(doctor_id, day, 11, 30, length=45)):
        assert refusal(await client.post("/api/appointments", json=body)) == (
            409, "SLOT_UNAVAILABLE")
    past = await client.post("/api/appointments", json=booking(doctor_id, day - timedelta(
        days=2)))
    assert refusal(past) == (422, "VALIDATION_ERROR")


async def test_booking_validation_names_the_field(client, clinic) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    no_contact = booking(doctor_id, day, patient_email=None, patient_phone=None)
    assert refusal(await client.post("/api/appointments", json=no_contact)) == (
        422, "VALIDATION_ERROR")
    bad_phone = await client.post("/api/appointments", json=booking(
        doctor_id, day, patient_phone="0712345678"))
    assert bad_phone.json()["error"]["field"] == "patient_phone"
    backwards = booking(doctor_id, day)
    backwards["end_time"] = backwards["start_time"]
    assert refusal(await client.post("/api/appointments", json=backwards)) == (
        422, "VALIDATION_ERROR")
    assert refusal(await client.post("/api/appointments", json=booking(
        "no-such-doctor", day))) == (404, "NOT_FOUND")


async def test_racing_bookings_in_one_app_give_one_201(client, clinic) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    answers = await asyncio.gather(*(
        client.post("/api/appointments", json=booking(
            doctor_id, day, 8, 30, patient_name=f"Patient {i}",
            patient_email=f"patient{i}@example.org", patient_phone=None))
        for i in range(12)))
    assert sorted(a.status_code for a in answers) == [201] + [409] * 11
    assert {a.json()["error"]["code"] for a in answers if a.status_code == 409} == {
        "SLOT_UNAVAILABLE"}
    headers = clinic["admin"]["headers"]
    booked = (await client.get(f"/fhir/Appointment?date={at(day, 8, 30)}&status=booked",
                               headers=headers)).json()
    assert booked["total"] == 1


async def test_racing_bookings_of_one_contact_all_book_and_register_nobody(client, clinic
                                                                          ) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    answers = await asyncio.gather(*(
        client.post("/api/appointments", json=booking(
            doctor_id, day, 8 + i // 2, 30 * (i % 2), patient_name="Zawadi Njeri",
            patient_email="zawadi@example.org", patient_phone=None))
        for i in range(6)))
    assert [a.status_code for a in answers] == [201] * 6
    assert {a.json()["data"]["patient_id"] for a in answers} == {None}
    patients = await client.get(f"/fhir/Patient?organization=Organization/{clinic['org_id']}",
                                headers=clinic["admin"]["headers"])
    assert patients.json()["total"] == 0


async def test_racing_bookings_across_two_apps_on_one_store(tmp_path, settings) -> None:
    first, second = create_app(settings), create_app(make_settings(tmp_path))
    async with LifespanManager(first, startup_timeout=30), \
            LifespanManager(second, startup_timeout=30):
        one = httpx.AsyncClient(transport=httpx.ASGITransport(app=first),
                                base_url="http://one")
        two = httpx.AsyncClient(transport=httpx.ASGITransport(app=second),
                                base_url="http://two")
        async with one, two:
            admin = await make_clinic_admin(one)
            doctor = await make_resource(one, admin["headers"], admin["org_id"])
            await make_schedule(one, admin["headers"], doctor["id"])
            day = tomorrow()
            for hour in (9, 10, 11):
                answers = await asyncio.gather(*(
                    (one if i % 2 else two).post("/api/appointments", json=booking(
                        doctor["id"], day, hour, patient_email=f"p{hour}-{i}@example.org",
                        patient_phone=None))
                    for i in range(10)))
                assert sorted(a.status_code for a in answers) == [201] + [409] * 9


def _serve(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HEALTHPLATFORM_DATA_DIR": str(data_dir),
           "HEALTHPLATFORM_HTTP_PORT": str(port), "HEALTHPLATFORM_MLLP_ENABLED": "false",
           "HEALTHPLATFORM_ACCESS_LOG": "false", "HEALTHPLATFORM_LOG_LEVEL": "WARNING",
           "HEALTHPLATFORM_RATE_LIMIT_ENABLED": "false",
           "HEALTHPLATFORM_ARGON2_TIME_COST": "1", "HEALTHPLATFORM_ARGON2_MEMORY_KIB": "8192"}
    return subprocess.Popen([sys.executable, "-m", "platform_api.cli", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_healthy(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = clock.monotonic() + 60
    while clock.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(server.stderr.read().decode() if server.stderr else "died")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        clock.sleep(0.2)
    raise AssertionError("the server did not start")


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[tuple[str, str]]:
    ports = (free_port(), free_port())
    first = _serve(tmp_path, ports[0])
    servers = [first]
    try:
        _wait_healthy(ports[0], first)  # the first makes the store and the keys
        servers.append(_serve(tmp_path, ports[1]))
        _wait_healthy(ports[1], servers[1])
        yield f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=30)


async def test_racing_bookings_across_two_server_processes(two_servers) -> None:
    one_url, two_url = two_servers
    async with httpx.AsyncClient(base_url=one_url, timeout=30) as one, \
            httpx.AsyncClient(base_url=two_url, timeout=30) as two:
        admin = await make_clinic_admin(one)
        doctor = await make_resource(one, admin["headers"], admin["org_id"])
        await make_schedule(one, admin["headers"], doctor["id"])
        day = tomorrow()
        for hour in (9, 10):
            answers = await asyncio.gather(*(
                (one if i % 2 else two).post("/api/appointments", json=booking(
                    doctor["id"], day, hour, patient_email=f"s{hour}-{i}@example.org",
                    patient_phone=None))
                for i in range(16)))
            assert sorted(a.status_code for a in answers) == [201] + [409] * 15
        listed = await two.get(f"/api/appointments?resource_id={doctor['id']}",
                               headers=admin["headers"])
        assert listed.json()["meta"]["total"] == 2


# -- availability and the board -------------------------------------------------------------------
async def test_availability_lists_free_slots_in_local_time_and_utc(client, clinic) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    data(await client.post("/api/appointments", json=booking(doctor_id, day, 9)), 201)
    patient = await register_and_login(client, first_name="Juma", last_name="Hassan")
    free = data(await client.get(f"/api/appointments/availability?resource_id={doctor_id}"
                                 f"&date={day}", headers=patient["headers"]))
    assert (free["time_zone"], free["date"]) == ("Africa/Nairobi", day.isoformat())
    starts = [s["start"][11:16] for s in free["slots"]]
    assert starts == ["08:00", "08:30", "09:30", "10:00", "10:30", "11:00", "11:30"]
    assert free["slots"][0]["start_utc"] == at(day, 8)
    assert free["slots"][0]["start"].endswith("+03:00")
    gone = await client.get(f"/api/appointments/availability?resource_id=nobody&date={day}",
                            headers=patient["headers"])
    assert refusal(gone) == (404, "NOT_FOUND")
    bad = await client.get(f"/api/appointments/availability?resource_id={doctor_id}"
                           "&date=26-11-2026", headers=patient["headers"])
    assert (refusal(bad), bad.json()["error"]["field"]) == ((422, "VALIDATION_ERROR"), "date")
    assert (await client.get(f"/api/appointments/availability?resource_id={doctor_id}"
                             f"&date={day}")).status_code == 401


async def test_kanban_groups_the_days_appointments_by_status(client, clinic) -> None:
    doctor_id, day, headers = clinic["doctor"]["id"], tomorrow(), clinic["admin"]["headers"]
    ids = [data(await client.post("/api/appointments", json=booking(
        doctor_id, day, 9 + i, patient_email=f"k{i}@example.org", patient_phone=None)), 201
        )["id"] for i in range(3)]
    data(await client.patch(f"/api/appointments/{ids[0]}/status", headers=headers,
                            json={"status": "arrived"}))
    data(await client.post(f"/api/appointments/{ids[1]}/cancel", headers=headers, json={}))
    board = data(await client.get(f"/api/appointments/kanban?date={day}"
                                  f"&resource_id={doctor_id}", headers=headers))
    columns = {c["status"]: [a["id"] for a in c["appointments"]] for c in board["columns"]}
    assert (board["total"], board["time_zone"]) == (3, "Africa/Nairobi")
    assert (columns["booked"], columns["arrived"], columns["cancelled"]) == (
        [ids[2]], [ids[0]], [ids[1]])
    other_day = data(await client.get(f"/api/appointments/kanban?date={day + timedelta(1)}"
                                      f"&organization_id={clinic['org_id']}", headers=headers))
    assert other_day["total"] == 0
    no_day = await client.get("/api/appointments/kanban", headers=headers)
    assert (refusal(no_day), no_day.json()["error"]["field"]) == (
        (422, "VALIDATION_ERROR"), "date")
    bad_zone = await client.get(f"/api/appointments/kanban?date={day}&time_zone=Mars/Olympus",
                                headers=headers)
    assert refusal(bad_zone) == (422, "VALIDATION_ERROR")
    assert (await client.get(f"/api/appointments/kanban?date={day}")).status_code == 401


# -- status, reschedule, cancel -------------------------------------------------------------------
async def test_status_moves_follow_the_table(client, clinic, app) -> None:
    doctor_id, day, headers = clinic["doctor"]["id"], tomorrow(), clinic["admin"]["headers"]
    made = data(await client.post("/api/appointments", json=booking(doctor_id, day)), 201)
    nurse = clinic["nurse"]["headers"]
    for status in ("arrived", "checked-in", "fulfilled"):
        moved = data(await client.patch(f"/api/appointments/{made['id']}/status",
                                        headers=nurse, json={"status": status}))
        assert moved["status"] == status
    back = await client.patch(f"/api/appointments/{made['id']}/status", headers=headers,
                              json={"status": "booked"})
    assert refusal(back) == (409, "INVALID_TRANSITION")
    unknown = await client.patch(f"/api/appointments/{made['id']}/status", headers=headers,
                                 json={"status": "rescheduled"})
    assert (refusal(unknown), unknown.json()["error"]["field"]) == (
        (422, "VALIDATION_ERROR"), "status")
    noshow = data(await client.post("/api/appointments", json=booking(doctor_id, day, 10)), 201)
    data(await client.patch(f"/api/appointments/{noshow['id']}/status", headers=headers,
                            json={"status": "noshow"}))
    slot = (await client.get(f"/fhir/Slot/{noshow['slot_ids'][0]}", headers=headers)).json()
    assert slot["status"] == "free"  # a no-show gives the time back


async def test_reschedule_takes_the_new_time_before_freeing_the_old(client, clinic, app
                                                                    ) -> None:
    doctor_id, day, headers = clinic["doctor"]["id"], tomorrow(), clinic["admin"]["headers"]
    made = data(await client.post("/api/appointments", json=booking(doctor_id, day, 9)), 201)
    other = data(await client.post("/api/appointments", json=booking(
        doctor_id, day, 10, patient_email="baraka@example.org", patient_phone=None)), 201)
    taken = await client.post(f"/api/appointments/{made['id']}/reschedule", headers=headers,
                              json={"start_time": at(day, 10), "end_time": at(day, 10, 30)})
    assert refusal(taken) == (409, "SLOT_UNAVAILABLE")
    kept = data(await client.get(f"/api/appointments/{made['id']}", headers=headers))
    assert (kept["start_time"], kept["slot_ids"]) == (at(day, 9), made["slot_ids"])
    moved = data(await client.post(f"/api/appointments/{made['id']}/reschedule",
                                   headers=headers, json={"start_time": at(day, 11),
                                                          "end_time": at(day, 11, 30),
                                                          "reason": "Patient asked"}))
    assert (moved["start_time"], moved["status"]) == (at(day, 11), "booked")
    old = (await client.get(f"/fhir/Slot/{made['slot_ids'][0]}", headers=headers)).json()
    new = (await client.get(f"/fhir/Slot/{moved['slot_ids'][0]}", headers=headers)).json()
    assert (old["status"], new["status"]) == ("free", "busy")
    # stretching over a slot it holds already
    longer = data(await client.post(f"/api/appointments/{made['id']}/reschedule",
                                    headers=headers, json={"start_time": at(day, 11),
                                                           "end_time": at(day, 12)}))
    assert len(longer["slot_ids"]) == 2
    # to another resource of the clinic
    room = await make_resource(client, headers, clinic["org_id"], type="room",
                               name="Consultation Room 2")
    await make_schedule(client, headers, room["id"])
    to_room = data(await client.post(f"/api/appointments/{other['id']}/reschedule",
                                     headers=headers, json={"start_time": at(day, 10),
                                                            "end_time": at(day, 10, 30),
                                                            "resource_id": room["id"]}))
    assert (to_room["resource_id"], to_room["resource_type"]) == (room["id"], "Location")
    await app.state.services.bus.drain()


async def test_cancel_frees_the_slot_and_the_time_can_be_booked_again(client, clinic) -> None:
    doctor_id, day, headers = clinic["doctor"]["id"], tomorrow(), clinic["admin"]["headers"]
    made = data(await client.post("/api/appointments", json=booking(doctor_id, day)), 201)
    cancelled = data(await client.post(f"/api/appointments/{made['id']}/cancel",
                                       headers=clinic["receptionist"]["headers"],
                                       json={"reason": "Patient travelling to Kisumu"}))
    assert (cancelled["status"], cancelled["cancellation_reason"]) == (
        "cancelled", "Patient travelling to Kisumu")
    again = await client.post(f"/api/appointments/{made['id']}/cancel", headers=headers,
                              json={})
    assert refusal(again) == (409, "INVALID_TRANSITION")
    data(await client.post("/api/appointments", json=booking(doctor_id, day)), 201)
    assert refusal(await client.post("/api/appointments/none/cancel", headers=headers,
                                     json={})) == (404, "NOT_FOUND")


async def test_events_carry_the_booking_the_move_and_the_cancellation(client, clinic, app
                                                                      ) -> None:
    seen: list[JSON] = []

    async def record(event: JSON) -> None:
        seen.append(event)
    app.state.services.bus.subscribe("platform.scheduling.>", record)
    doctor_id, day, headers = clinic["doctor"]["id"], tomorrow(), clinic["admin"]["headers"]
    made = data(await client.post("/api/appointments", json=booking(doctor_id, day)), 201)
    await client.post(f"/api/appointments/{made['id']}/reschedule", headers=headers,
                      json={"start_time": at(day, 10), "end_time": at(day, 10, 30)})
    await client.post(f"/api/appointments/{made['id']}/cancel", headers=headers,
                      json={"reason": "Unwell"})
    await app.state.services.bus.drain()
    topics = [e["topic"].rsplit(".", 1)[1] for e in seen]
    assert topics == ["appointment_booked", "appointment_rescheduled",
                      "appointment_cancelled"]
    booked, moved, cancelled = (e["payload"] for e in seen)
    assert booked["appointment_id"] == made["id"] and booked["channel"] == "public"
    assert (booked["organization_id"], booked["resource"]) == (
        clinic["org_id"], f"Practitioner/{doctor_id}")
    assert (moved["previous_start"], moved["start"]) == (at(day, 9), at(day, 10))
    assert (cancelled["reason"], cancelled["freed_slot_ids"]) == ("Unwell",
                                                                 moved["slot_ids"])
    assert all(e["source_service"] == "scheduling" for e in seen)


async def test_who_may_see_and_change_appointments(client, clinic, other_clinic) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    made = data(await client.post("/api/appointments", json=booking(doctor_id, day)), 201)
    url = f"/api/appointments/{made['id']}"
    for who in ("doctor_user", "nurse", "receptionist"):
        assert (await client.get(url, headers=clinic[who]["headers"])).status_code == 200
    outsider = other_clinic["admin"]["headers"]
    assert refusal(await client.get(url, headers=outsider)) == (403, "FORBIDDEN")
    assert refusal(await client.post(f"{url}/cancel", headers=outsider, json={})) == (
        403, "FORBIDDEN")
    assert (await client.get(f"/api/appointments?organization_id={clinic['org_id']}",
                             headers=outsider)).json()["meta"]["total"] == 0
    stranger = await register_and_login(client, first_name="Juma", last_name="Hassan")
    assert refusal(await client.get(url, headers=stranger["headers"])) == (403, "FORBIDDEN")
    assert (await client.get(url)).status_code == 401
    listed = await client.get(f"/api/appointments?resource_id={doctor_id}&date={day}",
                              headers=clinic["doctor_user"]["headers"])
    assert [a["id"] for a in data(listed)] == [made["id"]]


# -- confirmation e-mails ----------------------------------------------------------------------
@pytest.fixture
def mail_settings(tmp_path: Path, inbox: tuple[Inbox, int]) -> Settings:
    return make_settings(tmp_path, smtp_host="127.0.0.1", smtp_port=inbox[1], smtp_tls="none",
                         smtp_from="Kibera Clinic <bookings@kibera.example>")


async def test_the_booking_is_confirmed_by_email_once(mail_settings, inbox) -> None:
    async with served(mail_settings) as (application, client):
        _admin, _doctor, made = await booked_clinic(client)
        services = application.state.services
        await services.bus.drain()
        to_patient = inbox[0].to("amina.odhiambo@example.org")
        assert len(to_patient) == 1
        text = to_patient[0].get_content()
        assert to_patient[0]["Subject"] == "Your appointment is booked"
        assert "Dr. Wanjiru Kamau" in text and "09:00 (Africa/Nairobi)" in text
        assert made["id"] in text
        # an event delivered twice (a redelivery) sends one more message, not two
        replayed = {"id": "replayed-1", "topic": "platform.scheduling.appointment_booked",
                    "timestamp": "2026-11-25T00:00:00Z",
                    "payload": {"appointment_id": made["id"], "patient_id": made["patient_id"]}}
        assert await services.bus.deliver(replayed)
        assert await services.bus.deliver(replayed)
        assert len(inbox[0].to("amina.odhiambo@example.org")) == 2


async def test_public_booking_has_its_own_rate_limit(client, clinic) -> None:
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    answers = [await client.post("/api/appointments", json=booking(doctor_id, day, 15))
               for _ in range(31)]
    assert answers[0].headers["RateLimit-Limit"] == "30"
    assert refusal(answers[-1]) == (429, "RATE_LIMITED")

"""Video visits: rooms on a local stand-in of the video platform's RoomService, join
tokens, the session as an Encounter (class VR) kept current by platform.video events
published on the bus, and who may start, watch and end a visit."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from aiohttp import web

from platform_api.scheduling.telemedicine import ROOM_SYSTEM
from tests.conftest import make_settings, register_and_login
from tests.platform_api.scheduling.conftest import (
    booked_clinic,
    booking,
    data,
    refusal,
    served,
    tomorrow,
)
from tests.platform_api.scheduling.test_requests import patient_with_record
from tests.platform_api.scheduling.video_standin import VideoStandIn

JSON = dict[str, Any]
API_KEY, API_SECRET = "APIkibera01", "s3cr3t-shared-with-the-video-platform-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def video() -> AsyncIterator[tuple[VideoStandIn, str]]:
    stand_in = VideoStandIn(API_KEY, API_SECRET)
    runner = web.AppRunner(stand_in.app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield stand_in, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
def settings(tmp_path: Path, video: tuple[VideoStandIn, str]):  # type: ignore[no-untyped-def]
    return make_settings(tmp_path, video_url=video[1], video_api_key=API_KEY,
                         video_api_secret=API_SECRET)


async def visit(client, clinic) -> tuple[JSON, JSON]:
    """A patient with their own record and an approved appointment with the doctor."""
    patient = await patient_with_record(client)
    day = tomorrow()
    body = booking(clinic["doctor"]["id"], day)
    asked = data(await client.post("/api/appointment-requests", headers=patient["headers"],
                                   json={"resource_id": clinic["doctor"]["id"],
                                         "start_time": body["start_time"],
                                         "end_time": body["end_time"]}), 201)
    data(await client.post(f"/api/appointment-requests/{asked['id']}/approve",
                           headers=clinic["admin"]["headers"], json={}))
    return patient, asked


async def publish(app: Any, event: str, room: str, identity: str = "", event_id: str = "",
                  created_at: int = 1_795_000_000) -> None:
    """What the events issue's video webhook does: the platform.video event on the bus."""
    services = app.state.services
    async with services.store.unit_of_work() as uow:
        uow.emit(f"platform.video.{event}", {
            "event": event, "room_name": room, "room_sid": "RM_0001",
            "participant_identity": identity, "participant_sid": "PA_1" if identity else "",
            "track_sid": "", "created_at": created_at, "id": event_id or f"EV_{event}_"
            f"{identity}"}, source_service="webhooks")
        await uow.commit()
    await services.bus.drain()


async def test_initiate_creates_the_room_the_tokens_and_the_encounter(client, clinic, video
                                                                     ) -> None:
    stand_in, url = video
    patient, appointment = await visit(client, clinic)
    doctor = clinic["doctor_user"]["headers"]
    session = data(await client.post(
        f"/api/appointments/{appointment['id']}/telemedicine/initiate", headers=doctor), 201)
    room = session["room_name"]
    assert room in stand_in.rooms and stand_in.calls == ["CreateRoom"]
    assert (session["status"], session["video_url"]) == ("planned", url.replace("http", "ws"))
    doctor_claims = jwt.decode(session["doctor_token"], API_SECRET, algorithms=["HS256"])
    assert doctor_claims["sub"] == f"Practitioner/{clinic['doctor']['id']}"
    assert (doctor_claims["video"]["roomJoin"], doctor_claims["video"]["room"]) == (True, room)
    assert doctor_claims["name"] == "Dr. Wanjiru Kamau"
    patient_claims = jwt.decode(session["patient_token"], API_SECRET, algorithms=["HS256"])
    assert patient_claims["sub"] == f"Patient/{patient['patient_id']}"
    encounter = (await client.get(f"/fhir/Encounter/{session['session_id']}",
                                  headers=clinic["admin"]["headers"])).json()
    assert encounter["class"]["code"] == "VR"
    assert encounter["identifier"] == [{"system": ROOM_SYSTEM, "value": room}]
    assert encounter["appointment"] == [{"reference": f"Appointment/{appointment['id']}"}]
    assert encounter["subject"] == {"reference": f"Patient/{patient['patient_id']}"}
    # the patient gets the same session, with their own token only
    again = data(await client.post(
        f"/api/appointments/{appointment['id']}/telemedicine/initiate",
        headers=patient["headers"]), 201)
    assert (again["session_id"], again["doctor_token"]) == (session["session_id"], None)
    assert again["patient_token"]


async def test_video_events_keep_the_session_current_once_each(client, clinic, video, app
                                                               ) -> None:
    stand_in, _ = video
    patient, appointment = await visit(client, clinic)
    base = f"/api/appointments/{appointment['id']}/telemedicine"
    session = data(await client.post(f"{base}/initiate", headers=clinic["admin"]["headers"]),
                   201)
    room, sid = session["room_name"], session["session_id"]
    doctor_identity = f"Practitioner/{clinic['doctor']['id']}"
    patient_identity = f"Patient/{patient['patient_id']}"
    await publish(app, "room_started", room, created_at=1_795_000_000)
    await publish(app, "participant_joined", room, doctor_identity, created_at=1_795_000_010)
    await publish(app, "participant_joined", room, patient_identity, created_at=1_795_000_030)
    await publish(app, "participant_joined", room, patient_identity, created_at=1_795_000_030)
    await publish(app, "track_published", room, patient_identity, event_id="TR_1")
    await publish(app, "participant_left", room, patient_identity, created_at=1_795_000_600)
    await publish(app, "room_started", "someone-elses-room")  # not a visit: ignored
    status = data(await client.get(f"{base}/status/{sid}", headers=patient["headers"]))
    assert (status["status"], status["started_at"]) == ("in-progress", "2026-11-18T11:06:40Z")
    assert [(p["identity"], p["role"], p["joined_at"], p["left_at"])
            for p in status["participants"]] == [
        (doctor_identity, "doctor", "2026-11-18T11:06:50Z", None),
        (patient_identity, "patient", "2026-11-18T11:07:10Z", "2026-11-18T11:16:40Z")]
    # the doctor is in the room now, as the platform says
    stand_in.join(session["doctor_token"])
    present = data(await client.get(f"{base}/{sid}/participants",
                                    headers=clinic["doctor_user"]["headers"]))
    assert [(p["identity"], p["connected"]) for p in present["participants"]] == [
        (doctor_identity, True), (patient_identity, False)]
    await publish(app, "room_finished", room, created_at=1_795_001_000)
    finished = data(await client.get(f"{base}/status/{sid}", headers=clinic["admin"][
        "headers"]))
    assert (finished["status"], finished["ended_at"]) == ("finished", "2026-11-18T11:23:20Z")
    assert finished["participants"][0]["left_at"] == "2026-11-18T11:23:20Z"
    services = app.state.services
    assert await services.store.count_documents("video_events") == 6
    assert await services.store.count_documents("dead_letters") == 0


async def test_end_closes_the_room_and_fulfils_the_appointment(client, clinic, video, app
                                                                ) -> None:
    stand_in, _ = video
    patient, appointment = await visit(client, clinic)
    base = f"/api/appointments/{appointment['id']}/telemedicine"
    session = data(await client.post(f"{base}/initiate", headers=clinic["admin"]["headers"]),
                   201)
    sid = session["session_id"]
    assert refusal(await client.post(f"{base}/end/{sid}", headers=patient["headers"])) == (
        403, "FORBIDDEN")
    ended = data(await client.post(f"{base}/end/{sid}", headers=clinic["doctor_user"][
        "headers"]))
    assert ended["status"] == "finished" and ended["ended_at"]
    assert session["room_name"] not in stand_in.rooms
    assert data(await client.get(f"/api/appointments/{appointment['id']}",
                                 headers=patient["headers"]))["status"] == "fulfilled"
    again = data(await client.post(f"{base}/end/{sid}", headers=clinic["admin"]["headers"]))
    assert again["status"] == "finished"
    # a finished appointment starts no new visit
    assert refusal(await client.post(f"{base}/initiate", headers=clinic["admin"]["headers"])
                   ) == (409, "APPOINTMENT_NOT_BOOKED")
    participants = data(await client.get(f"{base}/{sid}/participants",
                                         headers=clinic["admin"]["headers"]))
    assert participants["status"] == "finished"


async def test_who_may_start_and_watch_a_visit(client, clinic, other_clinic, video) -> None:
    _, appointment = await visit(client, clinic)
    base = f"/api/appointments/{appointment['id']}/telemedicine"
    stranger = await register_and_login(client, first_name="Juma", last_name="Hassan")
    for who in (stranger["headers"], other_clinic["admin"]["headers"]):
        assert refusal(await client.post(f"{base}/initiate", headers=who)) == (
            403, "FORBIDDEN")
    assert (await client.post(f"{base}/initiate")).status_code == 401
    session = data(await client.post(f"{base}/initiate",
                                     headers=clinic["nurse"]["headers"]), 201)
    sid = session["session_id"]
    assert refusal(await client.get(f"{base}/status/{sid}", headers=stranger["headers"])
                   ) == (403, "FORBIDDEN")
    assert refusal(await client.get(f"{base}/{sid}/participants",
                                    headers=stranger["headers"])) == (403, "FORBIDDEN")
    assert refusal(await client.post(f"{base}/end/{sid}", headers=other_clinic["admin"][
        "headers"])) == (403, "FORBIDDEN")
    assert refusal(await client.get(f"{base}/status/not-a-session",
                                    headers=clinic["admin"]["headers"])) == (404, "NOT_FOUND")
    other = data(await client.post("/api/appointments", json=booking(
        clinic["doctor"]["id"], tomorrow(), 11, patient_email="other@example.org")), 201)
    assert refusal(await client.get(
        f"/api/appointments/{other['id']}/telemedicine/status/{sid}",
        headers=clinic["admin"]["headers"])) == (404, "NOT_FOUND")


async def test_without_a_video_platform_visits_are_refused_clearly(tmp_path) -> None:
    async with served(make_settings(tmp_path)) as (_app, client):
        admin, _doctor, made = await booked_clinic(client)
        refused = await client.post(f"/api/appointments/{made['id']}/telemedicine/initiate",
                                    headers=admin["headers"])
        assert refusal(refused) == (503, "VIDEO_NOT_CONFIGURED")


async def test_a_platform_that_refuses_is_a_502(tmp_path, video) -> None:
    wrong = make_settings(tmp_path, video_url=video[1], video_api_key=API_KEY,
                          video_api_secret="not-the-secret-the-platform-knows-0000")
    async with served(wrong) as (_app, client):
        admin, _doctor, made = await booked_clinic(client)
        refused = await client.post(f"/api/appointments/{made['id']}/telemedicine/initiate",
                                    headers=admin["headers"])
        assert refusal(refused) == (502, "VIDEO_PLATFORM_ERROR")
        assert "unauthenticated" in refused.json()["error"]["message"]

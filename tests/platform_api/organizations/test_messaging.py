"""Conversations and messages as FHIR Communication: members see only the conversations
they take part in, patients take part through their own record, and new messages are
pushed to connected clients over server-sent events (tested with a real HTTP client
against the app served by uvicorn on a local port)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from httpx_sse import aconnect_sse

from tests.conftest import register_and_login
from tests.platform_api.clinic import Clinic, refusal

FHIR = {"Content-Type": "application/fhir+json"}


def url(clinic: Clinic, *rest: str) -> str:
    return "/".join([f"/api/organizations/{clinic.org_id}/conversations", *rest])


async def start(clinic: Clinic, who: str = "doctor", **body: Any) -> Any:
    return await clinic.post(who, url(clinic), {
        "subject": "Amina Odhiambo: haemoglobin after transfusion",
        "participants": [{"user_id": clinic.user_id("nurse")},
                         {"patient_id": clinic.patient_id}],
        "message": "Please repeat the haemoglobin at 18:00.", **body})


async def test_a_conversation_is_started_with_members_and_a_patient(clinic: Clinic):
    started = await start(clinic)
    assert started.status_code == 201, started.text
    conversation = started.json()["data"]
    assert conversation["subject"] == "Amina Odhiambo: haemoglobin after transfusion"
    people = {(p["user_id"], p["patient_id"]) for p in conversation["participants"]}
    assert people == {(clinic.user_id("doctor"), None), (clinic.user_id("nurse"), None),
                      (None, clinic.patient_id)}
    assert conversation["created_by"] == clinic.user_id("doctor")
    fhir = (await clinic.get("doctor", f"/fhir/Communication/{conversation['id']}")).json()
    assert fhir["subject"]["reference"] == f"Patient/{clinic.patient_id}"
    first = (await clinic.get("nurse", url(clinic, conversation["id"], "messages"))).json()
    assert [m["text"] for m in first["data"]] == ["Please repeat the haemoglobin at 18:00."]


async def test_members_see_only_the_conversations_they_take_part_in(clinic: Clinic):
    conversation = (await start(clinic)).json()["data"]
    for who in ("doctor", "nurse"):
        listed = (await clinic.get(who, url(clinic))).json()
        assert [c["id"] for c in listed["data"]] == [conversation["id"]], who
    outsider = (await clinic.get("admin", url(clinic))).json()
    assert outsider["data"] == [] and outsider["meta"]["total"] == 0
    assert refusal(await clinic.get("admin", url(clinic, conversation["id"], "messages"))) == (
        404, "NOT_FOUND")
    assert refusal(await clinic.post("admin", url(clinic, conversation["id"], "messages"),
                                     {"text": "Hello"})) == (404, "NOT_FOUND")
    everything = (await clinic.get("platform_admin", url(clinic))).json()
    assert everything["meta"]["total"] == 1
    assert refusal(await clinic.get("stranger", url(clinic))) == (403, "FORBIDDEN")


async def test_participants_exchange_messages_oldest_first(clinic: Clinic):
    conversation = (await start(clinic)).json()["data"]
    messages = url(clinic, conversation["id"], "messages")
    sent = await clinic.post("nurse", messages, {"text": "Done: Hb 9.8 g/dL."})
    assert sent.status_code == 201, sent.text
    assert sent.json()["data"]["sender"]["user_id"] == clinic.user_id("nurse")
    listed = (await clinic.get("doctor", messages, limit=1, page=2)).json()
    assert listed["meta"]["total"] == 2
    assert [m["text"] for m in listed["data"]] == ["Done: Hb 9.8 g/dL."]
    empty = await clinic.post("nurse", messages, {"text": ""})
    assert refusal(empty) == (422, "VALIDATION_ERROR") and empty.json()["error"]["field"] == \
        "text"


async def test_a_patient_takes_part_through_their_own_record(clinic: Clinic):
    baraka = await register_and_login(clinic.client, first_name="Baraka", last_name="Mwangi")
    record = await clinic.client.post("/fhir/Patient", headers={**clinic.h("admin"), **FHIR},
                                      json={"resourceType": "Patient",
                                            "name": [{"family": "Mwangi", "given": ["Baraka"]}],
                                            "managingOrganization": {
                                                "reference": f"Organization/{clinic.org_id}"},
                                            "identifier": [{"system": "urn:healthplatform:user",
                                                            "value": baraka["user"]["id"]}]})
    patient_id = record.json()["id"]
    conversation = (await clinic.post("doctor", url(clinic), {
        "subject": "Your results", "participants": [{"patient_id": patient_id}]})).json()["data"]
    mine = await clinic.client.get(url(clinic), headers=baraka["headers"])
    assert mine.status_code == 200, mine.text
    assert [c["id"] for c in mine.json()["data"]] == [conversation["id"]]
    replied = await clinic.client.post(url(clinic, conversation["id"], "messages"),
                                       json={"text": "Asante daktari, I will come on Monday."},
                                       headers=baraka["headers"])
    assert replied.status_code == 201, replied.text
    assert replied.json()["data"]["sender"]["patient_id"] == patient_id
    other = (await start(clinic)).json()["data"]  # about another patient
    assert refusal(await clinic.client.get(url(clinic, other["id"], "messages"),
                                           headers=baraka["headers"])) == (404, "NOT_FOUND")


async def test_conversations_are_refused_to_the_wrong_people_and_participants(clinic: Clinic):
    assert refusal(await start(clinic, who="receptionist")) == (403, "FORBIDDEN")
    assert refusal(await start(clinic, who="stranger")) == (403, "FORBIDDEN")
    outsider = await clinic.post("doctor", url(clinic), {
        "subject": "Rota", "participants": [{"user_id": clinic.user_id("stranger")}]})
    assert refusal(outsider) == (422, "VALIDATION_ERROR")
    assert outsider.json()["error"]["field"] == "participants.0.user_id"
    both = await clinic.post("doctor", url(clinic), {
        "subject": "Rota", "participants": [{"user_id": clinic.user_id("nurse"),
                                             "patient_id": clinic.patient_id}]})
    assert refusal(both) == (422, "VALIDATION_ERROR")


# -- live messages over a real connection ----------------------------------------------------------
@pytest.fixture
async def served(clinic: Clinic) -> AsyncIterator[httpx.AsyncClient]:
    """The app (already started, on this test's event loop) served by uvicorn on a local
    port, and an HTTP client talking to it over TCP. The socket is bound first, so the
    port cannot be taken between choosing it and listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(clinic.app, lifespan="off", log_config=None,
                                           access_log=False, timeout_graceful_shutdown=1))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):  # uvicorn signals nothing but this flag
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as real:
            yield real
    finally:
        server.should_exit = True
        await task
        sock.close()


async def next_event(events: Any, kind: str) -> Any:
    async def wanted() -> Any:
        async for event in events:
            if event.event == kind:
                return event
        raise AssertionError("the stream ended")
    return await asyncio.wait_for(wanted(), timeout=10)


async def test_new_messages_are_pushed_to_a_connected_participant(clinic: Clinic,
                                                                  served: httpx.AsyncClient):
    conversation = (await start(clinic)).json()["data"]
    await clinic.drain()  # the first message went before anyone listened
    stream = url(clinic, conversation["id"], "stream")
    messages = url(clinic, conversation["id"], "messages")
    async with aconnect_sse(served, "GET", stream, headers=clinic.h("nurse")) as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        events = source.aiter_sse()
        await next_event(events, "ready")
        sent = await served.post(messages, json={"text": "BP 100/60, pulse 96."},
                                 headers=clinic.h("doctor"))
        assert sent.status_code == 201, sent.text
        pushed = await next_event(events, "message")
        assert pushed.id == sent.json()["data"]["id"]
        assert pushed.json()["text"] == "BP 100/60, pulse 96."
        assert pushed.json()["sender"]["user_id"] == clinic.user_id("doctor")
    # A client reconnecting with Last-Event-ID first gets what it missed.
    missed = (await served.post(messages, json={"text": "Start oral iron tomorrow."},
                                headers=clinic.h("doctor"))).json()["data"]
    async with aconnect_sse(served, "GET", stream, headers={
            **clinic.h("nurse"), "Last-Event-ID": pushed.id}) as source:
        events = source.aiter_sse()
        await next_event(events, "ready")
        replayed = await next_event(events, "message")
        assert replayed.id == missed["id"]


async def test_only_participants_may_open_the_stream(clinic: Clinic,
                                                     served: httpx.AsyncClient):
    conversation = (await start(clinic)).json()["data"]
    stream = url(clinic, conversation["id"], "stream")
    refused = await served.get(stream, headers=clinic.h("admin"))
    assert refusal(refused) == (404, "NOT_FOUND")
    assert (await served.get(stream)).status_code == 401

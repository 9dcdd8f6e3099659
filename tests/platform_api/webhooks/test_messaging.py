"""GET/POST /webhook: the messaging platform's handshake, incoming patient messages as
FHIR Communication matched to the patient by phone, and receipts moving the status of
messages the platform sent."""

from __future__ import annotations

from typing import Any

import pytest

from platform_api.webhooks.messaging import MESSAGE_SYSTEM, READ_AT
from tests.conftest import make_clinic_admin
from tests.platform_api.webhooks.conftest import (
    MESSAGING_TOKEN,
    dead_letters,
    nothing_kept,
)
from tests.platform_api.webhooks.signing import body_of, hub_headers

FHIR = {"Content-Type": "application/fhir+json"}


def notification(*, messages: list[dict[str, Any]] = (), statuses: list[dict[str, Any]] = (),
                 contacts: list[dict[str, Any]] = ()) -> dict[str, Any]:
    value: dict[str, Any] = {"messaging_product": "whatsapp", "metadata": {
        "display_phone_number": "254709876543", "phone_number_id": "106540352242922"}}
    if messages:
        value.update(messages=list(messages), contacts=list(contacts))
    if statuses:
        value["statuses"] = list(statuses)
    return {"object": "whatsapp_business_account",
            "entry": [{"id": "102290129340398", "changes": [{"field": "messages",
                                                             "value": value}]}]}


def text_message(wamid: str, sender: str, text: str) -> dict[str, Any]:
    return {"from": sender, "id": wamid, "timestamp": "1764061200", "type": "text",
            "text": {"body": text}}


async def send(secure: Any, payload: dict[str, Any] | bytes) -> Any:
    body = body_of(payload)
    return await secure.post("/webhook", content=body, headers=hub_headers(body))


@pytest.fixture
async def clinic(client: Any) -> dict[str, Any]:
    admin = await make_clinic_admin(client)
    response = await client.post(f"/api/organizations/{admin['org_id']}/patients",
                                 headers=admin["headers"], json={
                                     "first_name": "Amina", "last_name": "Odhiambo",
                                     "date_of_birth": "1988-04-12", "gender": "female",
                                     "phone": "+254712345678"})
    assert response.status_code == 201, response.text
    return {**admin, "patient_id": response.json()["data"]["id"]}


async def communications(client: Any, headers: dict[str, str], **params: str
                         ) -> list[dict[str, Any]]:
    bundle = (await client.get("/fhir/Communication", params=params, headers=headers)).json()
    return [e["resource"] for e in bundle.get("entry", [])]


async def test_the_handshake_echoes_the_challenge_for_the_right_token(secure):
    ok = await secure.get("/webhook", params={"hub.mode": "subscribe",
                                              "hub.verify_token": MESSAGING_TOKEN,
                                              "hub.challenge": "1158201444"})
    assert (ok.status_code, ok.text) == (200, "1158201444")
    assert ok.headers["content-type"].startswith("text/plain")
    for params in ({"hub.mode": "subscribe", "hub.verify_token": "guess", "hub.challenge": "1"},
                   {"hub.mode": "unsubscribe", "hub.verify_token": MESSAGING_TOKEN,
                    "hub.challenge": "1"}, {}):
        assert (await secure.get("/webhook", params=params)).status_code == 403


async def test_a_patients_message_becomes_a_communication_of_their_record(
        app, client, secure, clinic):
    response = await send(secure, notification(
        messages=[text_message("wamid.HBgMMjU0NzEyMzQ1Njc4FQIAEhggQ0", "254712345678",
                               "Habari daktari, my BP readings are higher this week")],
        contacts=[{"profile": {"name": "Amina O."}, "wa_id": "254712345678"}]))
    assert response.status_code == 200
    await app.state.services.bus.drain()
    [message] = await communications(client, clinic["headers"],
                                     subject=f"Patient/{clinic['patient_id']}")
    assert message["identifier"] == [{"system": MESSAGE_SYSTEM,
                                      "value": "wamid.HBgMMjU0NzEyMzQ1Njc4FQIAEhggQ0"}]
    assert message["status"] == "completed"
    assert message["sender"] == {"reference": f"Patient/{clinic['patient_id']}"}
    assert message["sent"] == "2025-11-25T09:00:00Z"
    assert message["payload"] == [
        {"contentString": "Habari daktari, my BP readings are higher this week"}]
    assert message["medium"][0]["text"] == "WhatsApp"
    # owned as the patient is: the clinic's staff reach it, others do not
    owners = {c["code"] for c in message["meta"]["security"]}
    assert owners == {clinic["org_id"]}
    stranger = await make_clinic_admin(client, name="Mombasa Road Clinic")
    assert await communications(client, stranger["headers"],
                                subject=f"Patient/{clinic['patient_id']}") == []


async def test_a_message_from_an_unknown_number_is_kept_with_the_number_as_sender(
        app, client, secure, admin):
    image = {"from": "256772123456", "id": "wamid.unknown1", "timestamp": "1764061260",
             "type": "image", "image": {"id": "1479537139650973", "mime_type": "image/jpeg",
                                        "caption": "rash on the arm"}}
    await send(secure, notification(messages=[image], contacts=[
        {"profile": {"name": "Okello"}, "wa_id": "256772123456"}]))
    await app.state.services.bus.drain()
    [message] = await communications(client, admin["headers"],
                                     identifier=f"{MESSAGE_SYSTEM}|wamid.unknown1")
    assert message["sender"] == {"identifier": {"system": "urn:healthplatform:whatsapp",
                                                "value": "256772123456"}, "display": "Okello"}
    assert "subject" not in message
    assert message["payload"][0]["contentAttachment"] == {
        "contentType": "image/jpeg", "title": "rash on the arm",
        "url": "urn:healthplatform:whatsapp-media:1479537139650973"}


async def test_receipts_move_a_sent_message_forward_only(app, client, secure, clinic):
    sent = await client.post("/fhir/Communication", headers={**clinic["headers"], **FHIR},
                             json={"resourceType": "Communication", "status": "in-progress",
                                   "identifier": [{"system": MESSAGE_SYSTEM,
                                                   "value": "wamid.OUT123"}],
                                   "subject": {"reference": f"Patient/{clinic['patient_id']}"},
                                   "payload": [{"contentString": "Your appointment is at 10:00"}]})
    assert sent.status_code == 201, sent.text

    def receipt(status: str, at: str) -> dict[str, Any]:
        return {"id": "wamid.OUT123", "status": status, "timestamp": at,
                "recipient_id": "254712345678"}
    await send(secure, notification(statuses=[receipt("delivered", "1764061300")]))
    await app.state.services.bus.drain()
    [message] = await communications(client, clinic["headers"],
                                      identifier=f"{MESSAGE_SYSTEM}|wamid.OUT123")
    assert (message["status"], message["received"]) == ("completed", "2025-11-25T09:01:40Z")
    await send(secure, notification(statuses=[receipt("read", "1764061400")]))
    await send(secure, notification(statuses=[receipt("failed", "1764061500")]))  # too late
    await app.state.services.bus.drain()
    [message] = await communications(client, clinic["headers"],
                                      identifier=f"{MESSAGE_SYSTEM}|wamid.OUT123")
    assert message["status"] == "completed"
    assert message["extension"] == [{"url": READ_AT, "valueDateTime": "2025-11-25T09:03:20Z"}]
    assert message["meta"]["versionId"] == "3"


async def test_a_failed_receipt_marks_the_message_not_done(app, client, secure, clinic):
    await client.post("/fhir/Communication", headers={**clinic["headers"], **FHIR},
                      json={"resourceType": "Communication", "status": "in-progress",
                            "identifier": [{"system": MESSAGE_SYSTEM, "value": "wamid.F1"}],
                            "subject": {"reference": f"Patient/{clinic['patient_id']}"}})
    await send(secure, notification(statuses=[{
        "id": "wamid.F1", "status": "failed", "timestamp": "1764061300",
        "errors": [{"code": 131026, "title": "Message undeliverable"}]}]))
    await app.state.services.bus.drain()
    [message] = await communications(client, clinic["headers"],
                                      identifier=f"{MESSAGE_SYSTEM}|wamid.F1")
    assert message["status"] == "not-done"
    assert message["statusReason"] == {"text": "Message undeliverable"}


async def test_a_receipt_for_an_unknown_message_is_kept_as_a_dead_letter(app, secure):
    await send(secure, notification(statuses=[{"id": "wamid.NOPE", "status": "read",
                                                "timestamp": "1764061300"}]))
    [entry] = await dead_letters(app)
    assert entry["consumer"] == "messaging_events"
    assert "no Communication has the message id wamid.NOPE" in entry["error"]


async def test_each_item_is_processed_once_across_redeliveries(app, client, secure, clinic):
    first = text_message("wamid.A1", "254712345678", "Asante")
    await send(secure, notification(messages=[first]))
    again = await send(secure, notification(messages=[first]))
    assert again.json()["data"]["duplicate"] is True
    second = text_message("wamid.A2", "254712345678", "Nitakuja kesho")
    mixed = await send(secure, notification(messages=[first, second]))
    assert mixed.json()["data"] == {"received": True, "duplicate": False,
                                    "event_ids": ["message:wamid.A1", "message:wamid.A2"]}
    await app.state.services.bus.drain()
    found = await communications(client, clinic["headers"],
                                 subject=f"Patient/{clinic['patient_id']}")
    assert sorted(c["identifier"][0]["value"] for c in found) == ["wamid.A1", "wamid.A2"]


async def test_a_notification_with_nothing_in_it_is_acknowledged(app, secure):
    response = await send(secure, notification())
    assert response.json()["data"] == {"received": True, "duplicate": False, "event_ids": []}
    assert await dead_letters(app) == []


async def test_unsigned_or_wrongly_signed_notifications_are_401(app, secure, published):
    body = body_of(notification(messages=[text_message("wamid.X", "254712345678", "hi")]))
    for headers in ({}, {"X-Hub-Signature-256": "sha256=" + "0" * 64},
                    {"X-Hub-Signature-256": "md5=abc"},
                    hub_headers(body, secret="not-the-app-secret")):
        response = await secure.post("/webhook", content=body, headers=headers)
        assert response.status_code == 401
    assert await nothing_kept(app, published)


async def test_a_signed_body_that_is_not_a_notification_becomes_a_dead_letter(app, secure):
    assert (await send(secure, b"[1, 2")).status_code == 200
    assert (await send(secure, {"object": "page"})).status_code == 200
    assert (await send(secure, notification(statuses=[{"id": "w", "status": "lost"}]))
            ).status_code == 200
    entries = await dead_letters(app)
    assert [e["error"] for e in entries][1:] == [
        "malformed messaging webhook body: not a notification: it needs an entry list",
        "malformed messaging webhook body: a status without an id or a known status"]

"""POST /api/gtm/webhooks/email-delivery and /inbound: Standard Webhooks signed delivery
events update the mail log and suppress bounced addresses (which the SMTP mailer then
skips); inbound leads are stored for follow-up."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import default as default_policy
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from platform_api.mailer import MAIL_LOG, SUPPRESSIONS, Mailer, MailLog, SmtpConfig
from platform_api.webhooks.gtm import LEADS
from tests.platform_api.webhooks.conftest import (
    INBOUND_SECRET,
    dead_letters,
    nothing_kept,
    recorder,
    stored,
)
from tests.platform_api.webhooks.signing import body_of, standard_headers

DELIVERY = "/api/gtm/webhooks/email-delivery"
INBOUND = "/api/gtm/webhooks/inbound"


def delivery(kind: str, message_id: str, to: str, **data: Any) -> dict[str, Any]:
    return {"type": f"email.{kind}", "created_at": "2026-11-24T08:30:00.000Z",
            "data": {"email_id": "4ef9a417-02e9-4d39-ad75-9611e0fcc33c",
                     "message_id": message_id, "to": [to],
                     "subject": "Reset your healthplatform password", **data}}


async def send(secure: Any, path: str, payload: Any, webhook_id: str, **signing: Any) -> Any:
    body = body_of(payload)
    return await secure.post(path, content=body,
                             headers=standard_headers(body, webhook_id, **signing))


class Inbox:
    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(BytesParser(policy=default_policy).parsebytes(envelope.content))  # type: ignore[arg-type]
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


async def test_the_mailer_logs_what_it_sends_and_skips_suppressed_addresses(app, secure,
                                                                            smtp):
    inbox, port = smtp
    store = app.state.services.store
    mailer = Mailer(SmtpConfig("127.0.0.1", port, "Kliniki <no-reply@kliniki.example>",
                               tls="none"), MailLog(store))
    assert await mailer.send("baraka.mwangi@example.org", "Your results are ready", "Hello")
    [sent] = inbox.messages
    message_id = str(sent["Message-ID"]).strip("<>")
    entry = await store.get_document(MAIL_LOG, message_id)
    assert (entry["to"], entry["status"]) == ("baraka.mwangi@example.org", "sent")
    bounced = delivery("bounced", f"<{message_id}>", "Baraka.Mwangi@example.org",
                       bounce={"type": "Permanent", "message": "550 5.1.1 user unknown"})
    assert (await send(secure, DELIVERY, bounced, "msg_2Kq1")).status_code == 200
    await app.state.services.bus.drain()
    entry = await store.get_document(MAIL_LOG, message_id)
    assert entry["status"] == "bounced"
    assert [e["type"] for e in entry["events"]] == ["bounced"]
    suppression = await store.get_document(SUPPRESSIONS, "baraka.mwangi@example.org")
    assert (suppression["reason"], suppression["detail"]) == ("bounced",
                                                              "550 5.1.1 user unknown")
    assert await mailer.send("baraka.mwangi@example.org", "Your results are ready",
                             "Hello") is False
    assert await mailer.send("zawadi.njeri@example.org", "Welcome", "Karibu")
    assert [m["To"] for m in inbox.messages] == ["baraka.mwangi@example.org",
                                                 "zawadi.njeri@example.org"]


async def test_delivery_events_move_the_log_forward_and_complaints_suppress(app, secure):
    store = app.state.services.store
    for n, kind in enumerate(("delivered", "opened", "delivered")):
        await send(secure, DELIVERY, delivery(kind, "<m1@kliniki.example>",
                                              "achieng@example.org"), f"msg_a{n}")
    await app.state.services.bus.drain()
    entry = await store.get_document(MAIL_LOG, "m1@kliniki.example")
    assert entry["status"] == "opened"  # a late "delivered" does not move it back
    assert [e["type"] for e in entry["events"]] == ["delivered", "opened", "delivered"]
    assert await store.count_documents(SUPPRESSIONS) == 0
    await send(secure, DELIVERY, delivery("bounced", "<m2@kliniki.example>",
                                          "temp@example.org", bounce={"type": "Transient"}),
               "msg_b1")
    await send(secure, DELIVERY, delivery("complained", "<m3@kliniki.example>",
                                          "kamau@example.org"), "msg_c1")
    await app.state.services.bus.drain()
    assert [s["id"] for s in await stored(app, SUPPRESSIONS)] == ["kamau@example.org"]


async def test_a_delivery_event_that_is_not_one_becomes_a_dead_letter(app, secure):
    await send(secure, DELIVERY, {"type": "email.teleported", "data": {}}, "msg_d1")
    await send(secure, DELIVERY, {"type": "email.delivered", "data": {"to": []}}, "msg_d2")
    await send(secure, DELIVERY, b"not json", "msg_d3")
    entries = await dead_letters(app)
    assert sorted(e["error"] for e in entries if e["consumer"]) == [
        "rejected: a delivery event needs data.message_id (or email_id) and data.to",
        "rejected: not a delivery event: type 'email.teleported'"]
    [malformed] = [e for e in entries if e["consumer"] is None]
    assert malformed["error"].startswith("malformed email_delivery webhook body: not JSON")
    assert malformed["original_payload"] == "not json"


async def test_an_inbound_lead_is_stored_for_follow_up(app, secure):
    seen = recorder(app, "platform.gtm.lead_received", "sales_follow_up")
    lead = {"type": "form.submitted", "data": {
        "first_name": "Halima", "last_name": "Yusuf", "email": "halima@nakuru-clinic.example",
        "phone": "+254722000111", "company": "Nakuru Family Clinic", "country": "KE",
        "message": "We run 3 clinics and want lab results over HL7", "form": "demo-request"}}
    response = await send(secure, INBOUND, lead, "msg_lead_01", secret=INBOUND_SECRET)
    assert response.status_code == 200
    await app.state.services.bus.drain()
    [stored_lead] = await stored(app, LEADS)
    assert stored_lead == {**stored_lead, "id": "msg_lead_01", "name": "Halima Yusuf",
                           "email": "halima@nakuru-clinic.example", "phone": "+254722000111",
                           "organization": "Nakuru Family Clinic", "source": "demo-request",
                           "country": "KE", "status": "new"}
    assert [e["payload"] for e in seen] == [{"lead_id": "msg_lead_01",
                                             "source": "demo-request",
                                             "organization": "Nakuru Family Clinic"}]
    again = await send(secure, INBOUND, lead, "msg_lead_01", secret=INBOUND_SECRET)
    assert again.json()["data"]["duplicate"] is True


async def test_a_lead_with_no_way_to_reach_it_becomes_a_dead_letter(app, secure):
    await send(secure, INBOUND, {"name": "Anonymous"}, "msg_lead_02", secret=INBOUND_SECRET)
    [entry] = await dead_letters(app)
    assert (entry["consumer"], entry["error"]) == (
        "inbound_leads", "rejected: a lead needs an email or a phone to follow up")


@pytest.mark.parametrize("path", [DELIVERY, INBOUND])
async def test_unsigned_wrongly_signed_or_stale_requests_are_401(app, secure, published,
                                                                 path):
    body = body_of(delivery("delivered", "<m@x>", "a@example.org"))
    secret = INBOUND_SECRET if path == INBOUND else None
    signing = {"secret": secret} if secret else {}
    good = standard_headers(body, "msg_x", **signing)
    cases = {
        "unsigned": {},
        "wrong secret": standard_headers(body, "msg_x", secret="whsec_" + "A" * 40),
        "stale": standard_headers(body, "msg_x", age=timedelta(minutes=6), **signing),
        "id changed": {**good, "webhook-id": "msg_y"},
        "malformed signature": {**good, "webhook-signature": "v1 nocomma"},
    }
    for name, headers in cases.items():
        response = await secure.post(path, content=body, headers=headers)
        assert response.status_code == 401, name
    stale = await secure.post(path, content=body, headers=cases["stale"])
    assert "too old" in stale.json()["error"]["message"]
    assert await nothing_kept(app, published)


async def test_a_redelivered_delivery_event_is_counted_once(app, secure):
    event = delivery("delivered", "<m9@kliniki.example>", "wanjiru@example.org")
    first = await send(secure, DELIVERY, event, "msg_once")
    again = await send(secure, DELIVERY, event, "msg_once")
    assert (first.json()["data"]["duplicate"], again.json()["data"]["duplicate"]) == (False,
                                                                                      True)
    await app.state.services.bus.drain()
    entry = await app.state.services.store.get_document(MAIL_LOG, "m9@kliniki.example")
    assert len(entry["events"]) == 1


async def test_a_signed_lead_that_is_not_a_json_object_becomes_a_dead_letter(app, secure):
    response = await send(secure, INBOUND, b'["Halima", "Yusuf"]', "msg_lead_03",
                          secret=INBOUND_SECRET)
    assert response.status_code == 200
    [entry] = await dead_letters(app)
    assert entry["error"] == "malformed inbound_lead webhook body: not a JSON object"
    assert entry["original_payload"] == '["Halima", "Yusuf"]'

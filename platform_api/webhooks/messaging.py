"""``GET /webhook`` and ``POST /webhook``: the messaging platform (WhatsApp Cloud API style).

``GET /webhook`` is the subscription handshake: ``hub.mode=subscribe`` with
``hub.verify_token`` equal to ``HEALTHPLATFORM_MESSAGING_VERIFY_TOKEN`` (compared in
constant time) is answered with ``hub.challenge`` as plain text; anything else is 403.

``POST /webhook`` notifications are signed with ``X-Hub-Signature-256: sha256=<hex
HMAC-SHA256 of the body with HEALTHPLATFORM_MESSAGING_APP_SECRET>`` (no library of the
platform's does it; the standard library's ``hmac`` with a constant-time compare). A
notification batches ``entry[].changes[].value`` items: ``messages`` (a patient wrote)
and ``statuses`` (receipts of messages the platform sent). Each item is its own event:
id ``message:<wamid>`` or ``status:<wamid>:<status>``, so a redelivered batch, or an item
repeated in another batch, is processed once.

Mapping (consumer ``messaging_events``):

- an incoming message → FHIR **Communication**: ``identifier`` ``urn:healthplatform:
  whatsapp-message|<wamid>``, ``status`` completed, ``medium`` WhatsApp,
  ``sent`` (the message's time), ``received`` (now), ``payload[0].contentString`` (the
  text, a caption, a location or what was sent), media as ``contentAttachment``
  (``contentType``, ``url`` ``urn:healthplatform:whatsapp-media:<media id>``);
  ``subject`` and ``sender`` the **Patient** whose ``telecom`` phone is the sender's
  number (``Patient?phone=+<number>``; one Communication per matching record, each owned
  as its patient is); with no match, ``sender`` is the number as an identifier
  (``urn:healthplatform:whatsapp|<number>``, display the profile name) and no subject,
  for platform administrators to match. Created conditionally on the identifier and
  subject, so it exists once.
- a receipt → the Communications with that identifier: ``sent`` → in-progress,
  ``delivered`` → completed with ``received`` the receipt's time, ``read`` → completed
  with the extension ``urn:healthplatform:extension:read-at`` (R4 has no read status),
  ``failed`` → not-done with ``statusReason`` the platform's error. A receipt never moves
  a message back (a late ``delivered`` after ``read`` changes nothing). A receipt for a
  message not (yet) recorded fails, is retried, and is kept as a dead letter.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse

from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from platform_api.envelope import ApiError, Envelope
from platform_api.events import Event, RejectedEvent, mark_handled
from platform_api.services import Services, request_services
from platform_api.webhooks.inbound import (
    PLATFORM_BODY,
    REFUSALS,
    TOPIC_PREFIX,
    Inbound,
    WebhookAck,
    accept,
    configured,
    dead_letter_body,
    parse_json,
    refuse,
    require_https,
)

FAMILY = "messaging"
TOPIC = TOPIC_PREFIX + FAMILY
CONSUMER = "messaging_events"
MESSAGE_SYSTEM = "urn:healthplatform:whatsapp-message"
SENDER_SYSTEM = "urn:healthplatform:whatsapp"
MEDIA_URL = "urn:healthplatform:whatsapp-media:"
READ_AT = "urn:healthplatform:extension:read-at"
MEDIUM = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-ParticipationMode",
                      "code": "WRITTEN", "display": "written"}], "text": "WhatsApp"}
MAX_MATCHES = 10  # patient records one number may reach (one per organization, usually)
# How far each receipt takes a message; never backwards.
RECEIPT_RANK = {"sent": 1, "delivered": 2, "read": 3, "failed": 4}
JSON = dict[str, Any]

router = APIRouter(tags=["webhooks"])


@router.get("/webhook", response_class=PlainTextResponse,
            summary="Messaging platform verification handshake",
            responses={200: {"content": {"text/plain": {}}, "description": "hub.challenge"},
                       **{status: {**REFUSALS[status], "content": {"application/json": {
                           "schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}}}
                          for status in (403, 503)}})
async def messaging_handshake(
    request: Request,
    mode: str = Query("", alias="hub.mode"),
    verify_token: str = Query("", alias="hub.verify_token"),
    challenge: str = Query("", alias="hub.challenge", max_length=512),
) -> Any:
    require_https(request, FAMILY)
    expected = configured(request_services(request).settings.messaging_verify_token, FAMILY,
                          "MESSAGING_VERIFY_TOKEN")
    if mode != "subscribe" or not hmac.compare_digest(verify_token.encode(), expected.encode()):
        raise ApiError(403, "FORBIDDEN", "Verification refused: wrong hub.mode or "
                       "hub.verify_token")
    return PlainTextResponse(challenge)


@router.post("/webhook", response_model=Envelope[WebhookAck],
             responses=REFUSALS, openapi_extra=PLATFORM_BODY,
             summary="Messaging platform notifications (X-Hub-Signature-256)")
async def messaging_webhook(request: Request) -> Any:
    require_https(request, FAMILY)
    services = request_services(request)
    secret = configured(services.settings.messaging_app_secret, FAMILY,
                        "MESSAGING_APP_SECRET")
    body = await request.body()
    signature = request.headers.get("x-hub-signature-256", "")
    if not signature.startswith("sha256="):
        raise refuse(FAMILY, request, "no X-Hub-Signature-256 sha256= signature")
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(signature[7:].strip().lower().encode(), expected.encode()):
        raise refuse(FAMILY, request, "the signature does not match the body")
    try:
        items = notification_items(parse_json(body))
    except ValueError as exc:
        return await dead_letter_body(services, FAMILY, body, str(exc))
    return await accept(services, FAMILY, items)


def notification_items(notification: Any) -> list[Inbound]:
    """The messages and receipts of a notification, one event each."""
    if not isinstance(notification, dict) or not isinstance(notification.get("entry"), list):
        raise ValueError("not a notification: it needs an entry list")
    items = []
    for entry in notification["entry"]:
        for change in (entry.get("changes") or []) if isinstance(entry, dict) else []:
            value = change.get("value") if isinstance(change, dict) else None
            if not isinstance(value, dict):
                continue
            context = {"metadata": value.get("metadata") or {},
                       "contacts": value.get("contacts") or []}
            for message in value.get("messages") or []:
                if not isinstance(message, dict) or not message.get("id"):
                    raise ValueError("a message without an id")
                items.append(Inbound(f"message:{message['id']}", TOPIC,
                                     {"kind": "message", "message": message, **context}))
            for status in value.get("statuses") or []:
                if not isinstance(status, dict) or not status.get("id") or \
                        status.get("status") not in RECEIPT_RANK:
                    raise ValueError("a status without an id or a known status")
                items.append(Inbound(f"status:{status['id']}:{status['status']}", TOPIC,
                                     {"kind": "status", "status": status}))
    return items


# -- the consumer -------------------------------------------------------------------------------
def install(services: Services) -> None:
    # The provider's messages come from no caller: they are recorded with rights elevated
    # once, here (the senders' patients are anyone's).
    fhir = services.policy.elevate("messaging webhook: record inbound messages and delivery "
                                   "receipts as Communications")

    async def messaging_events(event: Event) -> None:
        payload = event["payload"]
        if payload.get("kind") == "message":
            await record_message(fhir, event)
        else:
            await apply_receipt(fhir, event)
    services.bus.subscribe(TOPIC, messaging_events, consumer=CONSUMER)


def _instant(epoch: Any) -> str:
    try:
        return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError):
        return now_instant()


def _content(message: JSON) -> JSON:
    """The Communication.payload of a message."""
    kind = message.get("type", "text")
    if kind == "text":
        return {"contentString": str((message.get("text") or {}).get("body", ""))}
    if kind == "location":
        place = message.get("location") or {}
        return {"contentString": f"Location: {place.get('name') or ''} "
                f"({place.get('latitude')}, {place.get('longitude')})".strip()}
    media = message.get(kind)
    if isinstance(media, dict) and media.get("id"):
        return {"contentAttachment": {
            "contentType": media.get("mime_type", "application/octet-stream"),
            "url": MEDIA_URL + str(media["id"]),
            "title": media.get("caption") or media.get("filename") or kind}}
    return {"contentString": f"[{kind} message]"}


async def record_message(fhir: CallerFhir, event: Event) -> None:
    payload = event["payload"]
    message = payload["message"]
    number = str(message.get("from", "")).lstrip("+")
    if not number.isdigit():
        raise RejectedEvent(f"message {message.get('id')} has no sender number")
    patients = await fhir.match_ids("Patient", [("phone", f"+{number},{number}")], MAX_MATCHES)
    name = next((c.get("profile", {}).get("name") for c in payload.get("contacts") or []
                 if isinstance(c, dict) and c.get("wa_id") == number), None)
    base = {
        "resourceType": "Communication",
        "identifier": [{"system": MESSAGE_SYSTEM, "value": message["id"]}],
        "status": "completed", "medium": [MEDIUM],
        "sent": _instant(message.get("timestamp")), "received": now_instant(),
        "payload": [_content(message)],
    }
    async with fhir.unit() as unit:
        if not patients:
            sender: JSON = {"identifier": {"system": SENDER_SYSTEM, "value": number}}
            if name:
                sender["display"] = name
            await unit.create({**base, "sender": sender}, expected_type="Communication",
                              if_none_exist=[("identifier", f"{MESSAGE_SYSTEM}|{message['id']}")])
        for patient_id in patients:
            reference = {"reference": f"Patient/{patient_id}"}
            await unit.create({**base, "subject": reference, "sender": reference},
                              expected_type="Communication", if_none_exist=[
                                  ("identifier", f"{MESSAGE_SYSTEM}|{message['id']}"),
                                  ("subject", f"Patient/{patient_id}")])
        mark_handled(unit, CONSUMER, event)
        await unit.commit()


def _reached(communication: JSON) -> int:
    """How far a sent message has got, on the scale of RECEIPT_RANK."""
    if communication.get("status") == "not-done":
        return RECEIPT_RANK["failed"]
    if any(e.get("url") == READ_AT for e in communication.get("extension") or []):
        return RECEIPT_RANK["read"]
    return {"in-progress": 1, "completed": 2}.get(str(communication.get("status")), 0)


def _received(communication: JSON, status: JSON) -> JSON:
    """The Communication after a receipt; the same object when the receipt would move it
    backwards (or fail a message already delivered)."""
    kind, reached = status["status"], _reached(communication)
    if RECEIPT_RANK[kind] <= reached or (kind == "failed" and reached >= 2):
        return communication
    at = _instant(status.get("timestamp"))
    changed = dict(communication)
    if kind == "sent":
        changed["status"] = "in-progress"
    elif kind == "delivered":
        changed.update(status="completed", received=at)
    elif kind == "read":
        changed.update(status="completed", received=changed.get("received", at))
        changed["extension"] = [*(communication.get("extension") or []),
                                {"url": READ_AT, "valueDateTime": at}]
    else:
        errors = status.get("errors") or [{}]
        changed.update(status="not-done", statusReason={
            "text": str(errors[0].get("title") or errors[0].get("message") or "failed")})
    return changed


async def apply_receipt(fhir: CallerFhir, event: Event) -> None:
    status = event["payload"]["status"]
    found = await fhir.search("Communication",
                              [("identifier", f"{MESSAGE_SYSTEM}|{status['id']}")])
    if not found:
        raise LookupError(f"no Communication has the message id {status['id']}")
    async with fhir.unit() as unit:
        for communication in found:
            changed = _received(communication, status)
            if changed is not communication:
                await unit.update(changed, if_match=int(communication["meta"]["versionId"]))
        mark_handled(unit, CONSUMER, event)
        await unit.commit()

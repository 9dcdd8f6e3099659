"""``POST /api/gtm/webhooks/email-delivery`` and ``POST /api/gtm/webhooks/inbound``: the
go-to-market platforms (e-mail delivery, external forms), both signed the Standard
Webhooks way (:mod:`platform_api.webhooks.standard`) with
``HEALTHPLATFORM_EMAIL_WEBHOOK_SECRET`` and ``HEALTHPLATFORM_INBOUND_WEBHOOK_SECRET``.

**Delivery events** (consumer ``email_delivery_events``)::

    {"type": "email.delivered" | "email.bounced" | "email.complained" | "email.opened",
     "created_at": "...", "data": {"message_id": "<Message-ID>", "email_id": "...",
     "to": ["amina@example.org"], "subject": "...", "bounce": {"type": "...", ...}}}

update the platform's mail log (``mail_log/<Message-ID>``, see
:mod:`platform_api.mailer`: status and the list of events; a message the log does not
know, e.g. sent by another system through the same account, is logged from the event)
and suppress the recipients of a bounce — unless the platform calls it transient
(``soft``, ``transient``) — and of a complaint (``mail_suppressions/<address>``), which
the mailer then skips. A status never moves back (an ``opened`` after a ``bounced``
stays bounced).

**Inbound leads** (consumer ``inbound_leads``): a form's submission (``data`` or the
body itself: ``name``, ``email``, ``phone``, ``organization``/``company``, ``message``,
``source``/``form``, ``country``) is stored for follow-up as ``leads/<webhook id>``
(status ``new``) and announced as ``platform.gtm.lead_received`` ``{lead_id, source,
organization}``. A submission with neither an e-mail nor a phone is rejected into the
dead letters.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from fhir_server.clock import now_instant
from platform_api.envelope import Envelope
from platform_api.events import Event, RejectedEvent, mark_handled
from platform_api.mailer import MAIL_LOG, SUPPRESSIONS, message_key
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
    require_https,
)
from platform_api.webhooks.standard import verify_standard_webhook

EMAIL_FAMILY, LEAD_FAMILY = "email_delivery", "inbound_lead"
EMAIL_TOPIC, LEAD_TOPIC = TOPIC_PREFIX + EMAIL_FAMILY, TOPIC_PREFIX + LEAD_FAMILY
EMAIL_CONSUMER, LEAD_CONSUMER = "email_delivery_events", "inbound_leads"
LEADS = "leads"
# Where each delivery event takes a message; a status moves only forwards.
DELIVERY_RANK = {"sent": 0, "delivered": 1, "opened": 2, "complained": 3, "bounced": 3}
SUPPRESSING = frozenset({"bounced", "complained"})
TRANSIENT_BOUNCES = frozenset({"soft", "softbounce", "transient", "temporary"})
JSON = dict[str, Any]

router = APIRouter(tags=["webhooks"])


async def _signed_json(request: Request, secret: str, family: str, setting: str
                       ) -> tuple[Services, bytes, str, Any]:
    """HTTPS, signature and JSON of a Standard Webhooks request: (services, body,
    webhook id, parsed body or the ValueError saying why not)."""
    require_https(request, family)
    services = request_services(request)
    body = await request.body()
    webhook_id = verify_standard_webhook(request, body, configured(secret, family, setting),
                                         family)
    try:
        parsed: Any = parse_json(body)
        if not isinstance(parsed, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        parsed = exc
    return services, body, webhook_id, parsed


@router.post("/api/gtm/webhooks/email-delivery", response_model=Envelope[WebhookAck],
             responses=REFUSALS, openapi_extra=PLATFORM_BODY,
             summary="E-mail delivery events (Standard Webhooks signature)")
async def email_delivery_webhook(request: Request) -> Any:
    secret = request_services(request).settings.email_webhook_secret
    services, body, webhook_id, event = await _signed_json(request, secret, EMAIL_FAMILY,
                                                           "EMAIL_WEBHOOK_SECRET")
    if isinstance(event, ValueError):
        return await dead_letter_body(services, EMAIL_FAMILY, body, str(event))
    return await accept(services, EMAIL_FAMILY, [Inbound(webhook_id, EMAIL_TOPIC, {
        "webhook_id": webhook_id, "event": event})])


@router.post("/api/gtm/webhooks/inbound", response_model=Envelope[WebhookAck],
             responses=REFUSALS, openapi_extra=PLATFORM_BODY,
             summary="Inbound lead capture from external forms (Standard Webhooks signature)")
async def inbound_lead_webhook(request: Request) -> Any:
    secret = request_services(request).settings.inbound_webhook_secret
    services, body, webhook_id, submission = await _signed_json(
        request, secret, LEAD_FAMILY, "INBOUND_WEBHOOK_SECRET")
    if isinstance(submission, ValueError):
        return await dead_letter_body(services, LEAD_FAMILY, body, str(submission))
    return await accept(services, LEAD_FAMILY, [Inbound(webhook_id, LEAD_TOPIC, {
        "webhook_id": webhook_id, "submission": submission})])


# -- consumers ------------------------------------------------------------------------------------
def install(services: Services) -> None:
    async def email_delivery_events(event: Event) -> None:
        await apply_delivery_event(services, event)

    async def inbound_leads(event: Event) -> None:
        await store_lead(services, event)
    services.bus.subscribe(EMAIL_TOPIC, email_delivery_events, consumer=EMAIL_CONSUMER)
    services.bus.subscribe(LEAD_TOPIC, inbound_leads, consumer=LEAD_CONSUMER)


def _recipients(data: JSON) -> list[str]:
    to = data.get("to")
    listed = to if isinstance(to, list) else [to] if isinstance(to, str) else []
    return [str(a).strip().lower() for a in listed if isinstance(a, str) and "@" in a]


async def apply_delivery_event(services: Services, event: Event) -> None:
    delivery = event["payload"]["event"]
    kind = str(delivery.get("type", "")).removeprefix("email.")
    data = delivery.get("data")
    if kind not in DELIVERY_RANK or kind == "sent" or not isinstance(data, dict):
        raise RejectedEvent(f"not a delivery event: type {delivery.get('type')!r}")
    recipients = _recipients(data)
    message_id = data.get("message_id") or data.get("email_id")
    if not isinstance(message_id, str) or not recipients:
        raise RejectedEvent("a delivery event needs data.message_id (or email_id) and data.to")
    key = message_key(message_id)
    store = services.store
    at = str(delivery.get("created_at") or now_instant())
    entry = await store.get_document(MAIL_LOG, key) or {
        "id": key, "to": recipients[0], "subject": data.get("subject"), "status": "sent",
        "sent_at": None, "events": []}
    changed = {**entry, "events": [*entry.get("events", []), {"type": kind, "at": at}],
               "updated_at": now_instant()}
    if DELIVERY_RANK[kind] > DELIVERY_RANK.get(entry.get("status", "sent"), 0):
        changed["status"] = kind
    bounce: JSON = data["bounce"] if isinstance(data.get("bounce"), dict) else {}
    transient = str(bounce.get("type", "")).lower().replace("_", "") in TRANSIENT_BOUNCES
    async with store.unit_of_work() as uow:
        uow.put_document(MAIL_LOG, key, changed)
        if kind in SUPPRESSING and not transient:
            for address in recipients:
                uow.put_document(SUPPRESSIONS, address, {
                    "id": address, "reason": kind, "message_id": key,
                    "detail": bounce.get("message") or bounce.get("subType"),
                    "suppressed_at": now_instant()})
        mark_handled(uow, EMAIL_CONSUMER, event)
        await uow.commit()


def _text(value: Any, limit: int = 2000) -> str | None:
    text = str(value).strip() if value is not None else ""
    return text[:limit] or None


async def store_lead(services: Services, event: Event) -> None:
    submission = event["payload"]["submission"]
    form = submission.get("data") if isinstance(submission.get("data"), dict) else submission
    lead = {
        "id": event["payload"]["webhook_id"],
        "name": _text(form.get("name") or " ".join(
            str(form.get(k, "")) for k in ("first_name", "last_name")).strip(), 200),
        "email": _text(form.get("email"), 320),
        "phone": _text(form.get("phone"), 32),
        "organization": _text(form.get("organization") or form.get("company"), 200),
        "message": _text(form.get("message")),
        "source": _text(form.get("source") or form.get("form") or submission.get("type"), 200),
        "country": _text(form.get("country"), 60),
        "status": "new", "received_at": now_instant(),
    }
    if not lead["email"] and not lead["phone"]:
        raise RejectedEvent("a lead needs an email or a phone to follow up")
    async with services.store.unit_of_work() as uow:
        uow.put_document(LEADS, lead["id"], lead)
        uow.emit("platform.gtm.lead_received", {
            "lead_id": lead["id"], "source": lead["source"],
            "organization": lead["organization"]}, source_service="gtm")
        mark_handled(uow, LEAD_CONSUMER, event)
        await uow.commit()

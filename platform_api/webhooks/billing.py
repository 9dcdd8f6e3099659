"""``POST /api/webhooks/billing``: the billing platform's events (Stripe-style).

Verification: ``Stripe-Signature`` (``t=<unix time>,v1=<hex HMAC-SHA256 of "t.body">``)
checked by the ``stripe`` library (``WebhookSignature.verify_header``) with
``HEALTHPLATFORM_BILLING_WEBHOOK_SECRET`` and a 5-minute tolerance. The event id is the
Stripe event's ``id`` (``evt_…``).

Effects (consumer ``billing_events``, topic ``platform.webhook.billing``): the
organization's subscription and payment state, a document ``org_billing/<org id>`` —
platform bookkeeping, not health data:

- ``checkout.session.completed``: the organization is the session's
  ``client_reference_id`` (or ``metadata.organization_id``); records its billing
  customer (``billing_customers/<customer id>`` → organization, so later invoices find
  it), the subscription (active) and the payment (paid, when ``payment_status`` says so);
- ``invoice.payment_succeeded`` / ``invoice.payment_failed``: the payment (paid / failed,
  invoice id, amount, currency, attempt count); a failure leaves the subscription
  ``past_due`` until the platform says otherwise;
- ``customer.subscription.updated`` / ``.deleted``: the subscription's status
  (``canceled`` when deleted), plan (price id), period end and ``cancel_at_period_end``.

The organization of an invoice or subscription is its ``metadata.organization_id`` (or
the subscription details' metadata), else the customer recorded at checkout; an event
whose organization is not known yet (an invoice ahead of its checkout: the platform does
not promise order) fails and is retried, then kept as a dead letter. Events arrive out of
order too: a state is only replaced by one from a newer event (``created``). Each change
emits ``platform.billing.subscription_changed`` or ``platform.billing.payment_succeeded``
/ ``payment_failed``. Other event types are acknowledged and ignored.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import stripe
from fastapi import APIRouter, Request

from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from platform_api.envelope import Envelope
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

FAMILY = "billing"
TOPIC = TOPIC_PREFIX + FAMILY
CONSUMER = "billing_events"
TOLERANCE_SECONDS = 300
BILLING = "org_billing"
CUSTOMERS = "billing_customers"
JSON = dict[str, Any]
# Stripe's zero-decimal currencies: amounts are in whole units, not hundredths.
ZERO_DECIMAL = frozenset({"BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA", "PYG",
                          "RWF", "UGX", "VND", "VUV", "XAF", "XOF", "XPF"})

router = APIRouter(tags=["webhooks"])


@router.post("/api/webhooks/billing", response_model=Envelope[WebhookAck],
             responses=REFUSALS, openapi_extra=PLATFORM_BODY,
             summary="Billing platform events (Stripe-Signature)")
async def billing_webhook(request: Request) -> Any:
    require_https(request, FAMILY)
    services = request_services(request)
    secret = configured(services.settings.billing_webhook_secret, FAMILY,
                        "BILLING_WEBHOOK_SECRET")
    body = await request.body()
    try:
        stripe.WebhookSignature.verify_header(body, request.headers.get("stripe-signature"),
                                              secret, TOLERANCE_SECONDS)
    except (stripe.SignatureVerificationError, UnicodeDecodeError) as exc:
        raise refuse(FAMILY, request, str(exc).split(".")[0]) from None
    try:
        event = parse_json(body)
        if not isinstance(event, dict) or not isinstance(event.get("id"), str) \
                or not isinstance(event.get("type"), str):
            raise ValueError("not an event: it needs an id and a type")
    except ValueError as exc:
        return await dead_letter_body(services, FAMILY, body, str(exc))
    return await accept(services, FAMILY, [Inbound(event["id"], TOPIC, {"event": event})])


# -- the consumer -----------------------------------------------------------------------------
def install(services: Services) -> None:
    # The provider's events come from no caller: the organization they name is looked up
    # with rights elevated once, here.
    directory = services.policy.elevate("billing webhook: check the organization an event "
                                        "names exists")

    async def billing_events(event: Event) -> None:
        await apply_billing_event(services, directory, event)
    services.bus.subscribe(TOPIC, billing_events, consumer=CONSUMER)


def _object(stripe_event: JSON) -> JSON:
    data = stripe_event.get("data")
    found = data.get("object") if isinstance(data, dict) else None
    if not isinstance(found, dict):
        raise RejectedEvent(f"{stripe_event['type']} {stripe_event['id']} has no data.object")
    return found


def _metadata_org(obj: JSON) -> str | None:
    for holder in (obj, obj.get("subscription_details") or {},
                   ((obj.get("parent") or {}).get("subscription_details") or {})):
        metadata = holder.get("metadata") if isinstance(holder, dict) else None
        if isinstance(metadata, dict) and isinstance(metadata.get("organization_id"), str):
            return str(metadata["organization_id"])
    return None


async def _organization(services: Services, directory: CallerFhir, obj: JSON, *,
                        from_checkout: bool = False) -> str:
    org_id = (obj.get("client_reference_id") if from_checkout else None) or _metadata_org(obj)
    customer = obj.get("customer")
    if org_id is None and isinstance(customer, str):
        known = await services.store.get_document(CUSTOMERS, customer)
        org_id = known["organization_id"] if known else None
    if not isinstance(org_id, str):
        # Not yet known (its checkout may come later): retried, then a dead letter.
        raise LookupError(f"no organization is known for billing customer {customer!r}")
    if await directory.find_json("Organization", org_id) is None:
        raise RejectedEvent(f"Organization/{org_id} does not exist")
    return org_id


def _amount(minor: Any, currency: str) -> str | None:
    if not isinstance(minor, int):
        return None
    value = Decimal(minor) if currency.upper() in ZERO_DECIMAL else Decimal(minor) / 100
    return str(value.quantize(Decimal(1) if currency.upper() in ZERO_DECIMAL
                              else Decimal("0.01")))


async def apply_billing_event(services: Services, directory: CallerFhir, event: Event
                              ) -> None:
    stripe_event: JSON = event["payload"]["event"]
    kind = stripe_event["type"]
    if kind not in CHANGES:
        return
    obj = _object(stripe_event)
    org_id = await _organization(services, directory, obj,
                                 from_checkout=kind == "checkout.session.completed")
    current = await services.store.get_document(BILLING, org_id) or {
        "organization_id": org_id, "subscription": None, "payment": None}
    created = int(stripe_event.get("created") or 0)
    changed, topic, announced = CHANGES[kind](current, obj, created)
    async with services.store.unit_of_work() as uow:
        if changed is not None:
            changed["updated_at"] = now_instant()
            uow.put_document(BILLING, org_id, changed)
            uow.emit(topic, {"organization_id": org_id, **announced}, source_service=FAMILY)
        customer = obj.get("customer")
        if kind == "checkout.session.completed" and isinstance(customer, str):
            uow.put_document(CUSTOMERS, customer, {"id": customer, "organization_id": org_id})
        mark_handled(uow, CONSUMER, event)
        await uow.commit()


def _instant(epoch: Any) -> str | None:
    if not isinstance(epoch, int):
        return None
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _newer(state: JSON | None, created: int) -> bool:
    return state is None or int(state.get("event_created") or 0) <= created


Change = tuple[JSON | None, str, JSON]


def _checkout_completed(current: JSON, session: JSON, created: int) -> Change:
    subscription = {"id": session.get("subscription"), "status": "active",
                    "plan": (session.get("metadata") or {}).get("plan"),
                    "event_created": created}
    changed = {**current, "customer_id": session.get("customer")}
    if _newer(current.get("subscription"), created):
        changed["subscription"] = {**(current.get("subscription") or {}), **subscription}
    if session.get("payment_status") == "paid":
        currency = str(session.get("currency") or "").upper()
        changed["payment"] = {"status": "paid", "checkout_session_id": session.get("id"),
                              "amount": _amount(session.get("amount_total"), currency),
                              "currency": currency or None, "event_created": created}
    return changed, "platform.billing.subscription_changed", {
        "status": changed["subscription"]["status"], "subscription_id": subscription["id"]}


def _invoice(outcome: str) -> Any:
    def change(current: JSON, invoice: JSON, created: int) -> Change:
        if not _newer(current.get("payment"), created):
            return None, "", {}
        currency = str(invoice.get("currency") or "").upper()
        field = "amount_paid" if outcome == "paid" else "amount_due"
        payment = {"status": outcome, "invoice_id": invoice.get("id"),
                   "amount": _amount(invoice.get(field), currency), "currency": currency or None,
                   "attempt_count": invoice.get("attempt_count"), "event_created": created}
        changed = {**current, "payment": payment}
        subscription = current.get("subscription")
        if outcome == "failed" and subscription and _newer(subscription, created):
            changed["subscription"] = {**subscription, "status": "past_due",
                                       "event_created": created}
        topic = "platform.billing.payment_" + ("succeeded" if outcome == "paid" else "failed")
        return changed, topic, {"invoice_id": payment["invoice_id"],
                                "amount": payment["amount"], "currency": payment["currency"]}
    return change


def _subscription(deleted: bool) -> Any:
    def change(current: JSON, sub: JSON, created: int) -> Change:
        if not _newer(current.get("subscription"), created):
            return None, "", {}
        item = ((sub.get("items") or {}).get("data") or [{}])[0]
        # Newer API versions moved the period from the subscription to its items.
        period_end = sub.get("current_period_end") or item.get("current_period_end")
        subscription = {
            "id": sub.get("id"), "status": "canceled" if deleted else sub.get("status"),
            "plan": (item.get("price") or {}).get("id")
            or (current.get("subscription") or {}).get("plan"),
            "current_period_end": _instant(period_end),
            "cancel_at_period_end": bool(sub.get("cancel_at_period_end")),
            "event_created": created}
        return {**current, "customer_id": sub.get("customer") or current.get("customer_id"),
                "subscription": subscription}, "platform.billing.subscription_changed", {
            "status": subscription["status"], "subscription_id": subscription["id"]}
    return change


CHANGES = {
    "checkout.session.completed": _checkout_completed,
    "invoice.payment_succeeded": _invoice("paid"),
    "invoice.payment_failed": _invoice("failed"),
    "customer.subscription.updated": _subscription(deleted=False),
    "customer.subscription.deleted": _subscription(deleted=True),
}

"""POST /api/webhooks/billing: Stripe-signed events update an organization's subscription
and payment state, once each, in order of their creation."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from platform_api.webhooks.billing import BILLING, CUSTOMERS
from tests.conftest import make_clinic_admin
from tests.platform_api.webhooks.conftest import dead_letters, nothing_kept, recorder
from tests.platform_api.webhooks.signing import body_of, stripe_headers

PATH = "/api/webhooks/billing"
_ids = itertools.count(1)


def stripe_event(kind: str, obj: dict[str, Any], *, created: int | None = None
                 ) -> dict[str, Any]:
    return {"id": f"evt_1QkLm{next(_ids):04d}", "object": "event", "type": kind,
            "api_version": "2024-06-20", "created": created or int(time.time()),
            "livemode": False, "data": {"object": obj}}


def checkout(org_id: str) -> dict[str, Any]:
    return stripe_event("checkout.session.completed", {
        "id": "cs_test_a1B2c3", "object": "checkout.session", "mode": "subscription",
        "client_reference_id": org_id, "customer": "cus_Kibera01",
        "subscription": "sub_1Kibera", "payment_status": "paid", "amount_total": 450000,
        "currency": "kes", "metadata": {"plan": "clinic-standard"}})


async def send(secure: Any, event: dict[str, Any] | bytes, **signing: Any) -> Any:
    body = body_of(event)
    return await secure.post(PATH, content=body, headers=stripe_headers(body, **signing))


@pytest.fixture
async def org_id(client: Any) -> str:
    return (await make_clinic_admin(client))["org_id"]


async def billing_state(app: Any, org_id: str) -> dict[str, Any]:
    await app.state.services.bus.drain()
    return await app.state.services.store.get_document(BILLING, org_id)  # type: ignore[no-any-return]


async def test_a_completed_checkout_starts_the_subscription_and_records_the_payment(
        app, secure, org_id):
    changes = recorder(app, "platform.billing.>", "billing_audit")
    response = await send(secure, checkout(org_id))
    assert response.status_code == 200
    assert response.json()["data"]["duplicate"] is False
    state = await billing_state(app, org_id)
    assert state["customer_id"] == "cus_Kibera01"
    assert state["subscription"]["id"] == "sub_1Kibera"
    assert state["subscription"]["status"] == "active"
    assert state["subscription"]["plan"] == "clinic-standard"
    assert state["payment"]["status"] == "paid"
    assert (state["payment"]["amount"], state["payment"]["currency"]) == ("4500.00", "KES")
    customer = await app.state.services.store.get_document(CUSTOMERS, "cus_Kibera01")
    assert customer["organization_id"] == org_id
    assert [(e["topic"], e["payload"]["status"]) for e in changes] == [
        ("platform.billing.subscription_changed", "active")]


async def test_invoices_and_subscription_changes_follow_the_customer(app, secure, org_id):
    await send(secure, checkout(org_id))
    now = int(time.time())
    failed = stripe_event("invoice.payment_failed", {
        "id": "in_1Kib02", "customer": "cus_Kibera01", "amount_due": 450000, "currency": "kes",
        "attempt_count": 1}, created=now + 10)
    assert (await send(secure, failed)).status_code == 200
    state = await billing_state(app, org_id)
    assert state["payment"]["status"] == "failed"
    assert state["payment"]["invoice_id"] == "in_1Kib02"
    assert state["subscription"]["status"] == "past_due"
    paid = stripe_event("invoice.payment_succeeded", {
        "id": "in_1Kib02", "customer": "cus_Kibera01", "amount_paid": 450000, "currency": "kes",
        "attempt_count": 2}, created=now + 20)
    await send(secure, paid)
    updated = stripe_event("customer.subscription.updated", {
        "id": "sub_1Kibera", "customer": "cus_Kibera01", "status": "active",
        "cancel_at_period_end": True, "items": {"data": [{
            "price": {"id": "price_clinic_plus"}, "current_period_end": 1767225600}]}},
        created=now + 30)
    await send(secure, updated)
    state = await billing_state(app, org_id)
    assert state["payment"]["status"] == "paid" and state["payment"]["attempt_count"] == 2
    assert state["subscription"] == {**state["subscription"], "status": "active",
                                     "plan": "price_clinic_plus", "cancel_at_period_end": True,
                                     "current_period_end": "2026-01-01T00:00:00Z"}
    # An older event arriving late changes nothing; the deletion, newer, ends it.
    await send(secure, stripe_event("customer.subscription.updated", {
        "id": "sub_1Kibera", "customer": "cus_Kibera01", "status": "trialing"},
        created=now + 5))
    assert (await billing_state(app, org_id))["subscription"]["status"] == "active"
    await send(secure, stripe_event("customer.subscription.deleted", {
        "id": "sub_1Kibera", "customer": "cus_Kibera01", "status": "canceled"},
        created=now + 40))
    assert (await billing_state(app, org_id))["subscription"]["status"] == "canceled"


async def test_a_redelivered_event_is_answered_but_processed_once(app, secure, org_id):
    changes = recorder(app, "platform.billing.subscription_changed", "billing_audit")
    event = checkout(org_id)
    first, again = await send(secure, event), await send(secure, event)
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.json()["data"] == {"received": True, "duplicate": True,
                                    "event_ids": [event["id"]]}
    await app.state.services.bus.drain()
    assert len(changes) == 1


@pytest.mark.parametrize(("headers", "reason"), [
    ({}, "No Stripe-Signature header"),
    ({"Stripe-Signature": "t=1764000000,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff"},
     "No signatures found matching"),
    ({"Stripe-Signature": "garbage"}, "Unable to extract timestamp"),
])
async def test_an_unsigned_or_wrongly_signed_event_is_401_with_nothing_kept(
        app, secure, published, org_id, headers, reason):
    response = await secure.post(PATH, content=body_of(checkout(org_id)), headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "INVALID_SIGNATURE"
    assert reason in response.json()["error"]["message"]
    assert await nothing_kept(app, published)
    assert await billing_state(app, org_id) is None


async def test_a_signature_with_another_secret_or_too_old_is_401(app, secure, published,
                                                                 org_id):
    event = checkout(org_id)
    assert (await send(secure, event, secret="whsec_someone_else")).status_code == 401
    stale = await send(secure, event, age=301)
    assert stale.status_code == 401
    assert "tolerance" in stale.json()["error"]["message"]
    assert await nothing_kept(app, published)


async def test_a_signed_body_that_is_not_an_event_becomes_a_dead_letter(app, secure):
    for body in (b'{"type": "invoice.paid"', b'{"object": "event"}'):
        assert (await send(secure, body)).status_code == 200
    entries = await dead_letters(app)
    assert [e["original_payload"] for e in entries] == ['{"type": "invoice.paid"',
                                                        '{"object": "event"}']
    assert {e["topic"] for e in entries} == {"platform.webhook.billing"}
    assert entries[0]["error"].startswith("malformed billing webhook body: not JSON")


async def test_an_event_for_no_known_organization_becomes_a_dead_letter(app, secure, org_id):
    unknown = stripe_event("invoice.payment_succeeded", {
        "id": "in_1Unknown", "customer": "cus_Nobody", "amount_paid": 1000, "currency": "kes"})
    assert (await send(secure, unknown)).status_code == 200
    [entry] = await dead_letters(app)
    assert entry["consumer"] == "billing_events"
    assert "no organization is known for billing customer 'cus_Nobody'" in entry["error"]
    gone = checkout("no-such-organization")
    await send(secure, gone)
    entries = await dead_letters(app)
    assert "Organization/no-such-organization does not exist" in entries[-1]["error"]


async def test_an_event_type_without_effect_is_acknowledged(app, secure, published):
    response = await send(secure, stripe_event("customer.created", {"id": "cus_New"}))
    assert response.status_code == 200
    assert await dead_letters(app) == []

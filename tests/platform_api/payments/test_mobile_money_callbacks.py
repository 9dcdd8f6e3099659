"""The providers' callbacks (POST /api/payments/webhooks/mobile-money-a|b) and the sweep:
a callback is authenticated by its payment's token (and the allow-list), and settles the
payment only as the provider's status query confirms; payments no callback settles are
queried and timed out."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from platform_api.events import DEAD_LETTERS
from platform_api.payments import ledger
from platform_api.payments.providers import FAILED, PAID, Outcome
from platform_api.webhooks.inbound import RECEIPTS
from tests.conftest import make_admin

INITIATE = "/api/payments/mobile-money/initiate"
STATUS = "/api/payments/mobile-money/status/"


async def initiate(client: Any, user: dict[str, Any], **changes: Any) -> dict[str, Any]:
    payload = {"provider": "mobile-money-a", "phone": "+254712345678", "amount": 1500,
               "currency": "KES", "order_id": "INV-2026-000481",
               "description": "Consultation", **changes}
    response = await client.post(INITIATE, json=payload, headers=user["headers"])
    assert response.status_code == 201, response.text
    return response.json()["data"]  # type: ignore[no-any-return]


def callback_target(url: str) -> str:
    """The path and query of the callback URL given to the provider."""
    parsed = httpx.URL(url)
    return f"{parsed.path}?{parsed.query.decode()}"


async def state(app: Any, client: Any, user: dict[str, Any], order_id: str) -> dict[str, Any]:
    await app.state.services.bus.drain()
    return (await client.get(STATUS + order_id, headers=user["headers"])).json()["data"]  # type: ignore[no-any-return]


@pytest.fixture
def paid(app: Any) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    async def fulfil_order(event: dict[str, Any]) -> None:
        seen.append(event)
    app.state.services.bus.subscribe("platform.payments.*", fulfil_order, consumer="orders")
    return seen


async def test_a_confirmed_success_marks_the_payment_paid(app, client, secure, user, stk,
                                                          paid):
    payment = await initiate(client, user)
    [push] = stk.requests
    stk.results[push["CheckoutRequestID"]] = ("0", "The service request is processed "
                                                   "successfully.")
    response = await secure.post(callback_target(push["CallBackURL"]),
                                 json=stk.callback(push["CheckoutRequestID"], 0))
    assert response.status_code == 200
    settled = await state(app, client, user, "INV-2026-000481")
    assert (settled["state"], settled["receipt"]) == ("paid", "TKO8QX2M1B")
    admin = await make_admin(app, client)
    notice = (await client.get(f"/fhir/PaymentNotice/{payment['payment_notice_id']}",
                               headers=admin["headers"])).json()
    assert notice["paymentStatus"]["coding"][0] == {
        "system": "http://terminology.hl7.org/CodeSystem/paymentstatus", "code": "paid",
        "display": "Paid"}
    assert notice["paymentDate"] == datetime.now(UTC).date().isoformat()
    assert {"system": "urn:healthplatform:mobile-money-a:receipt", "value": "TKO8QX2M1B"} \
        in notice["identifier"]
    assert [e["topic"] for e in paid] == ["platform.payments.initiated",
                                          "platform.payments.paid"]
    assert paid[-1]["payload"] == {
        "order_id": "INV-2026-000481", "provider": "mobile-money-a", "state": "paid",
        "amount": "1500", "currency": "KES", "receipt": "TKO8QX2M1B",
        "payment_notice_id": payment["payment_notice_id"]}


async def test_a_success_the_provider_does_not_confirm_changes_nothing(
        app, client, secure, user, stk):
    await initiate(client, user)
    [push] = stk.requests  # the provider still says "being processed"
    await secure.post(callback_target(push["CallBackURL"]),
                      json=stk.callback(push["CheckoutRequestID"], 0))
    assert (await state(app, client, user, "INV-2026-000481"))["state"] == "pending"


async def test_a_cancelled_prompt_fails_the_payment(app, client, secure, user, stk):
    await initiate(client, user)
    [push] = stk.requests
    stk.results[push["CheckoutRequestID"]] = ("1032", "Request cancelled by user")
    await secure.post(callback_target(push["CallBackURL"]),
                      json=stk.callback(push["CheckoutRequestID"], 1032))
    settled = await state(app, client, user, "INV-2026-000481")
    assert (settled["state"], settled["failure_reason"]) == (
        "failed", "1032: Request cancelled by user")


async def test_a_success_for_another_amount_is_kept_for_a_human(app, client, secure, user,
                                                                 stk):
    await initiate(client, user)
    [push] = stk.requests
    stk.results[push["CheckoutRequestID"]] = ("0", "ok")
    await secure.post(callback_target(push["CallBackURL"]),
                      json=stk.callback(push["CheckoutRequestID"], 0, amount=15))
    assert (await state(app, client, user, "INV-2026-000481"))["state"] == "pending"
    [entry] = await app.state.services.store.find_documents(DEAD_LETTERS)
    assert entry["error"] == "rejected: the provider took 15, the payment asked 1500"


async def test_callbacks_without_the_payments_token_are_refused_with_nothing_kept(
        app, client, secure, user, stk):
    await initiate(client, user)
    await initiate(client, user, order_id="INV-OTHER")
    [push, other] = stk.requests
    body = stk.callback(push["CheckoutRequestID"], 0)
    path = "/api/payments/webhooks/mobile-money-a"
    other_token = httpx.URL(other["CallBackURL"]).params["token"]
    for query in ("", "?order_id=INV-2026-000481",
                  "?order_id=INV-2026-000481&token=guessed-token",
                  f"?order_id=INV-2026-000481&token={other_token}",
                  f"?order_id=INV-NOPE&token={other_token}"):
        response = await secure.post(path + query, json=body)
        assert response.status_code == 401, query
    # the token of provider A's payment does not open provider B's door
    wrong_door = callback_target(push["CallBackURL"]).replace("money-a", "money-b")
    assert (await secure.post(wrong_door, json=body)).status_code == 401
    plain = await client.post(callback_target(push["CallBackURL"]), json=body)
    assert plain.status_code == 403
    store = app.state.services.store
    assert await store.count_documents(RECEIPTS) == 0
    assert await store.count_documents(DEAD_LETTERS) == 0


async def test_the_allow_list_refuses_other_addresses(app, client, secure, user, stk,
                                                      settings):
    await initiate(client, user)
    [push] = stk.requests
    stk.results[push["CheckoutRequestID"]] = ("0", "ok")
    settings.mobile_money_a_callback_ips = ["196.201.214.0/24", "196.201.213.44"]
    transport = httpx.ASGITransport(app=app, client=("41.90.64.10", 443))
    async with httpx.AsyncClient(transport=transport, base_url="https://testserver") as other:
        refused = await other.post(callback_target(push["CallBackURL"]),
                                   json=stk.callback(push["CheckoutRequestID"], 0))
    assert (refused.status_code, refused.json()["error"]["code"]) == (403,
                                                                       "ADDRESS_NOT_ALLOWED")
    allowed = await secure.post(callback_target(push["CallBackURL"]),  # from 196.201.214.200
                                json=stk.callback(push["CheckoutRequestID"], 0))
    assert allowed.status_code == 200
    assert (await state(app, client, user, "INV-2026-000481"))["state"] == "paid"


async def test_a_redelivered_callback_is_processed_once_and_a_malformed_one_kept(
        app, client, secure, user, stk):
    await initiate(client, user)
    [push] = stk.requests
    stk.results[push["CheckoutRequestID"]] = ("0", "ok")
    target = callback_target(push["CallBackURL"])
    body = stk.callback(push["CheckoutRequestID"], 0)
    first, again = await secure.post(target, json=body), await secure.post(target, json=body)
    assert (first.json()["data"]["duplicate"], again.json()["data"]["duplicate"]) == (False,
                                                                                      True)
    malformed = await secure.post(target, content=b'{"Body": {"stkCallback": {}}}')
    assert malformed.status_code == 200
    [entry] = await app.state.services.store.find_documents(DEAD_LETTERS)
    assert entry["topic"] == "platform.webhook.mobile_money_a"
    assert entry["original_payload"] == '{"Body": {"stkCallback": {}}}'


async def test_request_to_pay_callbacks_settle_as_the_providers_status_says(
        app, client, secure, user, momo):
    def pay(order_id: str) -> dict[str, Any]:
        return {"provider": "mobile-money-b", "phone": "+256772123456", "currency": "UGX",
                "amount": 25000, "order_id": order_id}
    await initiate(client, user, **pay("INV-UG-1"))
    await initiate(client, user, **pay("INV-UG-2"))
    await initiate(client, user, **pay("INV-UG-3"))
    ok, rejected, forged = momo.requests
    body = momo.settle(ok["reference"], "SUCCESSFUL", transaction="1662829377")
    await secure.post(callback_target(ok["callback_url"]), json=body)
    body = momo.settle(rejected["reference"], "FAILED", reason="APPROVAL_REJECTED")
    await secure.post(callback_target(rejected["callback_url"]), json=body)
    claim = {**momo.statuses[forged["reference"]], "status": "SUCCESSFUL",
             "financialTransactionId": "999"}  # the provider itself still says PENDING
    await secure.post(callback_target(forged["callback_url"]), json=claim)
    settled = [await state(app, client, user, f"INV-UG-{n}") for n in (1, 2, 3)]
    assert [(s["state"], s["receipt"], s["failure_reason"]) for s in settled] == [
        ("paid", "1662829377", None), ("failed", None, "APPROVAL_REJECTED"),
        ("pending", None, None)]


async def test_the_sweep_times_out_what_no_callback_settled_and_honours_a_late_success(
        app, client, secure, user, stk, momo):
    await initiate(client, user)
    await initiate(client, user, provider="mobile-money-b", phone="+256772123456",
                   currency="UGX", amount=25000, order_id="INV-UG-9")
    [push], [request] = stk.requests, momo.requests
    momo.settle(request["reference"], "FAILED", reason="PAYER_NOT_FOUND")
    services = app.state.services
    assert await ledger.sweep(services) == 0  # not overdue yet
    later = datetime.now(UTC) + timedelta(seconds=services.settings.mobile_money_timeout_seconds
                                          + 1)
    assert await ledger.sweep(services, now=later) == 2
    timed_out = await state(app, client, user, "INV-2026-000481")
    assert (timed_out["state"], timed_out["failure_reason"]) == (
        "timed_out", "no callback; the provider still says pending")
    assert (await state(app, client, user, "INV-UG-9"))["failure_reason"] == "PAYER_NOT_FOUND"
    # The customer approved at the last moment: the money was taken, so it counts.
    stk.results[push["CheckoutRequestID"]] = ("0", "ok")
    await secure.post(callback_target(push["CallBackURL"]),
                      json=stk.callback(push["CheckoutRequestID"], 0))
    late = await state(app, client, user, "INV-2026-000481")
    assert late["state"] == "paid"
    document = await services.store.get_document(ledger.PAYMENTS, "INV-2026-000481")
    assert [(h["state"], h["via"]) for h in document["history"]] == [
        ("pending", "initiate"), ("timed_out", "timeout"), ("paid", "callback")]


async def test_two_settlements_at_once_settle_the_payment_once(app, client, user, stk, paid):
    await initiate(client, user)
    services = app.state.services
    results = await asyncio.gather(
        ledger.settle(services, "INV-2026-000481", Outcome(PAID, receipt="TKO8QX2M1B"),
                      via="callback"),
        ledger.settle(services, "INV-2026-000481", Outcome(FAILED, reason="1037: timeout"),
                      via="timeout"))
    assert sum(r is not None for r in results) == 1
    await services.bus.drain()
    assert len([e for e in paid if e["topic"] != "platform.payments.initiated"]) == 1
    document = await services.store.get_document(ledger.PAYMENTS, "INV-2026-000481")
    assert len(document["history"]) == 2


async def test_request_to_pay_callbacks_are_refused_repeated_once_and_kept_when_malformed(
        app, client, secure, user, momo):
    await initiate(client, user, provider="mobile-money-b", phone="+256772123456",
                   currency="UGX", amount=25000, order_id="INV-UG-7")
    [request] = momo.requests
    target = callback_target(request["callback_url"])
    body = momo.settle(request["reference"], "SUCCESSFUL")
    forged = target.split("&token=")[0] + "&token=" + "x" * 43
    assert (await secure.post(forged, json=body)).status_code == 401
    assert (await client.post(target, json=body)).status_code == 403  # plain HTTP
    first, again = await secure.post(target, json=body), await secure.post(target, json=body)
    assert (first.json()["data"]["duplicate"], again.json()["data"]["duplicate"]) == (False,
                                                                                      True)
    assert (await state(app, client, user, "INV-UG-7"))["state"] == "paid"
    assert (await secure.post(target, json={"status": "SUCCESSFUL"})).status_code == 200
    [entry] = await app.state.services.store.find_documents(DEAD_LETTERS)
    assert entry["topic"] == "platform.webhook.mobile_money_b"
    assert "not a request-to-pay callback" in entry["error"]

"""The Payments area: POST /api/payments/mobile-money/initiate and GET …/status/:order_id
against local stand-ins of both providers."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.payments.ledger import PAYMENTS
from tests.conftest import make_admin, make_settings, register_and_login
from tests.platform_api.payments.conftest import provider_settings
from tests.platform_api.payments.stand_ins import free_port

INITIATE = "/api/payments/mobile-money/initiate"
STATUS = "/api/payments/mobile-money/status/"


def order(**changes: Any) -> dict[str, Any]:
    return {"provider": "mobile-money-a", "phone": "+254712345678", "amount": 1500,
            "currency": "KES", "order_id": "INV-2026-000481",
            "description": "Consultation, Kibera Community Clinic", **changes}


async def test_initiating_prompts_the_customer_and_records_a_payment_notice(
        app, client, user, stk):
    response = await client.post(INITIATE, json=order(), headers=user["headers"])
    assert response.status_code == 201, response.text
    payment = response.json()["data"]
    assert payment == {**payment, "order_id": "INV-2026-000481", "provider": "mobile-money-a",
                       "state": "pending", "amount": "1500", "currency": "KES",
                       "phone": "+254712345678", "receipt": None}
    [push] = stk.requests
    assert push["Amount"] == 1500 and push["PartyA"] == push["PhoneNumber"] == "254712345678"
    assert push["TransactionType"] == "CustomerPayBillOnline"
    assert push["AccountReference"] == "INV-2026-000"
    assert payment["provider_reference"] == push["CheckoutRequestID"]
    callback = httpx.URL(push["CallBackURL"])
    assert (callback.scheme, callback.host, callback.path) == (
        "https", "api.kliniki.example", "/api/payments/webhooks/mobile-money-a")
    assert callback.params["order_id"] == "INV-2026-000481"
    token = callback.params["token"]
    assert len(token) >= 40
    document = await app.state.services.store.get_document(PAYMENTS, "INV-2026-000481")
    assert token not in str(document)  # only its digest is kept
    admin = await make_admin(app, client)
    notice = (await client.get(f"/fhir/PaymentNotice/{payment['payment_notice_id']}",
                               headers=admin["headers"])).json()
    assert notice["identifier"][:2] == [
        {"system": "urn:healthplatform:payment-order", "value": "INV-2026-000481"},
        {"system": "urn:healthplatform:mobile-money-a:request",
         "value": push["CheckoutRequestID"]}]
    assert notice["amount"] == {"value": 1500, "currency": "KES"}
    assert notice["status"] == "active"
    assert notice["paymentStatus"]["coding"] == [
        {"system": "urn:healthplatform:mobile-money-state", "code": "pending"}]
    assert notice["recipient"]["identifier"]["value"] == "174379"
    # the payer reads the /api view, not the platform's PaymentNotice
    assert (await client.get(f"/fhir/PaymentNotice/{payment['payment_notice_id']}",
                             headers=user["headers"])).status_code == 403


async def test_the_same_order_twice_is_the_same_payment_not_a_second_charge(
        client, user, stk):
    first = await client.post(INITIATE, json=order(), headers=user["headers"])
    again = await client.post(INITIATE, json=order(amount=99), headers=user["headers"])
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["data"] == first.json()["data"]
    assert len(stk.requests) == 1
    someone = await register_and_login(client, first_name="Otieno", last_name="Were")
    taken = await client.post(INITIATE, json=order(), headers=someone["headers"])
    assert (taken.status_code, taken.json()["error"]["code"]) == (409, "ORDER_ID_TAKEN")


async def test_the_providers_token_is_fetched_once_and_again_when_revoked(client, user, stk):
    for n in range(2):
        await client.post(INITIATE, json=order(order_id=f"INV-T{n}"), headers=user["headers"])
    assert (len(stk.requests), stk.tokens_issued) == (2, 1)
    stk.revoke_tokens()
    response = await client.post(INITIATE, json=order(order_id="INV-T3"),
                                 headers=user["headers"])
    assert response.status_code == 201
    assert stk.tokens_issued == 2


@pytest.mark.parametrize(("changes", "field"), [
    ({"provider": "mobile-money-z"}, "provider"),
    ({"phone": "0712345678"}, "phone"),
    ({"phone": "+256772123456"}, "phone"),  # provider A takes Kenyan numbers
    ({"amount": 0}, "amount"),
    ({"amount": -250}, "amount"),
    ({"amount": "mia tano"}, "amount"),
    ({"amount": 1500.5}, "amount"),  # provider A: whole shillings
    ({"amount": 1234567890123}, "amount"),
    ({"provider": "mobile-money-b", "currency": "EUR", "amount": 12.345}, "amount"),
    ({"provider": "mobile-money-b", "currency": "UGX", "amount": 2500.5,
      "phone": "+256772123456"}, "amount"),
    ({"currency": "kes"}, "currency"),
    ({"currency": "USD"}, "currency"),
    ({"order_id": "INV 2026/481"}, "order_id"),
    ({"order_id": None}, "order_id"),
])
async def test_a_bad_payload_is_422_naming_the_field(client, user, stk, changes, field):
    response = await client.post(INITIATE, json=order(**changes), headers=user["headers"])
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("VALIDATION_ERROR", field)
    assert stk.requests == []


async def test_amounts_stay_exact_decimals(client, user, momo):
    response = await client.post(INITIATE, headers=user["headers"], json=order(
        provider="mobile-money-b", phone="+233241234567", currency="EUR", amount=1500.10,
        order_id="INV-EUR-1"))
    assert response.status_code == 201, response.text
    assert response.json()["data"]["amount"] == "1500.10"
    [request] = momo.requests
    assert request["body"]["amount"] == "1500.10"
    assert request["body"]["payer"] == {"partyIdType": "MSISDN", "partyId": "233241234567"}
    assert request["environment"] == "sandbox"
    as_text = await client.post(INITIATE, headers=user["headers"], json=order(
        provider="mobile-money-b", phone="+256772123456", currency="UGX", amount="25000",
        order_id="INV-UGX-1"))
    assert as_text.json()["data"]["amount"] == "25000"
    assert Decimal(momo.requests[1]["body"]["amount"]) == Decimal(25000)


async def test_a_provider_refusal_charges_nothing_and_frees_the_order(app, client, user, stk):
    stk.refuse_with = (400, {"errorCode": "400.002.02",
                             "errorMessage": "Bad Request - Invalid PhoneNumber"})
    refused = await client.post(INITIATE, json=order(), headers=user["headers"])
    assert refused.status_code == 502
    assert refused.json()["error"]["code"] == "PROVIDER_REJECTED"
    assert "Invalid PhoneNumber" in refused.json()["error"]["message"]
    assert await app.state.services.store.get_document(PAYMENTS, "INV-2026-000481") is None
    again = await client.post(INITIATE, json=order(), headers=user["headers"])
    assert again.status_code == 201


async def test_a_provider_error_that_may_have_charged_leaves_the_payment_pending(
        client, user, momo):
    momo.refuse_with = (500, {"code": "INTERNAL_PROCESSING_ERROR", "message": "try later"})
    response = await client.post(INITIATE, headers=user["headers"], json=order(
        provider="mobile-money-b", phone="+256772123456", currency="UGX", amount=5000,
        order_id="INV-5XX"))
    assert response.status_code == 201
    payment = response.json()["data"]
    assert payment["state"] == "pending" and payment["provider_reference"]  # queryable


async def test_an_unreachable_provider_is_503_and_nothing_is_kept(tmp_path, stk, momo):
    settings = make_settings(tmp_path, **{**provider_settings(stk, momo),
                                          "mobile_money_a_base_url":
                                          f"http://127.0.0.1:{free_port()}"})
    app = create_app(settings)
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            payer = await register_and_login(c)
            response = await c.post(INITIATE, json=order(), headers=payer["headers"])
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "PROVIDER_UNAVAILABLE"
        assert await app.state.services.store.count_documents(PAYMENTS) == 0


async def test_a_payment_is_read_by_its_payer_and_platform_administrators(
        app, client, user, clinic_admin, stk):
    await client.post(INITIATE, json=order(), headers=user["headers"])
    path = STATUS + "INV-2026-000481"
    mine = await client.get(path, headers=user["headers"])
    assert (mine.status_code, mine.json()["data"]["state"]) == (200, "pending")
    admin = await make_admin(app, client)
    assert (await client.get(path, headers=admin["headers"])).status_code == 200
    assert (await client.get(path, headers=clinic_admin["headers"])).status_code == 404
    assert (await client.get(STATUS + "INV-UNKNOWN", headers=user["headers"])).status_code == 404
    assert (await client.get(path)).status_code == 401
    assert (await client.post(INITIATE, json=order())).status_code == 401

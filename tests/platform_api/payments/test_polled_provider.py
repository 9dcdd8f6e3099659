"""Provider C (``mobile-money-c``), settled by polling its status endpoint with no
callback, against a local stand-in of an Airtel Money style collections API: success,
failure, a payment that never settles, the idempotent retry of a request that may have
been taken, and a pending payment polled again after a restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.payments.ledger import PAYMENTS
from platform_api.settings import Settings
from tests.conftest import make_admin, make_settings, register_and_login
from tests.platform_api.payments.conftest import PUBLIC_BASE
from tests.platform_api.payments.stand_ins import PolledCollectionStandIn, serving

INITIATE = "/api/payments/mobile-money/initiate"
STATUS = "/api/payments/mobile-money/status/"
ORDER = "INV-2026-000907"


@pytest.fixture
async def airtel() -> AsyncIterator[PolledCollectionStandIn]:
    stand_in = PolledCollectionStandIn()
    async with serving(stand_in) as url:
        stand_in.url = url  # type: ignore[attr-defined]
        yield stand_in


def polled_settings(tmp_path: Path, stand_in: PolledCollectionStandIn,
                    **changes: Any) -> Settings:
    return make_settings(tmp_path, **{
        "base_url": PUBLIC_BASE, "mobile_money_sweep_interval_seconds": 0,
        "mobile_money_c_base_url": stand_in.url,  # type: ignore[attr-defined]
        "mobile_money_c_client_id": stand_in.client_id,
        "mobile_money_c_client_secret": stand_in.client_secret,
        "mobile_money_c_poll_interval_seconds": 0.05,
        "mobile_money_c_poll_timeout_seconds": 600, **changes})


@pytest.fixture
def settings(tmp_path: Path, airtel: PolledCollectionStandIn) -> Settings:
    return polled_settings(tmp_path, airtel)


@pytest.fixture
def events(app: Any) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    async def fulfil_order(event: dict[str, Any]) -> None:
        seen.append(event)
    app.state.services.bus.subscribe("platform.payments.*", fulfil_order, consumer="orders")
    return seen


def order(**changes: Any) -> dict[str, Any]:
    return {"provider": "mobile-money-c", "phone": "+256752123456", "amount": 25000,
            "currency": "UGX", "order_id": ORDER, "description": "Antenatal visit",
            **changes}


async def initiate(client: httpx.AsyncClient, user: dict[str, Any], **changes: Any
                   ) -> dict[str, Any]:
    response = await client.post(INITIATE, json=order(**changes), headers=user["headers"])
    assert response.status_code == 201, response.text
    return response.json()["data"]  # type: ignore[no-any-return]


async def settled(app: Any, client: httpx.AsyncClient, user: dict[str, Any],
                  order_id: str = ORDER) -> dict[str, Any]:
    """The payment once the background poller moved it out of pending (bounded wait)."""
    for _ in range(600):
        payment = (await client.get(STATUS + order_id, headers=user["headers"])).json()["data"]
        if payment["state"] != "pending":
            await app.state.services.bus.drain()
            return payment  # type: ignore[no-any-return]
        await asyncio.sleep(0.05)
    raise AssertionError(f"the payment of {order_id} was never settled")


async def test_a_payment_the_customer_approves_is_polled_to_paid(
        app, client, user, airtel, events):
    payment = await initiate(client, user)
    assert (payment["state"], payment["provider_reference"]) == ("pending", ORDER)
    [request] = airtel.requests
    assert request["subscriber"] == {"country": "UG", "currency": "UGX",
                                     "msisdn": "752123456"}
    assert request["transaction"] == {"amount": 25000, "country": "UG", "currency": "UGX",
                                      "id": ORDER}
    await asyncio.sleep(0.3)  # polled while the customer has not yet approved
    assert (await client.get(STATUS + ORDER, headers=user["headers"])).json()["data"][
        "state"] == "pending"
    assert airtel.status_calls >= 2
    airtel.settle(ORDER, "TS", "Transaction Success", receipt="MP260603.1234.L06941")
    paid = await settled(app, client, user)
    assert (paid["state"], paid["receipt"]) == ("paid", "MP260603.1234.L06941")
    admin = await make_admin(app, client)
    notice = (await client.get(f"/fhir/PaymentNotice/{payment['payment_notice_id']}",
                               headers=admin["headers"])).json()
    assert notice["paymentStatus"]["coding"][0]["code"] == "paid"
    assert {"system": "urn:healthplatform:mobile-money-c:receipt",
            "value": "MP260603.1234.L06941"} in notice["identifier"]
    assert notice["recipient"]["identifier"]["value"] == airtel.client_id
    assert [e["topic"] for e in events] == ["platform.payments.initiated",
                                            "platform.payments.paid"]
    assert events[-1]["payload"]["receipt"] == "MP260603.1234.L06941"
    calls = airtel.status_calls
    await asyncio.sleep(0.3)
    assert airtel.status_calls == calls  # a settled payment is no longer polled


async def test_a_failed_payment_is_polled_to_failed_with_the_providers_reason(
        app, client, user, airtel, events):
    await initiate(client, user)
    airtel.settle(ORDER, "TF", "Insufficient funds")
    failed = await settled(app, client, user)
    assert (failed["state"], failed["failure_reason"]) == ("failed", "Insufficient funds")
    assert [e["topic"] for e in events][-1] == "platform.payments.failed"


async def test_a_payment_that_never_settles_is_timed_out(tmp_path, airtel):
    app = create_app(polled_settings(tmp_path, airtel,
                                     mobile_money_c_poll_timeout_seconds=0.5))
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            payer = await register_and_login(c)
            await initiate(c, payer)
            timed_out = await settled(app, c, payer)
    assert timed_out["state"] == "timed_out"
    assert timed_out["failure_reason"] == "the provider still says pending"
    assert airtel.status_calls >= 2


async def test_a_request_that_may_have_been_taken_is_retried_with_the_same_id(
        app, client, user, airtel):
    airtel.fail_after_taking = 1  # taken, but answered 500: the client cannot know
    payment = await initiate(client, user)
    assert len(airtel.requests) == 2 and airtel.requests[0] == airtel.requests[1]
    assert list(airtel.transactions) == [ORDER]  # one transaction, not two charges
    again = await client.post(INITIATE, json=order(), headers=user["headers"])
    assert (again.status_code, again.json()["data"]) == (200, payment)
    assert len(airtel.requests) == 2  # the order's payment exists: nothing asked
    airtel.settle(ORDER, "TS")
    assert (await settled(app, client, user))["state"] == "paid"


async def test_a_request_still_failing_after_the_retry_stays_pending_and_is_polled(
        app, client, user, airtel):
    airtel.fail_after_taking = 2
    payment = await initiate(client, user)
    assert (payment["state"], payment["provider_reference"]) == ("pending", ORDER)
    airtel.settle(ORDER, "TS")
    assert (await settled(app, client, user))["state"] == "paid"


async def test_a_refusal_charges_nothing_and_frees_the_order(app, client, user, airtel):
    airtel.refuse_with = (400, {"status": {"code": "400", "success": False,
                                           "message": "Invalid MSISDN"}})
    refused = await client.post(INITIATE, json=order(), headers=user["headers"])
    assert (refused.status_code, refused.json()["error"]["code"]) == (502,
                                                                      "PROVIDER_REJECTED")
    assert "Invalid MSISDN" in refused.json()["error"]["message"]
    assert await app.state.services.store.get_document(PAYMENTS, ORDER) is None
    assert (await client.post(INITIATE, json=order(), headers=user["headers"])
            ).status_code == 201


@pytest.mark.parametrize(("changes", "field"), [
    ({"phone": "+254712345678"}, "phone"),  # another country's number
    ({"currency": "KES"}, "currency"),
    ({"amount": 2500.5}, "amount"),  # whole units
])
async def test_a_payload_the_provider_cannot_take_is_422(client, user, airtel, changes,
                                                         field):
    response = await client.post(INITIATE, json=order(**changes), headers=user["headers"])
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert airtel.requests == []


async def test_a_pending_payment_is_polled_again_after_a_restart(tmp_path, airtel):
    settings = polled_settings(tmp_path, airtel,
                               mobile_money_c_poll_interval_seconds=3600)
    first = create_app(settings)
    async with LifespanManager(first, startup_timeout=30):
        transport = httpx.ASGITransport(app=first)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            payer = await register_and_login(c)
            await initiate(c, payer)
    airtel.settle(ORDER, "TS")  # approved while the server was down
    second = create_app(settings)
    async with LifespanManager(second, startup_timeout=30):
        transport = httpx.ASGITransport(app=second)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            # the payer's token outlives the restart (the signing key is in the data dir)
            assert (await settled(second, c, payer))["state"] == "paid"

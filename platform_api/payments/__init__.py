"""Payments area: mobile money payments (spec: Payments; Mobile money payment).

``POST /api/payments/mobile-money/initiate`` asks the chosen provider
(:mod:`platform_api.payments.providers`) to collect ``amount`` from ``phone`` for
``order_id``; ``GET /api/payments/mobile-money/status/:order_id`` reads the payment.
The provider's callback (``/api/payments/webhooks/mobile-money-a|b``,
:mod:`platform_api.webhooks.mobile_money`) completes it once the provider's status query
confirms it; a payment with no callback by ``HEALTHPLATFORM_MOBILE_MONEY_TIMEOUT_SECONDS``
is queried and settled, or timed out (:mod:`platform_api.payments.ledger`).

Payload: ``provider`` (``mobile-money-a`` | ``mobile-money-b`` | ``mobile-money-c``,
configured on this server; C has no callback and is settled by polling,
:mod:`platform_api.payments.polled`), ``phone`` (E.164, ``+254712345678``; provider A
takes Kenyan numbers),
``amount`` (a positive decimal — a JSON number or a string, read as a decimal, never as a
binary float; at most 12 digits; whole units for currencies without minor units and for
provider A), ``currency`` (ISO 4217, one the provider takes: KES for A, the configured
list for B), ``order_id`` (letters, digits, ``._:-``; one payment per order: initiating
an order again answers its existing payment, 200, and charges nothing; another user's
order is 409 ``ORDER_ID_TAKEN``), ``description``. A refusal names the field (422).
A provider that cannot be reached (503 ``PROVIDER_UNAVAILABLE``) or refuses (502
``PROVIDER_REJECTED``) charged nothing: the order may be initiated again. A provider
that did not answer in time may have taken the request: the payment stays ``pending``
(201) and settles by callback or query.

States: ``pending`` → ``paid`` | ``failed`` | ``timed_out``; ``timed_out`` → ``paid``
when the provider confirms a success late (``ledger.MOVES``).

FHIR mapping (``PaymentNotice``, written by the platform, owned by no organization:
platform administrators see it on /fhir; the payer reads the /api view):
    order_id                → identifier[system=urn:healthplatform:payment-order]
    provider request id     → identifier[system=urn:healthplatform:<provider>:request]
                              and payment.identifier (the PaymentReconciliation is the
                              provider's; a logical reference)
    provider receipt        → identifier[system=urn:healthplatform:<provider>:receipt]
                              (and payment.identifier once paid)
    amount, currency        → amount.value, amount.currency
    state                   → paymentStatus.coding[system=urn:healthplatform:mobile-money-
                              state] (+ paymentstatus#paid once paid); status active, or
                              cancelled once failed or timed out
    created_at              → created;  paid date → paymentDate
    merchant (shortcode /   → recipient.identifier[system=urn:healthplatform:<provider>:
    API user)                 merchant]
Provider bookkeeping (phone, description, provider ids, the callback token's SHA-256,
who initiated it, the state's history) is the ``mobile_money_payments/<order_id>``
document; the callback URL carries an unguessable per-payment token that only its digest
is kept of.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Path, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.responses import Response

from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.store import DuplicateDocument
from platform_api.auth.dependencies import current_principal
from platform_api.auth.principal import Principal
from platform_api.envelope import ApiError, Envelope, conflict, created, not_found, ok
from platform_api.facade import ApiContext, api_context
from platform_api.payments import ledger, polled
from platform_api.payments.ledger import PAYMENTS, Sweeper, providers_of
from platform_api.payments.providers import (
    PENDING,
    MobileMoneyProvider,
    ProviderError,
    Requested,
    configured_providers,
)
from platform_api.services import Services, request_services

JSON = dict[str, Any]
E164 = r"^\+[1-9]\d{7,14}$"
ORDER_ID = r"^[A-Za-z0-9._:-]{1,64}$"
SWEEPER = "mobile_money_sweeper"
POLLER = "mobile_money_poller"


class DecimalJsonRequest(Request):
    """A request whose JSON numbers with a fraction are read as ``Decimal``."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), parse_float=Decimal)
        return self._json


class DecimalJsonRoute(APIRoute):
    """Routes whose bodies carry money: amounts never pass through a binary float."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(DecimalJsonRequest(request.scope, request.receive))
        return route


class PaymentInitiate(BaseModel):
    provider: str = Field(examples=["mobile-money-a"])
    phone: str = Field(pattern=E164, examples=["+254712345678"],
                       description="International format (E.164)")
    amount: Decimal = Field(gt=0, max_digits=12, decimal_places=2, examples=["1500"])
    currency: str = Field(pattern=r"^[A-Z]{3}$", examples=["KES"])
    order_id: str = Field(pattern=ORDER_ID, examples=["INV-2026-000481"])
    description: str = Field(default="", max_length=200,
                             examples=["Consultation, Kibera Community Clinic"])


class PaymentView(BaseModel):
    order_id: str
    provider: str
    state: str = Field(description="pending | paid | failed | timed_out")
    phone: str
    amount: str = Field(description="Decimal, as text")
    currency: str
    description: str
    provider_reference: str | None = None
    receipt: str | None = None
    failure_reason: str | None = None
    payment_notice_id: str | None = None
    created_at: str
    updated_at: str


router = APIRouter(prefix="/api/payments/mobile-money", tags=["payments"],
                   route_class=DecimalJsonRoute)


def view(payment: JSON) -> JSON:
    return PaymentView.model_validate(
        {k: payment.get(k) for k in PaymentView.model_fields}).model_dump()


def _provider(services: Services, body: PaymentInitiate) -> MobileMoneyProvider:
    """The provider, once the payload suits it (422 naming the field otherwise)."""
    provider = providers_of(services).get(body.provider)
    if provider is None:
        known = ", ".join(sorted(providers_of(services))) or "none is configured"
        raise ApiError(422, "VALIDATION_ERROR", f"provider: unknown provider "
                       f"{body.provider!r} (this server takes: {known})", field="provider")
    if not provider.supports(body.currency):
        raise ApiError(422, "VALIDATION_ERROR", f"currency: {body.provider} does not take "
                       f"{body.currency}", field="currency")
    problem = provider.phone_problem(body.phone)
    if problem:
        raise ApiError(422, "VALIDATION_ERROR", f"phone: {problem}", field="phone")
    places = provider.minor_units(body.currency)
    if body.amount != body.amount.quantize(Decimal(1).scaleb(-places)):
        raise ApiError(422, "VALIDATION_ERROR", f"amount: {body.provider} takes {body.currency}"
                       f" amounts with at most {places} decimal places", field="amount")
    return provider


def _callback_url(services: Services, provider: str, order_id: str, token: str) -> str:
    query = urlencode({"order_id": order_id, "token": token})
    return f"{services.settings.public_base_url}/api/payments/webhooks/{provider}?{query}"


@router.post("/initiate", status_code=201, response_model=Envelope[PaymentView],
             summary="Ask a mobile money provider to collect a payment",
             responses={200: {"description": "The order's existing payment (nothing charged)"},
                        409: {"description": "ORDER_ID_TAKEN: another user's order"},
                        502: {"description": "PROVIDER_REJECTED (nothing charged)"},
                        503: {"description": "PROVIDER_UNAVAILABLE (nothing charged)"}})
async def initiate_payment(body: PaymentInitiate, request: Request,
                           principal: Principal = Depends(current_principal)) -> Any:
    services = request_services(request)
    provider = _provider(services, body)
    places = provider.minor_units(body.currency)
    amount = body.amount.quantize(Decimal(1).scaleb(-places))
    token = secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    payment = {
        "id": body.order_id, "order_id": body.order_id, "provider": body.provider,
        "state": PENDING, "phone": body.phone, "amount": str(amount),
        "currency": body.currency, "description": body.description,
        "initiated_by": principal.user_id, "callback_token_sha256": ledger.token_digest(token),
        "provider_reference": None, "created_at": ledger._instant(now),
        "updated_at": ledger._instant(now),
        "expires_at": ledger.deadline(now, getattr(provider, "settle_within_seconds", None)
                                      or services.settings.mobile_money_timeout_seconds),
        "history": [{"state": PENDING, "at": ledger._instant(now), "via": "initiate"}],
    }
    try:  # the order is reserved before the provider is called: one charge per order
        async with services.store.unit_of_work() as uow:
            uow.insert_document(PAYMENTS, body.order_id, payment)
            await uow.commit()
    except DuplicateDocument:
        return await _existing(services, body.order_id, principal)
    try:
        requested = await provider.request_payment(
            order_id=body.order_id, phone=body.phone, amount=amount, currency=body.currency,
            description=body.description,
            callback_url=_callback_url(services, body.provider, body.order_id, token))
    except ProviderError as exc:
        if not exc.maybe_charged:
            await _release(services, body.order_id)
            status, code = (502, "PROVIDER_REJECTED") if exc.refused else \
                (503, "PROVIDER_UNAVAILABLE")
            raise ApiError(status, code, f"{body.provider}: {exc}. Nothing was charged; "
                           "the order may be initiated again.") from None
        # It may have been taken: pending, settled by its callback or the sweep's query.
        requested = Requested(exc.reference or "")
    # The PaymentNotice is the platform's record of the payment, which no payer writes.
    fhir = services.policy.elevate("payment.initiate: record the payment's PaymentNotice",
                                   principal)
    stored = await _record(services, fhir, provider, payment, requested)
    return created(view(stored))


async def _existing(services: Services, order_id: str, principal: Principal) -> Any:
    payment = await services.store.get_document(PAYMENTS, order_id)
    if payment is None:  # released meanwhile (the provider could not be reached)
        raise conflict("ORDER_ID_BUSY", "This order's payment is being initiated; try again")
    if payment["initiated_by"] != principal.user_id:
        raise conflict("ORDER_ID_TAKEN", "This order id belongs to another payment")
    return ok(view(payment))


async def _release(services: Services, order_id: str) -> None:
    async with services.store.unit_of_work() as uow:
        uow.delete_document(PAYMENTS, order_id)
        await uow.commit()


async def _record(services: Services, fhir: CallerFhir, provider: MobileMoneyProvider,
                  payment: JSON, requested: Requested) -> JSON:
    """The payment with the provider's ids and its PaymentNotice, in one commit."""
    stored = {**payment, "provider_reference": requested.reference or None,
              "merchant_reference": requested.merchant_reference,
              "payment_notice_id": new_id(), "updated_at": now_instant()}
    notice = ledger.payment_notice(stored, provider, services.settings.service_name)
    async with fhir.unit() as unit:
        await unit.create(notice, resource_id=stored["payment_notice_id"],
                          expected_type="PaymentNotice")
        unit.put_document(PAYMENTS, stored["order_id"], stored)
        unit.emit("platform.payments.initiated", {
            "order_id": stored["order_id"], "provider": stored["provider"],
            "amount": stored["amount"], "currency": stored["currency"],
            "payment_notice_id": stored["payment_notice_id"]}, source_service="payments")
        await unit.commit()
    return stored


@router.get("/status/{order_id}", response_model=Envelope[PaymentView],
            summary="A mobile money payment's state")
async def payment_status(order_id: Annotated[str, Path(pattern=ORDER_ID)],
                         ctx: ApiContext = Depends(api_context)) -> Any:
    payment = await ctx.services.store.get_document(PAYMENTS, order_id)
    # Someone else's payment is as unknown as a missing one: order ids are guessable.
    if payment is None or not ctx.may("payment.read", user_id=payment["initiated_by"]):
        raise not_found("Payment")
    return ok(view(payment))


# -- in the app -------------------------------------------------------------------------------
def install(services: Services) -> None:
    """The configured providers and the consumer of their callbacks."""
    providers_of(services).update(configured_providers(services.settings))
    if services.settings.mobile_money_c_base_url:
        providers_of(services)[polled.NAME] = polled.PolledProvider(services.settings)

    async def mobile_money_callbacks(event: Any) -> None:
        await ledger.confirm_callback(services, event)
    services.bus.subscribe(ledger.CALLBACK_TOPIC, mobile_money_callbacks,
                           consumer=ledger.CONSUMER)


async def start(services: Services) -> None:
    sweeper = Sweeper(services)
    sweeper.start()
    services.extras[SWEEPER] = sweeper
    poller = polled.Poller(services)
    poller.start()
    services.extras[POLLER] = poller


async def stop(services: Services) -> None:
    sweeper = services.extras.pop(SWEEPER, None)
    if sweeper is not None:
        await sweeper.stop()
    poller = services.extras.pop(POLLER, None)
    if poller is not None:
        await poller.stop()
    for provider in providers_of(services).values():
        await provider.close()

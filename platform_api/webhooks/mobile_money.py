"""``POST /api/payments/webhooks/mobile-money-a`` and ``…/mobile-money-b``: the mobile
money providers' payment callbacks.

These providers sign nothing (the STK push style's ``Body.stkCallback``, the
request-to-pay style's ``{externalId, financialTransactionId, status, reason}``), so a
callback is authenticated the way their integrators do it:

- the callback URL given at initiation carries the order id and a per-payment token of
  256 random bits (``?order_id=…&token=…``); only its SHA-256 is stored, and the token a
  callback presents is checked against it in constant time (an unknown order is checked
  against a dummy digest: the answer and its timing are the same, 401);
- optionally, the source address must be in the provider's allow-list
  (``HEALTHPLATFORM_MOBILE_MONEY_A_CALLBACK_IPS`` / ``_B_``; through a trusted proxy, the
  address it forwarded), else 403 ``ADDRESS_NOT_ALLOWED``;
- and the callback's word is not enough: its consumer asks the provider's status query
  before a payment is marked paid (:func:`platform_api.payments.ledger.confirm_callback`).

The event id is the checkout request id (A) or ``externalId:status:transaction id``
(B); the work is the event ``platform.webhook.mobile_money`` ``{order_id, provider,
callback}``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from platform_api.envelope import ApiError, Envelope
from platform_api.payments.ledger import CALLBACK_TOPIC, PAYMENTS, providers_of, token_matches
from platform_api.services import request_services
from platform_api.webhooks.inbound import (
    PLATFORM_BODY,
    REFUSALS,
    Inbound,
    WebhookAck,
    accept,
    dead_letter_body,
    log,
    networks,
    parse_json,
    refuse,
    require_https,
    within,
)

router = APIRouter(tags=["webhooks"])


async def _callback(request: Request, provider_name: str, order_id: str, token: str,
                    allowed: list[str]) -> Any:
    family = provider_name.replace("-", "_")
    address = require_https(request, family)
    if allowed and not within(address, networks(allowed)):
        log.warning("webhook %s refused from %s: address not allowed", family, address)
        raise ApiError(403, "ADDRESS_NOT_ALLOWED", "Callbacks are accepted from the "
                       "provider's addresses only")
    services = request_services(request)
    payment = await services.store.get_document(PAYMENTS, order_id) if order_id else None
    if not token_matches(payment, token) or payment is None \
            or payment["provider"] != provider_name:
        raise refuse(family, request, "no payment with this order id and token")
    provider = providers_of(services).get(provider_name)
    body = await request.body()
    if provider is None:
        raise ApiError(503, "WEBHOOK_NOT_CONFIGURED", f"{provider_name} is not configured")
    try:
        _, event_id, _ = provider.callback(parse_json(body))
    except ValueError as exc:
        return await dead_letter_body(services, family, body, str(exc))
    return await accept(services, family, [Inbound(event_id, CALLBACK_TOPIC, {
        "order_id": order_id, "provider": provider_name, "callback": parse_json(body)})])


def _mount(provider_name: str, allowed_setting: str, summary: str) -> None:
    async def callback(request: Request, order_id: str = Query("", max_length=64),
                       token: str = Query("", max_length=128)) -> Any:
        allowed = getattr(request_services(request).settings, allowed_setting)
        return await _callback(request, provider_name, order_id, token, allowed)
    callback.__name__ = provider_name.replace("-", "_") + "_callback"
    router.add_api_route(f"/api/payments/webhooks/{provider_name}", callback,
                         methods=["POST"], response_model=Envelope[WebhookAck],
                         summary=summary, responses=REFUSALS, openapi_extra=PLATFORM_BODY)


_mount("mobile-money-a", "mobile_money_a_callback_ips", "Payment callback of provider A "
       "(STK push)")
_mount("mobile-money-b", "mobile_money_b_callback_ips", "Payment callback of provider B "
       "(request to pay)")

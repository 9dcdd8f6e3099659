"""The state of mobile money payments: the ``mobile_money_payments`` documents (provider
bookkeeping) and the FHIR PaymentNotice of each, kept in step; how a callback or a
status query settles a payment; the sweep that settles those no callback settled.

A payment's state moves by :data:`MOVES` only (data, as the spec's status tables)::

    pending → paid | failed | timed_out;  timed_out → paid

``timed_out`` is final for the customer-facing flow, except that a success the provider
confirms later (a late callback) is honoured rather than lost: the money was taken.
Nothing is marked paid on a callback's word alone: the provider's status query must say
so, and the amount it took must be the amount asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.store import ConditionChanged, ResourceGone, ResourceNotFound, VersionConflict
from platform_api.events import Event, RejectedEvent, mark_handled
from platform_api.payments.providers import (
    FAILED,
    PAID,
    PENDING,
    MobileMoneyProvider,
    Outcome,
    ProviderError,
)
from platform_api.services import Services

log = logging.getLogger("healthplatform.payments")

PAYMENTS = "mobile_money_payments"
PROVIDERS_KEY = "mobile_money_providers"
TIMED_OUT = "timed_out"
STATES = (PENDING, PAID, FAILED, TIMED_OUT)
MOVES: dict[str, frozenset[str]] = {
    PENDING: frozenset({PAID, FAILED, TIMED_OUT}),
    TIMED_OUT: frozenset({PAID}),
    PAID: frozenset(),
    FAILED: frozenset(),
}
ORDER_SYSTEM = "urn:healthplatform:payment-order"
STATE_SYSTEM = "urn:healthplatform:mobile-money-state"
PAYMENT_STATUS = "http://terminology.hl7.org/CodeSystem/paymentstatus"
CONSUMER = "mobile_money_callbacks"
CALLBACK_TOPIC = "platform.webhook.mobile_money"
SWEEP_BATCH = 100
JSON = dict[str, Any]


def providers_of(services: Services) -> dict[str, MobileMoneyProvider]:
    return services.extras.setdefault(PROVIDERS_KEY, {})  # type: ignore[no-any-return]


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(payment: JSON | None, token: str) -> bool:
    """Constant-time check of a callback's token against the payment's stored digest
    (an unknown payment is compared against a dummy, so timing tells nothing)."""
    stored = (payment or {}).get("callback_token_sha256") or "0" * 64
    return hmac.compare_digest(token_digest(token), stored) and payment is not None


def _system(provider: str, what: str) -> str:
    return f"urn:healthplatform:{provider}:{what}"


def _instant(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def payment_notice(payment: JSON, provider: MobileMoneyProvider, service_name: str) -> JSON:
    """The PaymentNotice of a payment (see the area's docstring for the mapping)."""
    identifiers = [{"system": ORDER_SYSTEM, "value": payment["order_id"]}]
    if payment.get("provider_reference"):
        identifiers.append({"system": _system(payment["provider"], "request"),
                            "value": payment["provider_reference"]})
    if payment.get("receipt"):
        identifiers.append({"system": _system(payment["provider"], "receipt"),
                            "value": payment["receipt"]})
    state = payment["state"]
    coding = [{"system": STATE_SYSTEM, "code": state}]
    if state == PAID:
        coding.insert(0, {"system": PAYMENT_STATUS, "code": "paid", "display": "Paid"})
    amount = Decimal(payment["amount"])
    notice: JSON = {
        "resourceType": "PaymentNotice",
        "identifier": identifiers,
        "status": "cancelled" if state in (FAILED, TIMED_OUT) else "active",
        "created": payment["created_at"],
        "payment": {"identifier": identifiers[-1] if state == PAID else {
            "system": _system(payment["provider"], "request"),
            "value": payment.get("provider_reference") or payment["order_id"]},
            "display": f"{payment['provider']} payment of order {payment['order_id']}"},
        "recipient": {"identifier": {"system": _system(payment["provider"], "merchant"),
                                     "value": provider.merchant or payment["provider"]},
                      "display": service_name},
        # FHIR decimals are JSON numbers; at most 12 digits, so the text is exact.
        "amount": {"value": int(amount) if amount == amount.to_integral() else float(amount),
                   "currency": payment["currency"]},
        "paymentStatus": {"coding": coding, "text": state},
    }
    if state == PAID and payment.get("paid_at"):
        notice["paymentDate"] = str(payment["paid_at"])[:10]
    return notice


async def settle(services: Services, order_id: str, outcome: Outcome, *, via: str,
                 event: Event | None = None, reference: str | None = None) -> JSON | None:
    """Move a payment to the outcome's state (when :data:`MOVES` allows), with its
    PaymentNotice, the ``platform.payments.<state>`` event and, for a consumer, its
    handled record, in one commit; the payment after it, or ``None`` when unchanged.

    A callback and the sweep (or two processes) may settle one payment at once: the
    PaymentNotice's version is the lock. It is read *before* the payment document, so a
    settlement committed in between makes this one's If-Match fail; it then runs again
    and finds the payment moved.

    A settlement comes from a provider's callback or the sweep, never from a caller: the
    PaymentNotice (the platform's record) is written with rights elevated for it."""
    fhir = services.policy.elevate("payment settlement: record the payment's new state in "
                                   "its PaymentNotice")
    for attempt in range(2):
        try:
            return await _settle_once(services, fhir, order_id, outcome, via=via,
                                      event=event, reference=reference)
        except (VersionConflict, ConditionChanged):
            if attempt:
                raise
    return None


async def _settle_once(services: Services, fhir: CallerFhir, order_id: str, outcome: Outcome,
                       *, via: str, event: Event | None, reference: str | None
                       ) -> JSON | None:
    store = services.store
    first = await store.get_document(PAYMENTS, order_id)
    if first is None:
        raise RejectedEvent(f"no payment for order {order_id}")
    version = await _notice_version(fhir, first.get("payment_notice_id"))
    payment = await store.get_document(PAYMENTS, order_id) or first
    target = outcome.state
    changed = None
    async with fhir.unit() as unit:
        if target in MOVES.get(payment["state"], frozenset()):
            now = now_instant()
            changed = {**payment, "state": target, "updated_at": now,
                       "provider_reference": payment.get("provider_reference") or reference,
                       "history": [*payment.get("history", []),
                                   {"state": target, "at": now, "via": via}]}
            if target == PAID:
                changed.update(receipt=outcome.receipt or payment.get("receipt"), paid_at=now,
                               failure_reason=None)
            elif outcome.reason:
                changed["failure_reason"] = outcome.reason
            unit.put_document(PAYMENTS, order_id, changed)
            await _write_notice(services, unit, changed, version)
            unit.emit(f"platform.payments.{target}", {
                "order_id": order_id, "provider": payment["provider"], "state": target,
                "amount": payment["amount"], "currency": payment["currency"],
                "receipt": changed.get("receipt"), "payment_notice_id":
                changed.get("payment_notice_id")}, source_service="payments")
        if event is not None:
            mark_handled(unit, CONSUMER, event)
        await unit.commit()
    if changed is not None:
        log.info("payment of order %s: %s → %s (%s)", order_id, payment["state"], target, via)
    return changed


async def _notice_version(fhir: CallerFhir, notice_id: str | None) -> int | None:
    if notice_id is None:
        return None
    try:
        return (await fhir.read("PaymentNotice", notice_id)).version
    except (ResourceNotFound, ResourceGone):
        return None


async def _write_notice(services: Services, unit: Any, payment: JSON, version: int | None
                        ) -> None:
    provider = providers_of(services).get(payment["provider"])
    notice_id = payment.get("payment_notice_id")
    if provider is None or notice_id is None:
        return
    notice = payment_notice(payment, provider, services.settings.service_name)
    await unit.update({**notice, "id": notice_id}, if_match=version)


# -- callbacks ---------------------------------------------------------------------------------
async def confirm_callback(services: Services, event: Event) -> None:
    """The consumer of ``platform.webhook.mobile_money`` (both providers' callbacks):
    confirm what the callback claims with the provider's status query, then settle."""
    payload = event["payload"]
    order_id = payload["order_id"]
    payment = await services.store.get_document(PAYMENTS, order_id)
    provider = providers_of(services).get(payload["provider"])
    if payment is None or provider is None:
        raise RejectedEvent(f"no payment of {payload['provider']} for order {order_id}")
    try:
        reference, _, claimed = provider.callback(payload["callback"])
    except ValueError as exc:
        raise RejectedEvent(str(exc)) from None
    known = payment.get("provider_reference")
    if reference and known and reference != known:
        raise RejectedEvent(f"the callback is about request {reference}, the payment's is "
                            f"{known}")
    reference = known or reference
    if payment["state"] in (PAID, FAILED) or reference is None:
        await _handled(services, event)  # settled already, or nothing to query
        return
    confirmed = await provider.query(reference)  # ProviderError: retried, then a dead letter
    if confirmed.state == PENDING:
        log.info("callback for order %s: the provider still says pending; the sweep will "
                 "settle it", order_id)
        await _handled(services, event)
        return
    if confirmed.state == PAID:
        confirmed = Outcome(PAID, receipt=confirmed.receipt or claimed.receipt,
                            amount=confirmed.amount or claimed.amount,
                            currency=confirmed.currency or claimed.currency)
        _check_amount(payment, confirmed)
    await settle(services, order_id, confirmed, via="callback", event=event,
                 reference=reference)


def _check_amount(payment: JSON, outcome: Outcome) -> None:
    """A success for another amount or currency is not this payment's: a human looks."""
    if outcome.amount is not None and outcome.amount != Decimal(payment["amount"]):
        raise RejectedEvent(f"the provider took {outcome.amount}, the payment asked "
                            f"{payment['amount']}")
    if outcome.currency and outcome.currency.upper() != payment["currency"]:
        raise RejectedEvent(f"the provider took {outcome.currency}, the payment asked "
                            f"{payment['currency']}")


async def _handled(services: Services, event: Event) -> None:
    async with services.store.unit_of_work() as uow:
        mark_handled(uow, CONSUMER, event)
        await uow.commit()


# -- the sweep: payments no callback settled ---------------------------------------------------
async def sweep(services: Services, now: datetime | None = None) -> int:
    """Query each pending payment past its deadline; settle it as the provider says, or
    time it out when the provider still says pending (or cannot say). How many moved."""
    cutoff = _instant(now or datetime.now(UTC))
    moved = 0
    while True:
        overdue = [p for p in await services.store.find_documents(
            PAYMENTS, {"state": PENDING}, limit=SWEEP_BATCH, order_by="expires_at")
            if p["expires_at"] <= cutoff]
        for payment in overdue:
            outcome = await _final_outcome(services, payment)
            if await settle(services, payment["order_id"], outcome, via="timeout"):
                moved += 1
        if len(overdue) < SWEEP_BATCH:
            return moved


async def _final_outcome(services: Services, payment: JSON) -> Outcome:
    provider = providers_of(services).get(payment["provider"])
    reference = payment.get("provider_reference")
    if provider is None or not reference:
        return Outcome(TIMED_OUT, reason="no callback, and no request id to query")
    try:
        outcome = await provider.query(reference)
    except ProviderError as exc:
        return Outcome(TIMED_OUT, reason=f"no callback; the status query failed: {exc}")
    if outcome.state == PENDING:
        return Outcome(TIMED_OUT, reason="no callback; the provider still says pending")
    if outcome.state == PAID:
        try:
            _check_amount(payment, outcome)
        except RejectedEvent as exc:
            return Outcome(TIMED_OUT, reason=f"confirmed, but {exc}")
    return outcome


class Sweeper:
    """Runs :func:`sweep` every ``mobile_money_sweep_interval_seconds``."""

    def __init__(self, services: Services):
        self.services = services
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.services.settings.mobile_money_sweep_interval_seconds > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="payment-sweep")

    async def _run(self) -> None:
        interval = self.services.settings.mobile_money_sweep_interval_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                await sweep(self.services)
            except Exception:  # keep sweeping; say so loudly
                log.exception("the payment sweep failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def deadline(created: datetime, timeout_seconds: float) -> str:
    return _instant(created + timedelta(seconds=timeout_seconds))


def today() -> date:
    return datetime.now(UTC).date()

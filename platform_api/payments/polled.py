"""Provider C (``mobile-money-c``): collections settled by polling, with no callback, in
the style of the Airtel Money collections API; and the poller that settles its payments.

The API, through ``httpx`` with a cached OAuth token like the other providers:

- token ``POST /auth/oauth2/token`` (JSON ``client_id``, ``client_secret``,
  ``grant_type=client_credentials``; answers ``access_token``, ``expires_in``);
- ``POST /merchant/v1/payments/`` with ``X-Country`` and ``X-Currency``: ``reference``,
  ``subscriber`` (``msisdn`` without the country's dialing code), ``transaction``
  (``id`` — ours, the order's payment id, so the request can be retried and queried
  whatever happened —, ``amount`` in whole units, ``country``, ``currency``); the customer
  approves on their phone;
- ``GET /standard/v1/payments/{id}``: ``data.transaction.status`` ``TS`` (paid, with
  ``airtel_money_id`` the receipt), ``TF`` (failed, ``message`` the reason), ``TIP`` (in
  progress) or ``TA`` (ambiguous: still pending here, polled again).

Nothing calls us back: :class:`Poller` asks the status of every pending payment of this
provider each ``HEALTHPLATFORM_MOBILE_MONEY_C_POLL_INTERVAL_SECONDS`` and settles it
through :func:`platform_api.payments.ledger.settle` (the same states, PaymentNotice and
``platform.payments.*`` events as the others); one still pending
``HEALTHPLATFORM_MOBILE_MONEY_C_POLL_TIMEOUT_SECONDS`` after it was initiated is timed
out. The pending payments are read from the store on each pass, so a restarted server
polls them again at once.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from platform_api.events import RejectedEvent
from platform_api.payments import ledger
from platform_api.payments.ledger import PAYMENTS, TIMED_OUT, providers_of
from platform_api.payments.providers import (
    FAILED,
    PAID,
    PENDING,
    Outcome,
    ProviderError,
    Requested,
    _Client,
    _error_text,
)
from platform_api.services import Services
from platform_api.settings import Settings

log = logging.getLogger("healthplatform.payments")

JSON = dict[str, Any]
NAME = "mobile-money-c"
POLL_BATCH = 100
# data.transaction.status of the status endpoint → our state (TA, ambiguous, and TIP,
# in progress, are pending: polled again until the deadline)
STATUSES = {"TS": PAID, "TF": FAILED, "TIP": PENDING, "TA": PENDING}


class PolledProvider(_Client):
    """Provider C's API (see the module docstring)."""

    name = NAME
    polled = True  # no callback: the poller settles its payments

    def __init__(self, settings: Settings):
        super().__init__(settings.mobile_money_c_base_url)
        self.client_id = settings.mobile_money_c_client_id
        self.client_secret = settings.mobile_money_c_client_secret
        self.country, self.currency = (settings.mobile_money_c_country,
                                       settings.mobile_money_c_currency)
        self.dialing_code = settings.mobile_money_c_dialing_code
        self.settle_within_seconds = settings.mobile_money_c_poll_timeout_seconds
        self.merchant = self.client_id

    def supports(self, currency: str) -> bool:
        return currency == self.currency

    def minor_units(self, currency: str) -> int:
        return 0  # the collection takes whole units (a JSON integer)

    def phone_problem(self, phone: str) -> str | None:
        if not phone.startswith(f"+{self.dialing_code}"):
            return (f"provider {NAME} takes numbers of its country "
                    f"(+{self.dialing_code}, {self.country})")
        return None

    def _headers(self) -> dict[str, str]:
        return {"X-Country": self.country, "X-Currency": self.currency}

    async def fetch_token(self) -> tuple[str, Any]:
        response = await self.http.post("/auth/oauth2/token", json={
            "client_id": self.client_id, "client_secret": self.client_secret,
            "grant_type": "client_credentials"})
        response.raise_for_status()
        body = response.json()
        return body["access_token"], body.get("expires_in")

    async def request_payment(self, *, order_id: str, phone: str, amount: Decimal,
                              currency: str, description: str, callback_url: str
                              ) -> Requested:
        """Ask for the payment; the callback URL is unused (this provider has none). A
        call that may have been taken (a timeout, a 5xx) is sent once more with the same
        transaction id, which the provider takes at most once."""
        reference = order_id  # ours: one transaction per order, queryable by it
        body = {"reference": (description or order_id)[:64],
                "subscriber": {"country": self.country, "currency": currency,
                               "msisdn": phone.removeprefix(f"+{self.dialing_code}")},
                "transaction": {"amount": int(amount), "country": self.country,
                                "currency": currency, "id": reference}}
        for attempt in (1, 2):
            try:
                response = await self.call("POST", "/merchant/v1/payments/",
                                           headers=self._headers(), json=body)
            except ProviderError as exc:
                exc.reference = reference
                if exc.maybe_charged and attempt == 1:
                    continue
                raise
            if response.status_code >= 500 and attempt == 1:
                continue
            return self._accepted(response, reference)
        raise AssertionError("unreachable")

    def _accepted(self, response: Any, reference: str) -> Requested:
        answer = response.json() if response.content else {}
        status = answer.get("status") if isinstance(answer, dict) else None
        if response.status_code == 200 and isinstance(status, dict) and status.get("success"):
            return Requested(reference)
        maybe = response.status_code >= 500
        message = (status or {}).get("message") if isinstance(status, dict) else None
        raise ProviderError(f"payment request refused: {message or _error_text(response)}",
                            maybe_charged=maybe, refused=not maybe, reference=reference)

    async def query(self, reference: str) -> Outcome:
        response = await self.call("GET", f"/standard/v1/payments/{reference}",
                                   headers=self._headers())
        try:
            transaction = response.json()["data"]["transaction"]
            status = STATUSES[str(transaction["status"]).upper()]
        except (ValueError, KeyError, TypeError):
            raise ProviderError(f"payment status failed: {_error_text(response)}") from None
        if status == PAID:
            return Outcome(PAID, receipt=str(transaction.get("airtel_money_id") or "") or None)
        if status == FAILED:
            return Outcome(FAILED, reason=str(transaction.get("message") or "failed"))
        return Outcome(PENDING)

    def callback(self, body: Any) -> tuple[str | None, str, Outcome]:
        raise ValueError(f"{NAME} has no callbacks: its payments are settled by polling")


# -- the poller --------------------------------------------------------------------------------
async def poll(services: Services, now: datetime | None = None) -> int:
    """One pass: ask the status of each pending payment of a polled provider; settle it
    as the provider says, or time it out past its deadline. How many moved."""
    cutoff = ledger._instant(now or datetime.now(UTC))
    moved = 0
    for name, provider in list(providers_of(services).items()):
        if not getattr(provider, "polled", False):
            continue
        offset = 0
        while True:
            page = await services.store.find_documents(
                PAYMENTS, {"state": PENDING, "provider": name}, limit=POLL_BATCH,
                offset=offset, order_by="expires_at")
            for payment in page:
                outcome = await _outcome(provider, payment, overdue=payment["expires_at"]
                                         <= cutoff)
                if outcome is not None and await ledger.settle(
                        services, payment["order_id"], outcome, via="poll",
                        reference=payment.get("provider_reference")):
                    moved += 1
                else:
                    offset += 1  # still pending: the next page starts after it
            if len(page) < POLL_BATCH:
                break
    return moved


async def _outcome(provider: Any, payment: JSON, *, overdue: bool) -> Outcome | None:
    """The payment's outcome, or ``None`` while it is pending within its deadline."""
    reference = payment.get("provider_reference") or payment["order_id"]
    try:
        outcome: Outcome = await provider.query(reference)
    except ProviderError as exc:
        if overdue:
            return Outcome(TIMED_OUT, reason=f"the status query failed: {exc}")
        log.warning("status of the payment of order %s: %s; polled again",
                    payment["order_id"], exc)
        return None
    if outcome.state == PENDING:
        return Outcome(TIMED_OUT, reason="the provider still says pending") if overdue \
            else None
    if outcome.state == PAID:
        try:
            ledger._check_amount(payment, outcome)
        except RejectedEvent as exc:
            return Outcome(TIMED_OUT, reason=f"confirmed, but {exc}")
    return outcome


class Poller(ledger.Sweeper):
    """Runs :func:`poll` at start and every ``mobile_money_c_poll_interval_seconds`` while
    a polled provider is configured (stopped as the sweeper is)."""

    def start(self) -> None:
        if any(getattr(p, "polled", False) for p in providers_of(self.services).values()):
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="payment-poll")

    async def _run(self) -> None:
        interval = self.services.settings.mobile_money_c_poll_interval_seconds
        while True:  # the first pass at once: payments left pending by a restart
            try:
                await poll(self.services)
            except Exception:  # keep polling; say so loudly
                log.exception("the payment poll failed")
            await asyncio.sleep(interval)

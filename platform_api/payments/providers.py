"""The mobile money providers' APIs, through ``httpx``, each with its OAuth token fetched
and cached (until a minute before it expires; fetched again after a 401).

- **Provider A** (``mobile-money-a``), STK push in the style of M-Pesa Daraja: token
  ``GET /oauth/v1/generate?grant_type=client_credentials`` (Basic consumer key and
  secret); ``POST /mpesa/stkpush/v1/processrequest`` prompts the customer's phone
  (``BusinessShortCode``, ``Password`` = base64(shortcode + passkey + timestamp),
  ``Timestamp`` in Nairobi time, ``Amount`` in whole shillings, ``PartyA``/``PhoneNumber``
  the customer's number, ``CallBackURL``, ``AccountReference``, ``TransactionDesc``) and
  answers ``CheckoutRequestID``; ``POST /mpesa/stkpushquery/v1/query`` tells the outcome
  (``ResultCode`` 0 paid, another code failed, an ``errorCode`` while it is still being
  processed). Kenyan numbers (+254) and KES only.
- **Provider B** (``mobile-money-b``), collection request-to-pay in the style of MTN MoMo:
  token ``POST /collection/token/`` (Basic API user and key, ``Ocp-Apim-Subscription-
  Key``); ``POST /collection/v1_0/requesttopay`` with our ``X-Reference-Id`` (a UUID),
  ``X-Target-Environment``, ``X-Callback-Url`` (answers 202); ``GET
  /collection/v1_0/requesttopay/{reference}`` tells ``status`` PENDING / SUCCESSFUL /
  FAILED with ``financialTransactionId`` and ``reason``. The currencies configured.

Base URLs and credentials are settings (``HEALTHPLATFORM_MOBILE_MONEY_A_*``, ``_B_*``).
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol
from zoneinfo import ZoneInfo

import httpx

from platform_api.settings import Settings

JSON = dict[str, Any]
TIMEOUT = httpx.Timeout(15.0, connect=5.0)
TOKEN_MARGIN_SECONDS = 60
PENDING, PAID, FAILED = "pending", "paid", "failed"


class ProviderError(Exception):
    """The provider refused or failed a call. ``maybe_charged``: the request may have
    been taken (a timeout, a 5xx), so a payment may exist there (``reference``, when we
    chose it, queries it); else it surely was not: ``refused``, or unreachable."""

    def __init__(self, message: str, *, maybe_charged: bool = True, refused: bool = False,
                 reference: str | None = None):
        super().__init__(message)
        self.maybe_charged, self.refused, self.reference = maybe_charged, refused, reference


@dataclass(frozen=True)
class Requested:
    """What the provider gave back for a payment request."""

    reference: str  # the id to query it by (CheckoutRequestID / X-Reference-Id)
    merchant_reference: str | None = None


@dataclass(frozen=True)
class Outcome:
    """A payment's outcome at the provider."""

    state: str  # pending | paid | failed
    reason: str | None = None
    receipt: str | None = None
    amount: Decimal | None = None
    currency: str | None = None


class MobileMoneyProvider(Protocol):
    name: str
    merchant: str  # who is paid (shortcode / API user), for the PaymentNotice

    def supports(self, currency: str) -> bool: ...
    def minor_units(self, currency: str) -> int: ...
    def phone_problem(self, phone: str) -> str | None: ...
    async def request_payment(self, *, order_id: str, phone: str, amount: Decimal,
                              currency: str, description: str, callback_url: str
                              ) -> Requested: ...
    async def query(self, reference: str) -> Outcome: ...
    def callback(self, body: Any) -> tuple[str | None, str, Outcome]: ...
    async def close(self) -> None: ...


@dataclass
class OAuthToken:
    """A bearer token, cached until shortly before it expires."""

    value: str = ""
    expires_at: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def valid(self) -> bool:
        return bool(self.value) and time.monotonic() < self.expires_at - TOKEN_MARGIN_SECONDS

    def keep(self, value: str, expires_in: Any) -> str:
        self.value = value
        self.expires_at = time.monotonic() + float(expires_in or 3600)
        return value


class _Client:
    """An ``httpx`` client with a cached OAuth token; ``call`` fetches the token once
    more after a 401."""

    def __init__(self, base_url: str):
        self.http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=TIMEOUT)
        self.token = OAuthToken()

    async def fetch_token(self) -> tuple[str, Any]:
        raise NotImplementedError

    async def bearer(self) -> str:
        if self.token.valid():
            return self.token.value
        async with self.token.lock:
            if not self.token.valid():
                try:
                    value, expires_in = await self.fetch_token()
                except (httpx.HTTPError, KeyError, ValueError) as exc:
                    raise ProviderError(f"no access token: {type(exc).__name__}: {exc}",
                                        maybe_charged=False) from None
                self.token.keep(value, expires_in)
        return self.token.value

    async def call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        for attempt in (1, 2):
            headers = {**kwargs.pop("headers", {}),
                       "Authorization": f"Bearer {await self.bearer()}"}
            try:
                response = await self.http.request(method, url, headers=headers, **kwargs)
            except httpx.ConnectError as exc:
                raise ProviderError(f"unreachable: {exc}", maybe_charged=False) from None
            except httpx.HTTPError as exc:
                raise ProviderError(f"{type(exc).__name__}: {exc}") from None
            if response.status_code != 401 or attempt == 2:
                return response
            self.token.value = ""  # revoked or expired early: fetch a new one
            kwargs["headers"] = {k: v for k, v in headers.items() if k != "Authorization"}
        raise AssertionError("unreachable")

    async def close(self) -> None:
        await self.http.aclose()


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    if isinstance(body, dict):
        return str(body.get("errorMessage") or body.get("message") or body.get("reason")
                   or body.get("ResponseDescription") or f"HTTP {response.status_code}")
    return f"HTTP {response.status_code}"


# -- provider A: STK push ---------------------------------------------------------------------
NAIROBI = ZoneInfo("Africa/Nairobi")
STILL_PROCESSING = "500.001.1001"


class StkPushProvider(_Client):
    name = "mobile-money-a"

    def __init__(self, settings: Settings):
        super().__init__(settings.mobile_money_a_base_url)
        self.key, self.secret = (settings.mobile_money_a_consumer_key,
                                 settings.mobile_money_a_consumer_secret)
        self.shortcode, self.passkey = (settings.mobile_money_a_shortcode,
                                        settings.mobile_money_a_passkey)
        self.transaction_type = settings.mobile_money_a_transaction_type
        self.merchant = self.shortcode

    def supports(self, currency: str) -> bool:
        return currency == "KES"

    def minor_units(self, currency: str) -> int:
        return 0  # the STK push takes whole shillings

    def phone_problem(self, phone: str) -> str | None:
        if not phone.startswith("+254") or len(phone) != 13:
            return "provider mobile-money-a takes Kenyan mobile numbers (+254 and 9 digits)"
        return None

    async def fetch_token(self) -> tuple[str, Any]:
        response = await self.http.get("/oauth/v1/generate",
                                       params={"grant_type": "client_credentials"},
                                       auth=(self.key, self.secret))
        response.raise_for_status()
        body = response.json()
        return body["access_token"], body.get("expires_in")

    def _password(self) -> tuple[str, str]:
        stamp = datetime.now(NAIROBI).strftime("%Y%m%d%H%M%S")
        password = base64.b64encode(f"{self.shortcode}{self.passkey}{stamp}".encode()).decode()
        return password, stamp

    async def request_payment(self, *, order_id: str, phone: str, amount: Decimal,
                              currency: str, description: str, callback_url: str
                              ) -> Requested:
        password, stamp = self._password()
        number = phone.lstrip("+")
        response = await self.call("POST", "/mpesa/stkpush/v1/processrequest", json={
            "BusinessShortCode": self.shortcode, "Password": password, "Timestamp": stamp,
            "TransactionType": self.transaction_type, "Amount": int(amount),
            "PartyA": number, "PartyB": self.shortcode, "PhoneNumber": number,
            "CallBackURL": callback_url, "AccountReference": order_id[:12],
            "TransactionDesc": (description or order_id)[:13]})
        body = response.json() if response.content else {}
        if response.status_code != 200 or str(body.get("ResponseCode")) != "0":
            maybe = response.status_code >= 500
            raise ProviderError(f"STK push refused: {_error_text(response)}",
                                maybe_charged=maybe, refused=not maybe)
        return Requested(str(body["CheckoutRequestID"]), str(body.get("MerchantRequestID")))

    async def query(self, reference: str) -> Outcome:
        password, stamp = self._password()
        response = await self.call("POST", "/mpesa/stkpushquery/v1/query", json={
            "BusinessShortCode": self.shortcode, "Password": password, "Timestamp": stamp,
            "CheckoutRequestID": reference})
        body = response.json() if response.content else {}
        if body.get("errorCode") == STILL_PROCESSING:
            return Outcome(PENDING)
        if response.status_code != 200 or "ResultCode" not in body:
            raise ProviderError(f"STK query failed: {_error_text(response)}")
        if str(body["ResultCode"]) == "0":
            return Outcome(PAID)
        return Outcome(FAILED, reason=f"{body['ResultCode']}: {body.get('ResultDesc', '')}")

    def callback(self, body: Any) -> tuple[str | None, str, Outcome]:
        """(CheckoutRequestID, event id, outcome as the callback claims it) of an STK
        callback (``Body.stkCallback``); ``ValueError`` for anything else."""
        try:
            result = body["Body"]["stkCallback"]
            reference, code = str(result["CheckoutRequestID"]), int(result["ResultCode"])
        except (KeyError, TypeError, ValueError):
            raise ValueError("not an STK callback: Body.stkCallback with CheckoutRequestID "
                             "and ResultCode expected") from None
        if code != 0:
            return reference, reference, Outcome(FAILED, reason=f"{code}: "
                                                 f"{result.get('ResultDesc', '')}")
        items = (result.get("CallbackMetadata") or {}).get("Item") or []
        meta = {i.get("Name"): i.get("Value") for i in items if isinstance(i, dict)}
        amount = meta.get("Amount")
        return reference, reference, Outcome(
            PAID, receipt=str(meta["MpesaReceiptNumber"]) if meta.get("MpesaReceiptNumber")
            else None, amount=Decimal(str(amount)) if amount is not None else None,
            currency="KES")


# -- provider B: request to pay -----------------------------------------------------------------
class RequestToPayProvider(_Client):
    name = "mobile-money-b"
    ZERO_DECIMAL = frozenset({"UGX", "RWF", "XAF", "XOF"})

    def __init__(self, settings: Settings):
        super().__init__(settings.mobile_money_b_base_url)
        self.user, self.key = settings.mobile_money_b_api_user, settings.mobile_money_b_api_key
        self.subscription_key = settings.mobile_money_b_subscription_key
        self.environment = settings.mobile_money_b_target_environment
        self.currencies = frozenset(c.upper() for c in settings.mobile_money_b_currencies)
        self.merchant = self.user

    def supports(self, currency: str) -> bool:
        return currency in self.currencies

    def minor_units(self, currency: str) -> int:
        return 0 if currency in self.ZERO_DECIMAL else 2

    def phone_problem(self, phone: str) -> str | None:
        return None

    def _headers(self) -> dict[str, str]:
        return {"Ocp-Apim-Subscription-Key": self.subscription_key,
                "X-Target-Environment": self.environment}

    async def fetch_token(self) -> tuple[str, Any]:
        response = await self.http.post("/collection/token/", auth=(self.user, self.key),
                                        headers={"Ocp-Apim-Subscription-Key":
                                                 self.subscription_key})
        response.raise_for_status()
        body = response.json()
        return body["access_token"], body.get("expires_in")

    async def request_payment(self, *, order_id: str, phone: str, amount: Decimal,
                              currency: str, description: str, callback_url: str
                              ) -> Requested:
        reference = str(uuid.uuid4())  # ours: the request can be queried whatever happens
        try:
            response = await self.call("POST", "/collection/v1_0/requesttopay", headers={
                **self._headers(), "X-Reference-Id": reference,
                "X-Callback-Url": callback_url},
                json={"amount": str(amount), "currency": currency, "externalId": order_id,
                      "payer": {"partyIdType": "MSISDN", "partyId": phone.lstrip("+")},
                      "payerMessage": (description or order_id)[:160],
                      "payeeNote": order_id[:160]})
        except ProviderError as exc:
            exc.reference = reference
            raise
        if response.status_code != 202:
            maybe = response.status_code >= 500
            raise ProviderError(f"request to pay refused: {_error_text(response)}",
                                maybe_charged=maybe, refused=not maybe, reference=reference)
        return Requested(reference)

    async def query(self, reference: str) -> Outcome:
        response = await self.call("GET", f"/collection/v1_0/requesttopay/{reference}",
                                   headers=self._headers())
        if response.status_code != 200:
            raise ProviderError(f"request-to-pay status failed: {_error_text(response)}")
        body = response.json()
        return _request_to_pay_outcome(body)

    def callback(self, body: Any) -> tuple[str | None, str, Outcome]:
        """(reference — not in this provider's callbacks —, event id, claimed outcome)."""
        if not isinstance(body, dict) or str(body.get("status", "")).upper() not in (
                "SUCCESSFUL", "FAILED", "PENDING") or not body.get("externalId"):
            raise ValueError("not a request-to-pay callback: externalId and status "
                             "SUCCESSFUL, FAILED or PENDING expected")
        outcome = _request_to_pay_outcome(body)
        event_id = f"{body['externalId']}:{body['status']}:{outcome.receipt or ''}"
        return None, event_id, outcome


def _request_to_pay_outcome(body: JSON) -> Outcome:
    status = str(body.get("status", "")).upper()
    state = {"SUCCESSFUL": PAID, "FAILED": FAILED}.get(status, PENDING)
    amount = body.get("amount")
    try:
        value = Decimal(str(amount)) if amount is not None else None
    except ArithmeticError:
        value = None
    reason = body.get("reason")
    return Outcome(state, reason=str(reason) if state == FAILED and reason else None,
                   receipt=body.get("financialTransactionId") or None, amount=value,
                   currency=body.get("currency"))


PROVIDERS: dict[str, type[StkPushProvider] | type[RequestToPayProvider]] = {
    StkPushProvider.name: StkPushProvider, RequestToPayProvider.name: RequestToPayProvider}


def configured_providers(settings: Settings) -> dict[str, MobileMoneyProvider]:
    """The providers whose base URL is set."""
    found: dict[str, MobileMoneyProvider] = {}
    if settings.mobile_money_a_base_url:
        found[StkPushProvider.name] = StkPushProvider(settings)
    if settings.mobile_money_b_base_url:
        found[RequestToPayProvider.name] = RequestToPayProvider(settings)
    return found

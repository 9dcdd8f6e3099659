"""Local stand-ins for the three mobile money providers: small Starlette apps served by
uvicorn on a free port, speaking each provider's API as its documentation describes
(OAuth token, payment request, status query), recording what they were asked and
answering as a test sets them up."""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

INVALID_TOKEN = {"errorCode": "404.001.04", "errorMessage": "Invalid Access Token"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _basic(request: Request) -> tuple[str, str] | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    user, _, password = base64.b64decode(value).decode().partition(":")
    return user, password


@dataclass
class StandIn:
    """What every stand-in keeps: the tokens it issued and the calls it received."""

    tokens: set[str] = field(default_factory=set)
    tokens_issued: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    refuse_with: tuple[int, dict[str, Any]] | None = None  # the next payment request's answer

    def issue(self) -> str:
        token = secrets.token_urlsafe(16)
        self.tokens.add(token)
        self.tokens_issued += 1
        return token

    def bearer_ok(self, request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme == "Bearer" and token in self.tokens

    def revoke_tokens(self) -> None:
        self.tokens.clear()

    def app(self) -> Starlette:
        raise NotImplementedError


@dataclass
class StkPushStandIn(StandIn):
    """Provider A: M-Pesa Daraja style (oauth, stkpush, stkpushquery)."""

    key: str = "kliniki-consumer-key"
    secret: str = "kliniki-consumer-secret"
    shortcode: str = "174379"
    passkey: str = "bfb279f9aa9bdbcf158e97dd71a467cd2e0c893059b10f78e6b72ada1ed2c919"
    results: dict[str, tuple[str, str] | None] = field(default_factory=dict)

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/oauth/v1/generate", self.token, methods=["GET"]),
            Route("/mpesa/stkpush/v1/processrequest", self.push, methods=["POST"]),
            Route("/mpesa/stkpushquery/v1/query", self.query, methods=["POST"]),
        ])

    async def token(self, request: Request) -> Response:
        if request.query_params.get("grant_type") != "client_credentials" or \
                _basic(request) != (self.key, self.secret):
            return JSONResponse({"errorCode": "400.008.01",
                                 "errorMessage": "Invalid Authentication passed"}, 400)
        return JSONResponse({"access_token": self.issue(), "expires_in": "3599"})

    def _password_ok(self, body: dict[str, Any]) -> bool:
        expected = base64.b64encode(
            f"{self.shortcode}{self.passkey}{body.get('Timestamp')}".encode()).decode()
        return body.get("Password") == expected and body.get("BusinessShortCode") == \
            self.shortcode and re.fullmatch(r"\d{14}", str(body.get("Timestamp"))) is not None

    async def push(self, request: Request) -> Response:
        if not self.bearer_ok(request):
            return JSONResponse(INVALID_TOKEN, 401)
        body = await request.json()
        if self.refuse_with is not None:
            status, answer = self.refuse_with
            self.refuse_with = None
            return JSONResponse(answer, status)
        if not self._password_ok(body) or not isinstance(body.get("Amount"), int) or \
                not re.fullmatch(r"254\d{9}", str(body.get("PartyA"))):
            return JSONResponse({"errorCode": "400.002.02",
                                 "errorMessage": "Bad Request - Invalid request"}, 400)
        checkout = f"ws_CO_{uuid.uuid4().hex[:20]}"
        self.requests.append({**body, "CheckoutRequestID": checkout})
        self.results[checkout] = None  # being processed
        return JSONResponse({"MerchantRequestID": f"2911-{len(self.requests)}",
                             "CheckoutRequestID": checkout, "ResponseCode": "0",
                             "ResponseDescription": "Success. Request accepted for processing",
                             "CustomerMessage": "Success. Request accepted for processing"})

    async def query(self, request: Request) -> Response:
        if not self.bearer_ok(request):
            return JSONResponse(INVALID_TOKEN, 401)
        body = await request.json()
        checkout = body.get("CheckoutRequestID")
        if not self._password_ok(body) or checkout not in self.results:
            return JSONResponse({"errorCode": "400.002.02",
                                 "errorMessage": "Invalid CheckoutRequestID"}, 400)
        result = self.results[checkout]
        if result is None:
            return JSONResponse({"requestId": "1", "errorCode": "500.001.1001",
                                 "errorMessage": "The transaction is being processed"}, 500)
        return JSONResponse({"ResponseCode": "0", "ResponseDescription": "The service request "
                             "has been accepted successsfully", "MerchantRequestID": "2911-1",
                             "CheckoutRequestID": checkout, "ResultCode": result[0],
                             "ResultDesc": result[1]})

    def callback(self, checkout: str, code: int, *, amount: int = 1500,
                 receipt: str = "TKO8QX2M1B") -> dict[str, Any]:
        """The callback body this provider would post for ``checkout``."""
        result: dict[str, Any] = {"MerchantRequestID": "2911-1", "CheckoutRequestID": checkout,
                                  "ResultCode": code, "ResultDesc": "The service request is "
                                  "processed successfully." if code == 0 else
                                  "Request cancelled by user"}
        if code == 0:
            result["CallbackMetadata"] = {"Item": [
                {"Name": "Amount", "Value": amount}, {"Name": "MpesaReceiptNumber",
                                                      "Value": receipt},
                {"Name": "TransactionDate", "Value": 20261124083015},
                {"Name": "PhoneNumber", "Value": 254712345678}]}
        return {"Body": {"stkCallback": result}}


@dataclass
class RequestToPayStandIn(StandIn):
    """Provider B: MTN MoMo collection style (token, requesttopay, its status)."""

    user: str = "6b1e1c4e-8d0b-4f6f-9a7e-2b5f0c3d1e9a"
    key: str = "f1db798c98df4bcf83b538175893bbf0"
    subscription_key: str = "kliniki-subscription-key-b"
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/collection/token/", self.token, methods=["POST"]),
            Route("/collection/v1_0/requesttopay", self.request_to_pay, methods=["POST"]),
            Route("/collection/v1_0/requesttopay/{reference}", self.status, methods=["GET"]),
        ])

    def _subscribed(self, request: Request) -> bool:
        return request.headers.get("ocp-apim-subscription-key") == self.subscription_key

    async def token(self, request: Request) -> Response:
        if _basic(request) != (self.user, self.key) or not self._subscribed(request):
            return JSONResponse({"error": "login_failed"}, 401)
        return JSONResponse({"access_token": self.issue(), "token_type": "access_token",
                             "expires_in": 3600})

    async def request_to_pay(self, request: Request) -> Response:
        if not self.bearer_ok(request) or not self._subscribed(request):
            return JSONResponse({"code": "401", "message": "Access token invalid"}, 401)
        if self.refuse_with is not None:
            status, answer = self.refuse_with
            self.refuse_with = None
            return JSONResponse(answer, status)
        reference = request.headers.get("x-reference-id", "")
        body = await request.json()
        uuid.UUID(reference)
        self.requests.append({"reference": reference, "body": body,
                              "callback_url": request.headers.get("x-callback-url"),
                              "environment": request.headers.get("x-target-environment")})
        self.statuses[reference] = {
            "amount": body["amount"], "currency": body["currency"],
            "externalId": body["externalId"], "payer": body["payer"],
            "payerMessage": body.get("payerMessage"), "payeeNote": body.get("payeeNote"),
            "status": "PENDING"}
        return Response(status_code=202)

    async def status(self, request: Request) -> Response:
        if not self.bearer_ok(request) or not self._subscribed(request):
            return JSONResponse({"code": "401", "message": "Access token invalid"}, 401)
        found = self.statuses.get(request.path_params["reference"])
        if found is None:
            return JSONResponse({"code": "RESOURCE_NOT_FOUND",
                                 "message": "Requested resource was not found."}, 404)
        return JSONResponse(found)

    def settle(self, reference: str, status: str, *, reason: str | None = None,
               transaction: str = "1662829377") -> dict[str, Any]:
        """Move a request to ``status`` and return the callback body the provider sends."""
        entry = self.statuses[reference]
        entry["status"] = status
        if status == "SUCCESSFUL":
            entry["financialTransactionId"] = transaction
        if reason:
            entry["reason"] = reason
        return dict(entry)


@dataclass
class PolledCollectionStandIn(StandIn):
    """Provider C: Airtel Money collections style (oauth2 token, payments, their status);
    no callback. A transaction id is taken once: the same request again answers the same
    transaction (the client's retry), another request with that id is refused."""

    client_id: str = "kliniki-client-c"
    client_secret: str = "kliniki-client-secret-c"
    country: str = "UG"
    currency: str = "UGX"
    transactions: dict[str, dict[str, Any]] = field(default_factory=dict)
    fail_after_taking: int = 0  # the next payment requests taken but answered 500
    status_calls: int = 0

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/auth/oauth2/token", self.token, methods=["POST"]),
            Route("/merchant/v1/payments/", self.pay, methods=["POST"]),
            Route("/standard/v1/payments/{id}", self.status, methods=["GET"]),
        ])

    @staticmethod
    def _status(code: str, message: str, success: bool) -> dict[str, Any]:
        return {"code": code, "message": message, "result_code": "ESB000010" if success
                else "ESB000001", "success": success}

    def _allowed(self, request: Request) -> bool:
        return self.bearer_ok(request) and request.headers.get("x-country") == \
            self.country and request.headers.get("x-currency") == self.currency

    async def token(self, request: Request) -> Response:
        body = await request.json()
        if (body.get("client_id"), body.get("client_secret"), body.get("grant_type")) != (
                self.client_id, self.client_secret, "client_credentials"):
            return JSONResponse({"error": "invalid_client",
                                 "error_description": "Client authentication failed"}, 401)
        return JSONResponse({"access_token": self.issue(), "expires_in": "180",
                             "token_type": "bearer"})

    async def pay(self, request: Request) -> Response:
        if not self._allowed(request):
            return JSONResponse({"status": self._status("401", "Unauthorized", False)}, 401)
        body = await request.json()
        if self.refuse_with is not None:
            status, answer = self.refuse_with
            self.refuse_with = None
            return JSONResponse(answer, status)
        transaction = body.get("transaction") or {}
        reference = str(transaction.get("id", ""))
        if not reference or not isinstance(transaction.get("amount"), int) or \
                not re.fullmatch(r"\d{9}", str((body.get("subscriber") or {}).get("msisdn"))):
            return JSONResponse({"status": self._status("400", "Invalid request", False)}, 400)
        self.requests.append(body)
        known = self.transactions.get(reference)
        if known is not None and known["request"] != body:
            return JSONResponse({"status": self._status(
                "400", "Duplicate transaction id", False)}, 400)
        if known is None:
            self.transactions[reference] = {"request": body, "status": "TIP",
                                            "message": "In process"}
        if self.fail_after_taking:
            self.fail_after_taking -= 1
            return JSONResponse({"status": self._status("500", "Internal error", False)}, 500)
        return JSONResponse({"data": {"transaction": {"id": reference, "status": "Success."}},
                             "status": self._status("200", "Success.", True)})

    async def status(self, request: Request) -> Response:
        if not self._allowed(request):
            return JSONResponse({"status": self._status("401", "Unauthorized", False)}, 401)
        self.status_calls += 1
        reference = request.path_params["id"]
        found = self.transactions.get(reference)
        if found is None:
            return JSONResponse({"status": self._status("404", "Transaction not found",
                                                        False)}, 404)
        transaction = {"id": reference, "status": found["status"],
                       "message": found["message"]}
        if found["status"] == "TS":
            transaction["airtel_money_id"] = found["receipt"]
        return JSONResponse({"data": {"transaction": transaction},
                             "status": self._status("200", "Success.", True)})

    def settle(self, reference: str, status: str, message: str = "",
               receipt: str = "MP210603.1234.L06941") -> None:
        """The customer approved (``TS``) or the payment failed (``TF``)."""
        entry = self.transactions[reference]
        entry.update(status=status, message=message or status, receipt=receipt)


@asynccontextmanager
async def serving(stand_in: StandIn) -> AsyncIterator[str]:
    """Serve ``stand_in`` on a free port; its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(stand_in.app(), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task

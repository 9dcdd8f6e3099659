"""Local stand-ins for the two mobile money providers: small Starlette apps served by
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

"""A local stand-in payer with both kinds of API the revenue cycle talks to:

- FHIR: ``POST /fhir/Claim/$submit`` (a ClaimResponse) and ``POST
  /fhir/CoverageEligibilityRequest/$submit`` (a CoverageEligibilityResponse), bearer key;
- its own JSON: ``POST /own/claims``, ``/own/preauthorizations``, ``/own/eligibility``,
  ``X-Api-Key``.

``decision`` says what it does with the next requests: ``approve`` (everything, paid in
full), ``partial`` (60% of each line approved and paid), ``reject`` (nothing, with a
reason), ``queue`` (FHIR only: outcome queued), ``malformed`` (FHIR only: a
ClaimResponse R4 refuses), ``timeout`` (answers after ``delay``
seconds), ``fail`` (500). It keeps what it received.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from aiohttp import web

JSON = dict[str, Any]
ADJUDICATION = "http://terminology.hl7.org/CodeSystem/adjudication"
SHARE = {"approve": Decimal(1), "partial": Decimal("0.6"), "reject": Decimal(0),
         "queue": Decimal(0), "malformed": Decimal(1)}


@dataclass
class PayerStandIn:
    api_key: str
    decision: str = "approve"
    delay: float = 3.0
    pay_after_days: int = 0  # the payment's date: today + this
    received: list[tuple[str, JSON]] = field(default_factory=list)

    def app(self) -> web.Application:
        application = web.Application()
        application.router.add_post("/fhir/Claim/$submit", self.fhir_claim)
        application.router.add_post("/fhir/CoverageEligibilityRequest/$submit",
                                    self.fhir_eligibility)
        application.router.add_post("/own/claims", self.own_claim)
        application.router.add_post("/own/preauthorizations", self.own_claim)
        application.router.add_post("/own/eligibility", self.own_eligibility)
        return application

    async def _take(self, request: web.Request, header: str, value: str) -> JSON | None:
        if request.headers.get(header) != value:
            return None
        body = await request.json()
        self.received.append((request.path, body))
        if self.decision == "timeout":
            await asyncio.sleep(self.delay)
        return body  # type: ignore[no-any-return]

    def paid_on(self) -> str:
        return (date.today() + timedelta(days=self.pay_after_days)).isoformat()

    def _failure(self) -> web.Response | None:
        if self.decision == "fail":
            return web.json_response({"error": "database unavailable"}, status=500)
        return None

    # -- FHIR ------------------------------------------------------------------------------
    async def fhir_claim(self, request: web.Request) -> web.Response:
        claim = await self._take(request, "Authorization", f"Bearer {self.api_key}")
        if claim is None:
            return web.json_response({"resourceType": "OperationOutcome", "issue": [
                {"severity": "error", "code": "login", "diagnostics": "Unknown key"}]},
                status=401)
        if (failed := self._failure()) is not None:
            return failed
        share = SHARE[self.decision]
        currency = claim["total"]["currency"]
        items, submitted, benefit = [], Decimal(0), Decimal(0)
        for item in claim["item"]:
            net = Decimal(str(item["net"]["value"]))
            granted = (net * share).quantize(Decimal("0.01"))
            submitted, benefit = submitted + net, benefit + granted
            items.append({"itemSequence": item["sequence"], "adjudication": [
                _adjudication("submitted", net, currency),
                _adjudication("benefit", granted, currency)]})
        response: JSON = {
            "resourceType": "ClaimResponse", "id": "payer-side-id", "status": "active",
            "type": claim["type"], "use": claim["use"], "patient": claim["patient"],
            "created": "2026-11-21T08:00:00Z", "insurer": {"display": "NHIF"},
            "outcome": "queued" if self.decision == "queue" else "complete",
            "item": items, "total": [_adjudication("submitted", submitted, currency),
                                     _adjudication("benefit", benefit, currency)]}
        if self.decision == "reject":
            response["disposition"] = "Service not covered by the member's scheme"
        if claim["use"] == "preauthorization" and benefit > 0:
            response["preAuthRef"] = "NHIF-PA-7781"
        elif benefit > 0 and self.decision != "queue":
            response["payment"] = {"type": {"coding": [{"code": "complete"}]},
                                   "date": self.paid_on(),
                                   "amount": {"value": float(benefit), "currency": currency}}
        if self.decision == "malformed":  # R4 requires payment.type
            response["payment"] = {"amount": {"value": 1, "currency": currency}}
        return web.json_response(response)

    async def fhir_eligibility(self, request: web.Request) -> web.Response:
        body = await self._take(request, "Authorization", f"Bearer {self.api_key}")
        if body is None:
            return web.json_response({"resourceType": "OperationOutcome"}, status=401)
        inforce = self.decision != "reject"
        return web.json_response({
            "resourceType": "CoverageEligibilityResponse", "status": "active",
            "purpose": body["purpose"], "patient": body["patient"],
            "created": "2026-11-21T08:00:00Z", "request": {"reference": "x"},
            "outcome": "complete", "insurer": {"display": "NHIF"},
            **({} if inforce else {"disposition": "Membership lapsed"}),
            "insurance": [{"coverage": body["insurance"][0]["coverage"], "inforce": inforce,
                           "item": [{"productOrService": i["productOrService"], "benefit": [
                               {"type": {"coding": [{"code": "benefit"}]},
                                "allowedMoney": {"value": 1000, "currency": "KES"}}]}
                               for i in body.get("item", [])]}]})

    # -- own format ------------------------------------------------------------------------
    async def own_claim(self, request: web.Request) -> web.Response:
        claim = await self._take(request, "X-Api-Key", self.api_key)
        if claim is None:
            return web.json_response({"error": "bad key"}, status=401)
        if (failed := self._failure()) is not None:
            return failed
        share = SHARE[self.decision]
        lines = [{"line": line["line"],
                  "approved": str((Decimal(line["amount"]) * share).quantize(Decimal("0.01")))}
                 for line in claim["lines"]]
        paid = sum((Decimal(line["approved"]) for line in lines), Decimal(0))
        return web.json_response({
            "reference": "JUB-" + claim["claim_number"],
            "decision": {"approve": "approved", "partial": "partial"}.get(self.decision,
                                                                          "rejected"),
            "lines": lines, "paid": str(paid) if "preauth" not in request.path else "0",
            "paid_on": self.paid_on(),
            **({"reason": "Pre-existing condition excluded"} if self.decision == "reject"
               else {})})

    async def own_eligibility(self, request: web.Request) -> web.Response:
        body = await self._take(request, "X-Api-Key", self.api_key)
        if body is None:
            return web.json_response({"error": "bad key"}, status=401)
        eligible = self.decision != "reject"
        return web.json_response({"eligible": eligible,
                                  "reason": None if eligible else "Policy suspended",
                                  "benefits": [{"code": c, "allowed": "2500.00"}
                                               for c in body["codes"]]})


def _adjudication(category: str, amount: Decimal, currency: str) -> JSON:
    return {"category": {"coding": [{"system": ADJUDICATION, "code": category}]},
            "amount": {"value": float(amount), "currency": currency}}

"""The payers' APIs: claim submission, pre-authorization and eligibility, through ``httpx``,
with per-payer settings (``HEALTHPLATFORM_RCM_PAYERS``, JSON)::

    {"nhif": {"name": "NHIF", "base_url": "https://payer.example/fhir", "format": "fhir",
              "api_key": "...", "timeout_seconds": 15}}

A payer is known by the key of its name (``"NHIF"`` → ``nhif``, as the Coverage
identifiers of :mod:`platform_api.organizations.billing` spell it). Two formats:

- ``fhir``: the FHIR R4 operations. ``POST [base]/Claim/$submit`` with the Claim (``use``
  ``claim`` or ``preauthorization``) answers a ClaimResponse; ``POST
  [base]/CoverageEligibilityRequest/$submit`` answers a CoverageEligibilityResponse.
  ``Authorization: Bearer <api_key>``.
- ``own``: a payer's own JSON API. ``POST [base]/claims`` and ``POST
  [base]/preauthorizations`` take ``{claim_number, member_number, provider,
  service_date, currency, diagnoses, lines: [{line, code, description, quantity,
  unit_price, amount}], total}`` and answer ``{reference, decision: approved | partial |
  rejected, lines: [{line, approved}], paid, paid_on, reason}``; ``POST
  [base]/eligibility`` takes ``{member_number, service_date, codes}`` and answers
  ``{eligible, reason, benefits: [{code, allowed}]}``. ``X-Api-Key: <api_key>``. Its
  answers are turned into the same FHIR resources the FHIR payers answer.

Failures are refusals with codes, never a 500: no such payer configured (422
``PAYER_NOT_CONFIGURED``), the payer did not answer in time (504 ``PAYER_TIMEOUT``), could
not be reached or failed (502 ``PAYER_UNAVAILABLE``), refused the request or answered
something that is not the expected resource (502 ``PAYER_REFUSED``). The API key is never
logged or shown.
"""

from __future__ import annotations

import logging
import ssl
from decimal import Decimal
from functools import cache
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field, SecretStr, ValidationError

from fhir_server.clock import now_instant
from fhir_server.outcome import FhirError
from fhir_server.validation import validate_resource
from platform_api.envelope import ApiError
from platform_api.fhir_values import amount_text, coding, decimal_of, local_id, money
from platform_api.settings import Settings

JSON = dict[str, Any]
log = logging.getLogger("healthplatform.rcm.payers")
ADJUDICATION = "http://terminology.hl7.org/CodeSystem/adjudication"
BENEFIT_TYPE = "http://terminology.hl7.org/CodeSystem/benefit-type"
PAYMENT_TYPE = "http://terminology.hl7.org/CodeSystem/ex-paymenttype"
Decision = Literal["approved", "partial", "rejected", "pending"]


class PayerConfig(BaseModel):
    name: str = Field(min_length=1)
    base_url: str = Field(pattern=r"^https?://")
    format: Literal["fhir", "own"] = "fhir"
    api_key: SecretStr = SecretStr("")
    timeout_seconds: float = Field(default=15.0, gt=0)


def payer_config(settings: Settings, key: str) -> PayerConfig:
    """The settings of the payer ``key`` (422 ``PAYER_NOT_CONFIGURED`` when it has none)."""
    raw = settings.rcm_payers.get(key)
    if raw is None:
        raise ApiError(422, "PAYER_NOT_CONFIGURED", f"No payer API is configured for "
                       f"{key!r}: the claim cannot be sent", field="insurer")
    try:
        return PayerConfig.model_validate(raw)
    except ValidationError as error:  # a deployment mistake, said without the key
        raise ApiError(502, "PAYER_UNAVAILABLE", f"The settings of payer {key!r} are "
                       f"invalid: {error.errors()[0]['loc']}") from None


@cache
def tls_context() -> ssl.SSLContext:
    """The system's CA certificates, loaded once: loading them is most of the cost of a new
    ``httpx.AsyncClient`` (~100 ms), which each call to a payer would otherwise pay."""
    return ssl.create_default_context()


class PayerClient:
    """One payer's API (see the module docstring)."""

    def __init__(self, key: str, config: PayerConfig,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.key, self.config = key, config
        self._transport = transport

    # -- operations ------------------------------------------------------------------------
    async def submit(self, claim: JSON, coverage: JSON) -> JSON:
        """A ClaimResponse for ``claim`` (``use`` claim or preauthorization)."""
        if self.config.format == "fhir":
            answer = await self._post("/Claim/$submit", claim)
            return _expect(answer, "ClaimResponse", self.config.name)
        path = "/claims" if claim.get("use") == "claim" else "/preauthorizations"
        answer = await self._post(path, own_claim(claim, coverage))
        return own_claim_response(answer, claim, self.key)

    async def eligibility(self, request: JSON, coverage: JSON) -> JSON:
        """A CoverageEligibilityResponse for ``request``."""
        if self.config.format == "fhir":
            answer = await self._post("/CoverageEligibilityRequest/$submit", request)
            return _expect(answer, "CoverageEligibilityResponse", self.config.name)
        codes = [coding(i.get("productOrService")).get("code") for i in request.get("item", [])]
        answer = await self._post("/eligibility", {
            "member_number": coverage.get("subscriberId"),
            "service_date": request.get("servicedDate"), "codes": [c for c in codes if c]})
        return own_eligibility_response(answer, request, coverage)

    # -- transport -------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        key = self.config.api_key.get_secret_value()
        if self.config.format == "fhir":
            return {"Accept": "application/fhir+json", "Content-Type": "application/fhir+json",
                    **({"Authorization": f"Bearer {key}"} if key else {})}
        return {"Accept": "application/json", **({"X-Api-Key": key} if key else {})}

    async def _post(self, path: str, body: JSON) -> JSON:
        name = self.config.name
        timeout = httpx.Timeout(self.config.timeout_seconds)
        async with httpx.AsyncClient(base_url=self.config.base_url.rstrip("/"),
                                     timeout=timeout, transport=self._transport,
                                     verify=tls_context()) as http:
            try:
                response = await http.post(path, json=body, headers=self._headers())
            except httpx.TimeoutException:
                raise ApiError(504, "PAYER_TIMEOUT", f"{name} did not answer within "
                               f"{self.config.timeout_seconds:g} s; try again later") from None
            except httpx.HTTPError as error:
                raise ApiError(502, "PAYER_UNAVAILABLE", f"{name} could not be reached "
                               f"({type(error).__name__})") from None
        if response.status_code >= 500:
            raise ApiError(502, "PAYER_UNAVAILABLE", f"{name} failed (HTTP "
                           f"{response.status_code})")
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if response.status_code >= 400 or not isinstance(answer, dict):
            raise ApiError(502, "PAYER_REFUSED", f"{name} refused the request (HTTP "
                           f"{response.status_code}): {_reason(answer)}")
        log.info("payer %s answered %s %s", self.key, path, response.status_code)
        return answer


def _reason(answer: Any) -> str:
    if isinstance(answer, dict):
        issues = answer.get("issue") or []
        if issues and isinstance(issues[0], dict):
            return str(issues[0].get("diagnostics") or issues[0].get("code") or "refused")
        return str(answer.get("reason") or answer.get("error") or "refused")[:300]
    return "not JSON"


def _expect(answer: JSON, resource_type: str, name: str) -> JSON:
    if answer.get("resourceType") != resource_type:
        raise ApiError(502, "PAYER_REFUSED", f"{name} answered a "
                       f"{answer.get('resourceType') or 'non-FHIR document'}, not a "
                       f"{resource_type}: {_reason(answer)}")
    return answer


# -- the payers' own format -------------------------------------------------------------------
def own_claim(claim: JSON, coverage: JSON) -> JSON:
    total = claim.get("total") or {}
    period = claim.get("billablePeriod") or {}
    return {
        "claim_number": (claim.get("identifier") or [{}])[0].get("value"),
        "member_number": coverage.get("subscriberId"),
        "provider": (claim.get("provider") or {}).get("reference"),
        "service_date": period.get("start"), "currency": total.get("currency"),
        "diagnoses": [coding(d.get("diagnosisCodeableConcept")).get("code")
                      for d in claim.get("diagnosis", [])],
        "lines": [{"line": item["sequence"],
                   "code": coding(item.get("productOrService")).get("code"),
                   "description": (item.get("productOrService") or {}).get("text"),
                   "quantity": str(Decimal(str((item.get("quantity") or {}).get(
                       "value", 1))).normalize()),
                   "unit_price": amount_text(decimal_of((item.get("unitPrice") or {}).get(
                       "value"))),
                   "amount": amount_text(decimal_of((item.get("net") or {}).get("value")))}
                  for item in claim.get("item", [])],
        "total": amount_text(decimal_of(total.get("value")))}


def _adjudication(category: str, amount: Decimal, currency: str) -> JSON:
    return {"category": {"coding": [{"system": ADJUDICATION, "code": category}]},
            "amount": money(amount, currency)}


def _own_amount(value: Any, field: str, name: str) -> Decimal:
    try:
        return Decimal(str(value if value is not None else 0))
    except ArithmeticError:
        raise ApiError(502, "PAYER_REFUSED", f"{name} answered a {field} that is not a "
                       "number") from None


def own_claim_response(answer: JSON, claim: JSON, key: str) -> JSON:
    """The ClaimResponse of an own-format decision (the payer's per-line approvals; a
    rejection approves nothing)."""
    currency = (claim.get("total") or {}).get("currency", "")
    decision = answer.get("decision")
    if decision not in ("approved", "partial", "rejected"):
        raise ApiError(502, "PAYER_REFUSED", f"payer {key} answered no decision")
    approved_lines = {int(line.get("line", 0)): _own_amount(line.get("approved"), "line",
                                                             key)
                      for line in answer.get("lines") or [] if isinstance(line, dict)}
    items, submitted_total, benefit_total = [], Decimal(0), Decimal(0)
    for item in claim.get("item", []):
        submitted = decimal_of((item.get("net") or {}).get("value"))
        benefit = Decimal(0) if decision == "rejected" else approved_lines.get(
            item["sequence"], submitted if decision == "approved" else Decimal(0))
        submitted_total += submitted
        benefit_total += benefit
        items.append({"itemSequence": item["sequence"], "adjudication": [
            _adjudication("submitted", submitted, currency),
            _adjudication("benefit", benefit, currency)]})
    response: JSON = {
        "resourceType": "ClaimResponse", "status": "active", "type": claim["type"],
        "use": claim.get("use", "claim"), "patient": claim["patient"],
        "created": now_instant(), "insurer": claim["insurer"],
        "requestor": claim.get("provider"), "outcome": "complete",
        "item": items, "total": [_adjudication("submitted", submitted_total, currency),
                                 _adjudication("benefit", benefit_total, currency)]}
    if answer.get("reference"):
        response["identifier"] = [{"system": f"urn:healthplatform:payer:{key}",
                                   "value": str(answer["reference"])}]
        if claim.get("use") == "preauthorization":
            response["preAuthRef"] = str(answer["reference"])
    if answer.get("reason"):
        response["disposition"] = str(answer["reason"])[:1000]
    paid = _own_amount(answer.get("paid"), "paid amount", key)
    if paid > 0:
        response["payment"] = {
            "type": {"coding": [{"system": PAYMENT_TYPE,
                                 "code": "complete" if paid >= submitted_total
                                 else "partial"}]},
            "date": str(answer.get("paid_on") or now_instant()[:10])[:10],
            "amount": money(paid, currency)}
    return response


def own_eligibility_response(answer: JSON, request: JSON, coverage: JSON) -> JSON:
    currency = "KES"
    for item in request.get("item", []):
        currency = (item.get("unitPrice") or {}).get("currency", currency)
    allowed = {str(b.get("code")): b.get("allowed") for b in answer.get("benefits") or []
               if isinstance(b, dict)}
    items = []
    for item in request.get("item", []):
        code = coding(item.get("productOrService")).get("code")
        entry: JSON = {"productOrService": item.get("productOrService")}
        if code in allowed and allowed[code] is not None:
            entry["benefit"] = [{"type": {"coding": [{"system": BENEFIT_TYPE,
                                                      "code": "benefit"}]},
                                 "allowedMoney": money(_own_amount(allowed[code], "benefit",
                                                                   "payer"), currency)}]
        items.append(entry)
    response: JSON = {
        "resourceType": "CoverageEligibilityResponse", "status": "active",
        "purpose": request.get("purpose", ["validation"]), "patient": request["patient"],
        "created": now_instant(), "request": {"reference": "CoverageEligibilityRequest/"
                                              + str(request.get("id", ""))},
        "outcome": "complete", "insurer": request["insurer"],
        "insurance": [{"coverage": {"reference": f"Coverage/{coverage['id']}"},
                       "inforce": bool(answer.get("eligible")),
                       **({"item": items} if items else {})}]}
    if answer.get("reason"):
        response["disposition"] = str(answer["reason"])[:1000]
    return response


def checked(resource: JSON, resource_type: str, payer: str) -> JSON:
    """A payer's answer as we will store it, refused (502 ``PAYER_REFUSED``) when it is not
    a valid R4 resource: the caller's request was sound, the payer's answer was not."""
    try:  # the store's own check (the R4 JSON Schema), before anything is written
        return validate_resource(resource, resource_type)
    except FhirError as error:
        reason = error.issues[0].diagnostics if error.issues else "invalid"
        raise ApiError(502, "PAYER_REFUSED", f"{payer} answered an invalid {resource_type}: "
                       f"{reason}"[:500]) from None


# -- reading the answers -----------------------------------------------------------------------
def total_of(response: JSON, category: str) -> Decimal:
    for total in response.get("total") or []:
        if coding(total.get("category")).get("code") == category:
            return decimal_of((total.get("amount") or {}).get("value"))
    # a payer may give per-item adjudications only
    return sum((decimal_of((a.get("amount") or {}).get("value"))
                for item in response.get("item") or []
                for a in item.get("adjudication") or []
                if coding(a.get("category")).get("code") == category), Decimal(0))


def paid_of(response: JSON) -> Decimal:
    return decimal_of(((response.get("payment") or {}).get("amount") or {}).get("value"))


def decision_of(response: JSON) -> Decision:
    """A payer's decision from its ClaimResponse: queued is pending, an error or nothing
    granted is a rejection, less granted than asked a partial approval."""
    outcome = response.get("outcome")
    if outcome == "queued":
        return "pending"
    benefit = total_of(response, "benefit")
    if outcome == "error" or benefit <= 0:
        return "rejected"
    return "partial" if benefit < total_of(response, "submitted") else "approved"


def claim_of(response: JSON) -> str | None:
    return local_id(response.get("request"), "Claim")

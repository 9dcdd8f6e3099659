"""Cross-border patient lookup through national health information exchanges:
``GET /api/fhir/cross-border/Patient/:national_id?country=KE|GH|NG|ZA|TZ|UG|RW|ET``.

One :class:`Exchange` (its own ``httpx`` client) per country configured in
``cross_border_exchanges``: base URL, the national identifier's system URI, auth (none,
an API key in a header, or OAuth2 client credentials: a token fetched from ``token_url``
and kept until shortly before it expires, fetched again once when the exchange answers
401), time-out. The exchange is asked ``GET [base]/Patient?identifier={system}|{id}``
(FHIR R4 search); what comes back must be a searchset Bundle whose Patients pass this
server's FHIR validation, else 502.

Refusals: a country outside the supported list is 400 ``UNSUPPORTED_COUNTRY`` naming
them; a supported one without an exchange 503 ``EXCHANGE_NOT_CONFIGURED``; a time-out
504 ``EXCHANGE_TIMEOUT``; an exchange that fails, cannot be reached or answers what is
not FHIR 502 ``EXCHANGE_ERROR`` / ``EXCHANGE_AUTH_FAILED`` / ``EXCHANGE_INVALID_RESPONSE``.
The search is a GET, safe to repeat: time-outs, refused connections and 502/503/504 are
retried ``cross_border_retries`` times with exponential back-off (0.2 s, 0.4 s, ...).

Who: an organization's clinical or front-desk staff (``ORG:ADMIN``, ``ORG:DOCTOR``,
``ORG:NURSE``, ``ORG:RECEPTIONIST`` somewhere) and platform administrators: the policy's
``cross-border.lookup``, asked before the cache or an exchange is.

Found Patients are kept: stored (created, or updated when a Patient with that national
identifier exists) with a ``meta.tag`` naming the country, and a Provenance naming the
exchange (agent ``who.display`` and ``entity.what`` its URL, policy the search made), in
one unit of work, by the platform itself through a named elevation (the records belong
to no organization; the MPI compares them like any new Patient). Answers are cached per
country and id for ``cross_border_cache_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import httpx
import orjson
from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, Field, ValidationError

from fhir_server.caller import CallerFhir
from fhir_server.outcome import FhirError
from platform_api.envelope import ApiError, Envelope, ErrorEnvelope, ok
from platform_api.facade import ApiContext, api_context
from platform_api.services import Services

log = logging.getLogger("healthplatform.cross_border")
JSON = dict[str, Any]
SUPPORTED = ("KE", "GH", "NG", "ZA", "TZ", "UG", "RW", "ET")
EXTRAS_KEY = "cross_border"
TAG_SYSTEM = "urn:healthplatform:cross-border"
RETRIED_STATUSES = {502, 503, 504}
NATIONAL_ID = r"^[A-Za-z0-9][A-Za-z0-9\-/.]{0,63}$"
router = APIRouter(tags=["cross-border lookup"])


class ExchangeConfig(BaseModel):
    """One country's exchange, from ``cross_border_exchanges``."""

    base_url: str = Field(pattern=r"^https?://")
    identifier_system: str = Field(min_length=1)
    auth: Literal["none", "api_key", "oauth2"] = "none"
    api_key: str = ""
    api_key_header: str = "X-API-Key"
    token_url: str = ""
    client_id: str = ""
    client_secret: str = ""
    scope: str = ""
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)
    name: str = ""


class ExchangeFailure(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Exchange:
    """The client of one national exchange."""

    country: str
    config: ExchangeConfig
    retries: int
    http: httpx.AsyncClient = field(init=False)
    _token: tuple[str, float] | None = None

    def __post_init__(self) -> None:
        self.http = httpx.AsyncClient(base_url=self.config.base_url.rstrip("/"),
                                      timeout=self.config.timeout_seconds)

    @property
    def name(self) -> str:
        return self.config.name or f"{self.country} national health information exchange"

    async def _access_token(self, fresh: bool = False) -> str:
        if self._token is not None and not fresh and self._token[1] > time.monotonic():
            return self._token[0]
        config = self.config
        try:
            response = await self.http.post(
                config.token_url, auth=(config.client_id, config.client_secret),
                data={"grant_type": "client_credentials",
                      **({"scope": config.scope} if config.scope else {})})
            body = response.json() if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError) as exc:
            raise ExchangeFailure(502, "EXCHANGE_AUTH_FAILED", f"The {self.name} token "
                                  f"endpoint failed: {type(exc).__name__}") from None
        token = body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str):
            raise ExchangeFailure(502, "EXCHANGE_AUTH_FAILED", f"The {self.name} refused "
                                  f"the client credentials ({response.status_code})")
        lifetime = float(body.get("expires_in") or 300)
        self._token = (token, time.monotonic() + max(lifetime - 30, lifetime / 2))
        return token

    async def _headers(self, fresh_token: bool = False) -> dict[str, str]:
        headers = {"Accept": "application/fhir+json"}
        if self.config.auth == "api_key":
            headers[self.config.api_key_header] = self.config.api_key
        elif self.config.auth == "oauth2":
            headers["Authorization"] = f"Bearer {await self._access_token(fresh_token)}"
        return headers

    async def search(self, national_id: str) -> JSON:
        """The searchset Bundle of the Patients with this national id."""
        params = {"identifier": f"{self.config.identifier_system}|{national_id}"}
        refreshed = False
        attempt = 0
        while True:
            try:
                response = await self.http.get("/Patient", params=params,
                                               headers=await self._headers(refreshed))
            except httpx.TimeoutException:
                failure = ExchangeFailure(504, "EXCHANGE_TIMEOUT", f"The {self.name} did "
                                          f"not answer within {self.config.timeout_seconds} s")
            except httpx.TransportError as exc:
                failure = ExchangeFailure(502, "EXCHANGE_ERROR", f"The {self.name} could not "
                                          f"be reached ({type(exc).__name__})")
            else:
                if response.status_code == 401 and self.config.auth == "oauth2" \
                        and not refreshed:
                    refreshed = True  # the token may have been revoked: one fresh one
                    continue
                if response.status_code == 200:
                    return _bundle(response, self.name)
                failure = ExchangeFailure(502, "EXCHANGE_ERROR", f"The {self.name} answered "
                                          f"{response.status_code}")
                if response.status_code not in RETRIED_STATUSES:
                    raise failure
            if attempt >= self.retries:
                raise failure
            await asyncio.sleep(0.2 * 2 ** attempt)
            attempt += 1


def _bundle(response: httpx.Response, name: str) -> JSON:
    try:
        bundle = response.json()
    except ValueError:
        bundle = None
    if not isinstance(bundle, dict) or bundle.get("resourceType") != "Bundle" \
            or bundle.get("type") != "searchset":
        raise ExchangeFailure(502, "EXCHANGE_INVALID_RESPONSE", f"The {name} did not answer "
                              "a FHIR searchset Bundle")
    return bundle


@dataclass
class CrossBorder:
    services: Services
    exchanges: dict[str, Exchange] = field(default_factory=dict)
    cache: dict[tuple[str, str], tuple[float, JSON]] = field(default_factory=dict)

    def exchange(self, country: str) -> Exchange:
        if country not in SUPPORTED:
            raise ApiError(400, "UNSUPPORTED_COUNTRY", f"country must be one of "
                           f"{', '.join(SUPPORTED)}", field="country")
        found = self.exchanges.get(country)
        if found is not None:
            return found
        settings = self.services.settings
        raw = settings.cross_border_exchanges.get(country)
        if raw is None:
            raise ApiError(503, "EXCHANGE_NOT_CONFIGURED", f"No national health information "
                           f"exchange is configured for {country}")
        try:
            config = ExchangeConfig(**raw)
        except ValidationError as exc:
            log.error("cross_border_exchanges[%s] is not valid: %s", country,
                      exc.errors(include_input=False, include_url=False))
            raise ApiError(503, "EXCHANGE_NOT_CONFIGURED", f"The exchange of {country} is "
                           "misconfigured (see the server log)") from None
        found = self.exchanges[country] = Exchange(country, config,
                                                   settings.cross_border_retries)
        return found

    async def lookup(self, country: str, national_id: str,
                     writer: Callable[[], CallerFhir]) -> JSON:
        """The exchange's Patients for the national id (cached); ``writer()`` gives the
        rights they are kept with (an elevation the caller's permitted lookup names)."""
        exchange = self.exchange(country)
        key = (country, national_id)
        cached = self.cache.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return {**cached[1], "cached": True}
        try:
            bundle = await exchange.search(national_id)
        except ExchangeFailure as failure:
            raise ApiError(failure.status, failure.code, failure.message) from None
        patients = await self._validated(bundle, exchange)
        stored, provenance = await self._store(writer, patients, exchange, national_id)
        result = {"country": country, "national_id": national_id, "exchange": exchange.name,
                  "cached": False, "total": len(stored), "patients": stored,
                  "provenance_id": provenance}
        ttl = self.services.settings.cross_border_cache_seconds
        if ttl > 0:
            if len(self.cache) > 10_000:
                self.cache.clear()
            self.cache[key] = (time.monotonic() + ttl, result)
        return result

    async def _validated(self, bundle: JSON, exchange: Exchange) -> list[JSON]:
        patients = []
        for entry in bundle.get("entry") or []:
            resource = entry.get("resource") if isinstance(entry, dict) else None
            if not isinstance(resource, dict) or resource.get("resourceType") != "Patient":
                continue  # an OperationOutcome or an included resource
            try:
                await self.services.fhir.validate(resource, "Patient")
            except FhirError as exc:
                raise ApiError(502, "EXCHANGE_INVALID_RESPONSE", f"The {exchange.name} "
                               f"answered a Patient that is not valid FHIR R4: {exc}") from None
            patients.append(resource)
        return patients

    async def _store(self, writer: Callable[[], CallerFhir], patients: list[JSON],
                     exchange: Exchange, national_id: str) -> tuple[list[JSON], str | None]:
        if not patients:
            return [], None
        system = writer()
        token = f"{exchange.config.identifier_system}|{national_id}"
        existing = await system.search("Patient", [("identifier", token), ("_count", "10")])
        unit = system.unit()
        staged = []
        async with unit:
            for n, patient in enumerate(patients):
                body = _kept(patient, exchange, existing[n]["id"] if n < len(existing) else None)
                staged.append(await (unit.update(body) if "id" in body else unit.create(body)))
            written = [f"Patient/{s.id}" for s in staged]
            provenance = await unit.create({
                "resourceType": "Provenance",
                "target": [{"reference": ref} for ref in written],
                "recorded": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "policy": [f"{exchange.config.base_url.rstrip('/')}/Patient?identifier="
                           f"{token}"],
                "activity": {"coding": [{
                    "system": "http://terminology.hl7.org/CodeSystem/v3-DataOperation",
                    "code": "UPDATE", "display": "revise"}]},
                "agent": [{"type": {"coding": [{
                    "system": "http://terminology.hl7.org/CodeSystem/provenance-participant-type",
                    "code": "custodian", "display": "Custodian"}]},
                    "who": {"display": exchange.name}}],
                "entity": [{"role": "source", "what": {
                    "identifier": {"system": "urn:ietf:rfc:3986",
                                   "value": exchange.config.base_url},
                    "display": exchange.name}}],
            })
            await unit.commit()
        return [_body(s) for s in staged], provenance.id


def _kept(patient: JSON, exchange: Exchange, local_id: str | None) -> JSON:
    """The exchange's Patient as stored here: this server's id, tagged with the country."""
    body = {k: v for k, v in patient.items() if k not in ("id", "meta", "text", "contained")}
    body["meta"] = {"tag": [{"system": TAG_SYSTEM, "code": exchange.country,
                             "display": exchange.name}]}
    if local_id is not None:
        body["id"] = local_id
    return body


def _body(staged: Any) -> JSON:
    assert staged.result is not None
    return orjson.loads(staged.result.body)  # type: ignore[no-any-return]


def cross_border_of(services: Services) -> CrossBorder:
    found = services.extras.get(EXTRAS_KEY)
    if found is None:
        found = services.extras[EXTRAS_KEY] = CrossBorder(services)
    return found  # type: ignore[no-any-return]


async def stop(services: Services) -> None:
    found: CrossBorder | None = services.extras.get(EXTRAS_KEY)
    if found is not None:
        for exchange in found.exchanges.values():
            await exchange.http.aclose()


class CrossBorderResult(BaseModel):
    country: str
    national_id: str
    exchange: str
    cached: bool
    total: int
    patients: list[dict[str, Any]] = Field(description="FHIR Patients as stored here")
    provenance_id: str | None = Field(description="The Provenance naming the exchange")


@router.get("/api/fhir/cross-border/Patient/{national_id}",
            response_model=Envelope[CrossBorderResult],
            summary="Look a patient up by national id through a national exchange",
            responses={
                400: {"model": ErrorEnvelope, "description": "UNSUPPORTED_COUNTRY"},
                502: {"model": ErrorEnvelope, "description": "EXCHANGE_ERROR, "
                      "EXCHANGE_AUTH_FAILED, EXCHANGE_INVALID_RESPONSE"},
                503: {"model": ErrorEnvelope, "description": "EXCHANGE_NOT_CONFIGURED"},
                504: {"model": ErrorEnvelope, "description": "EXCHANGE_TIMEOUT"}})
async def cross_border_patient(
        national_id: str = Path(max_length=64, pattern=NATIONAL_ID),
        country: str = Query(min_length=2, max_length=2, description=", ".join(SUPPORTED)),
        ctx: ApiContext = Depends(api_context)) -> Any:
    ctx.authorize("cross-border.lookup")
    result = await cross_border_of(ctx.services).lookup(
        country.upper(), national_id,
        lambda: ctx.elevate("cross-border.lookup: keep the exchange's Patients and their "
                            "Provenance"))
    return ok(result)


__all__ = ["SUPPORTED", "CrossBorder", "cross_border_of", "router", "stop"]

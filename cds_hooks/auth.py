"""Trusting CDS clients: the JWT bearer of CDS Hooks 2.0 ("Trusting CDS Clients").

Every call (discovery aside, which is public here) carries ``Authorization: Bearer <JWT>``
signed by the CDS client (an EHR). The token is accepted when:

- its ``iss`` is on the allow-list (setting ``HEALTHPLATFORM_CDS_CLIENTS``, a JSON object
  mapping each issuer to ``{"jwks": {...}}`` or ``{"jwks_uri": "..."}``, and optionally
  ``"organizations": [<org id>, ...]`` whose records the client may have prefetched from
  this server);
- its ``alg`` is ES384 or RS384 (the spec's recommendation) or ES256 (older clients,
  the CDS Hooks sandbox): never ``none`` or an HMAC;
- a ``jku`` header, when present, is the issuer's registered ``jwks_uri`` (keys are never
  fetched from a URL the token names);
- exactly one key of the issuer's JWKS matches the ``kid`` (and ``kty`` suits ``alg``);
  keys fetched by URL are cached (``HEALTHPLATFORM_CDS_JWKS_CACHE_SECONDS``) and fetched
  again once when a ``kid`` is unknown (the client rotated its keys);
- the signature holds, ``aud`` is the URL of the service called, ``exp`` is in the
  future and at most 5 minutes away, ``iat`` and ``jti`` are present, and the ``jti`` has
  not been seen for this issuer before (replay): in memory, or in Redis when
  ``HEALTHPLATFORM_REDIS_URL`` is set, so every process shares it. ``sub`` is not
  required (CDS Hooks 1.0 had it; 2.0 does not).

A refusal is a 401 with ``WWW-Authenticate: Bearer error="invalid_token"``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt
from jwt import PyJWK

from cds_hooks.models import CdsError
from fhir_server.access import READ, SEARCH, Grant

JSON = dict[str, Any]
ALGORITHMS = ("ES384", "RS384", "ES256")
KEY_TYPES = {"ES384": "EC", "ES256": "EC", "RS384": "RSA"}
MAX_LIFETIME_SECONDS = 300
LEEWAY_SECONDS = 30  # clock skew between the client and this server


def refused(message: str) -> CdsError:
    return CdsError(401, message, headers={
        "WWW-Authenticate": f'Bearer error="invalid_token", error_description="{message}"'})


@dataclass(frozen=True)
class CdsClient:
    """A configured CDS client (one issuer)."""

    iss: str
    jwks: JSON | None = None
    jwks_uri: str | None = None
    organizations: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, iss: str, config: Mapping[str, Any]) -> CdsClient:
        jwks, uri = config.get("jwks"), config.get("jwks_uri")
        if (jwks is None) == (uri is None):
            raise ValueError(f"CDS client {iss!r}: give exactly one of jwks and jwks_uri")
        if jwks is not None and not isinstance(jwks.get("keys"), list):
            raise ValueError(f"CDS client {iss!r}: jwks must be a JWK Set ({{\"keys\": []}})")
        return cls(iss, jwks, uri, frozenset(config.get("organizations") or ()))


@dataclass
class VerifiedClient:
    client: CdsClient
    claims: JSON


class ClientAccess:
    """What a verified CDS client may read from this server when it sends no fhirServer:
    the records of its configured organizations, read-only (the
    :class:`~fhir_server.access.Access` port)."""

    def __init__(self, client: CdsClient):
        self.client = client
        self._read = (Grant(None, owners=client.organizations, relation="cds-client"),) \
            if client.organizations else ()

    def grants(self, action: str) -> tuple[Grant, ...] | None:
        return self._read if action in (READ, SEARCH) else ()

    def describe(self) -> str:
        return f"the CDS client {self.client.iss}"

    def explain(self, action: str, resource_type: str) -> str:
        return ""


class ReplayGuard:
    """Remembers each (iss, jti) until its token expires: in this process, or in Redis."""

    def __init__(self, redis_url: str = ""):
        self._seen: dict[tuple[str, str], float] = {}
        self._redis: Any = None
        if redis_url:
            import redis.asyncio as redis_asyncio

            self._redis = redis_asyncio.Redis.from_url(redis_url)

    async def first_use(self, iss: str, jti: str, expires: float) -> bool:
        if self._redis is not None:
            key = f"healthplatform:cds:jti:{iss}:{jti}"
            ttl = max(1, int(expires - time.time()) + LEEWAY_SECONDS)
            return bool(await self._redis.set(key, b"1", nx=True, ex=ttl))
        now = time.time()
        if len(self._seen) > 10_000:
            self._seen = {k: t for k, t in self._seen.items() if t > now}
        if self._seen.get((iss, jti), 0) > now:
            return False
        self._seen[(iss, jti)] = expires + LEEWAY_SECONDS
        return True

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()


@dataclass
class ClientVerifier:
    clients: dict[str, CdsClient]
    http: httpx.AsyncClient
    replay: ReplayGuard
    cache_seconds: float = 3600.0
    _fetched: dict[str, tuple[float, JSON]] = field(default_factory=dict)
    _keys: dict[tuple[str, str, str], PyJWK] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, config: Mapping[str, Mapping[str, Any]], http: httpx.AsyncClient,
                      *, redis_url: str = "", cache_seconds: float = 3600.0
                      ) -> ClientVerifier:
        clients = {iss: CdsClient.from_config(iss, c) for iss, c in config.items()}
        return cls(clients, http, ReplayGuard(redis_url), cache_seconds)

    def peek(self, token: str) -> tuple[JSON, JSON] | None:
        """(header, claims) of a JWT whose unverified ``iss`` names a configured client;
        None for anything else (another kind of token, an unknown issuer)."""
        try:
            decoded = jwt.api_jwt.decode_complete(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return None
        return (decoded["header"], decoded["payload"]) \
            if decoded["payload"].get("iss") in self.clients else None

    async def verify(self, token: str, audiences: Sequence[str],
                     peeked: tuple[JSON, JSON] | None = None) -> VerifiedClient:
        """The client of a valid token (401 otherwise); ``peeked`` is :meth:`peek`'s
        answer when the caller already has it (the token is decoded once)."""
        if peeked is None:
            try:
                decoded = jwt.api_jwt.decode_complete(token,
                                                      options={"verify_signature": False})
            except jwt.PyJWTError as exc:
                raise refused(f"The bearer token is not a JWT: {exc}") from None
            peeked = decoded["header"], decoded["payload"]
        header, unverified = peeked
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise refused(f"alg {alg!r} is not accepted (use one of {', '.join(ALGORITHMS)})")
        client = self.clients.get(str(unverified.get("iss")))
        if client is None:
            raise refused(f"The issuer {unverified.get('iss')!r} is not a trusted CDS client")
        jku = header.get("jku")
        if jku is not None and jku != client.jwks_uri:
            raise refused("jku is not the JWK Set URL registered for this issuer")
        key = await self._key(client, header.get("kid"), alg)
        try:
            claims = jwt.decode(token, key.key, algorithms=[alg], audience=list(audiences),
                                issuer=client.iss, leeway=LEEWAY_SECONDS,
                                options={"require": ["iss", "aud", "exp", "iat", "jti"]})
        except jwt.InvalidAudienceError:
            raise refused("aud is not the URL of the service called") from None
        except jwt.ExpiredSignatureError:
            raise refused("The token has expired") from None
        except jwt.PyJWTError as exc:
            raise refused(f"The token is not valid: {exc}") from None
        if float(claims["exp"]) > time.time() + MAX_LIFETIME_SECONDS + LEEWAY_SECONDS:
            raise refused("exp is more than 5 minutes away")
        if not await self.replay.first_use(client.iss, str(claims["jti"]),
                                           float(claims["exp"])):
            raise refused("This token was already used (jti replayed)")
        return VerifiedClient(client, claims)

    async def _key(self, client: CdsClient, kid: str | None, alg: str) -> PyJWK:
        jwks = client.jwks if client.jwks is not None else await self._jwks(client, False)
        found = _matching(jwks, kid, alg)
        if not found and client.jwks_uri is not None:  # rotated keys: fetch once more
            found = _matching(await self._jwks(client, True), kid, alg)
        if len(found) != 1:
            raise refused(f"No single key of the issuer matches kid {kid!r} for {alg}")
        cache_key = (client.iss, alg, json.dumps(found[0], sort_keys=True))
        if cache_key not in self._keys:  # parsing a JWK costs more than a verification
            try:
                self._keys[cache_key] = PyJWK(found[0], algorithm=alg)
            except jwt.PyJWTError as exc:
                raise refused(f"The issuer's key {kid!r} is not usable: {exc}") from None
        return self._keys[cache_key]

    async def _jwks(self, client: CdsClient, refresh: bool) -> JSON:
        uri = client.jwks_uri or ""
        cached = self._fetched.get(uri)
        if cached is not None and not refresh and time.monotonic() - cached[0] < \
                self.cache_seconds:
            return cached[1]
        try:
            response = await self.http.get(uri, headers={"Accept": "application/json"})
            response.raise_for_status()
            jwks = response.json()
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            raise refused(f"The issuer's JWK Set could not be fetched: {exc}") from None
        if not isinstance(jwks, dict) or not isinstance(jwks.get("keys"), list):
            raise refused("The issuer's JWK Set URL did not answer a JWK Set")
        self._fetched[uri] = (time.monotonic(), jwks)
        return jwks


def _matching(jwks: JSON, kid: str | None, alg: str) -> list[JSON]:
    keys = [k for k in jwks.get("keys") or [] if isinstance(k, dict)
            and k.get("kty") == KEY_TYPES[alg] and k.get("alg") in (None, alg)
            and k.get("use") in (None, "sig")]
    if kid is not None:
        return [k for k in keys if k.get("kid") == kid]
    return keys if len(keys) == 1 else []

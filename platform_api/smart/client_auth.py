"""Client authentication at the token, introspection and revocation endpoints.

A client authenticates the way it registered (RFC 7591 ``token_endpoint_auth_method``),
and only that way:

- ``none`` (public apps): ``client_id`` in the form, nothing to prove;
- ``client_secret_basic``: ``Authorization: Basic`` of the URL-encoded id and secret
  (RFC 6749 2.3.1); ``client_secret_post``: ``client_id`` and ``client_secret`` in the
  form;
- ``private_key_jwt`` (SMART client-confidential-asymmetric, RFC 7523): a
  ``client_assertion`` JWT signed RS384 or ES384, header ``kid`` and ``typ: JWT``, claims
  ``iss`` = ``sub`` = client_id, ``aud`` = the token URL, ``exp`` at most five minutes
  ahead, and a ``jti`` never seen before for that client (kept until the assertion
  expires, so a replay is refused by every process). The key is the one of the
  registered ``jwks``, or of the JWKS fetched from the registered ``jwks_uri`` (a
  ``jku`` header must name that same URL), whose ``kid`` matches and whose ``kty`` fits
  the algorithm: exactly one, or the assertion is refused. The key set is fetched only
  once what can be checked without it holds (a known client, a well-formed unexpired
  assertion for this token URL, a ``kid``), through the outbound guard
  (platform_api/outbound.py: no internal address, at most
  ``HEALTHPLATFORM_SMART_JWKS_MAX_BYTES``). Fetched key sets are kept as long as their
  ``Cache-Control`` allows (never longer than ``HEALTHPLATFORM_SMART_JWKS_MAX_CACHE_SECONDS``);
  an unknown ``kid`` fetches again, but a URL is fetched at most once per
  ``HEALTHPLATFORM_SMART_JWKS_REFETCH_SECONDS``.

Every failure is ``invalid_client`` (401), as the SMART IG and RFC 6749 5.2 say.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_plus

import jwt

from fhir_server.store import DuplicateDocument, ResourceStore
from platform_api.auth.tokens import rfc3339
from platform_api.outbound import Outbound, OutboundError
from platform_api.smart.clients import ClientRegistry, secret_matches
from platform_api.smart.oauth import ASSERTIONS, OAuthError, invalid_client

JSON = dict[str, Any]
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
ASSERTION_ALGORITHMS = {"RS384": "RSA", "ES384": "EC"}
MAX_ASSERTION_LIFETIME = 300  # seconds (client-confidential-asymmetric: "five minutes")
CLOCK_SKEW = 10  # seconds of leeway between the client's clock and ours
_MAX_AGE = re.compile(r"max-age=(\d+)")
log = logging.getLogger("healthplatform.smart")


class JwksCache:
    """Client key sets fetched from their ``jwks_uri`` through the outbound guard
    (module docstring). A URL is fetched at most once per ``refetch_seconds`` whatever
    its answers say (an unknown ``kid`` or a ``no-store`` answer uses the set fetched
    last until then), one fetch at a time; answers are capped at ``max_bytes``."""

    def __init__(self, outbound: Outbound, *, max_cache_seconds: float,
                 timeout_seconds: float, refetch_seconds: float, max_bytes: int):
        self.outbound = outbound
        self.max_cache_seconds, self.timeout_seconds = max_cache_seconds, timeout_seconds
        self.refetch_seconds, self.max_bytes = refetch_seconds, max_bytes
        # url -> (usable until, fetched at, keys)
        self._sets: dict[str, tuple[float, float, list[JSON]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def close(self) -> None:
        return None

    async def keys(self, url: str, *, refresh: bool = False) -> list[JSON]:
        lock = self._locks.setdefault(url, asyncio.Lock())
        async with lock:
            cached = self._sets.get(url)
            now = time.monotonic()
            if cached is not None and ((now < cached[0] and not refresh)
                                       or now < cached[1] + self.refetch_seconds):
                return cached[2]
            keys, lifetime = await self._fetch(url)
            if len(self._sets) > 1000:
                self._sets.clear()
                self._locks = {url: lock}
            self._sets[url] = (time.monotonic() + lifetime, time.monotonic(), keys)
            return keys

    async def _fetch(self, url: str) -> tuple[list[JSON], float]:
        try:
            body, headers = await self.outbound.get_json(
                url, time_limit=self.timeout_seconds, max_bytes=self.max_bytes)
        except OutboundError as exc:
            log.info("jwks_uri %s not usable: %s", url, exc.reason)
            raise invalid_client(f"the client's JWKS at {url} could not be used") from None
        keys = body.get("keys") if isinstance(body, dict) else None
        if not isinstance(keys, list):  # the same words: no port scanner (issue 32)
            log.info("jwks_uri %s answered no JWK Set", url)
            raise invalid_client(f"the client's JWKS at {url} could not be used")
        return keys, _cache_lifetime(headers.get("cache-control", ""),
                                     self.max_cache_seconds)


def _cache_lifetime(cache_control: str, ceiling: float) -> float:
    """How long a response may be kept: never beyond its Cache-Control (no-store and
    no-cache: not at all), nor ``ceiling``."""
    lowered = cache_control.lower()
    if "no-store" in lowered or "no-cache" in lowered:
        return 0.0
    found = _MAX_AGE.search(lowered)
    return min(float(found.group(1)), ceiling) if found else ceiling


class ClientAuthenticator:
    """Which registered client a request at an OAuth endpoint comes from."""

    def __init__(self, registry: ClientRegistry, jwks: JwksCache, store: ResourceStore):
        self.registry, self.jwks, self.store = registry, jwks, store

    async def authenticate(self, form: Mapping[str, str], authorization: str | None,
                           token_url: str) -> JSON:
        """The active client document; ``invalid_client`` when it did not prove it is
        that client the way it registered."""
        if authorization is not None and authorization.lower().startswith("basic "):
            client_id, secret = _basic(authorization)
            return await self._with_secret(client_id, secret, "client_secret_basic", form)
        if "client_assertion" in form or "client_assertion_type" in form:
            return await self._with_assertion(form, token_url)
        client_id = form.get("client_id", "")
        if "client_secret" in form:
            return await self._with_secret(client_id, form["client_secret"],
                                           "client_secret_post", form)
        client = await self._client(client_id)
        if client["token_endpoint_auth_method"] != "none":
            raise invalid_client(f"client {client_id} must authenticate "
                                 f"({client['token_endpoint_auth_method']})")
        return client

    async def _client(self, client_id: str) -> JSON:
        if not client_id:
            raise invalid_client("client_id is required (or client authentication)")
        client = await self.registry.active(client_id)
        if client is None:
            raise invalid_client("unknown or disabled client")
        return client

    async def _with_secret(self, client_id: str, secret: str, method: str,
                           form: Mapping[str, str]) -> JSON:
        if form.get("client_id") not in (None, client_id):
            raise invalid_client("client_id does not match the authenticated client")
        client = await self._client(client_id)
        if client["token_endpoint_auth_method"] != method:
            raise invalid_client(f"this client authenticates with "
                                 f"{client['token_endpoint_auth_method']}, not {method}")
        if not secret_matches(client, secret):
            raise invalid_client("wrong client secret")
        return client

    async def _with_assertion(self, form: Mapping[str, str], token_url: str) -> JSON:
        if form.get("client_assertion_type") != ASSERTION_TYPE:
            raise invalid_client(f"client_assertion_type must be {ASSERTION_TYPE}")
        assertion = form.get("client_assertion", "")
        try:
            header = jwt.get_unverified_header(assertion)
            unverified = jwt.decode(assertion, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise invalid_client("client_assertion is not a JWT") from None
        client_id = unverified.get("iss")
        if not isinstance(client_id, str) or unverified.get("sub") != client_id:
            raise invalid_client("the assertion's iss and sub must both be the client_id")
        if form.get("client_id") not in (None, client_id):
            raise invalid_client("client_id does not match the assertion's issuer")
        client = await self._client(client_id)
        if client["token_endpoint_auth_method"] != "private_key_jwt":
            raise invalid_client("this client does not authenticate with private_key_jwt")
        _plausible(unverified, token_url)  # before any key set is fetched
        key = await self._key(client, header)
        claims = _verified(assertion, key, header["alg"], client_id, token_url)
        await self._spend_jti(client_id, claims)
        return client

    async def _key(self, client: JSON, header: JSON) -> Any:
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in ASSERTION_ALGORITHMS:
            raise invalid_client(f"alg must be one of {', '.join(ASSERTION_ALGORITHMS)}")
        if not isinstance(kid, str) or not kid:
            raise invalid_client("the assertion's header needs a kid")
        if header.get("typ") != "JWT":
            raise invalid_client("the assertion's header needs typ JWT")
        jku, registered_url = header.get("jku"), client.get("jwks_uri")
        if jku is not None and jku != registered_url:
            raise invalid_client("jku is not the JWKS URL this client registered")
        if registered_url is None:
            candidates = client["jwks"]["keys"]
        else:
            candidates = await self.jwks.keys(registered_url)
            if not _matching(candidates, kid, alg):  # rotated: look again once
                candidates = await self.jwks.keys(registered_url, refresh=True)
        found = _matching(candidates, kid, alg)
        if len(found) != 1:
            raise invalid_client(f"{'no' if not found else 'more than one'} key of the "
                                 f"client matches kid {kid!r} and alg {alg}")
        try:
            return jwt.PyJWK(found[0], algorithm=alg).key
        except jwt.PyJWTError:
            raise invalid_client(f"the client's key {kid!r} is not a usable {alg} key") \
                from None

    async def _spend_jti(self, client_id: str, claims: JSON) -> None:
        digest = hashlib.sha256(f"{client_id}|{claims['jti']}".encode()).hexdigest()
        try:
            async with self.store.unit_of_work() as uow:
                uow.insert_document(ASSERTIONS, digest, {
                    "id": digest, "client_id": client_id,
                    "expires_at": rfc3339(float(claims["exp"]) + CLOCK_SKEW)})
                await uow.commit()
        except DuplicateDocument:
            raise invalid_client("this assertion's jti was already used (replay)") from None


def _matching(keys: list[JSON], kid: str, alg: str) -> list[JSON]:
    kty = ASSERTION_ALGORITHMS[alg]
    return [k for k in keys if isinstance(k, dict) and k.get("kid") == kid
            and k.get("kty") == kty]


def _plausible(claims: JSON, token_url: str) -> None:
    """What the unverified claims must already satisfy for a key set to be worth
    fetching: unexpired, not too far ahead, for this token URL, with a jti."""
    exp, now = claims.get("exp"), time.time()
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        raise invalid_client("the assertion needs a numeric exp")
    if exp < now - CLOCK_SKEW:
        raise invalid_client("the client assertion expired")
    if exp > now + MAX_ASSERTION_LIFETIME + CLOCK_SKEW:
        raise invalid_client("the assertion's exp is more than five minutes ahead")
    aud = claims.get("aud")
    if token_url not in (aud if isinstance(aud, list) else [aud]):
        raise invalid_client(f"the assertion's aud must be the token URL {token_url}")
    if not isinstance(claims.get("jti"), str) or not claims["jti"]:
        raise invalid_client("the assertion needs a jti")


def _verified(assertion: str, key: Any, alg: str, client_id: str, token_url: str) -> JSON:
    try:
        claims: JSON = jwt.decode(
            assertion, key, algorithms=[alg], audience=token_url, issuer=client_id,
            leeway=CLOCK_SKEW, options={"require": ["iss", "sub", "aud", "exp", "jti"]})
    except jwt.ExpiredSignatureError:
        raise invalid_client("the client assertion expired") from None
    except jwt.InvalidAudienceError:
        raise invalid_client(f"the assertion's aud must be the token URL {token_url}") \
            from None
    except jwt.PyJWTError as exc:
        raise invalid_client(f"the client assertion is not valid: {exc}") from None
    if float(claims["exp"]) > time.time() + MAX_ASSERTION_LIFETIME + CLOCK_SKEW:
        raise invalid_client("the assertion's exp is more than five minutes ahead")
    if not isinstance(claims["jti"], str) or not claims["jti"]:
        raise invalid_client("the assertion needs a jti")
    return claims


def _basic(authorization: str) -> tuple[str, str]:
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise invalid_client("malformed Basic credentials") from None
    client_id, colon, secret = decoded.partition(":")
    if not colon:
        raise invalid_client("malformed Basic credentials")
    return unquote_plus(client_id), unquote_plus(secret)


__all__ = ["ASSERTION_TYPE", "ClientAuthenticator", "JwksCache", "OAuthError"]

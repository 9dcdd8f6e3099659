"""Access tokens: PASETO v4.public issued and verified with the key ring.

Claims (PASETO 04-Claims): ``iss``, ``sub`` (user id), ``aud``, ``iat``, ``exp`` (RFC
3339 strings, not integers: pyseto refuses an integer ``exp``), ``jti`` (uuid4, the
handle for revocation), ``roles``, ``email`` and ``sid`` (the refresh-token family the
token belongs to, so logout and reuse detection can revoke the whole session).
Footer: ``{"kid": "k4.pid.…"}``.

A SMART access token (``platform_api.smart``) is the same token with one more claim,
``smart``: ``{client_id, scope, patient?, encounter?, fhirUser?, backend?}`` (its ``sub``
is the user, or for a backend services client the client id); only /fhir accepts it.

Verification order, each step failing closed with a 401:

1. the header must be ``v4.public.`` (no ``v4.local.``, ``v2.public.``, ...);
2. the footer is read *before* verification, as untrusted input, only to find ``kid``;
3. the key is looked up by that id; an unknown id is refused, never "try every key";
4. ``pyseto.decode(..., deserializer=json, aud=...)``: without the deserializer pyseto
   checks neither ``exp`` nor ``aud``;
5. ``iss``, ``sub`` and ``jti`` are checked here, since pyseto never looks at them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import pyseto
from pyseto.exceptions import PysetoError, VerifyError

from platform_api.auth.errors import invalid_token, token_expired
from platform_api.auth.keys import KeyRing
from platform_api.envelope import ApiError

ACCEPTED_HEADER = "v4.public."
# Ours are ~400 characters (a SMART token with many granular scopes a few thousand); a cap
# keeps base64 and JSON work bounded for garbage input, under the usual 8 KiB header limit.
MAX_TOKEN_LENGTH = 7168

K = TypeVar("K")
V = TypeVar("V")


def rfc3339(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(int(epoch_seconds), UTC).isoformat(timespec="seconds")


def parse_rfc3339(value: object) -> float:
    if not isinstance(value, str):
        raise ValueError("not an RFC 3339 string")
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise ValueError("RFC 3339 time without offset")
    return moment.timestamp()


@dataclass(frozen=True, slots=True)
class SmartClaims:
    """The ``smart`` claim of a SMART access token (module docstring)."""

    client_id: str
    scope: str
    patient: str | None = None
    encounter: str | None = None
    fhir_user: str | None = None
    backend: bool = False

    def as_claim(self) -> dict[str, Any]:
        claim: dict[str, Any] = {"client_id": self.client_id, "scope": self.scope}
        optional = {"patient": self.patient, "encounter": self.encounter,
                    "fhirUser": self.fhir_user}
        claim.update({k: v for k, v in optional.items() if v is not None})
        if self.backend:
            claim["backend"] = True
        return claim

    @classmethod
    def from_claim(cls, claim: object) -> SmartClaims:
        if not isinstance(claim, dict):
            raise ValueError("smart claim is not an object")
        client_id, scope = claim.get("client_id"), claim.get("scope")
        if not isinstance(client_id, str) or not client_id or not isinstance(scope, str):
            raise ValueError("smart claim needs client_id and scope")
        patient, encounter, fhir_user = (claim.get(k) for k in ("patient", "encounter",
                                                                "fhirUser"))
        if not all(v is None or isinstance(v, str) for v in (patient, encounter, fhir_user)):
            raise ValueError("smart launch context values are strings")
        return cls(client_id, scope, patient, encounter, fhir_user,
                   backend=claim.get("backend") is True)


@dataclass(frozen=True, slots=True)
class AccessClaims:
    """The claims of a verified access token that the service relies on."""

    sub: str
    jti: str
    expires_at: float  # epoch seconds
    roles: frozenset[str]
    email: str | None
    sid: str | None
    smart: SmartClaims | None = None


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token: str
    claims: AccessClaims

    @property
    def jti(self) -> str:
        return self.claims.jti

    @property
    def expires_at(self) -> float:
        return self.claims.expires_at


class AccessTokenCodec:
    """Issues and verifies access tokens; knows nothing about users or revocation."""

    def __init__(self, keys: KeyRing, issuer: str, audience: str):
        self.keys, self.issuer, self.audience = keys, issuer, audience

    def issue(
        self,
        *,
        subject: str,
        roles: Sequence[str],
        email: str | None,
        session_id: str | None,
        ttl_seconds: int,
        smart: SmartClaims | None = None,
    ) -> IssuedToken:
        """Sign a token valid for ``ttl_seconds`` (negative gives an expired token)."""
        now = time.time()
        expires_at = float(int(now + ttl_seconds))  # what the RFC 3339 claim can carry
        jti = str(uuid.uuid4())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": subject,
            "aud": self.audience,
            "iat": rfc3339(now),
            "exp": rfc3339(expires_at),
            "jti": jti,
            "roles": list(roles),
            "email": email,
        }
        if session_id is not None:
            claims["sid"] = session_id
        if smart is not None:
            claims["smart"] = smart.as_claim()
        key = self.keys.signing_key
        token = pyseto.encode(key.secret, claims, footer={"kid": key.kid}, serializer=json)
        issued = AccessClaims(subject, jti, expires_at, frozenset(roles), email, session_id,
                              smart)
        return IssuedToken(token.decode("ascii"), issued)

    def verify(self, token: str) -> AccessClaims:
        """The claims of a valid token; raises ApiError 401 INVALID_TOKEN/TOKEN_EXPIRED."""
        if len(token) > MAX_TOKEN_LENGTH:
            raise invalid_token("token is too long")
        if not token.startswith(ACCEPTED_HEADER):
            raise invalid_token(
                f"{_header_of(token)} tokens are not accepted; expected a PASETO v4.public token"
            )
        kid = _untrusted_kid(token)
        key = self.keys.verifying_key(kid)
        if key is None:
            raise invalid_token("signing key retired" if self.keys.retired(kid)
                                else "unknown signing key id")
        try:
            decoded = pyseto.decode(key, token, deserializer=json, aud=self.audience)
        except VerifyError as exc:
            raise _verify_failure(exc) from None
        except (PysetoError, ValueError, TypeError):
            raise invalid_token("signature verification failed") from None
        return self._checked_claims(decoded.payload)

    def _checked_claims(self, payload: object) -> AccessClaims:
        if not isinstance(payload, dict):
            raise invalid_token("claims are not a JSON object")
        if payload.get("iss") != self.issuer:
            raise invalid_token("wrong issuer")
        sub, jti, roles = payload.get("sub"), payload.get("jti"), payload.get("roles", [])
        if not isinstance(sub, str) or not sub or not isinstance(jti, str) or not jti:
            raise invalid_token("sub and jti are required")
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise invalid_token("roles must be a list of strings")
        try:
            expires_at = parse_rfc3339(payload.get("exp"))
        except ValueError:
            raise invalid_token("exp must be an RFC 3339 time") from None
        email, sid = payload.get("email"), payload.get("sid")
        try:
            smart = SmartClaims.from_claim(payload["smart"]) if "smart" in payload else None
        except ValueError as exc:
            raise invalid_token(str(exc)) from None
        return AccessClaims(
            sub,
            jti,
            expires_at,
            frozenset(roles),
            email if isinstance(email, str) else None,
            sid if isinstance(sid, str) else None,
            smart,
        )


def _header_of(token: str) -> str:
    parts = token.split(".", 2)
    return ".".join(parts[:2]) if len(parts) == 3 else "malformed"


def _untrusted_kid(token: str) -> str:
    """The footer's ``kid``, read before verification: only a key lookup hint."""
    try:
        footer = pyseto.Token.new(token).footer
        parsed = json.loads(footer) if isinstance(footer, bytes) and footer else None
    except (ValueError, TypeError):
        raise invalid_token("malformed token") from None
    kid = parsed.get("kid") if isinstance(parsed, dict) else None
    if not isinstance(kid, str) or not kid.startswith("k4.pid."):
        raise invalid_token("footer has no k4.pid key id")
    return kid


def _verify_failure(exc: VerifyError) -> ApiError:
    # pyseto reports which check failed only in the message (pyseto/paseto.py).
    message = str(exc)
    if message == "Token expired.":
        return token_expired()
    if message == "aud verification failed.":
        return invalid_token("wrong audience")
    if message == "Token has not been activated yet.":
        return invalid_token("not valid yet (nbf)")
    return invalid_token("signature verification failed")


class BoundedCache(Generic[K, V]):
    """A dict with a size cap; the oldest entry goes first (tokens age out anyway)."""

    def __init__(self, max_entries: int):
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._items: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        items = self._items
        if key not in items and len(items) >= self.max_entries:
            del items[next(iter(items))]
        items[key] = value

    def discard(self, key: K) -> None:
        self._items.pop(key, None)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

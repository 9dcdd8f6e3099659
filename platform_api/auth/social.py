"""Social login: OpenID Connect ID tokens verified against each configured provider.

Providers come from the ``oidc_providers`` setting (JSON), e.g.::

    {"google": {"issuer": "https://accounts.google.com",
                "client_id": "1234.apps.googleusercontent.com"}}

with optional ``jwks_uri`` (otherwise read from the issuer's
``/.well-known/openid-configuration``) and ``algorithms`` (default RS256 and ES256).

An ID token is accepted only when (OpenID Connect Core 1.0 section 3.1.3.7):

- its ``alg`` is one the provider is configured for (never ``none`` or a MAC: the
  client secret is not a key we hold), and its ``kid`` names a key of the provider's
  JWKS (fetched over HTTPS, cached, re-fetched on an unknown ``kid`` at most once per
  ``JWKS_REFETCH_SECONDS``);
- the signature verifies (PyJWT);
- ``iss`` is the provider's issuer, ``aud`` contains our client id (and ``azp``, when
  present with several audiences, is our client id), ``exp`` is in the future and
  ``iat`` is present;
- ``nonce`` equals the nonce the app sent with its authorization request, which it
  passes here too, so a token captured from another login cannot be replayed.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import jwt

from platform_api.audit import MINOR_FAILURE, SERIOUS_FAILURE, AuditRecord, ClientInfo
from platform_api.auth import users
from platform_api.auth.devices import KnownDevice
from platform_api.auth.errors import account_suspended
from platform_api.auth.tokens import rfc3339
from platform_api.envelope import ApiError

if TYPE_CHECKING:
    from platform_api.auth.service import AuthService, LoginResult, MfaRequired

JSON = users.JSON

DEFAULT_ALGORITHMS = ("RS256", "ES256")
REFUSED_ALGORITHMS = frozenset({"none", "HS256", "HS384", "HS512"})
JWKS_CACHE_SECONDS = 3600.0
JWKS_REFETCH_SECONDS = 60.0
LEEWAY_SECONDS = 30  # clock skew between us and the provider


def invalid_id_token(reason: str) -> ApiError:
    return ApiError(401, "INVALID_ID_TOKEN", f"ID token refused: {reason}")


def provider_unavailable(name: str, reason: str) -> ApiError:
    return ApiError(503, "PROVIDER_UNAVAILABLE",
                    f"Could not reach the {name} sign-in provider: {reason}")


@dataclass(frozen=True, slots=True)
class OidcProvider:
    name: str
    issuer: str
    client_ids: tuple[str, ...]
    jwks_uri: str | None = None
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS

    @classmethod
    def from_setting(cls, name: str, config: Mapping[str, Any]) -> OidcProvider:
        issuer, client_id = config.get("issuer"), config.get("client_id")
        if not isinstance(issuer, str) or not issuer:
            raise ValueError(f"oidc_providers.{name}: 'issuer' is required")
        ids = (client_id,) if isinstance(client_id, str) else tuple(client_id or ())
        if not ids or not all(isinstance(i, str) and i for i in ids):
            raise ValueError(f"oidc_providers.{name}: 'client_id' is required")
        algorithms = tuple(config.get("algorithms") or DEFAULT_ALGORITHMS)
        if REFUSED_ALGORITHMS & set(algorithms):
            raise ValueError(f"oidc_providers.{name}: algorithms may not include "
                             f"{', '.join(sorted(REFUSED_ALGORITHMS & set(algorithms)))}")
        return cls(name, issuer.rstrip("/"), ids, config.get("jwks_uri"), algorithms)


@dataclass(slots=True)
class _KeySet:
    keys: dict[str, Any] = field(default_factory=dict)  # kid -> PyJWK
    fetched_at: float = float("-inf")


@dataclass(frozen=True, slots=True)
class VerifiedIdentity:
    provider: str
    subject: str
    email: str | None
    email_verified: bool
    given_name: str | None
    family_name: str | None


class OidcVerifier:
    def __init__(self, providers: Mapping[str, Mapping[str, Any]]):
        self.providers = {name: OidcProvider.from_setting(name, cfg)
                          for name, cfg in providers.items()}
        self._keys: dict[str, _KeySet] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._http: httpx.AsyncClient | None = None

    def provider(self, name: str) -> OidcProvider:
        provider = self.providers.get(name)
        if provider is None:
            known = ", ".join(sorted(self.providers)) or "none configured"
            raise ApiError(422, "VALIDATION_ERROR",
                           f"Unknown sign-in provider {name!r} (known: {known})",
                           field="provider")
        return provider

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def verify(self, provider_name: str, id_token: str, nonce: str) -> VerifiedIdentity:
        provider = self.provider(provider_name)
        try:
            header = jwt.get_unverified_header(id_token)
        except jwt.PyJWTError:
            raise invalid_id_token("not a JWT") from None
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in provider.algorithms:
            raise invalid_id_token(f"algorithm {alg!r} is not accepted for {provider.name}")
        key = await self._key(provider, kid if isinstance(kid, str) else None)
        claims = self._decode(provider, id_token, key, alg)
        token_nonce = claims.get("nonce")
        if not isinstance(token_nonce, str) or not hmac.compare_digest(token_nonce, nonce):
            raise invalid_id_token("nonce does not match this login")
        return VerifiedIdentity(
            provider.name, str(claims["sub"]),
            claims.get("email") if isinstance(claims.get("email"), str) else None,
            claims.get("email_verified") is True,
            claims.get("given_name") if isinstance(claims.get("given_name"), str) else None,
            claims.get("family_name") if isinstance(claims.get("family_name"), str) else None,
        )

    def _decode(self, provider: OidcProvider, id_token: str, key: Any, alg: str
                ) -> dict[str, Any]:
        try:
            claims: dict[str, Any] = jwt.decode(
                id_token, key, algorithms=[alg], audience=list(provider.client_ids),
                issuer=provider.issuer, leeway=LEEWAY_SECONDS,
                options={"require": ["iss", "sub", "aud", "exp", "iat"]},
            )
        except jwt.ExpiredSignatureError:
            raise invalid_id_token("expired") from None
        except jwt.InvalidAudienceError:
            raise invalid_id_token("issued for another client (aud)") from None
        except jwt.InvalidIssuerError:
            raise invalid_id_token("wrong issuer") from None
        except jwt.MissingRequiredClaimError as exc:
            raise invalid_id_token(f"missing claim {exc.claim!r}") from None
        except jwt.InvalidSignatureError:
            raise invalid_id_token("signature does not verify") from None
        except jwt.PyJWTError as exc:
            raise invalid_id_token(str(exc)) from None
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        azp = claims.get("azp")
        if len(audiences) > 1 and azp is not None and azp not in provider.client_ids:
            raise invalid_id_token("authorized party (azp) is another client")
        return claims

    # -- keys --------------------------------------------------------------------------
    async def _key(self, provider: OidcProvider, kid: str | None) -> Any:
        keyset = self._keys.get(provider.name)
        now = time.monotonic()
        if keyset is None or now - keyset.fetched_at > JWKS_CACHE_SECONDS or (
            kid not in keyset.keys and now - keyset.fetched_at > JWKS_REFETCH_SECONDS
        ):
            keyset = await self._refresh(provider)
        if kid is None and len(keyset.keys) == 1:
            return next(iter(keyset.keys.values())).key
        found = keyset.keys.get(kid) if kid is not None else None
        if found is None:
            raise invalid_id_token(f"signing key {kid!r} is not in {provider.name}'s JWKS")
        return found.key

    async def _refresh(self, provider: OidcProvider) -> _KeySet:
        lock = self._locks.setdefault(provider.name, asyncio.Lock())
        async with lock:  # one fetch for a burst of logins
            current = self._keys.get(provider.name)
            if current is not None and time.monotonic() - current.fetched_at < 1.0:
                return current
            jwks = await self._get_json(provider, await self._jwks_uri(provider))
            try:
                keys = jwt.PyJWKSet.from_dict(jwks).keys
            except jwt.PyJWTError as exc:
                raise provider_unavailable(provider.name, f"unusable JWKS ({exc})") from None
            keyset = _KeySet({k.key_id or "": k for k in keys}, time.monotonic())
            self._keys[provider.name] = keyset
            return keyset

    async def _jwks_uri(self, provider: OidcProvider) -> str:
        if provider.jwks_uri:
            return provider.jwks_uri
        config = await self._get_json(provider,
                                      f"{provider.issuer}/.well-known/openid-configuration")
        if str(config.get("issuer", "")).rstrip("/") != provider.issuer:
            raise provider_unavailable(provider.name, "discovery names another issuer")
        uri = config.get("jwks_uri")
        if not isinstance(uri, str):
            raise provider_unavailable(provider.name, "discovery has no jwks_uri")
        return uri

    async def _get_json(self, provider: OidcProvider, url: str) -> dict[str, Any]:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=5.0, follow_redirects=False)
        try:
            response = await self._http.get(url)
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise provider_unavailable(provider.name, f"GET {url} failed ({exc})") from None
        if not isinstance(body, dict):
            raise provider_unavailable(provider.name, f"GET {url} did not return an object")
        return body


# -- accounts --------------------------------------------------------------------------
SOCIAL_IDENTITIES = "social_identities"  # "<provider>:<sub>" -> user id


def email_not_verified(provider: str) -> ApiError:
    return ApiError(422, "EMAIL_NOT_VERIFIED",
                    f"{provider} did not vouch for an e-mail address (email_verified); "
                    "sign up with e-mail and password instead")


class SocialLogin:
    """Log in (or sign up) with a verified ID token.

    The account is found by the provider's subject once linked; the first time, by the
    e-mail address only when the provider says it verified it (``email_verified``):
    linking on an unverified address would hand an existing account to whoever typed
    that address at the provider. With no account for the address, one is created
    (no password: it can be set through "forgot password")."""

    def __init__(self, auth: AuthService):
        self.auth = auth

    async def login(self, provider: str, id_token: str, nonce: str,
                    referral_code: str | None, client: ClientInfo,
                    device: KnownDevice | None = None) -> LoginResult | MfaRequired:
        try:
            identity = await self.auth.oidc.verify(provider, id_token, nonce)
        except ApiError as refused:
            if refused.status == 401:
                await self.auth.audit.record(AuditRecord(
                    "login", MINOR_FAILURE, refused.message, client=client,
                    details={"method": f"oidc:{provider}"}))
            raise
        user = await self._account_for(identity, referral_code)
        if user["status"] != users.ACTIVE:
            await self.auth.audit.record(AuditRecord(
                "login", SERIOUS_FAILURE, "suspended account", user_id=user["id"],
                user_email=user["email"], client=client))
            raise account_suspended()
        return await self.auth.first_factor_passed(user, f"oidc:{provider}", client, device)

    async def _account_for(self, identity: VerifiedIdentity, referral_code: str | None
                           ) -> JSON:
        link_id = f"{identity.provider}:{identity.subject}"
        store = self.auth.store
        link = await store.get_document(SOCIAL_IDENTITIES, link_id)
        if link is not None:
            user = await store.get_document(users.COLLECTION, link["user_id"])
            if user is not None:
                return user
        if not identity.email or not identity.email_verified:
            raise email_not_verified(identity.provider)
        link_doc = {"id": link_id, "provider": identity.provider, "subject": identity.subject,
                    "linked_at": rfc3339(time.time())}
        existing = await self.auth.find_user_by_email(identity.email)
        if existing is not None:
            async with store.unit_of_work() as uow:
                uow.put_document(SOCIAL_IDENTITIES, link_id, {**link_doc,
                                                              "user_id": existing["id"]})
                await uow.commit()
            return existing
        referrer = await self.auth.referrer(referral_code)
        local_part = identity.email.partition("@")[0]
        user = users.new_user(
            email=identity.email, password_hash=None,
            first_name=identity.given_name or local_part,
            last_name=identity.family_name or "-",
            registration_role="PATIENT", referred_by=referrer["id"] if referrer else None,
            email_verified=True,
        )
        await self.auth.insert_user(user, also=lambda uow: uow.put_document(
            SOCIAL_IDENTITIES, link_id, {**link_doc, "user_id": user["id"]}))
        return user

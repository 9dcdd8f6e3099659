"""Registered SMART clients: their metadata (RFC 7591), checked once, kept as documents.

A client is a ``smart_clients`` document keyed by its ``client_id``: ``client_name``,
``redirect_uris``, ``launch_uri``, ``token_endpoint_auth_method`` (``none`` for public
apps, ``client_secret_basic`` / ``client_secret_post`` for symmetric confidential apps,
``private_key_jwt`` for asymmetric ones), ``grant_types`` (``authorization_code``,
``refresh_token``, ``client_credentials``), ``scope`` (the most it may ever be granted),
``jwks`` or ``jwks_uri`` (its public keys), ``organization_id`` / ``platform_wide`` (what
a backend services client acts for, see :mod:`platform_api.policy.smart`), ``status``
(``active`` / ``disabled``), who registered it and when.

The secret of a symmetric client is shown once, at registration, and stored as its
SHA-256: it carries 256 random bits, so there is nothing to brute-force, and the token
endpoint compares it in constant time without an argon2 cost per request.

Rules a registration must meet (``invalid_client_metadata`` / ``invalid_redirect_uri``
otherwise): a redirect URI for every ``authorization_code`` client, https (or http on the
loopback interface, or a private-use scheme as native apps use, RFC 8252) and no
fragment; ``client_credentials`` only with ``private_key_jwt`` (SMART Backend Services);
``private_key_jwt`` with exactly one of ``jwks`` (RS/EC public keys, each with a ``kid``)
and ``jwks_uri``; ``system/`` scopes for backend clients only, ``patient/`` and ``user/``
scopes for apps that a user authorizes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from fhir_server.smart_scopes import SYSTEM, ScopeError, ScopeSet
from fhir_server.store import ResourceStore
from platform_api.auth.service import ClientStanding
from platform_api.auth.tokens import BoundedCache, rfc3339
from platform_api.smart.oauth import CLIENTS, OAuthError

JSON = dict[str, Any]
ACTIVE, DISABLED = "active", "disabled"
AUTH_METHODS = ("none", "client_secret_basic", "client_secret_post", "private_key_jwt")
SYMMETRIC = frozenset({"client_secret_basic", "client_secret_post"})
GRANT_TYPES = ("authorization_code", "refresh_token", "client_credentials")
SECRET_PREFIX = "hps_"
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
MAX_REDIRECT_URIS = 20
MAX_JWKS_KEYS = 10
MAX_JWKS_BYTES = 32 * 1024  # ten RSA-4096 public keys fit in a third of it
MAX_SCOPE_LENGTH = 4000
# Fields the registration and the administrators' update may set.
METADATA_FIELDS = ("client_name", "redirect_uris", "launch_uri", "token_endpoint_auth_method",
                   "grant_types", "response_types", "scope", "jwks", "jwks_uri",
                   "organization_id", "platform_wide")


def metadata_error(message: str) -> OAuthError:
    return OAuthError("invalid_client_metadata", message)


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _app_uri(value: Any, field: str, *, redirect: bool) -> str:
    """An https, loopback http or private-use-scheme URI without a fragment."""
    error = "invalid_redirect_uri" if redirect else "invalid_client_metadata"
    if not isinstance(value, str) or not value or len(value) > 2000:
        raise OAuthError(error, f"{field}: a URI is required")
    parts = urlsplit(value)
    if parts.fragment or "#" in value:
        raise OAuthError(error, f"{field}: {value!r} must not have a fragment")
    if parts.scheme == "https" and parts.hostname:
        return value
    if parts.scheme == "http" and parts.hostname in LOOPBACK:
        return value
    if redirect and "." in parts.scheme and parts.scheme not in ("http", "https"):
        return value  # a native app's private-use scheme (RFC 8252 7.1), com.example.app:/cb
    raise OAuthError(error, f"{field}: {value!r} must be https (http only on the loopback "
                     "interface)")


def _jwks(value: Any) -> JSON:
    """A JWK Set of RSA/EC public keys, each with ``kid`` (client-confidential-asymmetric)."""
    if not isinstance(value, dict) or not isinstance(value.get("keys"), list) or not value["keys"]:
        raise metadata_error("jwks: a JWK Set {\"keys\": [...]} with at least one key")
    for index, key in enumerate(value["keys"]):
        if not isinstance(key, dict) or not isinstance(key.get("kid"), str) or not key["kid"]:
            raise metadata_error(f"jwks.keys[{index}]: every key needs a kid")
        needed = {"RSA": ("n", "e"), "EC": ("crv", "x", "y")}.get(key.get("kty", ""))
        if needed is None or not all(isinstance(key.get(p), str) for p in needed):
            raise metadata_error(f"jwks.keys[{index}]: an RSA key (n, e) or an EC key "
                                 "(crv, x, y) is required")
        if any(private in key for private in ("d", "p", "q", "dp", "dq", "qi")):
            raise metadata_error(f"jwks.keys[{index}]: a private key was sent; register "
                                 "the public key only")
    if len(value["keys"]) > MAX_JWKS_KEYS:
        raise metadata_error(f"jwks: at most {MAX_JWKS_KEYS} keys")
    keys = [{k: v for k, v in key.items() if isinstance(k, str)} for key in value["keys"]]
    if len(orjson.dumps({"keys": keys})) > MAX_JWKS_BYTES:
        raise metadata_error(f"jwks: at most {MAX_JWKS_BYTES // 1024} KiB")
    return {"keys": keys}


def _scope(value: Any, grant_types: list[str]) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_SCOPE_LENGTH:
        raise metadata_error("scope: the space-separated scopes the client may ever be "
                             "granted are required")
    try:
        scopes = ScopeSet.parse(value)
    except ScopeError as exc:
        raise metadata_error(f"scope: {exc}") from None
    backend = "client_credentials" in grant_types
    user_facing = "authorization_code" in grant_types
    for scope in scopes.resources:
        if scope.context == SYSTEM and not backend:
            raise metadata_error(f"scope: {scope.text} is for backend services clients "
                                 "(grant type client_credentials)")
        if scope.context != SYSTEM and not user_facing:
            raise metadata_error(f"scope: {scope.text} needs a user's authorization "
                                 "(grant type authorization_code)")
    return str(scopes)


def checked_metadata(body: JSON) -> JSON:
    """The client metadata of a registration (or of an update merged over the current
    metadata), with defaults; ``OAuthError`` naming what is wrong."""
    method = body.get("token_endpoint_auth_method") or "client_secret_basic"
    if method not in AUTH_METHODS:
        raise metadata_error(f"token_endpoint_auth_method: one of {', '.join(AUTH_METHODS)}")
    grant_types = body.get("grant_types") or ["authorization_code"]
    if not isinstance(grant_types, list) or not set(grant_types) <= set(GRANT_TYPES):
        raise metadata_error(f"grant_types: a list of {', '.join(GRANT_TYPES)}")
    grant_types = list(dict.fromkeys(grant_types))
    if "client_credentials" in grant_types and method != "private_key_jwt":
        raise metadata_error("client_credentials needs token_endpoint_auth_method "
                             "private_key_jwt (SMART Backend Services)")
    if "refresh_token" in grant_types and "authorization_code" not in grant_types:
        raise metadata_error("grant_types: refresh_token comes with authorization_code")
    authorization_code = "authorization_code" in grant_types
    response_types = body.get("response_types") or (["code"] if authorization_code else [])
    if response_types not in (["code"], []) or bool(response_types) != authorization_code:
        raise metadata_error("response_types: [\"code\"] with authorization_code, else none")
    redirect_uris = body.get("redirect_uris") or []
    if not isinstance(redirect_uris, list) or len(redirect_uris) > MAX_REDIRECT_URIS:
        raise OAuthError("invalid_redirect_uri", "redirect_uris: a list of URIs")
    if authorization_code and not redirect_uris:
        raise OAuthError("invalid_redirect_uri", "redirect_uris: at least one is required "
                         "for authorization_code")
    metadata: JSON = {
        "client_name": _client_name(body.get("client_name")),
        "redirect_uris": [_app_uri(u, f"redirect_uris[{i}]", redirect=True)
                          for i, u in enumerate(redirect_uris)],
        "token_endpoint_auth_method": method,
        "grant_types": grant_types,
        "response_types": response_types,
        "scope": _scope(body.get("scope"), grant_types),
    }
    if body.get("launch_uri") is not None:
        metadata["launch_uri"] = _app_uri(body["launch_uri"], "launch_uri", redirect=False)
    metadata.update(_keys(body, method))
    organization = body.get("organization_id")
    if organization is not None and (not isinstance(organization, str) or not organization):
        raise metadata_error("organization_id: the id of an Organization")
    if body.get("platform_wide") not in (None, True, False):
        raise metadata_error("platform_wide: true or false")
    metadata["organization_id"] = organization
    metadata["platform_wide"] = bool(body.get("platform_wide"))
    if "client_credentials" not in grant_types and (organization or metadata["platform_wide"]):
        raise metadata_error("organization_id and platform_wide are for backend services "
                             "clients (client_credentials)")
    if organization and metadata["platform_wide"]:
        raise metadata_error("a client acts for one organization or for the whole "
                             "platform, not both")
    return metadata


def _client_name(value: Any) -> str:
    if value is None:
        return "Unnamed SMART app"
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        raise metadata_error("client_name: a name of at most 200 characters")
    return value.strip()


def _keys(body: JSON, method: str) -> JSON:
    jwks, jwks_uri = body.get("jwks"), body.get("jwks_uri")
    if method != "private_key_jwt":
        if jwks is not None or jwks_uri is not None:
            raise metadata_error("jwks and jwks_uri are for private_key_jwt clients")
        return {}
    if (jwks is None) == (jwks_uri is None):
        raise metadata_error("private_key_jwt needs exactly one of jwks and jwks_uri")
    if jwks is not None:
        return {"jwks": _jwks(jwks)}
    return {"jwks_uri": _app_uri(jwks_uri, "jwks_uri", redirect=False)}


def public_metadata(doc: JSON) -> JSON:
    """What RFC 7591 returns and administrators see: never the secret or its hash."""
    view = {k: doc[k] for k in METADATA_FIELDS if doc.get(k) is not None}
    view.update({
        "client_id": doc["id"], "client_id_issued_at": doc["client_id_issued_at"],
        "status": doc["status"], "registered_by": doc["registered_by"],
        "reviewed": bool(doc.get("reviewed")),
        "created_at": doc["created_at"], "updated_at": doc["updated_at"]})
    if doc["token_endpoint_auth_method"] in SYMMETRIC:
        view["client_secret_expires_at"] = 0  # never expires (RFC 7591 3.2.1)
    return view


@dataclass(frozen=True, slots=True)
class Registered:
    document: JSON
    secret: str | None  # shown once


class ClientRegistry:
    """The ``smart_clients`` documents, and each client's standing for the auth service
    (cached ``recheck_seconds``, dropped at once on a change made here)."""

    def __init__(self, store: ResourceStore, recheck_seconds: float = 5.0):
        self.store = store
        self.recheck_seconds = recheck_seconds
        self._standing: BoundedCache[str, tuple[float, ClientStanding | None]] = \
            BoundedCache(10_000)

    async def registered_by(self, account: str) -> int:
        """How many clients ``account`` registered (its API keys' included)."""
        return await self.store.count_documents(CLIENTS, {"registered_by": account})

    async def register(self, metadata: JSON, registered_by: str, *,
                       reviewed: bool = False) -> Registered:
        now = time.time()
        secret = SECRET_PREFIX + secrets.token_urlsafe(32) \
            if metadata["token_endpoint_auth_method"] in SYMMETRIC else None
        doc: JSON = {
            **metadata, "id": str(uuid.uuid4()), "status": ACTIVE,
            "secret_hash": secret_hash(secret) if secret else None,
            "registered_by": registered_by, "client_id_issued_at": int(now),
            # reviewed: registered or approved by a platform administrator; an error of
            # an unreviewed app's authorize request is shown here, not redirected
            "reviewed": reviewed,
            "created_at": rfc3339(now), "updated_at": rfc3339(now),
        }
        async with self.store.unit_of_work() as uow:
            uow.insert_document(CLIENTS, doc["id"], doc)
            await uow.commit()
        return Registered(doc, secret)

    async def get(self, client_id: str) -> JSON | None:
        if not client_id or len(client_id) > 200:
            return None
        return await self.store.get_document(CLIENTS, client_id)

    async def active(self, client_id: str) -> JSON | None:
        found = await self.get(client_id)
        return found if found is not None and found["status"] == ACTIVE else None

    async def list(self, offset: int, limit: int) -> tuple[list[JSON], int]:
        found = await self.store.find_documents(CLIENTS, {}, limit=limit, offset=offset,
                                                order_by="created_at")
        return found, await self.store.count_documents(CLIENTS, {})

    async def save(self, doc: JSON) -> JSON:
        saved = {**doc, "updated_at": rfc3339(time.time())}
        async with self.store.unit_of_work() as uow:
            uow.put_document(CLIENTS, saved["id"], saved)
            await uow.commit()
        self._standing.discard(saved["id"])
        return saved

    async def standing(self, client_id: str) -> ClientStanding | None:
        """The auth service's question (:data:`~platform_api.auth.service.ClientLookup`)."""
        cached = self._standing.get(client_id)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self.recheck_seconds:
            return cached[1]
        doc = await self.active(client_id)
        standing = None if doc is None else ClientStanding(
            doc.get("organization_id"), bool(doc.get("platform_wide")))
        self._standing.put(client_id, (now, standing))
        return standing


def secret_matches(doc: JSON, presented: str) -> bool:
    stored = doc.get("secret_hash")
    return isinstance(stored, str) and hmac.compare_digest(stored, secret_hash(presented))

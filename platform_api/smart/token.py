"""``POST /oauth2/token`` (RFC 6749 section 3.2; SMART app-launch.md steps 5 and 7,
backend-services.md step 3): ``application/x-www-form-urlencoded`` in, JSON out with
``Cache-Control: no-store`` and ``Pragma: no-cache``.

- ``authorization_code``: the client authenticates as it registered (a public app sends
  its ``client_id``); the code must be one this server issued to that client, for the
  same ``redirect_uri``, unexpired (``HEALTHPLATFORM_SMART_CODE_TTL_SECONDS``), with the
  ``code_verifier`` whose S256 is the request's ``code_challenge`` (RFC 7636 4.6). A code
  is used once: presenting it again revokes every token it issued (RFC 6749 4.1.2);
- ``refresh_token`` (RFC 6749 section 6): bound to the client it was issued to. ``scope``,
  when sent, is any subset of what the user granted, and is what the access token gets;
  omitted, it is the whole grant. The refresh token keeps the grant's scope ("If a new
  refresh token is issued, the refresh token scope MUST be identical to that of the
  refresh token included by the client"), so a later refresh may ask for the whole grant
  again. A new refresh token comes when the subset asked for keeps ``offline_access`` or
  ``online_access`` (the token presented is rotated; a reused one revokes the
  authorization, :mod:`platform_api.auth.refresh`); a subset without either gets the
  access token alone, and the token presented stays the client's to use (section 6: the
  client discards it only when it is given a new one);
- ``client_credentials``: a backend services client authenticated by ``private_key_jwt``
  gets the ``system/`` scopes it asked for that it registered; none grantable is
  ``invalid_scope``.

Errors are RFC 6749 5.2: ``invalid_request``, ``invalid_client`` (401),
``invalid_grant``, ``unauthorized_client``, ``unsupported_grant_type``,
``invalid_scope``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from fhir_server.smart_scopes import ScopeError, ScopeSet
from fhir_server.store import DuplicateDocument
from platform_api.auth.refresh import FAMILIES
from platform_api.auth.tokens import parse_rfc3339, rfc3339
from platform_api.envelope import ApiError
from platform_api.smart.issuance import (
    access_kind,
    backend_token_response,
    refresh_ttl,
    user_token_response,
)
from platform_api.smart.oauth import (
    CODE_USES,
    CODES,
    SMART_FAMILY,
    TOKEN_PATH,
    OAuthError,
    no_store_json,
    oauth_refusals,
    urls,
)
from platform_api.smart.server import SmartServer, smart_server

router = APIRouter(tags=["SMART authorization server"])
JSON = dict[str, Any]
GRANT_TYPES = ("authorization_code", "refresh_token", "client_credentials")
_VERIFIER = re.compile(r"^[A-Za-z0-9._~-]{43,128}$")


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


async def form_of(request: Request) -> dict[str, str]:
    """The form of an OAuth request; ``invalid_request`` for any other body or a
    repeated parameter (RFC 6749 3.2: "parameters MUST NOT be included more than
    once")."""
    if not request.headers.get("content-type", "").startswith(
            "application/x-www-form-urlencoded"):
        raise OAuthError("invalid_request", "send application/x-www-form-urlencoded")
    form = await request.form()
    values: dict[str, str] = {}
    for key, value in form.multi_items():
        if key in values:
            raise OAuthError("invalid_request", f"{key} is sent more than once")
        if not isinstance(value, str):
            raise OAuthError("invalid_request", f"{key} must be a plain form field")
        values[key] = value
    return values


@router.post(TOKEN_PATH, summary="OAuth 2.0 token endpoint (SMART App Launch, Backend "
             "Services)", response_description="A token response (RFC 6749 5.1)",
             responses=oauth_refusals(400, 401))
async def token(request: Request) -> Response:
    server = smart_server(request)
    try:
        form = await form_of(request)
        grant_type = form.get("grant_type")
        if grant_type not in GRANT_TYPES:
            raise OAuthError("unsupported_grant_type",
                             f"grant_type must be one of {', '.join(GRANT_TYPES)}")
        token_url = urls(request).of(TOKEN_PATH)
        client = await server.clients.authenticate(
            form, request.headers.get("authorization"), token_url)
        if grant_type not in client["grant_types"]:
            raise OAuthError("unauthorized_client",
                             f"this client is not registered for {grant_type}")
        if grant_type == "authorization_code":
            body = await _authorization_code(server, request, form, client)
        elif grant_type == "refresh_token":
            body = await _refresh(server, request, form, client)
        else:
            body = await _client_credentials(server, form, client)
    except OAuthError as error:
        return error.response()
    except ApiError as error:  # the refresh-token store's refusals
        return OAuthError("invalid_grant", error.message).response()
    return no_store_json(body)


async def _authorization_code(server: SmartServer, request: Request, form: dict[str, str],
                              client: JSON) -> JSON:
    code, verifier = form.get("code", ""), form.get("code_verifier", "")
    if not code or not form.get("redirect_uri"):
        raise OAuthError("invalid_request", "code and redirect_uri are required")
    store = server.services.store
    digest = code_hash(code)
    grant = await store.get_document(CODES, digest)
    if grant is None:
        raise OAuthError("invalid_grant", "unknown authorization code")
    if grant.get("used_at") is not None:
        await _revoke_reused(server, grant)
        raise OAuthError("invalid_grant", "the code was already used: what it issued is "
                         "revoked")
    if parse_rfc3339(grant["expires_at"]) <= time.time():
        raise OAuthError("invalid_grant", "the authorization code expired")
    if grant["client_id"] != client["id"]:
        raise OAuthError("invalid_grant", "the code was issued to another client")
    if grant["redirect_uri"] != form["redirect_uri"]:
        raise OAuthError("invalid_grant", "redirect_uri is not the one of the authorization "
                         "request")
    if not _VERIFIER.match(verifier):
        raise OAuthError("invalid_grant", "code_verifier is required: 43-128 characters of "
                         "[A-Za-z0-9-._~] (PKCE, RFC 7636)")
    if not hmac.compare_digest(s256(verifier), grant["code_challenge"]):
        raise OAuthError("invalid_grant", "code_verifier does not match the code_challenge")
    family = await store.get_document(FAMILIES, grant["family_id"])
    if family is None or family.get("revoked_at") is not None:
        raise OAuthError("invalid_grant", "the authorization was revoked")
    refresh_token = None
    try:
        async with store.unit_of_work() as uow:
            now = rfc3339(time.time())
            uow.insert_document(CODE_USES, digest, {"id": digest, "used_at": now})
            uow.put_document(CODES, digest, {**grant, "used_at": now})
            if family.get("access") is not None:
                refresh_token = server.services.auth.refresh_tokens.stage_token(
                    uow, family["id"], family["user_id"], refresh_ttl(server, family))
            await uow.commit()
    except DuplicateDocument:  # the same code at the same moment: a replay
        await _revoke_reused(server, grant)
        raise OAuthError("invalid_grant", "the code was already used") from None
    return await user_token_response(server, family, urls(request),
                                     refresh_token=refresh_token, nonce=grant.get("nonce"))


async def _revoke_reused(server: SmartServer, grant: JSON) -> None:
    await server.services.auth.refresh_tokens.revoke_family(
        grant["family_id"], "authorization code reused")


async def _refresh(server: SmartServer, request: Request, form: dict[str, str],
                   client: JSON) -> JSON:
    presented = form.get("refresh_token", "")
    if not presented:
        raise OAuthError("invalid_request", "refresh_token is required")
    tokens = server.services.auth.refresh_tokens
    record = await tokens.lookup(presented)
    family = record.family
    if family.get("kind") != SMART_FAMILY or family.get("client_id") != client["id"]:
        raise OAuthError("invalid_grant", "this refresh token was not issued to this client")
    granted = ScopeSet.parse(family["scope"])
    asked = granted
    if "scope" in form:
        try:
            asked = ScopeSet.parse(form["scope"])
        except ScopeError as exc:
            raise OAuthError("invalid_scope", str(exc)) from None
        if not asked.names or not asked.within(granted):
            raise OAuthError("invalid_scope", "a refresh may ask for the scopes granted or "
                             f"fewer ({family['scope']})")
    successor = None
    if access_kind(asked) is not None:
        successor = await tokens.rotate(record, refresh_ttl(server, family))
    return await user_token_response(server, family, urls(request), refresh_token=successor,
                                     scope=str(asked) if "scope" in form else None)


async def _client_credentials(server: SmartServer, form: dict[str, str], client: JSON
                              ) -> JSON:
    requested = form.get("scope", "")
    if not requested.strip():
        raise OAuthError("invalid_scope", "scope is required (system/ scopes)")
    granted = server.grantable(requested, client, backend=True)
    if not granted.names:
        raise OAuthError("invalid_scope", "none of the requested scopes may be granted to "
                         f"this client (registered: {client['scope']})")
    return backend_token_response(server, client, granted)

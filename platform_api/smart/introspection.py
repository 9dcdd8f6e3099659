"""Token introspection (RFC 7662, SMART token-introspection.md) and revocation (RFC 7009).

``POST /oauth2/introspect``: the caller proves who it is with a bearer token (a SMART
app's or backend client's access token, or a platform user's, as the SMART IG allows) or
as a confidential client (its secret or assertion). RFC 7662 2.1 wants the caller
authorized too: a token's details are for the client it was issued to (authenticated as
that client, or presenting one of its own access tokens) and for platform administrators
(the policy's ``smart-token.introspect``); anyone else is answered ``{"active": false}``,
as for a token that does not exist, so an introspection tells a stranger nothing. Then,
for the ``token`` sent, the answer is ``{"active": false}`` and nothing else for anything
that is not a live token this server issued to a SMART client (unknown, expired,
revoked, another kind of token, its client or user disabled), or ``active``, ``scope``,
``client_id``, ``exp``, ``iat``, ``sub``, ``token_type``, the launch context
(``patient``, ``encounter``), and ``iss`` and ``fhirUser`` when an ``id_token`` went
with it. A refresh token (``rt_…``) introspects as its authorization, with its own
expiry.

``POST /oauth2/revoke``: the client authenticates as at the token endpoint; a refresh
token revokes its whole authorization (every access token it issued too), an access
token itself. The answer is 200 for a token that is unknown or already invalid (RFC 7009
2.2); a token issued to another client is refused (``invalid_request``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from fhir_server.smart_scopes import ScopeSet
from platform_api.auth.principal import Principal
from platform_api.auth.refresh import FAMILIES, TOKEN_PREFIX, token_hash
from platform_api.auth.refresh import TOKENS as REFRESH_TOKENS
from platform_api.auth.tokens import parse_rfc3339
from platform_api.envelope import ApiError
from platform_api.policy import Target
from platform_api.smart.oauth import (
    INTROSPECT_PATH,
    REVOKE_PATH,
    SMART_FAMILY,
    TOKEN_PATH,
    OAuthError,
    Urls,
    no_store_json,
    oauth_refusals,
    urls,
)
from platform_api.smart.server import SmartServer, smart_server
from platform_api.smart.token import form_of

router = APIRouter(tags=["SMART authorization server"])
JSON = dict[str, Any]
INACTIVE: JSON = {"active": False}


@dataclass(frozen=True)
class Introspector:
    """Who asks: the SMART client it is (authenticated as the client, or by one of its
    access tokens), and the principal of a bearer token."""

    client_id: str | None
    principal: Principal | None


@router.post(INTROSPECT_PATH, summary="Token introspection (RFC 7662)",
             responses=oauth_refusals(400, 401))
async def introspect(request: Request) -> Response:
    server = smart_server(request)
    try:
        form = await form_of(request)
        caller = await _authenticate_introspector(server, request, form)
    except OAuthError as error:
        return error.response()
    presented = form.get("token", "")
    if not presented:
        return OAuthError("invalid_request", "token is required").response()
    if presented.startswith(TOKEN_PREFIX):
        info = await _refresh_token_info(server, presented, urls(request))
    else:
        info = await _access_token_info(server, presented, urls(request))
    if info["active"] and not await _may_introspect(server, caller, info["client_id"]):
        return no_store_json(INACTIVE)  # RFC 7662 2.1: not this caller's to know
    return no_store_json(info)


async def _authenticate_introspector(server: SmartServer, request: Request,
                                     form: dict[str, str]) -> Introspector:
    authorization = request.headers.get("authorization")
    if authorization is not None and authorization.lower().startswith("bearer "):
        try:
            principal = await server.services.auth.authenticate(authorization[7:].strip())
        except ApiError as error:
            raise OAuthError("invalid_token", error.message, 401,
                             {"WWW-Authenticate": 'Bearer error="invalid_token"'}) from None
        smart = principal.smart
        return Introspector(smart.client_id if smart is not None else None, principal)
    client = await server.clients.authenticate(form, authorization,
                                               urls(request).of(TOKEN_PATH))
    if client["token_endpoint_auth_method"] == "none":
        raise OAuthError("invalid_client", "a public client introspects with its access "
                         "token (Authorization: Bearer)", 401)
    return Introspector(str(client["id"]), None)


async def _may_introspect(server: SmartServer, caller: Introspector, client_id: str) -> bool:
    """The token's own client, or whom the policy lets introspect any token (platform
    administrators signed in as themselves)."""
    if caller.client_id is not None and caller.client_id == client_id:
        return True
    if caller.principal is None or caller.principal.smart is not None:
        return False  # another client, or another client's app
    policy = server.services.policy
    try:  # a refusal is recorded in the audit trail, as every refused action is
        policy.authorize(await policy.access(caller.principal), "smart-token.introspect",
                         Target())
    except ApiError:
        return False
    return True


async def _access_token_info(server: SmartServer, presented: str, where: Urls) -> JSON:
    auth = server.services.auth
    try:
        principal = await auth.authenticate(presented)
        claims = auth.verify_token(presented)
    except ApiError:
        return INACTIVE
    smart = claims.smart
    if smart is None or principal.smart is None:
        return INACTIVE  # a platform session's token: not an OAuth grant of a client
    info: JSON = {"active": True, "scope": smart.scope, "client_id": smart.client_id,
                  "exp": int(claims.expires_at), "sub": claims.sub, "token_type": "Bearer"}
    return {**info, **_context(smart.patient, smart.encounter, smart.fhir_user, smart.scope,
                               where)}


async def _refresh_token_info(server: SmartServer, presented: str, where: Urls) -> JSON:
    try:
        record = await server.services.auth.refresh_tokens.lookup(presented)
    except ApiError:
        return INACTIVE
    family = record.family
    if family.get("kind") != SMART_FAMILY or await server.registry.active(
            family["client_id"]) is None:
        return INACTIVE
    info: JSON = {"active": True, "scope": family["scope"], "client_id": family["client_id"],
                  "exp": int(parse_rfc3339(record.document["expires_at"])),
                  "sub": family["user_id"], "token_type": "refresh_token"}
    return {**info, **_context(family.get("patient"), family.get("encounter"),
                               family.get("fhir_user"), family["scope"], where)}


def _context(patient: str | None, encounter: str | None, fhir_user: str | None, scope: str,
             where: Urls) -> JSON:
    context: JSON = {k: v for k, v in (("patient", patient), ("encounter", encounter))
                     if v is not None}
    if "openid" in ScopeSet.parse(scope):  # an id_token went with it: its iss (and sub)
        context["iss"] = where.issuer
        if fhir_user is not None:
            context["fhirUser"] = f"{where.fhir}/{fhir_user}"
    return context


@router.post(REVOKE_PATH, summary="Token revocation (RFC 7009)",
             responses=oauth_refusals(400, 401))
async def revoke(request: Request) -> Response:
    server = smart_server(request)
    try:
        form = await form_of(request)
        client = await server.clients.authenticate(
            form, request.headers.get("authorization"), urls(request).of(TOKEN_PATH))
        presented = form.get("token", "")
        if not presented:
            raise OAuthError("invalid_request", "token is required")
        if presented.startswith(TOKEN_PREFIX):
            await _revoke_refresh_token(server, client, presented)
        else:
            await _revoke_access_token(server, client, presented)
    except OAuthError as error:
        return error.response()
    return no_store_json({})


async def _revoke_refresh_token(server: SmartServer, client: JSON, presented: str) -> None:
    store = server.services.store
    doc = await store.get_document(REFRESH_TOKENS, token_hash(presented))
    if doc is None:
        return
    tokens = server.services.auth.refresh_tokens
    family = await store.get_document(FAMILIES, doc["family_id"])
    if family is None or family.get("kind") != SMART_FAMILY:
        return  # not a SMART app's: nothing this endpoint revokes
    if family.get("client_id") != client["id"]:
        raise OAuthError("invalid_request", "this token was not issued to this client")
    await tokens.revoke_family(family["id"], "revoked by the client (RFC 7009)")


async def _revoke_access_token(server: SmartServer, client: JSON, presented: str) -> None:
    auth = server.services.auth
    try:
        claims = auth.verify_token(presented)
    except ApiError:
        return  # expired or not ours: nothing left to revoke
    if claims.smart is None:
        return
    if claims.smart.client_id != client["id"]:
        raise OAuthError("invalid_request", "this token was not issued to this client")
    async with server.services.store.unit_of_work() as uow:
        auth.stage_token_revocation(uow, claims)
        await uow.commit()
    auth.token_revoked(claims, presented)

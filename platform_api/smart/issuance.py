"""Token responses: what ``/oauth2/token`` hands out for each grant.

An authorization a user gave an app is a refresh-token *family* of kind ``smart``
(:mod:`platform_api.auth.refresh`): ``{client_id, scope, patient, encounter,
need_patient_banner, fhir_user, access}``. Its access tokens carry the family as their
``sid``, so revoking the family (a reused code, a reused refresh token, RFC 7009
revocation, the user's suspension or password reset) refuses every token it issued.
``access`` is ``offline`` or ``online`` when such a scope was granted: a refresh token
then comes with each answer (a refresh asking for a subset without that scope gets none,
RFC 6749 section 6, and keeps the one it presented), rotated on every use (reuse revokes
the family); offline
ones last ``HEALTHPLATFORM_SMART_OFFLINE_ACCESS_TTL_SECONDS`` from their last use,
online ones end ``HEALTHPLATFORM_SMART_ONLINE_ACCESS_TTL_SECONDS`` after the user
authorized (the length of a working session).

The answer (app-launch.md "Obtain access token"): ``access_token``, ``token_type``
``Bearer``, ``expires_in``, ``scope``, the launch context (``patient``, ``encounter``,
``need_patient_banner``, ``smart_style_url``, ``fhirUser``), an ``id_token`` (RS256,
``iss`` the FHIR base, ``sub`` the user, ``aud`` the client, ``fhirUser`` as an absolute
URL) when ``openid`` was granted, and the ``refresh_token`` when there is one.
Backend services get ``access_token``, ``token_type``, ``expires_in`` (at most 300
seconds by default) and ``scope`` only.
"""

from __future__ import annotations

import time
from typing import Any

from fhir_server.smart_scopes import ScopeSet
from platform_api.auth import users
from platform_api.auth.tokens import SmartClaims, parse_rfc3339
from platform_api.smart.oauth import STYLE_PATH, OAuthError, Urls
from platform_api.smart.server import SmartServer

JSON = dict[str, Any]
OFFLINE, ONLINE = "offline", "online"


def access_kind(scopes: ScopeSet) -> str | None:
    if "offline_access" in scopes:
        return OFFLINE
    return ONLINE if "online_access" in scopes else None


def refresh_ttl(server: SmartServer, family: JSON) -> int:
    """How long the family's next refresh token lasts (module docstring)."""
    settings = server.settings
    if family.get("access") == OFFLINE:
        return settings.smart_offline_access_ttl_seconds
    ends = parse_rfc3339(family["created_at"]) + settings.smart_online_access_ttl_seconds
    return max(0, int(ends - time.time()))


async def user_token_response(server: SmartServer, family: JSON, urls: Urls, *,
                              refresh_token: str | None, nonce: str | None = None,
                              scope: str | None = None) -> JSON:
    """The answer to an authorization code or refresh grant of a user's authorization;
    ``scope``: what the access token gets, when a refresh asked for less than the grant."""
    user = await server.services.store.get_document(users.COLLECTION, family["user_id"])
    if user is None or user["status"] != users.ACTIVE:
        raise OAuthError("invalid_grant", "the user who authorized this app is no longer "
                         "active")
    scope = scope or family["scope"]
    scopes = ScopeSet.parse(scope)
    ttl = server.settings.smart_access_token_ttl_seconds
    fhir_user = family.get("fhir_user") if "fhirUser" in scopes else None
    issued = server.services.auth.issue_smart_token(
        user["id"], SmartClaims(family["client_id"], scope, family.get("patient"),
                                family.get("encounter"), fhir_user),
        ttl_seconds=ttl, user=user, session_id=family["id"])
    body: JSON = {"access_token": issued.token, "token_type": "Bearer",
                  "expires_in": max(0, round(issued.expires_at - time.time())),
                  "scope": scope}
    for field, value in (("patient", family.get("patient")),
                         ("encounter", family.get("encounter")),
                         ("intent", family.get("intent"))):
        if value is not None:
            body[field] = value
    body["need_patient_banner"] = bool(family.get("need_patient_banner", True))
    body["smart_style_url"] = urls.of(STYLE_PATH)
    if fhir_user is not None:
        body["fhirUser"] = f"{urls.fhir}/{fhir_user}"
    if "openid" in scopes:
        body["id_token"] = id_token(server, user, family, urls, ttl, nonce, scopes)
    if refresh_token:
        body["refresh_token"] = refresh_token
    return body


def id_token(server: SmartServer, user: JSON, family: JSON, urls: Urls, ttl: int,
             nonce: str | None, scopes: ScopeSet) -> str:
    now = int(time.time())
    claims: JSON = {"iss": urls.issuer, "sub": user["id"], "aud": family["client_id"],
                    "iat": now, "exp": now + ttl,
                    "auth_time": int(parse_rfc3339(family["created_at"]))}
    if nonce:
        claims["nonce"] = nonce
    if "fhirUser" in scopes and family.get("fhir_user"):
        claims["fhirUser"] = f"{urls.fhir}/{family['fhir_user']}"
    if "profile" in scopes:
        claims.update({"name": f"{user['first_name']} {user['last_name']}",
                       "given_name": user["first_name"], "family_name": user["last_name"]})
    if "email" in scopes:
        claims.update({"email": user["email"],
                       "email_verified": bool(user.get("email_verified"))})
    return server.id_keys.sign(claims)


def backend_token_response(server: SmartServer, client: JSON, scopes: ScopeSet) -> JSON:
    ttl = server.settings.smart_backend_token_ttl_seconds
    issued = server.services.auth.issue_smart_token(
        client["id"], SmartClaims(client["id"], str(scopes), backend=True), ttl_seconds=ttl)
    return {"access_token": issued.token, "token_type": "Bearer",
            "expires_in": max(0, round(issued.expires_at - time.time())),
            "scope": str(scopes)}

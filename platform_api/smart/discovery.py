"""Discovery: what a SMART app or backend client learns before it starts.

- ``GET /.well-known/smart-configuration`` and ``GET /fhir/.well-known/smart-configuration``
  (SMART conformance.md): always ``application/json`` whatever ``Accept`` says, every URL
  absolute; ``capabilities`` lists exactly what this server does (:data:`CAPABILITIES`);
- ``GET /fhir/.well-known/openid-configuration`` (OpenID Connect Discovery 1.0, below the
  issuer, which is the FHIR base) for ``sso-openid-connect``;
- ``GET /oauth2/jwks``: the public keys of the id_tokens (bare JWKs);
- ``GET /oauth2/smart-style.json``: the style the ``smart_style_url`` of every launch
  points at (``context-style``).

The CapabilityStatement (``/fhir/metadata``) carries the same endpoints in the SMART
``oauth-uris`` extension (:func:`capability_security`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from platform_api.smart.client_auth import ASSERTION_ALGORITHMS
from platform_api.smart.clients import AUTH_METHODS, GRANT_TYPES
from platform_api.smart.keys import ID_TOKEN_ALGORITHM
from platform_api.smart.oauth import (
    AUTHORIZE_PATH,
    INTROSPECT_PATH,
    JWKS_PATH,
    MANAGE_PATH,
    REGISTER_PATH,
    REVOKE_PATH,
    STYLE_PATH,
    TOKEN_PATH,
    Urls,
    urls,
)
from platform_api.smart.server import SCOPES_SUPPORTED, smart_server

router = APIRouter(tags=["SMART discovery"])
JSON = dict[str, Any]
SMART_CONFIGURATION = "/.well-known/smart-configuration"
FHIR_SMART_CONFIGURATION = "/fhir/.well-known/smart-configuration"
OPENID_CONFIGURATION = "/fhir/.well-known/openid-configuration"
OAUTH_URIS = "http://fhir-registry.smarthealthit.org/StructureDefinition/oauth-uris"

# Every one of these works, and tests show it (smart-app-launch conformance.md).
CAPABILITIES = (
    "launch-ehr", "launch-standalone", "authorize-post",
    "client-public", "client-confidential-symmetric", "client-confidential-asymmetric",
    "sso-openid-connect", "context-banner", "context-style",
    "context-ehr-patient", "context-ehr-encounter", "context-standalone-patient",
    "permission-offline", "permission-online", "permission-patient", "permission-user",
    "permission-v1", "permission-v2",
)
# Sent however the client asked (SMART: "always application/json").
_JSON_HEADERS = {"Cache-Control": "public, max-age=300"}

# A SMART Style (scopes-and-launch-context.md "SMART App Styling"): the platform's look.
STYLE: JSON = {
    "color_background": "#f6f8f7", "color_error": "#b3261e", "color_highlight": "#0b6e4f",
    "color_modal_backdrop": "rgba(0, 0, 0, 0.4)", "color_success": "#2e7d32",
    "color_text": "#1c1b1f", "dim_border_radius": "6px", "dim_font_size": "15px",
    "dim_spacing_size": "16px",
    "font_family_body": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
    "font_family_heading": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
}


def smart_configuration(where: Urls) -> JSON:
    return {
        "issuer": where.issuer,
        "jwks_uri": where.of(JWKS_PATH),
        "authorization_endpoint": where.of(AUTHORIZE_PATH),
        "token_endpoint": where.of(TOKEN_PATH),
        "token_endpoint_auth_methods_supported": [m for m in AUTH_METHODS if m != "none"],
        "token_endpoint_auth_signing_alg_values_supported": list(ASSERTION_ALGORITHMS),
        "grant_types_supported": list(GRANT_TYPES),
        "registration_endpoint": where.of(REGISTER_PATH),
        "scopes_supported": list(SCOPES_SUPPORTED),
        "response_types_supported": ["code"],
        "management_endpoint": where.of(MANAGE_PATH),
        "introspection_endpoint": where.of(INTROSPECT_PATH),
        "revocation_endpoint": where.of(REVOKE_PATH),
        "code_challenge_methods_supported": ["S256"],
        "capabilities": list(CAPABILITIES),
    }


@router.get(SMART_CONFIGURATION, summary="SMART configuration (discovery)")
async def well_known(request: Request) -> JSONResponse:
    return JSONResponse(smart_configuration(urls(request)), headers=_JSON_HEADERS)


@router.get(FHIR_SMART_CONFIGURATION, summary="SMART configuration below the FHIR base")
async def fhir_well_known(request: Request) -> JSONResponse:
    return JSONResponse(smart_configuration(urls(request)), headers=_JSON_HEADERS)


@router.get(OPENID_CONFIGURATION, summary="OpenID Connect discovery (the issuer is the "
            "FHIR base)")
async def openid_configuration(request: Request) -> JSONResponse:
    where = urls(request)
    smart = smart_configuration(where)
    return JSONResponse({
        "issuer": where.issuer,
        "authorization_endpoint": smart["authorization_endpoint"],
        "token_endpoint": smart["token_endpoint"],
        "jwks_uri": smart["jwks_uri"],
        "registration_endpoint": smart["registration_endpoint"],
        "introspection_endpoint": smart["introspection_endpoint"],
        "revocation_endpoint": smart["revocation_endpoint"],
        "scopes_supported": smart["scopes_supported"],
        "response_types_supported": ["code"],
        "grant_types_supported": smart["grant_types_supported"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": [ID_TOKEN_ALGORITHM],
        "token_endpoint_auth_methods_supported":
            smart["token_endpoint_auth_methods_supported"],
        "token_endpoint_auth_signing_alg_values_supported":
            smart["token_endpoint_auth_signing_alg_values_supported"],
        "code_challenge_methods_supported": ["S256"],
        "claims_supported": ["iss", "sub", "aud", "exp", "iat", "auth_time", "nonce",
                             "fhirUser", "name", "given_name", "family_name", "email",
                             "email_verified"],
    }, headers=_JSON_HEADERS)


@router.get(JWKS_PATH, summary="Public keys of the id_tokens (JWK Set)")
async def jwks(request: Request) -> JSONResponse:
    return JSONResponse(smart_server(request).id_keys.jwks(), headers=_JSON_HEADERS)


@router.get(STYLE_PATH, summary="SMART style of the launches (smart_style_url)")
async def style() -> JSONResponse:
    return JSONResponse(STYLE, headers=_JSON_HEADERS)


def capability_security(fhir_base: str) -> JSON:
    """``CapabilityStatement.rest.security`` for the FHIR base ``fhir_base``: the SMART
    ``oauth-uris`` extension (authorize, token, register, manage, introspect, revoke)
    and the ``SMART-on-FHIR`` service code."""
    where = Urls(fhir_base.removesuffix("/fhir"))
    uris = [("authorize", AUTHORIZE_PATH), ("token", TOKEN_PATH), ("register", REGISTER_PATH),
            ("manage", MANAGE_PATH), ("introspect", INTROSPECT_PATH), ("revoke", REVOKE_PATH)]
    return {
        "cors": True,
        "extension": [{"url": OAUTH_URIS, "extension": [
            {"url": name, "valueUri": where.of(path)} for name, path in uris]}],
        "service": [{"coding": [{
            "system": "http://terminology.hl7.org/CodeSystem/restful-security-service",
            "code": "SMART-on-FHIR", "display": "SMART-on-FHIR"}],
            "text": "OAuth2 using SMART-on-FHIR profile (see http://docs.smarthealthit.org)"}],
        "description": "SMART App Launch 2.x (authorization code with PKCE S256, backend "
                       "services with private_key_jwt); platform access tokens (PASETO "
                       "v4.public from /api/auth/login) are accepted too.",
    }

"""SMART App Launch 2.x authorization server (IG 2.2, hl7.org/fhir/smart-app-launch).

The FHIR API at /fhir is its resource server: a SMART access token is a PASETO token of
the platform carrying the grant (:mod:`platform_api.auth.tokens`), and the access policy
narrows the user's (or backend client's) grants by its scopes
(:mod:`platform_api.policy.smart`, :mod:`fhir_server.smart_scopes`).

One module per concern:

- :mod:`~platform_api.smart.discovery`: ``/.well-known/smart-configuration`` (and below
  /fhir), OpenID Connect discovery, the id_token JWKS, the SMART style;
- :mod:`~platform_api.smart.registration`: RFC 7591 registration at ``/oauth2/register``
  and ``/api/smart/clients`` for administrators; :mod:`~platform_api.smart.clients` the
  client documents and metadata rules;
- :mod:`~platform_api.smart.launch`: ``POST /api/smart/launch`` (EHR launch);
- :mod:`~platform_api.smart.authorize`: ``/oauth2/authorize`` and its HTML pages
  (:mod:`~platform_api.smart.pages`): sign-in, MFA, patient picker, consent;
- :mod:`~platform_api.smart.token`: ``/oauth2/token`` (authorization code with PKCE,
  refresh, client credentials), answers built by :mod:`~platform_api.smart.issuance`,
  clients authenticated by :mod:`~platform_api.smart.client_auth`;
- :mod:`~platform_api.smart.introspection`: RFC 7662 introspection, RFC 7009 revocation;
- :mod:`~platform_api.smart.manage`: the user's page of authorized apps;
- :mod:`~platform_api.smart.server`: the service (registry, keys, scope negotiation).
"""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.smart import (
    authorize,
    discovery,
    introspection,
    launch,
    manage,
    registration,
    token,
)
from platform_api.smart.discovery import capability_security
from platform_api.smart.server import EXTRAS_KEY, SmartServer

router = APIRouter()
for _module_router in (discovery.router, registration.router, registration.admin_router,
                       launch.router, authorize.router, token.router, introspection.router,
                       manage.router):
    router.include_router(_module_router)

__all__ = ["EXTRAS_KEY", "SmartServer", "capability_security", "router"]

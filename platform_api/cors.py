"""CORS: which browser apps on other origins may call which paths.

- Discovery (``/.well-known/*``, ``/fhir/.well-known/*``, ``/fhir/metadata``,
  ``/cds-services``, the SMART server's ``/oauth2/jwks`` and style): any origin, reading
  only (GET): what a SMART app or an EHR reads before it has any credentials, and the
  same for everyone.
- ``/api``, ``/fhir``, ``/admin`` and the SMART token endpoints (``/oauth2/token``,
  ``/revoke``, ``/introspect``): the origins of ``HEALTHPLATFORM_CORS_ORIGINS`` (the web
  front ends and browser SMART apps of this deployment, e.g.
  ``https://app.clinic.example.org``), every
  method these routes take, the headers a FHIR client and the /api send
  (``Authorization``, ``Content-Type``, ``If-Match``, ``Prefer``...), credentials allowed
  (the device cookie of a sign-in), and the headers a client must read exposed
  (``Location``, ``ETag``, ``X-Request-ID``, ``RateLimit-*``, ``Retry-After``). No origin
  configured: a preflight is refused (400), a simple request gets no CORS headers.
- Elsewhere (``/docs``, ``/healthz``): no CORS.

Preflights (``OPTIONS`` with ``Access-Control-Request-Method``) are answered here, before
the access table: they carry no credentials. The work is Starlette's ``CORSMiddleware``,
one per policy; this module only chooses the policy by path.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

DISCOVERY_PREFIXES = ("/.well-known/", "/fhir/.well-known/")
DISCOVERY_PATHS = frozenset({"/fhir/metadata", "/cds-services", "/oauth2/jwks",
                             "/oauth2/smart-style.json"})
# The SMART token, revocation and introspection endpoints a browser app calls
# (platform_api.smart); its /authorize pages are navigations, which need no CORS.
CONFIGURED_PREFIXES = ("/api/", "/fhir", "/admin/", "/oauth2/token", "/oauth2/revoke",
                       "/oauth2/introspect")
REQUEST_HEADERS = ("Authorization", "Content-Type", "Accept", "X-API-Key", "X-Request-ID",
                   "If-Match", "If-None-Match", "If-None-Exist", "If-Modified-Since",
                   "Prefer")
EXPOSED_HEADERS = ("Location", "Content-Location", "ETag", "Last-Modified", "X-Request-ID",
                   "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset",
                   "Retry-After")
MAX_AGE = 600  # seconds a browser keeps a preflight's answer


def is_discovery(path: str) -> bool:
    return path in DISCOVERY_PATHS or path.startswith(DISCOVERY_PREFIXES)


class CorsMiddleware:
    """Pass each request to the CORS policy of its path (module docstring)."""

    def __init__(self, app: ASGIApp, *, origins: Sequence[str]):
        for origin in origins:
            if origin == "*" or not origin.startswith(("https://", "http://")) or \
                    origin.endswith("/"):
                raise ValueError(f"CORS origin {origin!r} must be a scheme and host such "
                                 "as https://app.example.org (no '*', no trailing slash)")
        self.app = app
        self.discovery = CORSMiddleware(app, allow_origins=["*"], allow_methods=["GET", "HEAD"],
                                        allow_headers=["Authorization", "Accept"],
                                        expose_headers=EXPOSED_HEADERS, max_age=MAX_AGE)
        self.configured = CORSMiddleware(
            app, allow_origins=list(origins), allow_credentials=True,
            allow_methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"],
            allow_headers=REQUEST_HEADERS, expose_headers=EXPOSED_HEADERS, max_age=MAX_AGE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Only a browser's cross-origin request carries Origin: everything else (FHIR
        # clients, HL7 feeds, load balancers) goes straight on (Starlette's middleware
        # cost ~15 µs a request even to find that out).
        if scope["type"] == "http" and any(name == b"origin" for name, _ in scope["headers"]):
            path = scope["path"]
            if is_discovery(path):
                await self.discovery(scope, receive, send)
                return
            if path.startswith(CONFIGURED_PREFIXES):
                await self.configured(scope, receive, send)
                return
        await self.app(scope, receive, send)

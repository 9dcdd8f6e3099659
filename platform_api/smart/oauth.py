"""What every SMART endpoint shares: the server's URLs, OAuth 2.0 error answers, and the
documents the authorization server keeps.

OAuth endpoints answer as RFC 6749 says, not with the /api envelope: JSON
``{"error", "error_description"}`` with the status of section 5.2 (and RFC 7591 section
3.2.2 for registration), ``Cache-Control: no-store`` and ``Pragma: no-cache`` on
everything that carries a token or a secret.

URLs are absolute (SMART conformance: discovery SHALL give absolute URLs): built from
``HEALTHPLATFORM_BASE_URL`` when it is set, else from the request (its scheme and
``Host``), as the FHIR API builds its own links.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse

from platform_api.services import Services

NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}

# Bookkeeping documents (not health data).
CLIENTS = "smart_clients"
LAUNCHES = "smart_launches"
LAUNCH_USES = "smart_launch_uses"
AUTH_REQUESTS = "smart_auth_requests"
CODES = "smart_codes"
CODE_USES = "smart_code_uses"
ASSERTIONS = "smart_assertion_jtis"
MANAGE_SESSIONS = "smart_manage_sessions"
SMART_FAMILY = "smart"  # refresh_families.kind of a SMART authorization

# Paths of the authorization server (the spec lists only discovery and the launch).
AUTHORIZE_PATH = "/oauth2/authorize"
TOKEN_PATH = "/oauth2/token"
INTROSPECT_PATH = "/oauth2/introspect"
REVOKE_PATH = "/oauth2/revoke"
REGISTER_PATH = "/oauth2/register"
JWKS_PATH = "/oauth2/jwks"
MANAGE_PATH = "/oauth2/manage"
STYLE_PATH = "/oauth2/smart-style.json"


class OAuthErrorBody(BaseModel):
    """What an OAuth 2.0 endpoint answers when it refuses (RFC 6749 5.2, RFC 7591 3.2.2)."""

    error: str = Field(examples=["invalid_redirect_uri"])
    error_description: str | None = None


def oauth_refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI answers of an OAuth endpoint's refusals."""
    said = {400: "invalid_request, invalid_grant, unsupported_grant_type, invalid_scope",
            401: "invalid_client (client authentication failed)"}
    return {status: {"model": OAuthErrorBody, "description": said.get(status, "Refused")}
            for status in statuses}


class OAuthError(Exception):
    """An OAuth 2.0 error answer (RFC 6749 5.2, RFC 7009, RFC 7591 3.2.2)."""

    def __init__(self, error: str, description: str, status: int = 400,
                 headers: dict[str, str] | None = None):
        super().__init__(description)
        self.error, self.description, self.status = error, description, status
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.error, "error_description": self.description},
                            status_code=self.status, headers={**NO_STORE, **self.headers})


def invalid_client(description: str) -> OAuthError:
    return OAuthError("invalid_client", description, 401,
                      {"WWW-Authenticate": 'Basic realm="token"'})


def no_store_json(body: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=dict(NO_STORE))


@dataclass(frozen=True, slots=True)
class Urls:
    """The absolute URLs of this server, for one request."""

    base: str  # e.g. https://ehr.example.org

    @property
    def fhir(self) -> str:
        return f"{self.base}/fhir"

    @property
    def issuer(self) -> str:
        """OpenID Connect issuer: the FHIR base (its discovery is below it)."""
        return self.fhir

    def of(self, path: str) -> str:
        return f"{self.base}{path}"


def urls(request: Request) -> Urls:
    """The server's public URLs: ``HEALTHPLATFORM_BASE_URL``, or when unset the bind
    address; never the request's ``Host`` (anyone can send one: a discovery document
    cached with another host's URLs, or an assertion whose ``aud`` names that host,
    would follow it)."""
    services: Services = request.app.state.services
    return Urls(services.settings.public_base_url)

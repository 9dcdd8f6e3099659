"""FastAPI dependencies that turn ``Authorization: Bearer <token>`` (or ``X-API-Key``)
into a Principal.

``current_principal`` (401 without a valid token), ``optional_principal`` (``None``
without a header, 401 with a bad one: a broken credential is never silently ignored),
``require_roles(*roles)``, ``require_platform_admin`` and ``require_super_admin``
(403 ``FORBIDDEN``; ``SUPER:ADMIN`` passes every role check).

``authenticate_request`` does the same outside dependency injection (the FHIR router
calls it). The principal is kept on ``request.state.principal``, so a request is
authenticated once however many dependencies ask; in the app the access middleware
(:mod:`platform_api.access`) has usually put it there already.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from platform_api.audit import ClientInfo
from platform_api.auth.errors import missing_token
from platform_api.auth.principal import Principal
from platform_api.auth.service import AuthService
from platform_api.envelope import ApiError, forbidden

# Declared so /docs shows the lock and the "Authorize" button; parsing is done below,
# because the scheme's own errors would not use the envelope.
bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="PASETO",
    description="PASETO v4.public access token from /api/auth/login",
)


api_key_scheme = APIKeyHeader(
    name="X-API-Key",
    auto_error=False,
    scheme_name="APIKey",
    description="Developer API key (hpk_<id>.<secret>) from /api/developer/keys",
)


def auth_service(request: Request) -> AuthService:
    return request.app.state.services.auth  # type: ignore[no-any-return]


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, ``None`` if there is no header."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise missing_token("Authorization header must be 'Bearer <token>'")
    return token


def client_info(request: Request) -> ClientInfo:
    """The caller's address and user agent, for the audit trail."""
    client = request.client
    return ClientInfo(client.host if client else None, request.headers.get("user-agent"))


async def authenticate_request(request: Request) -> Principal:
    """The caller of this request; raises ApiError 401 (403 for a suspended account).

    On a route the access middleware authorized, the principal is already there. Left
    to authenticate here (a public route asking who calls, a route missing from the
    access table, an app without the middleware), an API key is accepted only on a
    public route: a key's reach is what the access table grants, nothing more."""
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is not None:
        return principal
    headers = request.headers
    principal = await auth_service(request).authenticate_credentials(
        headers.get("authorization"), headers.get("x-api-key"), client_info(request)
    )
    if principal.kind == "api_key":
        rule = getattr(request.state, "access_rule", None)
        if rule is None or rule.access != "public":
            raise ApiError(403, "INSUFFICIENT_SCOPE",
                           "API keys reach only the routes of the access table")
    if principal.kind == "smart" and not request.url.path.startswith("/fhir/"):
        raise ApiError(403, "INSUFFICIENT_SCOPE", "SMART access tokens reach only /fhir")
    request.state.principal = principal
    return principal


async def current_principal(
    request: Request,
    _credentials: HTTPAuthorizationCredentials | None = Depends(bearer_scheme),
    _api_key: str | None = Depends(api_key_scheme),
) -> Principal:
    return await authenticate_request(request)


async def optional_principal(
    request: Request,
    _credentials: HTTPAuthorizationCredentials | None = Depends(bearer_scheme),
    _api_key: str | None = Depends(api_key_scheme),
) -> Principal | None:
    if "authorization" not in request.headers and "x-api-key" not in request.headers:
        return None
    return await authenticate_request(request)


def require_roles(*roles: str) -> Callable[..., Awaitable[Principal]]:
    """A dependency admitting callers with any of ``roles`` (or SUPER:ADMIN)."""
    if not roles or not all(isinstance(r, str) and r for r in roles):
        raise ValueError("require_roles needs at least one non-empty role name")
    wanted = frozenset(roles)

    async def has_role(principal: Principal = Depends(current_principal)) -> Principal:
        if principal.is_super_admin or principal.roles & wanted:
            return principal
        raise forbidden(f"This needs one of the roles: {', '.join(sorted(wanted))}")

    return has_role


async def require_platform_admin(principal: Principal = Depends(current_principal)) -> Principal:
    """SUPER:ADMIN or APP:ADMIN (spec: the master patient index and platform tools)."""
    if not principal.is_platform_admin:
        raise forbidden("This needs a platform administrator (SUPER:ADMIN or APP:ADMIN)")
    return principal


async def require_super_admin(principal: Principal = Depends(current_principal)) -> Principal:
    """SUPER:ADMIN only (spec: user administration and system health)."""
    if not principal.is_super_admin:
        raise forbidden("This needs a super administrator (SUPER:ADMIN)")
    return principal


async def require_user_session(principal: Principal = Depends(current_principal)) -> Principal:
    """A person's token, not an API key (managing keys, MFA, the account itself)."""
    if principal.kind != "user":
        raise forbidden("This needs a user's access token; API keys cannot do it")
    return principal

"""Client registration (OAuth 2.0 Dynamic Client Registration, RFC 7591) and the
administrators' view of the registered clients.

``POST /oauth2/register`` takes the client metadata (:mod:`platform_api.smart.clients`)
and answers 201 with it, the ``client_id`` and, for a symmetric client, the
``client_secret`` (shown this once). Who may register:

- a platform administrator (their access token): any client, including a backend
  services client for any organization (``organization_id``) or for the whole platform
  (``platform_wide``);
- an API key with the scope ``smart:register`` (a developer's key): apps that users
  authorize, and backend services clients for an organization whose ``ORG:ADMIN`` the
  key's owner is; never a platform-wide client.

Who may is the access policy's (``smart-client.register``,
``smart-client.register-platform-wide``, ``smart-client.act-for-organization``); an API
key's scope is checked here, as the route table checks a route's. Refusals are RFC 7591
errors (``invalid_client_metadata``, ``invalid_redirect_uri``) or 403
``insufficient_scope``.

``/api/smart/clients`` (platform administrators, the /api envelope): list, read, update
(the same metadata rules; ``status`` ``disabled`` stops the client at once: its tokens
are refused, it gets no new ones) and the secret never shows again.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse, Response

from platform_api.auth.dependencies import current_principal, require_platform_admin
from platform_api.auth.errors import validation_error
from platform_api.auth.principal import Principal
from platform_api.envelope import (
    ApiError,
    Envelope,
    ErrorEnvelope,
    PageEnvelope,
    Pagination,
    not_found,
    ok,
    pagination,
)
from platform_api.facade import ApiContext, api_context
from platform_api.smart.clients import (
    ACTIVE,
    DISABLED,
    METADATA_FIELDS,
    checked_metadata,
    metadata_error,
    public_metadata,
)
from platform_api.smart.oauth import NO_STORE, REGISTER_PATH, OAuthError, OAuthErrorBody
from platform_api.smart.server import SmartServer, smart_server

router = APIRouter(tags=["SMART"])
JSON = dict[str, Any]
REGISTER_SCOPE = "smart:register"


class ClientMetadata(BaseModel):
    """RFC 7591 client metadata (and this server's two extensions for backend clients)."""

    model_config = ConfigDict(extra="forbid")
    client_name: str | None = Field(default=None, examples=["Amani Growth Charts"])
    redirect_uris: list[str] | None = Field(default=None,
                                            examples=[["https://amani.example.org/cb"]])
    launch_uri: str | None = Field(default=None, examples=["https://amani.example.org/launch"])
    token_endpoint_auth_method: str | None = Field(
        default=None, description="none | client_secret_basic | client_secret_post | "
        "private_key_jwt (default client_secret_basic)")
    grant_types: list[str] | None = Field(
        default=None, description="authorization_code, refresh_token, client_credentials")
    response_types: list[str] | None = None
    scope: str | None = Field(default=None, examples=[
        "launch launch/patient openid fhirUser offline_access patient/*.rs"])
    jwks: dict[str, Any] | None = None
    jwks_uri: str | None = None
    organization_id: str | None = Field(
        default=None, description="Backend services: the organization the client acts for")
    platform_wide: bool | None = Field(
        default=None, description="Backend services: the whole platform (administrators "
        "only)")


class ClientUpdate(ClientMetadata):
    status: str | None = Field(default=None, description="active | disabled")
    reviewed: bool | None = Field(default=None, description="An administrator reviewed the "
                                  "app: its authorize errors are redirected to it")


class ClientView(BaseModel):
    client_id: str
    client_name: str
    redirect_uris: list[str] = []
    launch_uri: str | None = None
    token_endpoint_auth_method: str
    grant_types: list[str]
    response_types: list[str] = []
    scope: str
    jwks: dict[str, Any] | None = None
    jwks_uri: str | None = None
    organization_id: str | None = None
    platform_wide: bool = False
    status: str
    registered_by: str
    reviewed: bool = False
    client_id_issued_at: int
    client_secret_expires_at: int | None = None
    created_at: str
    updated_at: str


class RegisteredClient(ClientView):
    client_secret: str | None = Field(default=None, description="Shown once: store it now")


def _authorize(ctx: ApiContext, action: str, organization: str | None = None) -> None:
    """The policy's rule for ``action``; its refusal (recorded) as RFC 7591 says."""
    try:
        ctx.authorize(action, organization)
    except ApiError as refused:
        raise OAuthError("insufficient_scope", refused.message, 403) from None


async def _check_registrant(ctx: ApiContext, metadata: JSON) -> None:
    """403 unless the caller may register this client (module docstring)."""
    principal = ctx.principal
    if principal.kind == "api_key":
        if REGISTER_SCOPE not in principal.scopes and "*:*" not in principal.scopes:
            raise OAuthError("insufficient_scope", f"the API key needs {REGISTER_SCOPE}", 403)
    else:
        _authorize(ctx, "smart-client.register")
    if metadata["platform_wide"]:
        _authorize(ctx, "smart-client.register-platform-wide")
    organization = metadata["organization_id"]
    if organization is None:
        return
    # Organizations are the directory every signed-in caller reads.
    if await ctx.fhir.find_json("Organization", organization) is None:
        raise metadata_error(f"organization_id: no Organization/{organization}")
    _authorize(ctx, "smart-client.act-for-organization", organization)


async def _within_budget(server: SmartServer, principal: Principal) -> None:
    """An account (with all its API keys) registers at most
    ``HEALTHPLATFORM_SMART_MAX_CLIENTS_PER_ACCOUNT`` clients: each is stored for good."""
    limit = server.settings.smart_max_clients_per_account
    if principal.kind == "api_key" and \
            await server.registry.registered_by(principal.user_id) >= limit:
        raise OAuthError("invalid_client_metadata", f"this account registered {limit} "
                         "clients already, the most it may (ask an administrator)", 400)


@router.post(REGISTER_PATH, status_code=201, response_model=RegisteredClient,
             responses={400: {"description": "Invalid client metadata (RFC 7591 3.2.2), "
                              "or a body that is not JSON (the /api envelope)",
                              "content": {"application/json": {"schema": {"anyOf": [
                                  OAuthErrorBody.model_json_schema(),
                                  {"$ref": "#/components/schemas/ErrorEnvelope"}]}}}}},
             summary="Register a SMART client (RFC 7591 dynamic client registration)")
async def register(body: ClientMetadata, request: Request,
                   principal: Principal = Depends(current_principal)) -> Response:
    server = smart_server(request)
    try:
        metadata = checked_metadata(body.model_dump(exclude_none=True))
        await _check_registrant(await api_context(request, principal), metadata)
        await _within_budget(server, principal)
    except OAuthError as error:
        return error.response()
    # a platform administrator's registration is reviewed; a developer key's is not
    registered = await server.registry.register(metadata, principal.user_id,
                                                reviewed=principal.kind != "api_key")
    view = public_metadata(registered.document)
    if registered.secret is not None:
        view["client_secret"] = registered.secret
    return JSONResponse(view, status_code=201, headers=dict(NO_STORE))


# -- administration ------------------------------------------------------------------------
admin_router = APIRouter(prefix="/api/smart/clients", tags=["SMART"])
_ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorEnvelope}
                                           for s in (401, 403, 404, 422)}


@admin_router.get("", response_model=PageEnvelope[ClientView], responses=_ERRORS,
                  summary="List the registered SMART clients")
async def list_clients(request: Request, page: Pagination = Depends(pagination),
                       _admin: Principal = Depends(require_platform_admin)) -> Any:
    found, total = await smart_server(request).registry.list(page.offset, page.limit)
    return page.respond([public_metadata(doc) for doc in found], total)


async def _client(server: SmartServer, client_id: str) -> JSON:
    found = await server.registry.get(client_id)
    if found is None:
        raise not_found("SMART client")
    return found


@admin_router.get("/{client_id}", response_model=Envelope[ClientView], responses=_ERRORS,
                  summary="Read a registered SMART client")
async def get_client(client_id: str, request: Request,
                     _admin: Principal = Depends(require_platform_admin)) -> Any:
    return ok(public_metadata(await _client(smart_server(request), client_id)))


@admin_router.patch("/{client_id}", response_model=Envelope[ClientView], responses=_ERRORS,
                    summary="Update or disable a SMART client")
async def update_client(client_id: str, body: ClientUpdate, request: Request,
                        admin: Principal = Depends(require_platform_admin)) -> Any:
    server = smart_server(request)
    current = await _client(server, client_id)
    changes = body.model_dump(exclude_unset=True)
    status = changes.pop("status", None)
    reviewed = changes.pop("reviewed", None)
    if status not in (None, ACTIVE, DISABLED):
        raise validation_error("status", "status is active or disabled")
    if changes.get("token_endpoint_auth_method", current["token_endpoint_auth_method"]) != \
            current["token_endpoint_auth_method"]:
        raise validation_error("token_endpoint_auth_method", "a client keeps the way it "
                               "authenticates; register a new client instead")
    merged = {k: current.get(k) for k in METADATA_FIELDS} | changes
    try:
        metadata = checked_metadata({k: v for k, v in merged.items() if v is not None})
        await _check_registrant(await api_context(request, admin), metadata)
    except OAuthError as error:
        named = re.match(r"[a-z_]+", error.description)
        field = named.group(0) if named and named.group(0) in METADATA_FIELDS else "body"
        raise validation_error(field, error.description) from None
    saved = await server.registry.save({
        **current, **metadata, "status": status or current["status"],
        "reviewed": current.get("reviewed", False) if reviewed is None else reviewed})
    return ok(public_metadata(saved))

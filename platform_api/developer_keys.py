"""Developer API keys area (spec: Organizations, ``/api/developer/keys``).

A signed-in user manages their own keys: create (the secret is in the answer once and
never again), list (never a secret), rotate (a new secret; the old one keeps working
for 24 hours) and revoke (at once). Keys are presented as ``X-API-Key: hpk_<id>.<secret>``
and reach only the routes their scopes name (:mod:`platform_api.access`); there a key
acts for the account that made it (its memberships, not its administrator roles), and it
stops working while that account is suspended. An API key cannot manage keys.

Scopes are ``<resource>:<action>`` with action ``read``, ``write`` or ``*``, and
resource an /api resource (``patients``, ``vitals``, ``appointments``: the first path
segment after /api), a FHIR resource type for /fhir (``Patient``, ``Observation``) or
``*``. Every change is audited as a FHIR AuditEvent.

Storage and key format: :mod:`platform_api.auth.api_keys`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field, StringConstraints

from platform_api.access import SCOPE_ACTIONS, SPECIAL_SCOPES, scope_resources
from platform_api.audit import AuditRecord
from platform_api.auth.api_keys import key_view
from platform_api.auth.dependencies import auth_service, client_info, require_user_session
from platform_api.auth.errors import validation_error
from platform_api.auth.principal import Principal
from platform_api.envelope import (
    Envelope,
    ErrorEnvelope,
    PageEnvelope,
    Pagination,
    created,
    ok,
    pagination,
)

router = APIRouter(prefix="/api/developer/keys", tags=["developer keys"])
NO_STORE = {"Cache-Control": "no-store"}
_SCOPE = re.compile(r"^([A-Za-z*][A-Za-z0-9_.-]*):([a-z*]+)$")
MAX_SCOPES = 50


class KeyCreate(BaseModel):
    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1,
                                           max_length=100)] = Field(
        examples=["Lab results sync"])
    scopes: list[Annotated[str, Field(max_length=100)]] = Field(
        min_length=1, max_length=MAX_SCOPES, examples=[["Observation:read", "patients:read"]])


class KeyView(BaseModel):
    id: str
    name: str
    scopes: list[str]
    prefix: str = Field(description="hpk_<id>: how the key starts, to recognise it")
    status: str
    created_at: str
    rotated_at: str | None = None
    previous_secret_valid_until: str | None = None
    revoked_at: str | None = None
    last_used_at: str | None = None


class IssuedKeyView(KeyView):
    key: str = Field(description="The whole key. Shown once: store it now")


def check_scopes(scopes: list[str]) -> list[str]:
    """422 naming the first scope that is not ``<known resource>:<read|write|*>``."""
    known = scope_resources()
    for index, scope in enumerate(scopes):
        if scope in SPECIAL_SCOPES:
            continue
        match = _SCOPE.match(scope)
        if match is None or match.group(2) not in SCOPE_ACTIONS:
            raise validation_error(f"scopes.{index}", f"{scope!r} is not <resource>:<action> "
                                   f"with action one of {', '.join(SCOPE_ACTIONS)}")
        if match.group(1) not in known:
            raise validation_error(f"scopes.{index}", f"unknown resource {match.group(1)!r} "
                                   "in scope (an /api resource such as patients, a FHIR "
                                   "resource type such as Patient, or *)")
    return scopes


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorEnvelope} for status in statuses}


def _record(event: str, principal: Principal, doc: dict[str, Any], request: Request
            ) -> AuditRecord:
    return AuditRecord(event, user_id=principal.user_id, user_email=principal.email,
                       client=client_info(request),
                       details={"api_key": doc["id"], "name": doc["name"],
                                "scopes": " ".join(doc["scopes"])})


@router.post("", status_code=201, response_model=Envelope[IssuedKeyView],
             responses=_errors(401, 403, 409, 422), summary="Create an API key (secret shown once)")
async def create_key(body: KeyCreate, request: Request,
                     principal: Principal = Depends(require_user_session)) -> Any:
    auth = auth_service(request)
    scopes = check_scopes(body.scopes)

    def audit(uow: Any, doc: dict[str, Any]) -> None:
        auth.audit.stage(uow, _record("api-key-created", principal, doc, request))

    issued = await auth.api_keys.create(principal.user_id, body.name, scopes, audit)
    return created({**key_view(issued.document), "key": issued.key}, headers=NO_STORE)


@router.get("", response_model=PageEnvelope[KeyView], responses=_errors(401, 403),
            summary="List your API keys (never their secrets)")
async def list_keys(request: Request, page: Pagination = Depends(pagination),
                    include_revoked: bool = Query(False, description="Also revoked keys"),
                    principal: Principal = Depends(require_user_session)) -> Any:
    views, total = await auth_service(request).api_keys.list(
        principal.user_id, page, include_revoked=include_revoked)
    return page.respond(views, total)


@router.post("/{key_id}/rotate", response_model=Envelope[IssuedKeyView],
             responses=_errors(401, 403, 404, 409),
             summary="New secret (shown once); the old one works for 24 more hours")
async def rotate_key(key_id: str, request: Request,
                     principal: Principal = Depends(require_user_session)) -> Any:
    auth = auth_service(request)
    doc = await auth.api_keys.owned(principal.user_id, key_id)
    async with auth.store.unit_of_work() as uow:
        issued = await auth.api_keys.rotate(doc, uow)
        auth.audit.stage(uow, _record("api-key-rotated", principal, doc, request))
        await uow.commit()
    return ok({**key_view(issued.document), "key": issued.key}, headers=NO_STORE)


@router.delete("/{key_id}", response_model=Envelope[KeyView],
               responses=_errors(401, 403, 404),
               summary="Revoke an API key: it stops working at once")
async def revoke_key(key_id: str, request: Request,
                     principal: Principal = Depends(require_user_session)) -> Any:
    auth = auth_service(request)
    doc = await auth.api_keys.owned(principal.user_id, key_id)
    async with auth.store.unit_of_work() as uow:
        revoked = auth.api_keys.revoke(doc, uow)
        if revoked is not doc:
            auth.audit.stage(uow, _record("api-key-revoked", principal, doc, request))
        await uow.commit()
    return ok(key_view(revoked))

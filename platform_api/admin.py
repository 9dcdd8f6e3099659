"""Administration (spec: Auth area, Super Admin only): users, their status, health.

- ``GET /api/admin/users``: paginated accounts, newest first, filtered by ``status``,
  ``role`` (exact, e.g. ``ORG:DOCTOR``) and ``email`` (case-insensitive part of the
  address); each with MFA state and last login.
- ``PATCH /api/admin/users/:id/status``: ``active`` or ``suspended`` (with an optional
  reason). Suspension revokes the account's sessions and refuses its tokens and API
  keys from the next request (at once in this process, within the auth recheck
  interval in others). An administrator cannot suspend themself. Audited.
- ``GET /api/admin/health``: store, event bus, SMTP, disk, rate limiter, version,
  uptime; ``status`` is ``ok`` or ``degraded`` naming what failed.

Filtering by role or part of an address reads the accounts in batches (the document
store matches whole values only); status alone is one indexed query.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from platform_api.auth import users
from platform_api.auth.dependencies import auth_service, client_info, require_super_admin
from platform_api.auth.mfa import ACTIVE as MFA_ACTIVE
from platform_api.auth.mfa import FACTORS as MFA_FACTORS
from platform_api.auth.principal import Principal
from platform_api.auth.service import LOGINS
from platform_api.envelope import (
    Envelope,
    ErrorEnvelope,
    PageEnvelope,
    Pagination,
    conflict,
    ok,
    pagination,
)
from platform_api.events import DEAD_LETTERS
from platform_api.services import Services, request_services

router = APIRouter(prefix="/api/admin", tags=["admin"])
JSON = dict[str, Any]
SCAN_BATCH = 500
DISK_LOW_FRACTION = 0.05
HEALTH_CHECK_TIMEOUT = 3.0


class AdminUserView(BaseModel):
    id: str
    email: str
    first_name: str
    last_name: str
    registration_role: str
    roles: list[str]
    status: str
    created_at: str
    referral_code: str | None = None
    email_verified: bool = False
    mfa_enabled: bool = False
    last_login_at: str | None = None
    last_login_ip: str | None = None


class StatusChange(BaseModel):
    status: Literal["active", "suspended"]
    reason: str | None = Field(default=None, max_length=500,
                               examples=["Left the clinic on 2026-03-01"])


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorEnvelope} for status in statuses}


async def admin_view(services: Services, user: JSON) -> JSON:
    factor = await services.store.get_document(MFA_FACTORS, user["id"])
    login = await services.store.get_document(LOGINS, user["id"]) or {}
    return {
        **users.account_view(user),
        "mfa_enabled": factor is not None and factor.get("status") == MFA_ACTIVE,
        "last_login_at": login.get("last_login_at"),
        "last_login_ip": login.get("last_login_ip"),
    }


def _matcher(role: str | None, email: str | None) -> Callable[[JSON], bool]:
    needle = email.strip().lower() if email else None

    def matches(user: JSON) -> bool:
        if role is not None and role not in user.get("roles", []):
            return False
        return needle is None or needle in user["email"]

    return matches


async def find_users(services: Services, page: Pagination, status: str | None,
                     role: str | None, email: str | None) -> tuple[list[JSON], int]:
    where = {"status": status} if status else {}
    store = services.store
    if role is None and not email:
        found = await store.find_documents(users.COLLECTION, where, limit=page.limit,
                                           offset=page.offset, order_by="created_at",
                                           descending=True)
        return found, await store.count_documents(users.COLLECTION, where)
    matches, selected, total, offset = _matcher(role, email), [], 0, 0
    while True:
        batch = await store.find_documents(users.COLLECTION, where, limit=SCAN_BATCH,
                                           offset=offset, order_by="created_at",
                                           descending=True)
        for user in batch:
            if matches(user):
                if page.offset <= total < page.offset + page.limit:
                    selected.append(user)
                total += 1
        if len(batch) < SCAN_BATCH:
            return selected, total
        offset += SCAN_BATCH


@router.get("/users", response_model=PageEnvelope[AdminUserView], responses=_errors(401, 403),
            summary="List accounts (Super Admin), filtered by status, role or e-mail")
async def list_users(
    request: Request,
    page: Pagination = Depends(pagination),
    status: Literal["active", "suspended"] | None = Query(None),
    role: str | None = Query(None, max_length=64, examples=["ORG:DOCTOR"]),
    email: str | None = Query(None, max_length=320, description="Part of the address"),
    _: Principal = Depends(require_super_admin),
) -> Any:
    services = request_services(request)
    found, total = await find_users(services, page, status, role, email)
    return page.respond([await admin_view(services, u) for u in found], total)


@router.patch("/users/{user_id}/status", response_model=Envelope[AdminUserView],
              responses=_errors(401, 403, 404, 409, 422),
              summary="Activate or suspend an account (Super Admin)")
async def change_status(user_id: str, body: StatusChange, request: Request,
                        principal: Principal = Depends(require_super_admin)) -> Any:
    if user_id == principal.user_id and body.status == users.SUSPENDED:
        raise conflict("CANNOT_SUSPEND_SELF", "You cannot suspend your own account")
    auth = auth_service(request)
    await auth.set_user_status(user_id, body.status, actor=principal, reason=body.reason,
                               client=client_info(request))
    services = request_services(request)
    user = await services.store.get_document(users.COLLECTION, user_id)
    assert user is not None  # set_user_status answered 404 otherwise
    return ok(await admin_view(services, user))


# -- health ----------------------------------------------------------------------------
async def _timed(check: Callable[[], Any]) -> JSON:
    started = time.perf_counter()
    try:
        detail = await asyncio.wait_for(check(), HEALTH_CHECK_TIMEOUT)
    except Exception as exc:  # any failure is the answer of a health check
        return {"status": "unavailable", "error": f"{type(exc).__name__}: {exc}",
                "latency_ms": round((time.perf_counter() - started) * 1000, 2)}
    return {"status": "ok", **(detail if isinstance(detail, dict) else {}),
            "latency_ms": round((time.perf_counter() - started) * 1000, 2)}


async def _store(services: Services) -> JSON:
    return await _timed(lambda: services.store.count_documents("healthz"))


async def _bus(services: Services) -> JSON:
    async def check() -> JSON:
        pending = len(await services.store.pending_events(limit=1000))
        dead = await services.store.count_documents(DEAD_LETTERS)
        return {"pending_events": pending, "dead_letters": dead}

    result = await _timed(check)
    if result["status"] == "ok" and result["pending_events"] >= 1000:
        result["status"] = "backlog"
    return result


async def _smtp(services: Services) -> JSON:
    mailer = services.auth.mailer
    if not mailer.enabled:
        return {"status": "disabled"}

    async def check() -> JSON:
        state = await mailer.check()  # "ok" or "unreachable: <reason>"
        if state != "ok":
            raise ConnectionError(state)
        return {}

    return {**await _timed(check), "host": f"{mailer.config.host}:{mailer.config.port}"}


def _disk(services: Services) -> JSON:
    path = services.settings.data_dir
    try:
        usage = shutil.disk_usage(path)
    except OSError as exc:
        return {"status": "unavailable", "error": str(exc), "path": str(path)}
    free = usage.free / usage.total if usage.total else 0.0
    return {"status": "ok" if free >= DISK_LOW_FRACTION else "low", "path": str(path),
            "free_bytes": usage.free, "total_bytes": usage.total,
            "free_percent": round(free * 100, 1)}


async def _rate_limiter(services: Services) -> JSON:
    limiter = services.auth.limiter
    reachable = await limiter.ping()
    return {"status": "ok" if reachable else "unavailable", "backend": limiter.backend}


@router.get("/health", responses=_errors(401, 403),
            summary="System health: store, bus, SMTP, disk, rate limiter (Super Admin)")
async def health(request: Request, _: Principal = Depends(require_super_admin)) -> Any:
    services = request_services(request)
    store, bus, smtp, limiter = await asyncio.gather(
        _store(services), _bus(services), _smtp(services), _rate_limiter(services))
    checks = {"store": store, "bus": bus, "smtp": smtp, "disk": _disk(services),
              "rate_limiter": limiter}
    failing = sorted(name for name, check in checks.items()
                     if check["status"] not in ("ok", "disabled"))
    return ok({
        "status": "degraded" if failing else "ok",
        "failing": failing,
        "version": request.app.version,
        "uptime_seconds": round(time.time() - services.started_at, 1),
        "checks": checks,
    })

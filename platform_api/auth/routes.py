"""Auth area routes (spec: Endpoints, Auth): register, login, refresh, logout, me.

Every answer is the /api envelope; refusals are ``ApiError`` with these codes:
``EMAIL_TAKEN`` 409, ``INVALID_CREDENTIALS`` 401, ``ACCOUNT_SUSPENDED`` 403,
``INVALID_REFRESH_TOKEN`` / ``REFRESH_TOKEN_REUSED`` 401, ``UNAUTHORIZED`` /
``INVALID_TOKEN`` / ``TOKEN_EXPIRED`` 401. Token answers carry ``Cache-Control:
no-store`` (RFC 6749 section 5.1).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from platform_api.auth.dependencies import auth_service, bearer_token, current_principal
from platform_api.auth.errors import invalid_token, missing_token
from platform_api.auth.principal import Principal
from platform_api.auth.schemas import (
    Account,
    LoggedOut,
    LoginRequest,
    RefreshRequest,
    RegisterRequest,
    Session,
    User,
)
from platform_api.auth.service import LoginResult
from platform_api.envelope import Envelope, ErrorEnvelope, JSONResponse, created, ok

router = APIRouter(prefix="/api/auth", tags=["auth"])

_NO_STORE = {"Cache-Control": "no-store"}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorEnvelope} for status in statuses}


def _session(result: LoginResult) -> dict[str, Any]:
    return {
        "user": result.user,
        "token": result.tokens.access_token,
        "refresh_token": result.tokens.refresh_token,
        "token_type": result.tokens.token_type,
        "expires_in": result.tokens.expires_in,
    }


@router.post(
    "/register",
    status_code=201,
    response_model=Envelope[User],
    responses=_errors(409, 422),
    summary="Register a user",
)
async def register(body: RegisterRequest, request: Request) -> JSONResponse:
    user = await auth_service(request).register(
        str(body.email),
        body.password,
        body.first_name,
        body.last_name,
        body.registration_role,
    )
    return created(user)


@router.post(
    "/login",
    response_model=Envelope[Session],
    responses=_errors(401, 403, 422),
    summary="Authenticate, receive the user and a token pair",
)
async def login(body: LoginRequest, request: Request) -> JSONResponse:
    result = await auth_service(request).login(body.email, body.password)
    return ok(_session(result), headers=_NO_STORE)


@router.post(
    "/refresh",
    response_model=Envelope[Session],
    responses=_errors(401, 403, 422),
    summary="Exchange a refresh token for a new token pair",
)
async def refresh(body: RefreshRequest, request: Request) -> JSONResponse:
    result = await auth_service(request).refresh(body.refresh_token)
    return ok(_session(result), headers=_NO_STORE)


@router.post(
    "/logout",
    response_model=Envelope[LoggedOut],
    responses=_errors(401),
    summary="Revoke the access token and its refresh tokens",
)
async def logout(request: Request, _: Principal = Depends(current_principal)) -> JSONResponse:
    token = bearer_token(request)
    if token is None:
        raise missing_token()
    await auth_service(request).logout(token)
    return ok({"logged_out": True})


@router.get(
    "/me",
    response_model=Envelope[Account],
    responses=_errors(401, 403),
    summary="The current authenticated user",
)
async def me(request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    account = await auth_service(request).get_user(principal.user_id)
    if account is None:
        raise invalid_token("the account no longer exists")
    return ok(account)

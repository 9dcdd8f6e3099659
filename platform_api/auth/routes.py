"""Auth area routes (spec: Endpoints, Auth): accounts, sessions, e-mail links, social
login, referral codes; the MFA routes are in ``mfa_routes`` and included here.

Every answer is the /api envelope; refusals are ``ApiError`` with these codes:
``INVALID_CREDENTIALS`` 401, ``ACCOUNT_SUSPENDED`` 403,
``INVALID_REFRESH_TOKEN`` / ``REFRESH_TOKEN_REUSED`` 401, ``UNAUTHORIZED`` /
``INVALID_TOKEN`` / ``TOKEN_EXPIRED`` 401, ``INVALID_RESET_TOKEN`` /
``INVALID_VERIFICATION_TOKEN`` 400, ``INVALID_ID_TOKEN`` 401, ``EMAIL_NOT_VERIFIED``
422, ``RATE_LIMITED`` 429. Token answers carry ``Cache-Control: no-store`` (RFC 6749
section 5.1).

A login (password or social) answers either a session or, for an account with MFA,
``{"mfa_required": true, "mfa_token": ...}``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from platform_api.auth import users
from platform_api.auth.dependencies import (
    auth_service,
    bearer_token,
    client_info,
    current_principal,
    known_device,
)
from platform_api.auth.errors import invalid_token, missing_token, validation_error
from platform_api.auth.mfa_routes import router as mfa_router
from platform_api.auth.principal import Principal
from platform_api.auth.schemas import (
    Accepted,
    Account,
    ForgotPasswordRequest,
    LoggedOut,
    LoginRequest,
    MfaPending,
    Referral,
    RefreshRequest,
    RegisterRequest,
    ResetPasswordRequest,
    Session,
    SocialLoginRequest,
    User,
    VerifyEmailRequest,
    session_answer,
    session_data,
)
from platform_api.auth.service import LoginResult, MfaRequired
from platform_api.envelope import Envelope, ErrorEnvelope, JSONResponse, created, not_found, ok

router = APIRouter(prefix="/api/auth", tags=["auth"])

NO_STORE = {"Cache-Control": "no-store"}
_SENT = ("If an account uses this address, a message with a link is on its way. "
         "The link works once.")


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorEnvelope} for status in statuses}


def login_answer(result: LoginResult | MfaRequired, request: Request) -> JSONResponse:
    if isinstance(result, MfaRequired):
        return ok(MfaPending(mfa_token=result.mfa_token, expires_in=result.expires_in)
                  .model_dump(), headers=NO_STORE)
    return session_answer(result, request)


@router.post(
    "/register",
    status_code=201,
    response_model=Envelope[User],
    responses=errors(422, 429),
    summary="Register a user (a verification e-mail follows; an address already "
            "registered gets the same answer, and its owner an e-mail)",
)
async def register(body: RegisterRequest, request: Request) -> JSONResponse:
    user = await auth_service(request).register(
        str(body.email),
        body.password,
        body.first_name,
        body.last_name,
        body.registration_role,
        referral_code=body.referral_code,
        client=client_info(request),
    )
    return created(user)


@router.post(
    "/login",
    response_model=Envelope[Session | MfaPending],
    responses=errors(401, 403, 422, 429),
    summary="Authenticate: a token pair, or an MFA challenge when the account has MFA",
)
async def login(body: LoginRequest, request: Request) -> JSONResponse:
    result = await auth_service(request).login(body.email, body.password, client_info(request),
                                               known_device(request))
    return login_answer(result, request)


@router.post(
    "/refresh",
    response_model=Envelope[Session],
    responses=errors(401, 403, 422, 429),
    summary="Exchange a refresh token for a new token pair",
)
async def refresh(body: RefreshRequest, request: Request) -> JSONResponse:
    result = await auth_service(request).refresh(body.refresh_token, client_info(request))
    return ok(session_data(result), headers=NO_STORE)


@router.post(
    "/logout",
    response_model=Envelope[LoggedOut],
    responses=errors(401),
    summary="Revoke the access token and its refresh tokens",
)
async def logout(request: Request, _: Principal = Depends(current_principal)) -> JSONResponse:
    token = bearer_token(request)
    if token is None:
        raise missing_token()
    await auth_service(request).logout(token, client_info(request))
    return ok({"logged_out": True})


@router.get(
    "/me",
    response_model=Envelope[Account],
    responses=errors(401, 403),
    summary="The current authenticated user",
)
async def me(request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    account = await auth_service(request).get_user(principal.user_id)
    if account is None:
        raise invalid_token("the account no longer exists")
    return ok(account)


@router.post(
    "/verify-email",
    response_model=Envelope[Account | Accepted],
    responses=errors(400, 422, 429),
    summary="Verify an e-mail address with the link's token, or send the link again",
)
async def verify_email(body: VerifyEmailRequest, request: Request) -> JSONResponse:
    emails = auth_service(request).emails
    if body.token is not None:
        return ok(await emails.verify_email(body.token, client_info(request)))
    if body.email is None:
        raise validation_error("token", "send the token from the e-mail, or an e-mail "
                               "address to receive the link again")
    emails.resend_verification_later(str(body.email))
    return ok(Accepted(message=_SENT).model_dump(), 202)


@router.post(
    "/forgot-password",
    status_code=202,
    response_model=Envelope[Accepted],
    responses=errors(422, 429),
    summary="E-mail a password reset link (the answer does not tell if the address is known)",
)
async def forgot_password(body: ForgotPasswordRequest, request: Request) -> JSONResponse:
    auth_service(request).emails.request_password_reset_later(str(body.email))
    return ok(Accepted(message=_SENT).model_dump(), 202)


@router.post(
    "/reset-password",
    response_model=Envelope[Accepted],
    responses=errors(400, 422, 429),
    summary="Set a new password with the link's token; every session is signed out",
)
async def reset_password(body: ResetPasswordRequest, request: Request) -> JSONResponse:
    await auth_service(request).emails.reset_password(body.token, body.password,
                                                      client_info(request),
                                                      known_device(request))
    return ok(Accepted(message="Password changed; log in with the new password.")
              .model_dump())


@router.post(
    "/social-login",
    response_model=Envelope[Session | MfaPending],
    responses=errors(401, 403, 422, 429, 503),
    summary="Log in (or sign up) with an OpenID Connect ID token from a configured provider",
)
async def social_login(body: SocialLoginRequest, request: Request) -> JSONResponse:
    result = await auth_service(request).social.login(
        body.provider, body.id_token, body.nonce, body.referral_code, client_info(request),
        known_device(request))
    return login_answer(result, request)


@router.get(
    "/referral/{code}",
    response_model=Envelope[Referral],
    responses=errors(404, 429),
    summary="Who a referral code belongs to (first name and last initial only)",
)
async def referral(code: str, request: Request) -> JSONResponse:
    referrer = await auth_service(request).find_user_by_referral_code(code)
    if referrer is None or referrer["status"] != users.ACTIVE:
        raise not_found("Referral code")
    return ok(users.referral_view(referrer))


router.include_router(mfa_router)

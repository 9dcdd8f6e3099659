"""Request and response bodies of ``/api/auth`` (pydantic, so /docs shows them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, EmailStr, Field, StringConstraints
from starlette.requests import Request

from platform_api.auth import devices
from platform_api.auth.users import MIN_PASSWORD_LENGTH, RegistrationRole
from platform_api.client_origin import client_origin
from platform_api.envelope import JSONResponse, ok

if TYPE_CHECKING:
    from platform_api.auth.service import LoginResult

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
# NIST SP 800-63B 5.1.1.2: at least 8 characters, allow at least 64; the cap only
# bounds hashing work.
Password = Annotated[str, Field(min_length=MIN_PASSWORD_LENGTH, max_length=1024)]


ReferralCode = Annotated[str, Field(min_length=1, max_length=20, examples=["K7M2QX9P"])]
MfaCode = Annotated[str, Field(min_length=6, max_length=16, examples=["492039"],
                               description="6-digit TOTP code, or a recovery code")]


class RegisterRequest(BaseModel):
    email: EmailStr
    password: Password
    first_name: Name
    last_name: Name
    registration_role: RegistrationRole = Field(
        default="PATIENT", description="DOCTOR also creates a doctor profile"
    )
    referral_code: ReferralCode | None = Field(
        default=None, description="Code of the user who referred this one"
    )


class LoginRequest(BaseModel):
    # Not EmailStr: a malformed address is simply a wrong credential here.
    email: Annotated[str, Field(min_length=1, max_length=320)]
    password: Annotated[str, Field(min_length=1, max_length=1024)]


class RefreshRequest(BaseModel):
    refresh_token: Annotated[str, Field(min_length=1, max_length=512)]


class User(BaseModel):
    """The spec's User resource."""

    id: str = Field(description="UUID")
    email: str
    first_name: str
    last_name: str
    registration_role: str


class Account(User):
    """The current user as ``GET /api/auth/me`` shows it."""

    roles: list[str]
    status: Literal["active", "suspended"]
    created_at: str
    referral_code: str | None = None
    email_verified: bool = False
    mfa_enabled: bool = False


class Session(BaseModel):
    user: User
    token: str = Field(description="PASETO v4.public access token")
    refresh_token: str = Field(description="Opaque, single use: /api/auth/refresh rotates it")
    token_type: Literal["Bearer"] = "Bearer"
    expires_in: int = Field(description="Seconds until the access token expires")
    mfa_required: Literal[False] = False


class MfaPending(BaseModel):
    """The password (or ID token) was right and the account has MFA: finish the login
    with ``POST /api/auth/mfa/challenge`` and ``Authorization: Bearer <mfa_token>``."""

    mfa_required: Literal[True] = True
    mfa_token: str = Field(description="Single use, short-lived; only for /mfa/challenge")
    expires_in: int = Field(description="Seconds until the MFA token expires")
    methods: list[str] = Field(default=["totp", "recovery_code"])


class LoggedOut(BaseModel):
    logged_out: bool = True


class Accepted(BaseModel):
    accepted: bool = True
    message: str


class VerifyEmailRequest(BaseModel):
    """Either the token from the e-mail's link (verifies) or an address (sends the link
    again; the answer is the same whether or not the address has an account)."""

    token: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    email: EmailStr | None = None


class ForgotPasswordRequest(BaseModel):
    email: EmailStr


class ResetPasswordRequest(BaseModel):
    token: Annotated[str, Field(min_length=1, max_length=256)]
    password: Password


class SocialLoginRequest(BaseModel):
    provider: Annotated[str, Field(min_length=1, max_length=64, examples=["google"])]
    id_token: Annotated[str, Field(min_length=1, max_length=16_384)]
    nonce: Annotated[str, Field(min_length=8, max_length=512, description=(
        "The nonce the app sent with its authorization request; the ID token must carry it"))]
    referral_code: ReferralCode | None = None


class Referrer(BaseModel):
    first_name: str
    last_initial: str | None


class Referral(BaseModel):
    code: str
    valid: bool = True
    referrer: Referrer


class MfaEnrollment(BaseModel):
    secret: str = Field(description="Base32 TOTP secret, for typing into an authenticator")
    otpauth_uri: str = Field(description="otpauth://totp/... provisioning URI")
    qr_png: str = Field(description="The URI as a QR code: data:image/png;base64,...")
    qr_svg: str = Field(description="The URI as a QR code: data:image/svg+xml,...")


class MfaCodeRequest(BaseModel):
    code: MfaCode


class MfaActivated(BaseModel):
    enabled: Literal[True] = True
    recovery_codes: list[str] = Field(description="Each works once; shown only now")


class MfaDisabled(BaseModel):
    enabled: Literal[False] = False


def session_data(result: LoginResult) -> dict[str, Any]:
    """The ``Session`` answer of a finished login."""
    return {
        "user": result.user,
        "token": result.tokens.access_token,
        "refresh_token": result.tokens.refresh_token,
        "token_type": result.tokens.token_type,
        "expires_in": result.tokens.expires_in,
        "mfa_required": False,
    }


def session_answer(result: LoginResult, request: Request) -> JSONResponse:
    """A finished sign-in: the ``Session`` (never cached, RFC 6749 5.1), and the device
    cookie that makes this browser or app a known device of the account
    (:mod:`platform_api.auth.devices`)."""
    answer = ok(session_data(result), headers={"Cache-Control": "no-store"})
    if result.device_cookie is not None:
        answer.set_cookie(devices.COOKIE, result.device_cookie, max_age=devices.MAX_AGE,
                          path=devices.PATH, httponly=True, samesite="strict",
                          secure=client_origin(request.scope).scheme == "https")
    return answer

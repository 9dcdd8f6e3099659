"""Request and response bodies of ``/api/auth`` (pydantic, so /docs shows them)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, EmailStr, Field, StringConstraints

from platform_api.auth.users import MIN_PASSWORD_LENGTH, RegistrationRole

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
# NIST SP 800-63B 5.1.1.2: at least 8 characters, allow at least 64; the cap only
# bounds hashing work.
Password = Annotated[str, Field(min_length=MIN_PASSWORD_LENGTH, max_length=1024)]


class RegisterRequest(BaseModel):
    email: EmailStr
    password: Password
    first_name: Name
    last_name: Name
    registration_role: RegistrationRole = Field(
        default="PATIENT", description="DOCTOR also creates a doctor profile"
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


class Session(BaseModel):
    user: User
    token: str = Field(description="PASETO v4.public access token")
    refresh_token: str = Field(description="Opaque, single use: /api/auth/refresh rotates it")
    token_type: Literal["Bearer"] = "Bearer"
    expires_in: int = Field(description="Seconds until the access token expires")


class LoggedOut(BaseModel):
    logged_out: bool = True

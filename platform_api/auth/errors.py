"""The refusals of the auth area, each with a stable envelope ``code``.

401 answers carry ``WWW-Authenticate: Bearer`` (RFC 6750 section 3) so a client knows
which scheme to retry with; ``error="invalid_token"`` is added when a token was sent
but refused.
"""

from __future__ import annotations

from platform_api.envelope import ApiError

_BEARER = {"WWW-Authenticate": "Bearer"}
_BEARER_INVALID = {"WWW-Authenticate": 'Bearer error="invalid_token"'}


def missing_token(
    message: str = "Authentication required: send Authorization: Bearer <token> or X-API-Key",
) -> ApiError:
    return ApiError(401, "UNAUTHORIZED", message, headers=dict(_BEARER))


def invalid_token(reason: str) -> ApiError:
    return ApiError(
        401, "INVALID_TOKEN", f"Invalid access token: {reason}", headers=dict(_BEARER_INVALID)
    )


def token_expired() -> ApiError:
    return ApiError(
        401,
        "TOKEN_EXPIRED",
        "Access token expired: refresh it or log in again",
        headers=dict(_BEARER_INVALID),
    )


def invalid_credentials() -> ApiError:
    return ApiError(401, "INVALID_CREDENTIALS", "E-mail or password is incorrect")


def account_suspended() -> ApiError:
    return ApiError(403, "ACCOUNT_SUSPENDED", "This account is suspended")


def email_taken() -> ApiError:
    return ApiError(409, "EMAIL_TAKEN", "An account with this e-mail already exists")


def invalid_refresh_token(reason: str) -> ApiError:
    return ApiError(401, "INVALID_REFRESH_TOKEN", f"Invalid refresh token: {reason}")


def refresh_token_reused() -> ApiError:
    return ApiError(
        401,
        "REFRESH_TOKEN_REUSED",
        "Refresh token was already used; the session is revoked, log in again",
    )


def validation_error(field: str, message: str) -> ApiError:
    return ApiError(422, "VALIDATION_ERROR", message, field=field)

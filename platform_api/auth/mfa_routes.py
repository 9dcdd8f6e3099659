"""MFA routes: ``/api/auth/mfa/enroll``, ``/verify``, ``/challenge``, ``/disable``.

Enroll returns a new TOTP secret as text, otpauth URI and QR code (PNG and SVG data
URIs); verify activates it with a first code and returns 10 single-use recovery codes;
challenge finishes a login that answered ``mfa_required`` (credential: ``Authorization:
Bearer <mfa_token>``); disable needs a current code (or a recovery code). Refusals:
``INVALID_MFA_CODE`` / ``INVALID_MFA_TOKEN`` 401, ``MFA_ALREADY_ENABLED`` /
``MFA_NOT_PENDING`` / ``MFA_NOT_ENABLED`` 409, ``RATE_LIMITED`` 429 (attempts per
account, see ``mfa``).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from platform_api.audit import MINOR_FAILURE, AuditRecord
from platform_api.auth.dependencies import (
    auth_service,
    client_info,
    known_device,
    require_user_session,
)
from platform_api.auth.errors import missing_token
from platform_api.auth.mfa import commit_code
from platform_api.auth.principal import Principal
from platform_api.auth.schemas import (
    MfaActivated,
    MfaCodeRequest,
    MfaDisabled,
    MfaEnrollment,
    Session,
    session_answer,
)
from platform_api.envelope import ApiError, Envelope, ErrorEnvelope, JSONResponse, ok

router = APIRouter(prefix="/mfa", tags=["auth"])
NO_STORE = {"Cache-Control": "no-store"}


def _errors(*statuses: int) -> dict[int | str, dict[str, type[ErrorEnvelope]]]:
    return {status: {"model": ErrorEnvelope} for status in statuses}


@router.post("/enroll", response_model=Envelope[MfaEnrollment], responses=_errors(401, 409),
             summary="Start TOTP enrollment: secret, otpauth URI and QR code")
async def enroll(request: Request, principal: Principal = Depends(require_user_session)
                 ) -> JSONResponse:
    enrollment = await auth_service(request).mfa.enroll(principal.user_id,
                                                        principal.email or principal.user_id)
    return ok(MfaEnrollment(secret=enrollment.secret, otpauth_uri=enrollment.otpauth_uri,
                            qr_png=enrollment.qr_png, qr_svg=enrollment.qr_svg).model_dump(),
              headers=NO_STORE)


@router.post("/verify", response_model=Envelope[MfaActivated],
             responses=_errors(401, 409, 422, 429),
             summary="Activate MFA with a first code; returns the recovery codes (once)")
async def verify(body: MfaCodeRequest, request: Request,
                 principal: Principal = Depends(require_user_session)) -> JSONResponse:
    auth = auth_service(request)
    record = AuditRecord("mfa-enrolled", user_id=principal.user_id, user_email=principal.email,
                         client=client_info(request))
    try:
        async with auth.store.unit_of_work() as uow:
            codes = await auth.mfa.activate(principal.user_id, body.code, uow)
            auth.audit.stage(uow, record)
            await commit_code(uow)
    except ApiError as refused:
        if refused.status in (401, 429):
            await auth.audit.record(AuditRecord(
                "mfa-verify", MINOR_FAILURE, refused.message, user_id=principal.user_id,
                user_email=principal.email, client=client_info(request)))
        raise
    return ok(MfaActivated(recovery_codes=codes).model_dump(), headers=NO_STORE)


@router.post("/challenge", response_model=Envelope[Session],
             responses=_errors(401, 403, 422, 429),
             summary="Finish a login with the MFA token (Bearer) and a TOTP or recovery code")
async def challenge(body: MfaCodeRequest, request: Request) -> JSONResponse:
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise missing_token("This completes a login: send Authorization: Bearer "
                            "<mfa_token from /api/auth/login>")
    result = await auth_service(request).complete_mfa_login(
        token.strip(), body.code, client_info(request), known_device(request))
    return session_answer(result, request)


@router.post("/disable", response_model=Envelope[MfaDisabled],
             responses=_errors(401, 409, 422, 429),
             summary="Turn MFA off; needs a current code (or a recovery code)")
async def disable(body: MfaCodeRequest, request: Request,
                  principal: Principal = Depends(require_user_session)) -> JSONResponse:
    auth = auth_service(request)
    client = client_info(request)
    try:
        async with auth.store.unit_of_work() as uow:
            factor = await auth.mfa.stage_disable(principal.user_id, body.code, uow)
            auth.audit.stage(uow, AuditRecord(
                "mfa-disabled", user_id=principal.user_id, user_email=principal.email,
                client=client, details={"factor": factor}))
            await commit_code(uow)
    except ApiError as refused:
        if refused.status in (401, 429):
            await auth.audit.record(AuditRecord(
                "mfa-disabled", MINOR_FAILURE, refused.message, user_id=principal.user_id,
                user_email=principal.email, client=client))
        raise
    return ok(MfaDisabled().model_dump())

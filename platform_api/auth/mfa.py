"""TOTP multi-factor authentication (RFC 6238 with pyotp), recovery codes, MFA logins.

State (documents, not health data):

- ``mfa_factors/<user_id>``: ``{status: pending|active, secret (sealed, see
  secretbox), last_timecode, recovery_hashes, created_at, activated_at}``;
- ``mfa_used_steps/<user_id>:<timecode>``: a code's time step, inserted when the code is
  accepted. The store refuses a second insert, so a code is accepted once even when two
  requests race (RFC 6238 section 5.2: "MUST NOT accept the second attempt");
- ``mfa_recovery_uses/<hash>``: the same for recovery codes;
- ``mfa_challenges/<sha256 of the MFA token>``: a login that passed the password and
  waits for its second factor (single use, ``mfa_token_ttl_seconds``).

Codes are checked with one step of tolerance either side (``valid_window=1``: a code
typed just before the 30 s boundary still counts) and must come from a later step than
the last accepted one. Every attempt spends the account's ``mfa`` rate limit first.

Recovery codes: 10, shown once when MFA is activated, each 50 random bits (two groups
of five characters from an unambiguous alphabet, e.g. ``7KQ2M-HX4TP``), stored as SHA-256
of the user id and the code.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any

import pyotp
import segno
from pyotp.exceptions import OTPVerificationError

from fhir_server.store import DuplicateDocument, ResourceStore, UnitOfWork
from platform_api.auth.refresh import token_hash
from platform_api.auth.secretbox import SecretBox
from platform_api.auth.tokens import parse_rfc3339, rfc3339
from platform_api.envelope import ApiError, conflict
from platform_api.rate_limit import RateLimiter, rate_limited

FACTORS = "mfa_factors"
USED_STEPS = "mfa_used_steps"
RECOVERY_USES = "mfa_recovery_uses"
CHALLENGES = "mfa_challenges"
PENDING, ACTIVE = "pending", "active"
RECOVERY_CODE_COUNT = 10
_RECOVERY_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
MFA_TOKEN_PREFIX = "mfa_"
VALID_WINDOW = 1  # SMART-CDS-NOTES.md section 4: one step of network delay either side


@dataclass(frozen=True, slots=True)
class Enrollment:
    secret: str
    otpauth_uri: str
    qr_png: str  # data: URI
    qr_svg: str  # data: URI


@dataclass(frozen=True, slots=True)
class Challenge:
    mfa_token: str
    expires_in: int


def invalid_code(reason: str = "the code is not valid") -> ApiError:
    return ApiError(401, "INVALID_MFA_CODE", f"MFA code refused: {reason}")


def invalid_mfa_token(reason: str) -> ApiError:
    return ApiError(401, "INVALID_MFA_TOKEN", f"Invalid MFA token: {reason}; log in again",
                    headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})


def _normalize(code: str) -> str:
    return "".join(code.split()).replace("-", "").upper()


def new_recovery_code() -> str:
    raw = "".join(secrets.choice(_RECOVERY_ALPHABET) for _ in range(10))
    return f"{raw[:5]}-{raw[5:]}"


def recovery_hash(user_id: str, code: str) -> str:
    return hashlib.sha256(f"{user_id}:{_normalize(code)}".encode()).hexdigest()


class MfaService:
    def __init__(self, store: ResourceStore, box: SecretBox, limiter: RateLimiter, *,
                 issuer: str, challenge_ttl_seconds: int):
        self.store, self.box, self.limiter = store, box, limiter
        self.issuer, self.challenge_ttl = issuer, challenge_ttl_seconds
        self.clock = time.time  # the time codes are checked against (tests fix it)

    # -- state -------------------------------------------------------------------------
    async def factor(self, user_id: str) -> dict[str, Any] | None:
        return await self.store.get_document(FACTORS, user_id)

    async def is_active(self, user_id: str) -> bool:
        factor = await self.factor(user_id)
        return factor is not None and factor["status"] == ACTIVE

    # -- enrollment --------------------------------------------------------------------
    async def enroll(self, user_id: str, email: str) -> Enrollment:
        """Start (or restart) enrollment: a new secret, pending until verified."""
        if await self.is_active(user_id):
            raise conflict("MFA_ALREADY_ENABLED",
                           "MFA is already enabled; disable it first to enroll again")
        secret = pyotp.random_base32()
        async with self.store.unit_of_work() as uow:
            uow.put_document(FACTORS, user_id, {
                "id": user_id, "user_id": user_id, "status": PENDING,
                "secret": self.box.seal(secret, user_id), "last_timecode": None,
                "recovery_hashes": [], "created_at": rfc3339(time.time()),
                "activated_at": None,
            })
            await uow.commit()
        uri = pyotp.TOTP(secret).provisioning_uri(name=email, issuer_name=self.issuer)
        qr = segno.make(uri, error="m")
        return Enrollment(secret, uri, qr.png_data_uri(scale=5, border=2),
                          qr.svg_data_uri(scale=5, border=2))

    async def activate(self, user_id: str, code: str, uow: UnitOfWork) -> list[str]:
        """Check the first code of a pending enrollment and stage its activation; returns
        the recovery codes (shown once)."""
        factor = await self.factor(user_id)
        if factor is None or factor["status"] != PENDING:
            raise conflict("MFA_NOT_PENDING", "There is no MFA enrollment to verify; "
                           "POST /api/auth/mfa/enroll first"
                           if factor is None else "MFA is already enabled")
        timecode = await self._check_totp(factor, code)
        codes = [new_recovery_code() for _ in range(RECOVERY_CODE_COUNT)]
        self._stage_step(uow, user_id, timecode)
        uow.put_document(FACTORS, user_id, {
            **factor, "status": ACTIVE, "last_timecode": timecode,
            "recovery_hashes": [recovery_hash(user_id, c) for c in codes],
            "activated_at": rfc3339(time.time()),
        })
        return codes

    async def stage_disable(self, user_id: str, code: str, uow: UnitOfWork) -> str:
        """Check a current code (or a recovery code) and stage removing the factor."""
        factor = await self._active_factor(user_id)
        method = await self.stage_second_factor(factor, code, uow)
        uow.delete_document(FACTORS, user_id)
        return method

    # -- codes -------------------------------------------------------------------------
    async def stage_second_factor(self, factor: dict[str, Any], code: str,
                                  uow: UnitOfWork) -> str:
        """Check a TOTP or recovery code of an active factor and stage its single use;
        returns ``"totp"`` or ``"recovery-code"``. Commit with :func:`commit_code`."""
        user_id = factor["user_id"]
        normalized = _normalize(code)
        if len(normalized) == 10:
            await self._spend_attempt(user_id)
            digest = recovery_hash(user_id, normalized)
            remaining = [h for h in factor["recovery_hashes"]
                         if not hmac.compare_digest(h, digest)]
            if len(remaining) == len(factor["recovery_hashes"]):
                raise invalid_code("unknown or already used recovery code")
            uow.insert_document(RECOVERY_USES, digest, {"id": digest, "user_id": user_id})
            uow.put_document(FACTORS, user_id, {**factor, "recovery_hashes": remaining})
            return "recovery-code"
        timecode = await self._check_totp(factor, code)
        self._stage_step(uow, user_id, timecode)
        uow.put_document(FACTORS, user_id, {**factor, "last_timecode": timecode})
        return "totp"

    async def _check_totp(self, factor: dict[str, Any], code: str) -> int:
        user_id = factor["user_id"]
        await self._spend_attempt(user_id)
        normalized = _normalize(code)
        if len(normalized) != 6 or not normalized.isdecimal():
            raise invalid_code("a TOTP code has 6 digits")
        totp = pyotp.TOTP(self.box.open(factor["secret"], user_id))
        try:
            timecode = totp.verify_and_get_timecode(normalized, for_time=self.clock(),
                                                    valid_window=VALID_WINDOW)
        except OTPVerificationError:
            raise invalid_code() from None
        last = factor.get("last_timecode")
        if last is not None and timecode <= last:
            raise invalid_code("this code was already used; wait for the next one")
        return timecode

    async def _spend_attempt(self, user_id: str) -> None:
        decision = await self.limiter.hit("mfa", f"user:{user_id}")
        if not decision.allowed:
            raise rate_limited(decision, "MFA attempts")

    def _stage_step(self, uow: UnitOfWork, user_id: str, timecode: int) -> None:
        step_id = f"{user_id}:{timecode}"
        uow.insert_document(USED_STEPS, step_id, {"id": step_id, "user_id": user_id,
                                                  "used_at": rfc3339(time.time())})

    async def _active_factor(self, user_id: str) -> dict[str, Any]:
        factor = await self.factor(user_id)
        if factor is None or factor["status"] != ACTIVE:
            raise conflict("MFA_NOT_ENABLED", "MFA is not enabled for this account")
        return factor

    # -- MFA logins --------------------------------------------------------------------
    async def open_challenge(self, user_id: str, method: str) -> Challenge:
        """A login passed its first factor: issue the short-lived MFA token."""
        token = MFA_TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = time.time()
        async with self.store.unit_of_work() as uow:
            digest = token_hash(token)
            uow.insert_document(CHALLENGES, digest, {
                "id": digest, "user_id": user_id, "method": method,
                "created_at": rfc3339(now), "expires_at": rfc3339(now + self.challenge_ttl),
                "used_at": None,
            })
            await uow.commit()
        return Challenge(token, self.challenge_ttl)

    async def find_challenge(self, mfa_token: str) -> dict[str, Any]:
        if not mfa_token.startswith(MFA_TOKEN_PREFIX) or len(mfa_token) > 128:
            raise invalid_mfa_token("not an MFA token (use the mfa_token from the login)")
        challenge = await self.store.get_document(CHALLENGES, token_hash(mfa_token))
        if challenge is None:
            raise invalid_mfa_token("unknown token")
        if challenge.get("used_at") is not None:
            raise invalid_mfa_token("already used")
        if parse_rfc3339(challenge["expires_at"]) <= time.time():
            raise invalid_mfa_token("expired")
        return challenge

    async def stage_redeem(self, challenge: dict[str, Any], code: str, uow: UnitOfWork
                           ) -> str:
        """Check the second factor for a challenge and stage both single uses."""
        factor = await self._active_factor(challenge["user_id"])
        method = await self.stage_second_factor(factor, code, uow)
        used = rfc3339(time.time())
        uow.insert_document(CHALLENGES + "_uses", challenge["id"],
                            {"id": challenge["id"], "used_at": used})
        uow.put_document(CHALLENGES, challenge["id"], {**challenge, "used_at": used})
        return method


async def commit_code(uow: UnitOfWork) -> None:
    """Commit a unit of work that spends a code; losing a race means a replay."""
    try:
        await uow.commit()
    except DuplicateDocument:
        raise invalid_code("this code was already used") from None

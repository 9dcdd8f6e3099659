"""Single-use, expiring tokens sent by e-mail (password reset, e-mail verification).

The token travels in a link; the store keeps only its SHA-256 (``one_time_tokens``,
keyed by the hash): a copy of the database holds nothing that can be redeemed. The
token carries 256 random bits, so a fast hash is enough and the lookup is one read.

Single use is atomic: redeeming inserts ``one_time_token_uses/<hash>`` in the unit of
work of the change the token authorizes, and the store refuses a second insert of the
same id, so two concurrent redemptions cannot both succeed.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

from fhir_server.store import DuplicateDocument, ResourceStore, UnitOfWork
from platform_api.auth.tokens import parse_rfc3339, rfc3339
from platform_api.envelope import ApiError

TOKENS = "one_time_tokens"
USES = "one_time_token_uses"
MAX_TOKEN_LENGTH = 256


@dataclass(frozen=True, slots=True)
class Purpose:
    name: str  # stored with the token; a token of one purpose never redeems another
    prefix: str  # makes a pasted token recognisable
    error_code: str


PASSWORD_RESET = Purpose("password-reset", "pr_", "INVALID_RESET_TOKEN")
EMAIL_VERIFICATION = Purpose("email-verification", "ev_", "INVALID_VERIFICATION_TOKEN")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def invalid(purpose: Purpose, reason: str) -> ApiError:
    what = purpose.name.replace("-", " ")
    return ApiError(400, purpose.error_code, f"This {what} link is {reason}; request a new one")


class OneTimeTokens:
    def __init__(self, store: ResourceStore):
        self.store = store

    def stage(self, uow: UnitOfWork, purpose: Purpose, user_id: str, ttl_seconds: int,
              **data: Any) -> str:
        """Stage a new token for ``user_id``; returns the token (shown once, in a link)."""
        token = purpose.prefix + secrets.token_urlsafe(32)
        digest, now = token_hash(token), time.time()
        uow.insert_document(TOKENS, digest, {
            "id": digest, "purpose": purpose.name, "user_id": user_id,
            "created_at": rfc3339(now), "expires_at": rfc3339(now + ttl_seconds),
            "used_at": None, **data,
        })
        return token

    async def find(self, purpose: Purpose, token: str) -> dict[str, Any]:
        """The record of a usable token; 400 for unknown, used and expired ones."""
        if not token or len(token) > MAX_TOKEN_LENGTH:
            raise invalid(purpose, "not valid")
        doc = await self.store.get_document(TOKENS, token_hash(token))
        if doc is None or doc.get("purpose") != purpose.name:
            raise invalid(purpose, "not valid")
        if doc.get("used_at") is not None:
            raise invalid(purpose, "already used")
        if parse_rfc3339(doc["expires_at"]) <= time.time():
            raise invalid(purpose, "expired")
        return doc

    def stage_use(self, uow: UnitOfWork, doc: dict[str, Any]) -> None:
        now = rfc3339(time.time())
        uow.insert_document(USES, doc["id"], {"id": doc["id"], "used_at": now})
        uow.put_document(TOKENS, doc["id"], {**doc, "used_at": now})

    async def stage_retire_others(self, uow: UnitOfWork, purpose: Purpose, user_id: str,
                                  keep: str | None = None) -> None:
        """Mark every other unused token of this purpose and user as used."""
        pending = await self.store.find_documents(
            TOKENS, {"user_id": user_id, "purpose": purpose.name, "used_at": None}, limit=1000)
        now = rfc3339(time.time())
        for doc in pending:
            if doc["id"] != keep:
                uow.put_document(TOKENS, doc["id"], {**doc, "used_at": now})


async def commit_use(uow: UnitOfWork, purpose: Purpose) -> None:
    """Commit a unit of work that redeems a token; a concurrent redemption loses."""
    try:
        await uow.commit()
    except DuplicateDocument:
        raise invalid(purpose, "already used") from None

"""Refresh tokens: opaque, stored hashed, rotated on every use, reuse revokes the family.

A login opens a *family* (one session): ``refresh_families`` document
``{id, user_id, created_at, revoked_at, revoked_reason}``. Each refresh token of the
family is a ``refresh_tokens`` document keyed by the SHA-256 of the token (the token
itself is never stored): ``{id, family_id, user_id, created_at, expires_at, used_at,
replaced_by}``.

Using a token marks it used and hands out its successor. Presenting a used token again
means two parties hold it (the OAuth 2.0 Security BCP's refresh-token rotation), so the
whole family is revoked and both must log in again. "Mark used" is an insert into
``refresh_token_uses`` keyed by the token hash: the store refuses a second insert of the
same id, which makes single use atomic even between processes.

SHA-256 rather than argon2 for the hash: the token carries 256 random bits, so there is
nothing to brute-force, and the lookup must be one indexed read.
"""

from __future__ import annotations

import hashlib
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fhir_server.store import DuplicateDocument, ResourceStore, UnitOfWork
from platform_api.auth.errors import invalid_refresh_token, refresh_token_reused
from platform_api.auth.tokens import parse_rfc3339, rfc3339

TOKENS = "refresh_tokens"
USES = "refresh_token_uses"
FAMILIES = "refresh_families"
TOKEN_PREFIX = "rt_"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class RefreshRecord:
    """A refresh token that was found, unused, unexpired and in a live family."""

    token_hash: str
    family_id: str
    user_id: str
    document: dict[str, object]
    family: dict[str, Any] = field(default_factory=dict)  # the family document


class RefreshTokens:
    """Store-backed refresh-token families."""

    def __init__(
        self,
        store: ResourceStore,
        ttl_seconds: int,
        on_revoke: Callable[[str], None] | None = None,
    ):
        """``on_revoke(family_id)`` runs on every revocation, so access tokens of the
        family can be refused in memory at once."""
        self.store, self.ttl_seconds = store, ttl_seconds
        self._on_revoke = on_revoke or (lambda _family_id: None)

    def open_family(self, uow: UnitOfWork, user_id: str, *, first_token: bool = True,
                    ttl_seconds: int | None = None, **details: Any) -> tuple[str, str]:
        """Stage a new family and its first token; returns ``(token, family_id)``.

        ``details`` are kept in the family document (a SMART authorization's ``kind``,
        client and grant); without ``first_token`` the family has no token yet (the
        token is ``""``): a session that only revokes together what it issued."""
        family_id = str(uuid.uuid4())
        uow.insert_document(
            FAMILIES,
            family_id,
            {
                **details,
                "id": family_id,
                "user_id": user_id,
                "created_at": rfc3339(time.time()),
                "revoked_at": None,
                "revoked_reason": None,
            },
        )
        token = self.stage_token(uow, family_id, user_id, ttl_seconds) if first_token else ""
        return token, family_id

    async def lookup(self, token: str) -> RefreshRecord:
        """The record of a usable token; refuses unknown, expired, revoked and reused ones."""
        digest = token_hash(token)
        doc = await self.store.get_document(TOKENS, digest)
        if doc is None:
            raise invalid_refresh_token("unknown token")
        family_id, user_id = str(doc["family_id"]), str(doc["user_id"])
        if doc.get("used_at") is not None:
            await self.revoke_family(family_id, "refresh token reused")
            raise refresh_token_reused()
        family = await self.store.get_document(FAMILIES, family_id)
        if family is None or family.get("revoked_at") is not None:
            raise invalid_refresh_token("the session was revoked; log in again")
        if parse_rfc3339(doc["expires_at"]) <= time.time():
            raise invalid_refresh_token("token expired; log in again")
        return RefreshRecord(digest, family_id, user_id, doc, family)

    async def rotate(self, record: RefreshRecord, ttl_seconds: int | None = None) -> str:
        """Mark ``record`` used and return its successor in the same family (valid for
        ``ttl_seconds``, the default lifetime when ``None``)."""
        now = rfc3339(time.time())
        try:
            async with self.store.unit_of_work() as uow:
                uow.insert_document(
                    USES, record.token_hash, {"id": record.token_hash, "used_at": now}
                )
                successor = self.stage_token(uow, record.family_id, record.user_id,
                                             ttl_seconds)
                uow.put_document(
                    TOKENS,
                    record.token_hash,
                    {
                        **record.document,
                        "used_at": now,
                        "replaced_by": token_hash(successor),
                    },
                )
                await uow.commit()
        except DuplicateDocument:
            # Another request used the same token first: a replay, same as a late reuse.
            await self.revoke_family(record.family_id, "refresh token reused")
            raise refresh_token_reused() from None
        return successor

    async def family_revoked(self, family_id: str) -> bool:
        family = await self.store.get_document(FAMILIES, family_id)
        return family is None or family.get("revoked_at") is not None

    async def revoke_family(
        self, family_id: str, reason: str, uow: UnitOfWork | None = None
    ) -> None:
        """Revoke one family; staged into ``uow`` when given, else committed at once."""
        family = await self.store.get_document(FAMILIES, family_id)
        if family is None or family.get("revoked_at") is not None:
            return
        revoked = {**family, "revoked_at": rfc3339(time.time()), "revoked_reason": reason}
        self._on_revoke(family_id)
        if uow is not None:
            uow.put_document(FAMILIES, family_id, revoked)
            return
        async with self.store.unit_of_work() as own:
            own.put_document(FAMILIES, family_id, revoked)
            await own.commit()

    async def revoke_user(self, user_id: str, reason: str) -> list[str]:
        """Revoke every live family of a user (suspension); returns their ids."""
        families = await self.store.find_documents(
            FAMILIES, {"user_id": user_id, "revoked_at": None}, limit=10_000
        )
        if not families:
            return []
        now = rfc3339(time.time())
        async with self.store.unit_of_work() as uow:
            for family in families:
                self._on_revoke(family["id"])
                uow.put_document(
                    FAMILIES, family["id"], {**family, "revoked_at": now, "revoked_reason": reason}
                )
            await uow.commit()
        return [f["id"] for f in families]

    def stage_token(self, uow: UnitOfWork, family_id: str, user_id: str,
                    ttl_seconds: int | None = None) -> str:
        """Stage a new token of the family (valid ``ttl_seconds``, default the
        configured lifetime); returns it."""
        ttl = self.ttl_seconds if ttl_seconds is None else ttl_seconds
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        digest, now = token_hash(token), time.time()
        uow.insert_document(
            TOKENS,
            digest,
            {
                "id": digest,
                "family_id": family_id,
                "user_id": user_id,
                "created_at": rfc3339(now),
                "expires_at": rfc3339(now + ttl),
                "used_at": None,
                "replaced_by": None,
            },
        )
        return token

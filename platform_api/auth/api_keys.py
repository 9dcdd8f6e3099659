"""Developer API keys: server-to-server credentials with ``<resource>:<action>`` scopes.

Key format ``hpk_<id>.<secret>``: ``hpk_`` says what it is (secret scanners and people
recognise it, SMART-CDS-NOTES.md section 5), ``<id>`` is 8 characters naming the key
(the document id, shown in listings and used in URLs), ``<secret>`` 32 characters of
base62 (190 bits). The store keeps only the SHA-256 of the secret: with that much
entropy there is nothing to brute-force, and checking a key is one document read plus
one hash, so revocation is seen at once by every process.

Documents:

- ``api_keys/<id>``: ``{user_id, name, scopes, secret_hash, grace, status (active |
  revoked), created_at, rotated_at, revoked_at}``; ``grace`` holds the hash of the
  secret the last rotation replaced, with the time it stops working (rotation keeps the
  previous secret valid for 24 hours, spec: Limits; the ones before it stop at once: a
  rotation after a leak must not leave every earlier secret working for a day);
- ``api_key_usage/<id>``: ``{last_used_at, last_used_ip}``, kept apart so that the
  usage write (at most once a minute per key and process) can never race a revocation
  into undoing it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
import time
from dataclasses import dataclass
from typing import Any

from fhir_server.store import DuplicateDocument, ResourceStore, UnitOfWork
from platform_api.auth.tokens import parse_rfc3339, rfc3339
from platform_api.envelope import ApiError, Pagination, conflict, not_found

KEYS = "api_keys"
USAGE = "api_key_usage"
KEY_PREFIX = "hpk_"
ID_LENGTH, SECRET_LENGTH = 8, 32
GRACE_SECONDS = 24 * 3600  # spec: Limits, key rotation grace period
USAGE_RECORD_INTERVAL = 60.0  # seconds between last-used writes per key and process
MAX_ACTIVE_KEYS = 25
ACTIVE, REVOKED = "active", "revoked"
_ALPHABET = string.ascii_letters + string.digits
_KEY_SHAPE = re.compile(
    rf"^{KEY_PREFIX}([A-Za-z0-9]{{{ID_LENGTH}}})\.([A-Za-z0-9]{{{SECRET_LENGTH}}})$"
)

JSON = dict[str, Any]


def _random(length: int) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def invalid_api_key(reason: str) -> ApiError:
    return ApiError(401, "INVALID_API_KEY", f"Invalid API key: {reason}",
                    headers={"WWW-Authenticate": 'ApiKey realm="healthplatform"'})


def key_view(doc: JSON, usage: JSON | None = None) -> JSON:
    """What listings show: never a secret or a hash."""
    now = time.time()
    grace = [g for g in doc.get("grace", []) if parse_rfc3339(g["expires_at"]) > now]
    return {
        "id": doc["id"],
        "name": doc["name"],
        "scopes": list(doc["scopes"]),
        "prefix": f"{KEY_PREFIX}{doc['id']}",
        "status": doc["status"],
        "created_at": doc["created_at"],
        "rotated_at": doc.get("rotated_at"),
        "previous_secret_valid_until": max((g["expires_at"] for g in grace), default=None),
        "revoked_at": doc.get("revoked_at"),
        "last_used_at": (usage or {}).get("last_used_at"),
    }


@dataclass(frozen=True, slots=True)
class IssuedKey:
    key: str  # the whole secret key: shown once
    document: JSON


class ApiKeys:
    def __init__(self, store: ResourceStore):
        self.store = store
        self._usage_recorded: dict[str, float] = {}  # key id -> monotonic time of last write

    # -- management --------------------------------------------------------------------
    async def create(self, user_id: str, name: str, scopes: list[str], uow_hook: Any = None
                     ) -> IssuedKey:
        """A new key; ``uow_hook(uow, doc)`` stages more in the same unit of work (audit)."""
        active = await self.store.count_documents(KEYS, {"user_id": user_id, "status": ACTIVE})
        if active >= MAX_ACTIVE_KEYS:
            raise conflict("TOO_MANY_KEYS", f"At most {MAX_ACTIVE_KEYS} active API keys per "
                           "account; revoke one first")
        for _attempt in range(5):
            key_id, secret = _random(ID_LENGTH), _random(SECRET_LENGTH)
            doc = {
                "id": key_id, "user_id": user_id, "name": name, "scopes": sorted(set(scopes)),
                "secret_hash": secret_hash(secret), "grace": [], "status": ACTIVE,
                "created_at": rfc3339(time.time()), "rotated_at": None, "revoked_at": None,
            }
            try:
                async with self.store.unit_of_work() as uow:
                    uow.insert_document(KEYS, key_id, doc)
                    if uow_hook is not None:
                        uow_hook(uow, doc)
                    await uow.commit()
            except DuplicateDocument:
                continue  # 62^8 ids: a clash is rare; draw again
            return IssuedKey(f"{KEY_PREFIX}{key_id}.{secret}", doc)
        raise RuntimeError("could not draw a free API key id in 5 attempts")

    async def owned(self, user_id: str, key_id: str) -> JSON:
        """The caller's key; 404 for another account's key (its existence is not told)."""
        doc = await self.store.get_document(KEYS, key_id)
        if doc is None or doc["user_id"] != user_id:
            raise not_found("API key")
        return doc

    async def list(self, user_id: str, page: Pagination, *, include_revoked: bool
                   ) -> tuple[list[JSON], int]:
        where: dict[str, Any] = {"user_id": user_id}
        if not include_revoked:
            where["status"] = ACTIVE
        docs = await self.store.find_documents(KEYS, where, limit=page.limit,
                                               offset=page.offset, order_by="created_at")
        total = await self.store.count_documents(KEYS, where)
        views = [key_view(d, await self.store.get_document(USAGE, d["id"])) for d in docs]
        return views, total

    async def rotate(self, doc: JSON, uow: UnitOfWork) -> IssuedKey:
        """Stage a new secret; the current one keeps working for ``GRACE_SECONDS``, the
        ones before it stop now."""
        if doc["status"] != ACTIVE:
            raise conflict("KEY_REVOKED", "A revoked API key cannot be rotated")
        now = time.time()
        secret = _random(SECRET_LENGTH)
        grace = [{"hash": doc["secret_hash"], "expires_at": rfc3339(now + GRACE_SECONDS)}]
        rotated = {**doc, "secret_hash": secret_hash(secret), "grace": grace,
                   "rotated_at": rfc3339(now)}
        uow.put_document(KEYS, doc["id"], rotated)
        return IssuedKey(f"{KEY_PREFIX}{doc['id']}.{secret}", rotated)

    def revoke(self, doc: JSON, uow: UnitOfWork) -> JSON:
        """Stage the revocation: every secret of the key stops working at commit."""
        if doc["status"] == REVOKED:
            return doc
        revoked = {**doc, "status": REVOKED, "grace": [], "revoked_at": rfc3339(time.time())}
        uow.put_document(KEYS, doc["id"], revoked)
        return revoked

    # -- per request -------------------------------------------------------------------
    async def verify(self, presented: str) -> JSON:
        """The active key document of a presented key; 401 INVALID_API_KEY otherwise."""
        match = _KEY_SHAPE.match(presented)
        if match is None:
            raise invalid_api_key("malformed key (expected hpk_<id>.<secret>)")
        key_id, secret = match.groups()
        doc = await self.store.get_document(KEYS, key_id)
        if doc is None:
            raise invalid_api_key("unknown key")
        if doc["status"] != ACTIVE:
            raise invalid_api_key("the key was revoked")
        digest = secret_hash(secret)
        if hmac.compare_digest(doc["secret_hash"], digest):
            return doc
        now = time.time()
        for old in doc.get("grace", []):
            if hmac.compare_digest(old["hash"], digest):
                if parse_rfc3339(old["expires_at"]) > now:
                    return doc
                raise invalid_api_key("this secret was rotated out; use the new one")
        raise invalid_api_key("wrong secret")

    def usage_due(self, key_id: str) -> bool:
        """True at most once per ``USAGE_RECORD_INTERVAL`` per key: time to write."""
        now = time.monotonic()
        last = self._usage_recorded.get(key_id)
        if last is not None and now - last < USAGE_RECORD_INTERVAL:
            return False
        if len(self._usage_recorded) > 100_000:
            self._usage_recorded.clear()
        self._usage_recorded[key_id] = now
        return True

    def stage_usage(self, uow: UnitOfWork, key_id: str, ip: str | None) -> None:
        uow.put_document(USAGE, key_id, {"id": key_id, "last_used_at": rfc3339(time.time()),
                                         "last_used_ip": ip})

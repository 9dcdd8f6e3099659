"""Password hashing with argon2id (argon2-cffi), cost parameters from the settings.

Defaults (settings): time cost 2, memory 19 MiB, parallelism 1: the OWASP Password
Storage Cheat Sheet's argon2id baseline. A hash made with older parameters still
verifies; :meth:`PasswordHashing.needs_rehash` tells the login to store a fresh one.

Hashing costs tens of milliseconds of CPU on purpose, so the async helpers run it in a
worker thread instead of stalling the event loop.
"""

from __future__ import annotations

import asyncio
import secrets

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from platform_api.settings import Settings


class PasswordHashing:
    """Hash, verify and re-hash passwords; never raises on a wrong password."""

    def __init__(self, time_cost: int, memory_kib: int, parallelism: int = 1):
        self._hasher = PasswordHasher(
            time_cost=time_cost, memory_cost=memory_kib, parallelism=parallelism, type=Type.ID
        )
        # Verified when the e-mail is unknown, so that answer costs as much as a wrong
        # password and timing does not reveal which accounts exist.
        self._dummy_hash = self._hasher.hash(secrets.token_urlsafe(16))

    @classmethod
    def from_settings(cls, settings: Settings) -> PasswordHashing:
        return cls(settings.argon2_time_cost, settings.argon2_memory_kib)

    def hash(self, password: str) -> str:
        return self._hasher.hash(password)

    def verify(self, password_hash: str, password: str) -> bool:
        try:
            return self._hasher.verify(password_hash, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False

    def verify_dummy(self, password: str) -> bool:
        """Spend the time of one verification; always ``False``."""
        self.verify(self._dummy_hash, password)
        return False

    def needs_rehash(self, password_hash: str) -> bool:
        try:
            return self._hasher.check_needs_rehash(password_hash)
        except InvalidHashError:
            return True

    async def hash_async(self, password: str) -> str:
        return await asyncio.to_thread(self.hash, password)

    async def verify_async(self, password_hash: str | None, password: str) -> bool:
        if password_hash is None:
            return await asyncio.to_thread(self.verify_dummy, password)
        return await asyncio.to_thread(self.verify, password_hash, password)

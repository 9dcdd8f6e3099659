"""The auth service: accounts, login, token pairs, logout and request authentication.

Built once per process (``AuthService(settings, store)``, then ``await start()``) and
reached by handlers as ``request.app.state.services.auth``.

Authenticating a request is on every hot path, so it is mostly memory work:

- a bounded cache maps a token string to its verified claims: the Ed25519 check (about
  0.2 ms here) runs once per token and process, later requests only compare ``exp``
  with the clock; tokens this process issues enter the cache when they are signed;
- revocation (logout, refresh reuse) lands at once in in-memory sets of this process;
  other processes see it through the store, re-read per token every
  ``recheck_seconds``;
- the user's status and roles come from a short-lived cache (``recheck_seconds``) that
  this service invalidates on every change it makes (:meth:`invalidate_user` for
  writers elsewhere). A suspended user is refused within that delay everywhere, at once
  here.

The principal's roles are the user's *current* roles, not the ``roles`` claim, so a
demotion does not wait for the token to expire.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from fhir_server.store import DuplicateDocument, ResourceStore
from platform_api.auth import users
from platform_api.auth.errors import (
    account_suspended,
    email_taken,
    invalid_credentials,
    invalid_refresh_token,
    invalid_token,
    token_expired,
)
from platform_api.auth.keys import KeyRing
from platform_api.auth.passwords import PasswordHashing
from platform_api.auth.principal import SUPER_ADMIN, Principal
from platform_api.auth.refresh import RefreshTokens
from platform_api.auth.tokens import (
    AccessClaims,
    AccessTokenCodec,
    BoundedCache,
    IssuedToken,
    rfc3339,
)
from platform_api.envelope import not_found
from platform_api.settings import Settings

JSON = users.JSON
REVOKED_TOKENS = "revoked_tokens"
USER_CREATED = "platform.auth.user_created"
SOURCE_SERVICE = "auth"


@dataclass(frozen=True, slots=True)
class TokenPair:
    access_token: str
    refresh_token: str
    expires_in: int  # seconds
    token_type: str = "Bearer"


@dataclass(frozen=True, slots=True)
class LoginResult:
    user: JSON  # the spec's User resource
    tokens: TokenPair


@dataclass(frozen=True, slots=True)
class _UserState:
    status: str
    roles: frozenset[str]
    email: str


@dataclass(slots=True)
class _Session:
    """A verified token in the cache, with what was last checked about it."""

    claims: AccessClaims
    checked_at: float = -math.inf  # monotonic time of the last revocation read
    state: _UserState | None = None
    principal: Principal | None = None


@dataclass(slots=True)
class _Revocations:
    """Token ids and sessions revoked by this process, each kept until it cannot matter."""

    jtis: dict[str, float] = field(default_factory=dict)  # jti -> token exp (epoch)
    sids: dict[str, float] = field(default_factory=dict)  # family -> last access exp
    max_entries: int = 100_000

    def add(self, table: dict[str, float], key: str, until: float) -> None:
        table[key] = until
        if len(table) > self.max_entries:
            now = time.time()
            for stale in [k for k, v in table.items() if v < now]:
                del table[stale]

    def hit(self, claims: AccessClaims) -> bool:
        return claims.jti in self.jtis or (claims.sid is not None and claims.sid in self.sids)


class AuthService:
    """Accounts and tokens; every refusal is an ``ApiError`` with a stable code."""

    def __init__(
        self,
        settings: Settings,
        store: ResourceStore,
        *,
        cache_size: int = 10_000,
        recheck_seconds: float = 5.0,
    ):
        self.settings, self.store = settings, store
        self.recheck_seconds = recheck_seconds
        self.refresh_tokens = RefreshTokens(
            store, settings.refresh_token_ttl_seconds, on_revoke=self._session_revoked
        )
        self._sessions: BoundedCache[str, _Session] = BoundedCache(cache_size)
        self._users: BoundedCache[str, tuple[_UserState | None, float]] = BoundedCache(cache_size)
        self._revoked = _Revocations()
        self._keys: KeyRing | None = None
        self._codec: AccessTokenCodec | None = None
        self._passwords: PasswordHashing | None = None

    async def start(self) -> None:
        """Load (or create) the signing keys and declare the unique user fields."""
        self.store.set_unique_document_fields(users.COLLECTION, users.UNIQUE_FIELDS)
        self._keys = await asyncio.to_thread(
            KeyRing.load_or_create, self.settings.data_dir / "keys"
        )
        self._codec = AccessTokenCodec(
            self._keys, self.settings.token_issuer, self.settings.token_audience
        )
        self._passwords = await asyncio.to_thread(PasswordHashing.from_settings, self.settings)

    @property
    def keys(self) -> KeyRing:
        if self._keys is None:
            raise RuntimeError("AuthService.start() has not been awaited")
        return self._keys

    @property
    def codec(self) -> AccessTokenCodec:
        if self._codec is None:
            raise RuntimeError("AuthService.start() has not been awaited")
        return self._codec

    @property
    def passwords(self) -> PasswordHashing:
        if self._passwords is None:
            raise RuntimeError("AuthService.start() has not been awaited")
        return self._passwords

    # -- accounts ----------------------------------------------------------------------
    async def register(
        self,
        email: str,
        password: str,
        first_name: str,
        last_name: str,
        registration_role: str = "PATIENT",
    ) -> JSON:
        """Create an account and emit ``platform.auth.user_created``; returns the User."""
        users.check_email(email)
        users.check_password(password)
        users.check_registration_role(registration_role)
        if await self.find_user_by_email(email) is not None:
            raise email_taken()
        user = users.new_user(
            email=email,
            password_hash=await self.passwords.hash_async(password),
            first_name=first_name,
            last_name=last_name,
            registration_role=registration_role,
        )
        await self._insert_user(user)
        return users.public_user(user)

    async def create_admin(
        self, email: str, password: str, first_name: str, last_name: str
    ) -> tuple[JSON, bool]:
        """Create a SUPER:ADMIN, or promote the existing account with this e-mail.

        Returns ``(account view, created)``. A promoted account keeps its password: the
        given one is only used for a new account.
        """
        existing = await self.find_user_by_email(users.check_email(email))
        if existing is not None:
            roles = users.check_roles([*existing.get("roles", []), SUPER_ADMIN])
            return users.account_view(await self._save_user({**existing, "roles": roles})), False
        user = users.new_user(
            email=email,
            password_hash=await self.passwords.hash_async(users.check_password(password)),
            first_name=first_name,
            last_name=last_name,
            registration_role=users.ADMIN_REGISTRATION_ROLE,
            roles=[SUPER_ADMIN],
        )
        await self._insert_user(user)
        return users.account_view(user), True

    async def get_user(self, user_id: str) -> JSON | None:
        """The account view of a user, or ``None``."""
        user = await self.store.get_document(users.COLLECTION, user_id)
        return users.account_view(user) if user is not None else None

    async def find_user_by_email(self, email: str) -> JSON | None:
        """The stored user document (hash included) by e-mail: one indexed read."""
        found = await self.store.find_documents(
            users.COLLECTION, {"email": users.normalize_email(email)}, limit=1
        )
        return found[0] if found else None

    async def set_user_status(self, user_id: str, status: str) -> JSON:
        """Activate or suspend; suspension also revokes every refresh-token family."""
        users.check_status(status)
        user = await self._require_user(user_id)
        saved = await self._save_user({**user, "status": status})
        if status == users.SUSPENDED:
            await self.refresh_tokens.revoke_user(user_id, "account suspended")
        return users.account_view(saved)

    async def set_roles(self, user_id: str, roles: Iterable[str]) -> JSON:
        """Replace a user's roles (platform roles and ``ORG:<ROLE>``)."""
        user = await self._require_user(user_id)
        return users.account_view(
            await self._save_user({**user, "roles": users.check_roles(roles)})
        )

    def invalidate_user(self, user_id: str) -> None:
        """Forget the cached status and roles (call after writing a user elsewhere)."""
        self._users.discard(user_id)

    # -- sessions ----------------------------------------------------------------------
    async def login(self, email: str, password: str) -> LoginResult:
        """Check the password and open a session; the same 401 for any wrong pair."""
        user = await self.find_user_by_email(email)
        stored_hash = user["password_hash"] if user is not None else None
        if not await self.passwords.verify_async(stored_hash, password) or user is None:
            raise invalid_credentials()
        # Checked after the password, so the status of an account is not disclosed.
        if user["status"] != users.ACTIVE:
            raise account_suspended()
        user = await self._rehash_if_needed(user, password)
        return LoginResult(users.public_user(user), await self._open_session(user))

    async def refresh(self, refresh_token: str) -> LoginResult:
        """Rotate a refresh token: a new pair; a reused token revokes the family."""
        record = await self.refresh_tokens.lookup(refresh_token)
        user = await self.store.get_document(users.COLLECTION, record.user_id)
        if user is None:
            await self.refresh_tokens.revoke_family(record.family_id, "user deleted")
            raise invalid_refresh_token("the account no longer exists")
        if user["status"] != users.ACTIVE:
            raise account_suspended()
        successor = await self.refresh_tokens.rotate(record)
        access = self.issue_access_token(user, session_id=record.family_id)
        return LoginResult(users.public_user(user), self._pair(access, successor))

    async def logout(self, access_token: str) -> None:
        """Revoke the access token and its refresh-token family."""
        claims = self.codec.verify(access_token)
        async with self.store.unit_of_work() as uow:
            uow.put_document(
                REVOKED_TOKENS,
                claims.jti,
                {
                    "id": claims.jti,
                    "user_id": claims.sub,
                    "expires_at": rfc3339(claims.expires_at),
                    "revoked_at": rfc3339(time.time()),
                },
            )
            if claims.sid is not None:
                await self.refresh_tokens.revoke_family(claims.sid, "logout", uow)
            await uow.commit()
        self._revoked.add(self._revoked.jtis, claims.jti, claims.expires_at)
        self._sessions.discard(access_token)

    def issue_access_token(
        self, user: JSON, *, session_id: str | None = None, ttl_seconds: int | None = None
    ) -> IssuedToken:
        """Sign an access token for a user document (negative ttl: already expired)."""
        ttl = self.settings.access_token_ttl_seconds if ttl_seconds is None else ttl_seconds
        issued = self.codec.issue(
            subject=user["id"],
            roles=user.get("roles", []),
            email=user.get("email"),
            session_id=session_id,
            ttl_seconds=ttl,
        )
        # Signed here a moment ago: its first request in this process skips the Ed25519
        # check (revocation and account status are still checked as for any token).
        self._sessions.put(issued.token, _Session(issued.claims))
        return issued

    # -- per request -------------------------------------------------------------------
    async def authenticate(self, token: str) -> Principal:
        """The principal of a bearer token; ApiError 401 (or 403 when suspended)."""
        session = self._sessions.get(token)
        if session is None:
            session = _Session(self.codec.verify(token))
            self._sessions.put(token, session)
        claims = session.claims
        if time.time() >= claims.expires_at:
            self._sessions.discard(token)
            raise token_expired()
        state = await self._user_state(claims.sub)
        if state is None:
            raise invalid_token("the account no longer exists")
        if state.status != users.ACTIVE:
            raise account_suspended()
        if self._revoked.hit(claims):
            raise invalid_token("the token was revoked")
        if time.monotonic() - session.checked_at >= self.recheck_seconds:
            await self._recheck_revocation(session)
        if session.state is not state or session.principal is None:
            session.state = state
            session.principal = Principal(
                user_id=claims.sub, email=state.email, roles=state.roles, token_id=claims.jti
            )
        return session.principal

    # -- internals ---------------------------------------------------------------------
    def _session_revoked(self, family_id: str) -> None:
        """A refresh family was revoked here: refuse its access tokens from now on."""
        until = time.time() + self.settings.access_token_ttl_seconds
        self._revoked.add(self._revoked.sids, family_id, until)

    async def _recheck_revocation(self, session: _Session) -> None:
        """Read revocations made by other processes (at most every recheck_seconds)."""
        claims = session.claims
        if await self.store.get_document(REVOKED_TOKENS, claims.jti) is not None:
            self._revoked.add(self._revoked.jtis, claims.jti, claims.expires_at)
            raise invalid_token("the token was revoked")
        if claims.sid is not None and await self.refresh_tokens.family_revoked(claims.sid):
            self._session_revoked(claims.sid)
            raise invalid_token("the session was revoked")
        session.checked_at = time.monotonic()

    async def _user_state(self, user_id: str) -> _UserState | None:
        cached = self._users.get(user_id)
        now = time.monotonic()
        if cached is not None and now - cached[1] < self.recheck_seconds:
            return cached[0]
        user = await self.store.get_document(users.COLLECTION, user_id)
        state = (
            None
            if user is None
            else _UserState(user["status"], frozenset(user.get("roles", [])), user["email"])
        )
        self._users.put(user_id, (state, now))
        return state

    async def _open_session(self, user: JSON) -> TokenPair:
        async with self.store.unit_of_work() as uow:
            refresh_token, family_id = self.refresh_tokens.open_family(uow, user["id"])
            await uow.commit()
        return self._pair(self.issue_access_token(user, session_id=family_id), refresh_token)

    def _pair(self, access: IssuedToken, refresh_token: str) -> TokenPair:
        expires_in = max(0, round(access.expires_at - time.time()))
        return TokenPair(access.token, refresh_token, expires_in)

    async def _insert_user(self, user: JSON) -> None:
        """Insert with its creation event; a clash on referral code draws a new one."""
        for _attempt in range(3):
            try:
                async with self.store.unit_of_work() as uow:
                    uow.insert_document(users.COLLECTION, user["id"], user)
                    uow.emit(USER_CREATED, users.created_event(user), source_service=SOURCE_SERVICE)
                    await uow.commit()
                return
            except DuplicateDocument:
                if await self.find_user_by_email(user["email"]) is not None:
                    raise email_taken() from None
                user["referral_code"] = users.new_referral_code()
        raise RuntimeError("could not draw a unique referral code in 3 attempts")

    async def _save_user(self, user: JSON) -> JSON:
        async with self.store.unit_of_work() as uow:
            uow.put_document(users.COLLECTION, user["id"], user)
            await uow.commit()
        self.invalidate_user(user["id"])
        return user

    async def _require_user(self, user_id: str) -> JSON:
        user = await self.store.get_document(users.COLLECTION, user_id)
        if user is None:
            raise not_found("User")
        return user

    async def _rehash_if_needed(self, user: JSON, password: str) -> JSON:
        if not self.passwords.needs_rehash(user["password_hash"]):
            return user
        return await self._save_user(
            {**user, "password_hash": await self.passwords.hash_async(password)}
        )

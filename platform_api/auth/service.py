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

SMART access tokens (``platform_api.smart`` issues them with :meth:`issue_smart_token`)
are checked the same way, plus their client's standing (``smart_clients``, set by the
SMART authorization server: a disabled client's tokens are refused within
``recheck_seconds``); their principal is of kind ``smart`` and carries the grant.

The service also composes the rest of the auth area, each in its own module: API keys
(``api_keys``), TOTP MFA (``mfa``), e-mail links (``recovery``), social login
(``social``), the audit trail (:mod:`platform_api.audit`) and the rate limiter
(:mod:`platform_api.rate_limit`). A login whose account has MFA enabled answers
:class:`MfaRequired` instead of a session; :meth:`complete_mfa_login` finishes it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from fhir_server.service import FhirService
from fhir_server.smart_scopes import ScopeSet
from fhir_server.store import DuplicateDocument, ResourceStore, UnitOfWork
from platform_api.audit import (
    MINOR_FAILURE,
    NO_CLIENT,
    SERIOUS_FAILURE,
    AuditRecord,
    AuditTrail,
    ClientInfo,
)
from platform_api.auth import users
from platform_api.auth.api_keys import ApiKeys
from platform_api.auth.devices import DeviceCookies, KnownDevice
from platform_api.auth.errors import (
    account_suspended,
    email_taken,
    invalid_credentials,
    invalid_refresh_token,
    invalid_token,
    missing_token,
    token_expired,
    validation_error,
)
from platform_api.auth.keys import KeyRing
from platform_api.auth.mfa import MFA_TOKEN_PREFIX, MfaService, commit_code
from platform_api.auth.one_time import OneTimeTokens
from platform_api.auth.passwords import PasswordHashing
from platform_api.auth.principal import (
    PLATFORM_ADMIN_ROLES,
    SUPER_ADMIN,
    Principal,
    SmartAuthorization,
)
from platform_api.auth.recovery import AccountEmails
from platform_api.auth.refresh import TOKENS as REFRESH_TOKENS
from platform_api.auth.refresh import RefreshTokens, token_hash
from platform_api.auth.secretbox import SecretBox
from platform_api.auth.social import OidcVerifier, SocialLogin
from platform_api.auth.tokens import (
    AccessClaims,
    AccessTokenCodec,
    BoundedCache,
    IssuedToken,
    SmartClaims,
    rfc3339,
)
from platform_api.envelope import ApiError, not_found
from platform_api.mailer import Mailer, MailLog, SmtpConfig
from platform_api.rate_limit import (
    BACKOFFS,
    Backoff,
    RateLimiter,
    limiter_from_settings,
    rate_limited,
)
from platform_api.settings import Settings

log = logging.getLogger("healthplatform.auth")

JSON = users.JSON
REVOKED_TOKENS = "revoked_tokens"
LOGINS = "user_logins"  # last login per user, apart from the user document (no lost updates)
KNOWN_ADDRESSES = 10  # the addresses a user signed in from that count as known...
KNOWN_ADDRESS_DAYS = 90  # ... for this long after the last sign-in from them
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
    device_cookie: str | None = None  # the hp_device cookie to set (see auth.devices)


@dataclass(frozen=True, slots=True)
class MfaRequired:
    """The first factor passed; the login finishes at /api/auth/mfa/challenge."""

    mfa_token: str
    expires_in: int


@dataclass(frozen=True, slots=True)
class _UserState:
    status: str
    roles: frozenset[str]
    email: str


@dataclass(frozen=True, slots=True)
class ClientStanding:
    """What admitting a SMART client's tokens depends on (see ``smart_clients``): the
    organization a backend services client acts for, or the whole platform."""

    organization: str | None = None
    platform_wide: bool = False


# client_id -> its standing; None when unknown or disabled (its tokens are refused).
ClientLookup = Callable[[str], Awaitable[ClientStanding | None]]


@dataclass(slots=True)
class _Session:
    """A verified token in the cache, with what was last checked about it."""

    claims: AccessClaims
    checked_at: float = -math.inf  # monotonic time of the last revocation read
    state: _UserState | None = None
    principal: Principal | None = None
    standing: ClientStanding | None = None


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
        fhir: FhirService | None = None,
        cache_size: int = 10_000,
        recheck_seconds: float = 5.0,
    ):
        self.settings, self.store = settings, store
        self.recheck_seconds = recheck_seconds
        self.refresh_tokens = RefreshTokens(
            store, settings.refresh_token_ttl_seconds, on_revoke=self._session_revoked
        )
        # The app's FHIR service, so audit events are validated and indexed like any write.
        self.fhir = fhir or FhirService(store)
        self.audit = AuditTrail(self.fhir, settings.token_issuer)
        self.limiter: RateLimiter = limiter_from_settings(settings.redis_url,
                                                          settings.rate_limits)
        self.mailer = Mailer(SmtpConfig(
            settings.smtp_host, settings.smtp_port, settings.smtp_from,
            settings.smtp_username, settings.smtp_password, settings.smtp_tls,
            settings.smtp_timeout_seconds,
        ), MailLog(store))
        self.api_keys = ApiKeys(store)
        self.one_time = OneTimeTokens(store)
        self.oidc = OidcVerifier(settings.oidc_providers)
        self.emails = AccountEmails(self)
        self.social = SocialLogin(self)
        self._sessions: BoundedCache[str, _Session] = BoundedCache(cache_size)
        self._users: BoundedCache[str, tuple[_UserState | None, float]] = BoundedCache(cache_size)
        self._revoked = _Revocations()
        self._keys: KeyRing | None = None
        self._codec: AccessTokenCodec | None = None
        self._passwords: PasswordHashing | None = None
        self._mfa: MfaService | None = None
        self._devices: DeviceCookies | None = None
        # The growing delays after failed logins (rate_limit.BACKOFFS), per kind of source.
        self.backoffs: dict[str, Backoff] = dict(BACKOFFS)
        self._background: set[asyncio.Task[None]] = set()
        # Set by the SMART authorization server; without it SMART tokens are refused.
        self.smart_clients: ClientLookup | None = None

    async def start(self) -> None:
        """Load (or create) the signing keys and declare the unique user fields."""
        self.store.set_unique_document_fields(users.COLLECTION, users.UNIQUE_FIELDS)
        key_dir = self.settings.data_dir / "keys"
        self._keys = await asyncio.to_thread(KeyRing.load_or_create, key_dir)
        self._keys.retire_after(self.settings.access_token_ttl_seconds)
        self._codec = AccessTokenCodec(
            self._keys, self.settings.token_issuer, self.settings.token_audience
        )
        self._passwords = await asyncio.to_thread(PasswordHashing.from_settings, self.settings)
        box = await asyncio.to_thread(SecretBox.load_or_create, key_dir)
        self._devices = DeviceCookies(box)
        self._mfa = MfaService(self.store, box, self.limiter, issuer=self.settings.service_name,
                               challenge_ttl_seconds=self.settings.mfa_token_ttl_seconds)

    async def stop(self) -> None:
        """Finish background work (e-mails, usage records) and close connections."""
        await self.drain()
        await self.limiter.close()
        await self.oidc.close()

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

    @property
    def devices(self) -> DeviceCookies:
        if self._devices is None:
            raise RuntimeError("AuthService.start() has not been awaited")
        return self._devices

    @property
    def mfa(self) -> MfaService:
        if self._mfa is None:
            raise RuntimeError("AuthService.start() has not been awaited")
        return self._mfa

    # -- background work ---------------------------------------------------------------
    def spawn(self, work: Coroutine[Any, Any, None], what: str) -> None:
        """Run ``work`` after the response; failures are logged, never lost silently."""

        async def guarded() -> None:
            try:
                await work
            except Exception:
                log.exception("background %s failed", what)

        task = asyncio.get_running_loop().create_task(guarded(), name=what)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Wait for the background work started so far (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*list(self._background))

    # -- accounts ----------------------------------------------------------------------
    async def register(
        self,
        email: str,
        password: str,
        first_name: str,
        last_name: str,
        registration_role: str = "PATIENT",
        *,
        referral_code: str | None = None,
        client: ClientInfo = NO_CLIENT,
    ) -> JSON:
        """Create an account and emit ``platform.auth.user_created``; returns the User.

        A verification e-mail goes out after the response (see ``recovery``). An address
        that already has an account gets the same answer (a User that is not stored), and
        its owner an e-mail saying someone tried: the answer does not tell who is
        registered (login and password reset do not either). The password is hashed in
        both cases, so the time taken does not tell it either."""
        users.check_email(email)
        users.check_password(password, self.password_context(
            {"email": email, "first_name": first_name, "last_name": last_name}))
        users.check_registration_role(registration_role)
        referrer = await self.referrer(referral_code)
        user = users.new_user(
            email=email,
            password_hash=await self.passwords.hash_async(password),
            first_name=first_name,
            last_name=last_name,
            registration_role=registration_role,
            referred_by=referrer["id"] if referrer else None,
        )
        existing = await self.find_user_by_email(email)
        created = False
        if existing is None:
            try:
                await self.insert_user(user)
                created = True
            except ApiError as refused:
                if refused.code != "EMAIL_TAKEN":
                    raise
                existing = await self.find_user_by_email(email)  # registered meanwhile
        if created:
            self.emails.send_verification_later(user)
        elif existing is not None:
            self.emails.send_registration_notice_later(existing)
        return users.public_user(user)

    def password_context(self, user: JSON) -> list[str]:
        """What a user's password must not be made of: their e-mail address and names,
        and this service's name (``password_policy``)."""
        return [str(user.get(field) or "") for field in ("email", "first_name", "last_name")
                ] + [self.settings.service_name]

    async def referrer(self, referral_code: str | None) -> JSON | None:
        if referral_code is None:
            return None
        referrer = await self.find_user_by_referral_code(referral_code)
        if referrer is None or referrer["status"] != users.ACTIVE:
            raise validation_error("referral_code", "unknown referral code")
        return referrer

    async def find_user_by_referral_code(self, code: str) -> JSON | None:
        normalized = users.normalize_referral_code(code)
        if normalized is None:
            return None
        found = await self.store.find_documents(
            users.COLLECTION, {"referral_code": normalized}, limit=1
        )
        return found[0] if found else None

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
            password_hash=await self.passwords.hash_async(users.check_password(
                password, self.password_context({"email": email, "first_name": first_name,
                                                 "last_name": last_name}))),
            first_name=first_name,
            last_name=last_name,
            registration_role=users.ADMIN_REGISTRATION_ROLE,
            roles=[SUPER_ADMIN],
        )
        await self.insert_user(user)
        return users.account_view(user), True

    async def get_user(self, user_id: str) -> JSON | None:
        """The account view of a user, or ``None``."""
        user = await self.store.get_document(users.COLLECTION, user_id)
        if user is None:
            return None
        return {**users.account_view(user), "mfa_enabled": await self.mfa.is_active(user_id)}

    async def find_user_by_email(self, email: str) -> JSON | None:
        """The stored user document (hash included) by e-mail: one indexed read."""
        found = await self.store.find_documents(
            users.COLLECTION, {"email": users.normalize_email(email)}, limit=1
        )
        return found[0] if found else None

    async def set_user_status(
        self,
        user_id: str,
        status: str,
        *,
        actor: Principal | None = None,
        reason: str | None = None,
        client: ClientInfo = NO_CLIENT,
    ) -> JSON:
        """Activate or suspend; suspension also revokes every refresh-token family.

        Refused at once in this process (the user cache is dropped); other processes
        see it within ``recheck_seconds``."""
        users.check_status(status)
        user = await self._require_user(user_id)
        details = {"status": status, **({"reason": reason} if reason else {})}
        record = self._admin_record("user-status-changed", actor, user_id, details, client)
        saved = await self._save_user({**user, "status": status}, audit=record)
        if status == users.SUSPENDED:
            await self.refresh_tokens.revoke_user(user_id, "account suspended")
        return users.account_view(saved)

    async def set_roles(
        self,
        user_id: str,
        roles: Iterable[str],
        *,
        actor: Principal | None = None,
        client: ClientInfo = NO_CLIENT,
    ) -> JSON:
        """Replace a user's roles (platform roles and ``ORG:<ROLE>``)."""
        user = await self._require_user(user_id)
        checked = users.check_roles(roles)
        record = self._admin_record("user-roles-changed", actor, user_id,
                                    {"roles": ",".join(checked) or "(none)"}, client)
        return users.account_view(await self._save_user({**user, "roles": checked},
                                                        audit=record))

    def _admin_record(self, event: str, actor: Principal | None, subject_id: str,
                      details: dict[str, str], client: ClientInfo) -> AuditRecord:
        return AuditRecord(event, user_id=actor.user_id if actor else None,
                           user_email=actor.email if actor else "system",
                           subject_id=subject_id, details=details, client=client)

    def invalidate_user(self, user_id: str) -> None:
        """Forget the cached status and roles (call after writing a user elsewhere)."""
        self._users.discard(user_id)

    # -- sessions ----------------------------------------------------------------------
    async def login(
        self, email: str, password: str, client: ClientInfo = NO_CLIENT,
        device: KnownDevice | None = None,
    ) -> LoginResult | MfaRequired:
        """Check the password and open a session (or an MFA challenge).

        The same 401 for any wrong pair. Guessing is throttled with growing delays (NIST
        SP 800-63B 5.2.2; ``rate_limit.BACKOFFS``), never with a lockout: from a known
        device of the account (its ``hp_device`` cookie, :mod:`platform_api.auth.devices`)
        or an address it signed in from before, only that device's or address's own
        failures count; from anywhere else, the account's failures from unknown places
        and the address's failures on any account. An attacker can slow down guesses
        against an account, not stop its owner signing in from where they did before.
        While a delay runs the answer is 429 with ``Retry-After`` and the password is not
        even checked. A successful login clears the account's count and forgives its own
        attempt."""
        user = await self.verify_password(email, password, client, device)
        return await self.first_factor_passed(user, "password", client, device)

    async def verify_password(self, email: str, password: str,
                              client: ClientInfo = NO_CLIENT,
                              device: KnownDevice | None = None) -> JSON:
        """The first factor of a login (see :meth:`login`: the same refusals, throttling
        and audit): the active user document, without opening a session (the SMART
        authorization pages sign users in this way)."""
        account = users.normalize_email(email)
        user = await self.find_user_by_email(email)
        sources = await self._login_sources(user, account, client, device)
        await self._throttle(sources, account, client)
        stored_hash = user["password_hash"] if user is not None else None
        if not await self.passwords.verify_async(stored_hash, password) or user is None:
            await self.audit.record(AuditRecord(
                "login", MINOR_FAILURE, "wrong e-mail or password",
                user_id=user["id"] if user else None, user_email=account, client=client))
            raise invalid_credentials()
        # Checked after the password, so the status of an account is not disclosed.
        if user["status"] != users.ACTIVE:
            await self.audit.record(AuditRecord(
                "login", SERIOUS_FAILURE, "suspended account", user_id=user["id"],
                user_email=user["email"], client=client))
            raise account_suspended()
        for kind, key in sources:
            if kind == "account":
                await self.clear_login_failures(account)
            else:
                await self.limiter.forgive(key)
        return await self._rehash_if_needed(user, password)

    async def _login_sources(self, user: JSON | None, account: str, client: ClientInfo,
                             device: KnownDevice | None) -> list[tuple[str, str]]:
        """The (backoff kind, client) pairs a login attempt is counted against."""
        if user is not None:
            if device is not None and device.knows(user["id"]):
                return [("known", f"device:{device.id}|{user['id']}")]
            if client.ip and client.ip in (await self._known_addresses(user["id"])):
                return [("known", f"address:{client.ip}|{user['id']}")]
        address = "shared" if self._shared(client.ip) else "address"
        return [("account", f"account:{account}"), (address, f"ip:{client.ip}")]

    def _shared(self, ip: str | None) -> bool:
        """Whether ``ip`` is one an administrator named shared (a clinic's gateway)."""
        if not ip or not self.settings.shared_addresses:
            return False
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return any(address in ipaddress.ip_network(n, strict=False)
                   for n in self.settings.shared_addresses)

    async def _throttle(self, sources: list[tuple[str, str]], account: str,
                        client: ClientInfo) -> None:
        """Count the attempt against each source, or refuse it (429) while one of them
        must wait (what was counted already is forgiven)."""
        counted: list[str] = []
        for kind, key in sources:
            decision = await self.limiter.attempt(self.backoffs[kind], key)
            if not decision.allowed:
                for earlier in counted:
                    await self.limiter.forgive(earlier)
                await self.audit.record(AuditRecord(
                    "login", MINOR_FAILURE, f"refused: too many failed logins ({kind}); "
                    f"next attempt in {decision.retry_after} s", user_email=account,
                    client=client))
                raise rate_limited(decision, "failed logins")
            counted.append(key)

    async def clear_login_failures(self, account: str) -> None:
        """Forget an account's failed logins from unknown places (its owner proved the
        password)."""
        await self.limiter.reset("backoff", f"account:{users.normalize_email(account)}")

    async def password_reset(self, user: JSON, device: KnownDevice | None) -> None:
        """The owner proved the mailbox and chose a new password: forget the account's
        failed logins, from unknown places and from its known addresses and this device."""
        await self.clear_login_failures(user["email"])
        for ip in await self._known_addresses(user["id"]):
            await self.limiter.reset("backoff", f"address:{ip}|{user['id']}")
        if device is not None:
            await self.limiter.reset("backoff", f"device:{device.id}|{user['id']}")

    async def first_factor_passed(self, user: JSON, method: str, client: ClientInfo,
                                  device: KnownDevice | None = None
                                  ) -> LoginResult | MfaRequired:
        """A password or an ID token was accepted: a session (and the device cookie),
        or an MFA challenge."""
        if await self.mfa.is_active(user["id"]):
            challenge = await self.mfa.open_challenge(user["id"], method)
            return MfaRequired(challenge.mfa_token, challenge.expires_in)
        record = AuditRecord("login", user_id=user["id"], user_email=user["email"],
                             client=client, details={"method": method})
        return LoginResult(users.public_user(user), await self._open_session(user, record),
                           self.devices.signed_in(device, user["id"]))

    async def complete_mfa_login(self, mfa_token: str, code: str,
                                 client: ClientInfo = NO_CLIENT,
                                 device: KnownDevice | None = None) -> LoginResult:
        """Finish a login with its second factor (TOTP or recovery code)."""
        challenge = await self.mfa.find_challenge(mfa_token)
        user = await self.store.get_document(users.COLLECTION, challenge["user_id"])
        if user is None:
            raise invalid_token("the account no longer exists")
        if user["status"] != users.ACTIVE:
            raise account_suspended()
        known = await self._known_addresses(user["id"])
        try:
            async with self.store.unit_of_work() as uow:
                factor = await self.mfa.stage_redeem(challenge, code, uow)
                refresh_token, family_id = self.refresh_tokens.open_family(uow, user["id"])
                self._stage_login(uow, user, client, AuditRecord(
                    "mfa-challenge", user_id=user["id"], user_email=user["email"],
                    client=client, details={"method": challenge["method"], "factor": factor}),
                    known)
                await commit_code(uow)
        except ApiError as refused:
            await self.audit.record(AuditRecord(
                "mfa-challenge", MINOR_FAILURE, refused.message, user_id=user["id"],
                user_email=user["email"], client=client))
            raise
        access = self.issue_access_token(user, session_id=family_id)
        return LoginResult(users.public_user(user), self._pair(access, refresh_token),
                           self.devices.signed_in(device, user["id"]))

    async def refresh(self, refresh_token: str, client: ClientInfo = NO_CLIENT) -> LoginResult:
        """Rotate a refresh token: a new pair; a reused token revokes the family."""
        try:
            record = await self.refresh_tokens.lookup(refresh_token)
        except ApiError as refused:
            if refused.code == "REFRESH_TOKEN_REUSED":
                await self._audit_reuse(refresh_token, client)
            raise
        if record.family.get("kind") is not None:  # a SMART app's: never a platform session
            raise invalid_refresh_token("this refresh token belongs to an app; use the token "
                                        "endpoint that issued it")
        user = await self.store.get_document(users.COLLECTION, record.user_id)
        if user is None:
            await self.refresh_tokens.revoke_family(record.family_id, "user deleted")
            raise invalid_refresh_token("the account no longer exists")
        if user["status"] != users.ACTIVE:
            raise account_suspended()
        try:
            successor = await self.refresh_tokens.rotate(record)
        except ApiError as refused:
            if refused.code == "REFRESH_TOKEN_REUSED":
                await self._audit_reuse(refresh_token, client)
            raise
        access = self.issue_access_token(user, session_id=record.family_id)
        return LoginResult(users.public_user(user), self._pair(access, successor))

    async def _audit_reuse(self, refresh_token: str, client: ClientInfo) -> None:
        doc = await self.store.get_document(REFRESH_TOKENS, token_hash(refresh_token))
        await self.audit.record(AuditRecord(
            "token-refresh", SERIOUS_FAILURE,
            "refresh token reused: the session was revoked",
            user_id=doc["user_id"] if doc else None, client=client))

    async def logout(self, access_token: str, client: ClientInfo = NO_CLIENT) -> None:
        """Revoke the access token and its refresh-token family."""
        claims = self.codec.verify(access_token)
        async with self.store.unit_of_work() as uow:
            self.stage_token_revocation(uow, claims)
            if claims.sid is not None:
                await self.refresh_tokens.revoke_family(claims.sid, "logout", uow)
            self.audit.stage(uow, AuditRecord("logout", user_id=claims.sub,
                                              user_email=claims.email, client=client))
            await uow.commit()
        self.token_revoked(claims, access_token)

    def stage_token_revocation(self, uow: UnitOfWork, claims: AccessClaims) -> None:
        """Stage the revocation of one access token (every process refuses it within
        ``recheck_seconds``; call :meth:`token_revoked` after the commit)."""
        uow.put_document(REVOKED_TOKENS, claims.jti, {
            "id": claims.jti, "user_id": claims.sub,
            "expires_at": rfc3339(claims.expires_at), "revoked_at": rfc3339(time.time())})

    def token_revoked(self, claims: AccessClaims, token: str | None = None) -> None:
        """Refuse a revoked access token in this process from now on."""
        self._revoked.add(self._revoked.jtis, claims.jti, claims.expires_at)
        if token is not None:
            self._sessions.discard(token)

    async def revoke_sessions(self, user_id: str, reason: str) -> None:
        """End every session of a user (password reset): refresh families and, through
        them, the access tokens they issued."""
        await self.refresh_tokens.revoke_user(user_id, reason)

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

    def issue_smart_token(self, subject: str, smart: SmartClaims, *, ttl_seconds: int,
                          user: JSON | None = None, session_id: str | None = None
                          ) -> IssuedToken:
        """Sign a SMART access token: for ``user`` (a user document) through a SMART app,
        or for a backend services client (``subject`` its client id, no user)."""
        issued = self.codec.issue(
            subject=subject, roles=[] if user is None else user.get("roles", []),
            email=None if user is None else user.get("email"), session_id=session_id,
            ttl_seconds=ttl_seconds, smart=smart)
        self._sessions.put(issued.token, _Session(issued.claims))
        return issued

    def verify_token(self, token: str) -> AccessClaims:
        """The verified claims of an access token (signature, issuer, audience, expiry);
        ApiError 401 otherwise. Revocation and account status are not checked here."""
        session = self._sessions.get(token)
        claims = session.claims if session is not None else self.codec.verify(token)
        if time.time() >= claims.expires_at:
            raise token_expired()
        return claims

    # -- per request -------------------------------------------------------------------
    async def authenticate_credentials(
        self, authorization: str | None, api_key: str | None, client: ClientInfo = NO_CLIENT
    ) -> Principal:
        """The principal of a request's ``Authorization`` or ``X-API-Key`` header."""
        if api_key is not None:
            if authorization is not None:
                raise invalid_token("send either Authorization or X-API-Key, not both")
            return await self.authenticate_api_key(api_key, client)
        if authorization is None:
            raise missing_token()
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise missing_token("Authorization header must be 'Bearer <token>'")
        if token.startswith("hpk_"):
            raise invalid_token("API keys go in the X-API-Key header")
        if token.startswith(MFA_TOKEN_PREFIX):
            raise invalid_token("an MFA token only completes a login at /api/auth/mfa/challenge")
        return await self.authenticate(token)

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
        if claims.smart is not None:
            return await self._smart_principal(session, claims.smart)
        state = await self._active_user(claims.sub)
        await self._check_revocation(session)
        if session.state is not state or session.principal is None:
            session.state = state
            session.principal = Principal(
                user_id=claims.sub, email=state.email, roles=state.roles, token_id=claims.jti
            )
        return session.principal

    async def _active_user(self, user_id: str) -> _UserState:
        state = await self._user_state(user_id)
        if state is None:
            raise invalid_token("the account no longer exists")
        if state.status != users.ACTIVE:
            raise account_suspended()
        return state

    async def _check_revocation(self, session: _Session) -> None:
        if self._revoked.hit(session.claims):
            raise invalid_token("the token was revoked")
        if time.monotonic() - session.checked_at >= self.recheck_seconds:
            await self._recheck_revocation(session)

    async def _smart_principal(self, session: _Session, smart: SmartClaims) -> Principal:
        """The principal of a SMART access token: its client must still be registered
        and enabled, its user (if it has one) active, the token and its session live."""
        claims = session.claims
        standing = await self.smart_clients(smart.client_id) if self.smart_clients else None
        if standing is None:
            raise invalid_token("the SMART client is unknown or disabled")
        state = None if smart.backend else await self._active_user(claims.sub)
        await self._check_revocation(session)
        if session.principal is None or session.state is not state or \
                session.standing != standing:
            session.state, session.standing = state, standing
            grant = SmartAuthorization(
                smart.client_id, ScopeSet.parse(smart.scope), smart.patient, smart.encounter,
                smart.fhir_user, smart.backend, standing.organization, standing.platform_wide)
            session.principal = Principal(
                user_id=f"client:{smart.client_id}" if smart.backend else claims.sub,
                kind="smart", email=None if state is None else state.email,
                roles=frozenset() if state is None else state.roles, token_id=claims.jti,
                smart=grant)
        return session.principal

    async def authenticate_api_key(self, presented: str, client: ClientInfo = NO_CLIENT
                                   ) -> Principal:
        """The principal of an ``X-API-Key``: the key's owner, limited to its scopes."""
        key = await self.api_keys.verify(presented)
        state = await self._user_state(key["user_id"])
        if state is None:
            raise invalid_token("the account owning this API key no longer exists")
        if state.status != users.ACTIVE:
            raise account_suspended()
        if self.api_keys.usage_due(key["id"]):
            self.spawn(self._record_key_use(key, state, client), "API key usage record")
        # A key acts within its scopes for the account's memberships (ORG:<ROLE>), never
        # with its platform administrator powers: a leaked key must not be an admin.
        return Principal(user_id=key["user_id"], kind="api_key", email=state.email,
                         roles=state.roles - PLATFORM_ADMIN_ROLES,
                         scopes=frozenset(key["scopes"]), token_id=key["id"])

    def audit_refused_api_key(self, presented: str, refusal: ApiError,
                              client: ClientInfo) -> None:
        """Record a refused ``X-API-Key`` (after the response; the access middleware
        calls it while the caller is within its failure budget)."""
        key_id = presented[4:12] if presented.startswith("hpk_") else None
        self.spawn(self.audit.record(AuditRecord(
            "api-key-use", MINOR_FAILURE, refusal.message, api_key_id=key_id, client=client)),
            "audit of a refused API key")

    async def _record_key_use(self, key: JSON, state: _UserState, client: ClientInfo) -> None:
        async with self.store.unit_of_work() as uow:
            self.api_keys.stage_usage(uow, key["id"], client.ip)
            self.audit.stage(uow, AuditRecord(
                "api-key-use", user_id=key["user_id"], user_email=state.email,
                api_key_id=key["id"], api_key_name=key["name"], client=client,
                description="API key authentication (recorded at most once a minute)"))
            await uow.commit()

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

    async def _open_session(self, user: JSON, record: AuditRecord | None = None) -> TokenPair:
        known = await self._known_addresses(user["id"]) if record is not None else {}
        async with self.store.unit_of_work() as uow:
            refresh_token, family_id = self.refresh_tokens.open_family(uow, user["id"])
            if record is not None:
                self._stage_login(uow, user, record.client, record, known)
            await uow.commit()
        return self._pair(self.issue_access_token(user, session_id=family_id), refresh_token)

    async def _known_addresses(self, user_id: str) -> dict[str, float]:
        """The addresses a user signed in from lately (address -> epoch seconds)."""
        login = await self.store.get_document(LOGINS, user_id) or {}
        now = time.time()
        return {ip: seen for ip, seen in (login.get("known_addresses") or {}).items()
                if now - seen < KNOWN_ADDRESS_DAYS * 86400}

    def _stage_login(self, uow: UnitOfWork, user: JSON, client: ClientInfo,
                     record: AuditRecord, known: dict[str, float]) -> None:
        """The audit event and last-login record of a successful login, with the
        addresses the user signed in from (the latest ``KNOWN_ADDRESSES``)."""
        self.audit.stage(uow, record)
        now = time.time()
        if client.ip:
            known = {**known, client.ip: now}
        latest = dict(sorted(known.items(), key=lambda item: -item[1])[:KNOWN_ADDRESSES])
        uow.put_document(LOGINS, user["id"], {
            "id": user["id"], "last_login_at": rfc3339(now), "last_login_ip": client.ip,
            "known_addresses": latest})

    def _pair(self, access: IssuedToken, refresh_token: str) -> TokenPair:
        expires_in = max(0, round(access.expires_at - time.time()))
        return TokenPair(access.token, refresh_token, expires_in)

    async def insert_user(
        self, user: JSON, also: Callable[[UnitOfWork], None] | None = None
    ) -> None:
        """Insert with its creation event; a clash on referral code draws a new one.

        ``also(uow)`` stages more writes in the same unit of work (a social identity)."""
        for _attempt in range(3):
            try:
                async with self.store.unit_of_work() as uow:
                    uow.insert_document(users.COLLECTION, user["id"], user)
                    uow.emit(USER_CREATED, users.created_event(user), source_service=SOURCE_SERVICE)
                    if also is not None:
                        also(uow)
                    await uow.commit()
                return
            except DuplicateDocument:
                if await self.find_user_by_email(user["email"]) is not None:
                    raise email_taken() from None
                user["referral_code"] = users.new_referral_code()
        raise RuntimeError("could not draw a unique referral code in 3 attempts")

    async def _save_user(self, user: JSON, audit: AuditRecord | None = None) -> JSON:
        async with self.store.unit_of_work() as uow:
            uow.put_document(users.COLLECTION, user["id"], user)
            if audit is not None:
                self.audit.stage(uow, audit)
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

"""E-mail verification and password reset: links with single-use tokens, sent by SMTP.

Links point at the web front end (``web_app_url``, default ``public_base_url``):
``<base>/verify-email?token=ev_…`` and ``<base>/reset-password?token=pr_…``; the page
posts the token to ``/api/auth/verify-email`` or ``/api/auth/reset-password``.

Requests that name an e-mail address (forgot password, resend verification) answer the
same, at once, whether or not an account has that address: the lookup, the token and
the SMTP conversation happen after the response (:meth:`AuthService.spawn`), so neither
the answer nor its timing tells an attacker which addresses are registered.

A registration with an address that already has an account answers as for a new one
(``AuthService.register``) and this module tells the owner by e-mail instead.

A password reset marks the token used, retires the account's other reset links, sets the
new password, revokes every session (refresh families and their access tokens) and
clears the failed-login count; it also proves the mailbox, so the address is verified.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from platform_api.audit import AuditRecord, ClientInfo
from platform_api.auth import users
from platform_api.auth.devices import KnownDevice
from platform_api.auth.one_time import (
    EMAIL_VERIFICATION,
    PASSWORD_RESET,
    Purpose,
    commit_use,
    invalid,
)
from platform_api.auth.tokens import rfc3339

if TYPE_CHECKING:
    from platform_api.auth.service import AuthService

log = logging.getLogger("healthplatform.auth")

JSON = users.JSON


class AccountEmails:
    def __init__(self, auth: AuthService):
        self.auth = auth

    def link(self, path: str, token: str) -> str:
        settings = self.auth.settings
        base = (settings.web_app_url or settings.public_base_url).rstrip("/")
        return f"{base}{path}?token={token}"

    # -- e-mail verification -----------------------------------------------------------
    def send_verification_later(self, user: JSON) -> None:
        if not user.get("email_verified"):
            self.auth.spawn(self._send_verification(user), "verification e-mail")

    def resend_verification_later(self, email: str) -> None:
        self.auth.spawn(self._resend_verification(email), "verification e-mail")

    async def _resend_verification(self, email: str) -> None:
        user = await self.auth.find_user_by_email(email)
        if user is None or user["status"] != users.ACTIVE or user.get("email_verified"):
            log.info("verification e-mail not sent: no unverified active account")
            return
        await self._send_verification(user)

    async def _send_verification(self, user: JSON) -> None:
        name = self.auth.settings.service_name
        await self._mail_link(
            user, EMAIL_VERIFICATION, self.auth.settings.email_verification_ttl_seconds,
            f"Confirm your e-mail address for {name}", "/verify-email",
            f"Please confirm that this is your e-mail address for {name}:",
            "If you did not create an account, ignore this message.")

    async def _mail_link(self, user: JSON, purpose: Purpose, ttl: int, subject: str, path: str,
                         intro: str, closing: str) -> None:
        """Mail ``user`` a single-use link to ``path`` (a token of ``purpose`` valid for
        ``ttl`` seconds); with e-mail disabled no token is made (nobody would receive it)."""
        if not self.auth.mailer.enabled:
            self.auth.mailer.report_disabled(subject)
            return
        token = await self._new_token(purpose, user, ttl)
        await self.auth.mailer.send(user["email"], subject, (
            f"Hello {user['first_name']},\n\n{intro}\n\n{self.link(path, token)}\n\n"
            f"The link works once, for {_hours(ttl)}. {closing}\n"
        ))

    # -- a registration with a taken address ----------------------------------------------
    def send_registration_notice_later(self, user: JSON) -> None:
        """Someone tried to register ``user``'s address: tell its owner (the answer to the
        registration was the same as for a new address)."""
        self.auth.spawn(self._send_registration_notice(user), "registration notice e-mail")

    async def _send_registration_notice(self, user: JSON) -> None:
        settings = self.auth.settings
        subject = f"Someone tried to create a {settings.service_name} account for you"
        if not self.auth.mailer.enabled:
            self.auth.mailer.report_disabled(subject)
            return
        base = (settings.web_app_url or settings.public_base_url).rstrip("/")
        await self.auth.mailer.send(user["email"], subject, (
            f"Hello {user['first_name']},\n\nSomeone tried to create a "
            f"{settings.service_name} account with this e-mail address, which already has "
            "one. No new account was made and nothing of yours changed.\n\n"
            f"If it was you: log in at {base}, or choose a new password at "
            f"{base}/forgot-password if you forgot it. If it was not you, ignore this "
            "message.\n"))

    async def verify_email(self, token: str, client: ClientInfo) -> JSON:
        """Mark the address of the token's account verified; returns the account."""
        doc = await self.auth.one_time.find(EMAIL_VERIFICATION, token)
        user = await self.auth.store.get_document(users.COLLECTION, doc["user_id"])
        if user is None or user["email"] != doc.get("email"):
            # The account is gone, or its address changed after the link was sent.
            raise invalid(EMAIL_VERIFICATION, "not valid")
        verified = {**user, "email_verified": True, "email_verified_at": rfc3339(time.time())}
        async with self.auth.store.unit_of_work() as uow:
            self.auth.one_time.stage_use(uow, doc)
            uow.put_document(users.COLLECTION, user["id"], verified)
            self.auth.audit.stage(uow, AuditRecord(
                "email-verified", user_id=user["id"], user_email=user["email"], client=client))
            await commit_use(uow, EMAIL_VERIFICATION)
        self.auth.invalidate_user(user["id"])
        return users.account_view(verified)

    # -- password reset ----------------------------------------------------------------
    def request_password_reset_later(self, email: str) -> None:
        self.auth.spawn(self._send_reset(email), "password reset e-mail")

    async def _send_reset(self, email: str) -> None:
        user = await self.auth.find_user_by_email(email)
        if user is None or user["status"] != users.ACTIVE:
            log.info("password reset e-mail not sent: no active account for the address")
            return
        name = self.auth.settings.service_name
        await self._mail_link(
            user, PASSWORD_RESET, self.auth.settings.password_reset_ttl_seconds,
            f"Reset your {name} password", "/reset-password",
            f"Someone asked to reset the password of your {name} account. To choose a new "
            "one, open:",
            "Resetting signs you out everywhere. If you did not ask for this, ignore this "
            "message: your password stays as it is.")

    async def reset_password(self, token: str, password: str, client: ClientInfo,
                             device: KnownDevice | None = None) -> None:
        users.check_password(password)
        doc = await self.auth.one_time.find(PASSWORD_RESET, token)
        user = await self.auth.store.get_document(users.COLLECTION, doc["user_id"])
        if user is None or user["status"] != users.ACTIVE:
            raise invalid(PASSWORD_RESET, "not valid")
        users.check_password(password, self.auth.password_context(user))
        changed = {**user, "password_hash": await self.auth.passwords.hash_async(password),
                   "email_verified": True}
        async with self.auth.store.unit_of_work() as uow:
            self.auth.one_time.stage_use(uow, doc)
            await self.auth.one_time.stage_retire_others(uow, PASSWORD_RESET, user["id"],
                                                         keep=doc["id"])
            uow.put_document(users.COLLECTION, user["id"], changed)
            self.auth.audit.stage(uow, AuditRecord(
                "password-reset", user_id=user["id"], user_email=user["email"],
                client=client, details={"sessions": "revoked"}))
            await commit_use(uow, PASSWORD_RESET)
        self.auth.invalidate_user(user["id"])
        await self.auth.revoke_sessions(user["id"], "password reset")
        await self.auth.password_reset(user, device)

    async def _new_token(self, purpose: Purpose, user: JSON, ttl: int) -> str:
        async with self.auth.store.unit_of_work() as uow:
            token = self.auth.one_time.stage(uow, purpose, user["id"], ttl, email=user["email"])
            await uow.commit()
        return token


def _hours(seconds: int) -> str:
    if seconds % 3600 == 0:
        hours = seconds // 3600
        return f"{hours} hour" + ("s" if hours != 1 else "")
    return f"{max(1, seconds // 60)} minutes"

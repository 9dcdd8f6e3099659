"""Outgoing e-mail over SMTP (``aiosmtplib``) to the configured server.

Used by the auth area for e-mail verification and password reset links. With no
``smtp_host`` configured e-mail is *disabled*: messages are dropped (a warning says so
once; never with the body, whose link carries a secret), and ``/api/admin/health``
reports ``disabled``, so an embedded install without a mail server still starts.

TLS (``smtp_tls``): ``auto`` upgrades with STARTTLS when the server offers it,
``starttls`` requires it, ``implicit`` is TLS from the first byte (port 465), ``none``
never encrypts (a local relay or a test server).

The **mail log** (:class:`MailLog`, documents ``mail_log/<Message-ID>``) records each
message sent (recipient, subject, status ``sent``); the e-mail delivery platform's
webhooks (``platform_api.webhooks.gtm``) move it on (delivered, opened, bounced,
complained). An address that bounced or complained is **suppressed**
(``mail_suppressions/<address>``): the mailer no longer sends to it, so the platform's
sending reputation does not suffer from mailing a dead address again and again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import make_msgid

import aiosmtplib

from fhir_server.clock import now_instant
from fhir_server.store import ResourceStore

log = logging.getLogger("healthplatform.mail")

MAIL_LOG = "mail_log"
SUPPRESSIONS = "mail_suppressions"

TLS_MODES = ("auto", "starttls", "implicit", "none")


@dataclass(frozen=True, slots=True)
class SmtpConfig:
    host: str
    port: int
    sender: str
    username: str = ""
    password: str = ""
    tls: str = "auto"
    timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.tls not in TLS_MODES:
            raise ValueError(f"smtp_tls must be one of {', '.join(TLS_MODES)}, not {self.tls!r}")


def message_key(message_id: str) -> str:
    """A Message-ID as the mail log's key: without its angle brackets."""
    return message_id.strip().strip("<>")


class MailLog:
    """What was sent, what became of it, and the addresses not to mail any more."""

    def __init__(self, store: ResourceStore):
        self.store = store

    async def suppressed(self, address: str) -> bool:
        return await self.store.get_document(SUPPRESSIONS, address.strip().lower()) \
            is not None

    async def sent(self, message_id: str, to: str, subject: str) -> None:
        key = message_key(message_id)
        async with self.store.unit_of_work() as uow:
            uow.put_document(MAIL_LOG, key, {
                "id": key, "to": to, "subject": subject, "status": "sent",
                "sent_at": now_instant(), "updated_at": now_instant(), "events": []})
            await uow.commit()


class Mailer:
    """Send plain-text e-mail; ``enabled`` is false without an SMTP host. With a
    :class:`MailLog`, what is sent is logged and suppressed addresses are skipped."""

    def __init__(self, config: SmtpConfig, mail_log: MailLog | None = None):
        self.config = config
        self.mail_log = mail_log
        self._warned_disabled = False

    @property
    def enabled(self) -> bool:
        return bool(self.config.host)

    def _client(self) -> aiosmtplib.SMTP:
        tls, config = self.config.tls, self.config
        return aiosmtplib.SMTP(
            hostname=config.host, port=config.port, timeout=config.timeout,
            username=config.username or None, password=config.password or None,
            use_tls=tls == "implicit",
            # None lets aiosmtplib upgrade when the server offers STARTTLS.
            start_tls={"auto": None, "starttls": True}.get(tls, False),
        )

    def compose(self, to: str, subject: str, body: str) -> EmailMessage:
        message = EmailMessage()
        message["From"] = self.config.sender
        message["To"] = to
        message["Subject"] = subject
        message["Message-ID"] = make_msgid(domain=self.config.sender.rpartition("@")[2].strip(">"))
        message.set_content(body)
        return message

    async def send(self, to: str, subject: str, body: str) -> bool:
        """Send one message; ``False`` (and a log line) when disabled or refused."""
        if not self.enabled:
            self.report_disabled(subject)
            return False
        if self.mail_log is not None and await self.mail_log.suppressed(to):
            log.info("not sending %r: the address bounced or complained before", subject)
            return False
        client = self._client()
        message = self.compose(to, subject, body)
        try:
            async with client:
                await client.send_message(message)
        except (aiosmtplib.SMTPException, OSError) as exc:
            log.error("sending %r to %s via %s:%s failed: %s", subject, to,
                      self.config.host, self.config.port, exc)
            return False
        if self.mail_log is not None:
            await self.mail_log.sent(str(message["Message-ID"]), to, subject)
        return True

    def report_disabled(self, subject: str) -> None:
        """Log that a message is not sent: a warning once per process (an install without
        a mail server is a choice, not news), then debug lines."""
        level = logging.DEBUG if self._warned_disabled else logging.WARNING
        self._warned_disabled = True
        log.log(level, "e-mail is disabled (no smtp_host): not sending %r", subject)

    async def check(self) -> str:
        """``ok``, ``disabled`` or ``unreachable: <reason>`` (for the health report)."""
        if not self.enabled:
            return "disabled"
        client = self._client()
        try:
            await client.connect()
            await client.noop()
        except (aiosmtplib.SMTPException, OSError) as exc:
            return f"unreachable: {exc}"
        finally:
            if client.is_connected:
                try:
                    await client.quit()
                except (aiosmtplib.SMTPException, OSError):
                    client.close()
        return "ok"

"""Outgoing e-mail over SMTP (``aiosmtplib``) to the configured server.

Used by the auth area for e-mail verification and password reset links. With no
``smtp_host`` configured e-mail is *disabled*: messages are dropped (a warning says so
once; never with the body, whose link carries a secret), and ``/api/admin/health``
reports ``disabled``, so an embedded install without a mail server still starts.

TLS (``smtp_tls``): ``auto`` upgrades with STARTTLS when the server offers it,
``starttls`` requires it, ``implicit`` is TLS from the first byte (port 465), ``none``
never encrypts (a local relay or a test server).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import make_msgid

import aiosmtplib

log = logging.getLogger("healthplatform.mail")

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


class Mailer:
    """Send plain-text e-mail; ``enabled`` is false without an SMTP host."""

    def __init__(self, config: SmtpConfig):
        self.config = config
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
        client = self._client()
        try:
            async with client:
                await client.send_message(self.compose(to, subject, body))
        except (aiosmtplib.SMTPException, OSError) as exc:
            log.error("sending %r to %s via %s:%s failed: %s", subject, to,
                      self.config.host, self.config.port, exc)
            return False
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

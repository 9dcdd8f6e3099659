"""Housekeeping: bookkeeping the platform no longer needs is deleted on a schedule.

Health data (FHIR resources and their versions) is never touched here. What goes:

- HL7v2 idempotency records (``hl7_messages``) older than ``hl7_record_retention_days``:
  a resend after that is processed afresh (senders resend within minutes or hours);
- events the bus dispatched, older than ``event_retention_days`` (events not yet
  dispatched, and the dead letters, stay until handled);
- the ids of inbound webhook events received (``webhook_receipts``), after
  ``webhook_receipt_retention_days``, and the consumers' records of the events they
  handled (``handled_events``), after ``handled_event_retention_days``: platforms
  redeliver within hours or days, brokers within minutes;
- refresh tokens, MFA challenges and one-time tokens (password reset, e-mail
  verification) a day after they expired, with their single-use guards, and the record of
  each TOTP code used (a replay guard needed only while the code is valid) a day after;
- the SMART authorization server's short-lived records a day after they expired:
  authorization codes, EHR launch contexts, pending /authorize requests, management-page
  sessions and the ``jti`` of client assertions (a replay guard needed only while the
  assertion is valid);
- the fingerprints of anonymous feedback texts, once the day in which the same text is
  refused as a repeat is over.

Without it every message, login and event left a row behind for ever: a lab sending 50
messages a second adds four million idempotency records a day. The pass runs every
``housekeeping_interval_seconds`` in the server (0 turns it off) and on demand with
``healthplatform purge``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from fhir_server.search.dates import fmt
from fhir_server.store import ResourceStore
from hl7_gateway.gateway import MESSAGES
from platform_api.auth import mfa, one_time, refresh
from platform_api.auth.tokens import rfc3339
from platform_api.events import HANDLED
from platform_api.feedback.routes import FINGERPRINTS
from platform_api.feedback.spam import REPEAT_WINDOW_SECONDS
from platform_api.settings import Settings
from platform_api.smart import oauth as smart
from platform_api.webhooks.inbound import RECEIPTS as WEBHOOK_RECEIPTS

__all__ = ["Housekeeping", "Rule"]

log = logging.getLogger("healthplatform.housekeeping")

DAY = 24 * 3600.0
EXPIRY_GRACE = DAY  # an expired token still answers "expired" for a day, then goes


def _instant(epoch: float) -> str:
    """The store's sortable instant text, as in ``hl7_messages.received_at`` and the
    outbox's timestamps."""
    return fmt(datetime.fromtimestamp(epoch, UTC))


@dataclass(frozen=True)
class Rule:
    """Documents of ``collection`` whose ``field`` is older than ``age`` seconds go, and
    the documents with their ids in ``companions``; ``stamp`` writes an epoch time the
    way the collection stores its instants, so that they compare as text."""

    name: str
    collection: str
    field: str
    age: float
    stamp: Callable[[float], str] = rfc3339
    companions: tuple[str, ...] = ()


class Housekeeping:
    def __init__(self, store: ResourceStore, settings: Settings):
        self.store, self.settings = store, settings
        self.rules = [
            Rule("hl7_records", MESSAGES, "received_at",
                 settings.hl7_record_retention_days * DAY, stamp=_instant),
            Rule("refresh_tokens", refresh.TOKENS, "expires_at", EXPIRY_GRACE,
                 companions=(refresh.USES,)),
            Rule("mfa_challenges", mfa.CHALLENGES, "expires_at", EXPIRY_GRACE,
                 companions=(mfa.CHALLENGES + "_uses",)),
            # a used TOTP step only guards against a replay while the code is valid (90 s)
            Rule("mfa_used_steps", mfa.USED_STEPS, "used_at", EXPIRY_GRACE),
            Rule("one_time_tokens", one_time.TOKENS, "expires_at", EXPIRY_GRACE,
                 companions=(one_time.USES,)),
            Rule("smart_codes", smart.CODES, "expires_at", EXPIRY_GRACE,
                 companions=(smart.CODE_USES,)),
            Rule("smart_launches", smart.LAUNCHES, "expires_at", EXPIRY_GRACE,
                 companions=(smart.LAUNCH_USES,)),
            Rule("smart_auth_requests", smart.AUTH_REQUESTS, "expires_at", EXPIRY_GRACE),
            Rule("smart_manage_sessions", smart.MANAGE_SESSIONS, "expires_at", EXPIRY_GRACE),
            Rule("smart_assertions", smart.ASSERTIONS, "expires_at", EXPIRY_GRACE),
            Rule("webhook_receipts", WEBHOOK_RECEIPTS, "received_at",
                 settings.webhook_receipt_retention_days * DAY, stamp=_instant),
            Rule("handled_events", HANDLED, "handled_at",
                 settings.handled_event_retention_days * DAY, stamp=_instant),
            Rule("feedback_fingerprints", FINGERPRINTS, "seen_at", REPEAT_WINDOW_SECONDS,
                 stamp=_instant),
        ]
        self._task: asyncio.Task[None] | None = None

    async def run_once(self, now: float | None = None) -> dict[str, int]:
        """One pass: how many records of each kind went."""
        now = time.time() if now is None else now
        purged = {}
        for rule in self.rules:
            purged[rule.name] = await self.store.purge_documents(
                rule.collection, rule.field, rule.stamp(now - rule.age),
                companions=rule.companions)
        purged["events"] = await self.store.purge_dispatched_events(
            _instant(now - self.settings.event_retention_days * DAY))
        return purged

    def start(self) -> None:
        """Run a pass every ``housekeeping_interval_seconds`` (the first one after the
        first interval, so that starting stays quick); 0 turns housekeeping off."""
        if self.settings.housekeeping_interval_seconds > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._every_interval())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _every_interval(self) -> None:
        while True:
            await asyncio.sleep(self.settings.housekeeping_interval_seconds)
            try:
                purged = await self.run_once()
            except Exception:  # a failed pass is retried at the next interval
                log.exception("housekeeping pass failed")
            else:
                if any(purged.values()):
                    log.info("housekeeping purged %s", purged)

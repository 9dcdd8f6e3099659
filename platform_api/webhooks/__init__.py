"""Inbound webhooks: signed notifications from external platforms (spec: Events,
Inbound webhooks), one module per platform family:

- ``POST /api/webhooks/billing`` (:mod:`.billing`): ``stripe``, ``Stripe-Signature``;
- ``POST /api/webhooks/video`` (:mod:`.video`): ``livekit-api``, a JWT with the body's
  SHA-256;
- ``POST /api/payments/webhooks/mobile-money-a`` / ``-b`` (:mod:`.mobile_money`): a
  per-payment callback token, an address allow-list, the provider's status query;
- ``GET`` / ``POST /webhook`` (:mod:`.messaging`): the verify token /
  ``X-Hub-Signature-256`` (HMAC-SHA256);
- ``POST /api/gtm/webhooks/email-delivery`` and ``/inbound`` (:mod:`.gtm`) and
  ``POST /api/workforce/webhooks/leave-approved`` (:mod:`.workforce`):
  ``standardwebhooks``.

What every endpoint does (HTTPS, signature first, once per event id, 200 at once, the
work through the bus) is :mod:`.inbound`.
"""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.services import Services
from platform_api.webhooks import billing, gtm, messaging, mobile_money, video, workforce

router = APIRouter()
for family in (billing, video, mobile_money, messaging, gtm, workforce):
    router.include_router(family.router)


def install(services: Services) -> None:
    """Subscribe the consumers that do the webhooks' work."""
    billing.install(services)
    messaging.install(services)
    gtm.install(services)


__all__ = ["install", "router"]

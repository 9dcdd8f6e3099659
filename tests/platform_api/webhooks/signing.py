"""Signing webhook requests the way each platform does, with its official library where
one exists (stripe, livekit-api, standardwebhooks)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import stripe
from livekit.api import AccessToken
from standardwebhooks import Webhook

from tests.platform_api.webhooks.conftest import (
    BILLING_SECRET,
    EMAIL_SECRET,
    MESSAGING_SECRET,
    VIDEO_KEY,
    VIDEO_SECRET,
)


def body_of(payload: Any) -> bytes:
    return payload if isinstance(payload, bytes) else orjson.dumps(payload)


def stripe_headers(body: bytes, *, secret: str = BILLING_SECRET, age: int = 0
                   ) -> dict[str, str]:
    header = stripe.WebhookSignature.generate_signature_header(
        body.decode(), secret, timestamp=int(time.time()) - age)
    return {"Stripe-Signature": header, "Content-Type": "application/json"}


def livekit_headers(body: bytes, *, secret: str = VIDEO_SECRET, key: str = VIDEO_KEY,
                    ttl: timedelta = timedelta(minutes=5)) -> dict[str, str]:
    digest = base64.b64encode(hashlib.sha256(body).digest()).decode()
    token = AccessToken(key, secret).with_sha256(digest).with_ttl(ttl).to_jwt()
    return {"Authorization": token, "Content-Type": "application/webhook+json"}


def hub_headers(body: bytes, *, secret: str = MESSAGING_SECRET) -> dict[str, str]:
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={signature}", "Content-Type": "application/json"}


def standard_headers(body: bytes, webhook_id: str, *, secret: str = EMAIL_SECRET,
                     age: timedelta = timedelta(0)) -> dict[str, str]:
    at = datetime.now(UTC) - age
    signature = Webhook(secret).sign(webhook_id, at, body.decode())
    return {"webhook-id": webhook_id, "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signature, "Content-Type": "application/json"}

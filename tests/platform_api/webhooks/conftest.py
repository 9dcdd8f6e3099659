"""Fixtures of the webhook tests: the app with every webhook's secret configured, a
client that arrives over HTTPS (``secure``) beside the plain-HTTP ``client``, and readers
of what a webhook left behind (receipts, dead letters, events)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from platform_api.events import DEAD_LETTERS
from platform_api.settings import Settings
from platform_api.webhooks.inbound import RECEIPTS
from tests.conftest import make_settings

BILLING_SECRET = "whsec_kliniki_billing_3f9a1c"
VIDEO_KEY, VIDEO_SECRET = "APIkliniki01", "video-secret-9c2f7e41b8d64a0f9e1d3c5b7a9f2e4d"
MESSAGING_TOKEN, MESSAGING_SECRET = "kliniki-verify-7731", "whatsapp-app-secret-55c1"
EMAIL_SECRET = "whsec_" + base64.b64encode(b"email-delivery-signing-key-0001").decode()
INBOUND_SECRET = "whsec_" + base64.b64encode(b"inbound-forms-signing-key-00002").decode()
LEAVE_SECRET = "whsec_" + base64.b64encode(b"hr-system-leave-signing-key-003").decode()
SECRETS: dict[str, Any] = {
    "billing_webhook_secret": BILLING_SECRET, "video_api_key": VIDEO_KEY,
    "video_api_secret": VIDEO_SECRET, "messaging_verify_token": MESSAGING_TOKEN,
    "messaging_app_secret": MESSAGING_SECRET, "email_webhook_secret": EMAIL_SECRET,
    "inbound_webhook_secret": INBOUND_SECRET, "leave_webhook_secret": LEAVE_SECRET,
    "trusted_proxies": ["10.20.0.0/16"],
}


WEBHOOK_TOPICS = ("platform.webhook.", "platform.video.", "platform.workforce.",
                  "platform.billing.", "platform.gtm.", "platform.payments.")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, **SECRETS)


@pytest.fixture
async def secure(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client whose requests arrive over TLS."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="https://testserver") as c:
        yield c


async def stored(app: Any, collection: str) -> list[dict[str, Any]]:
    return await app.state.services.store.find_documents(collection, limit=1000)


@pytest.fixture
def published(app: Any) -> list[dict[str, Any]]:
    """Every event the app publishes from now on."""
    return recorder(app, "platform.>", "everything")


async def nothing_kept(app: Any, published: list[dict[str, Any]]) -> bool:
    """No receipt, no dead letter, no event: what a refused request leaves behind."""
    store = app.state.services.store
    await app.state.services.bus.drain()
    return (await store.count_documents(RECEIPTS) == 0
            and await store.count_documents(DEAD_LETTERS) == 0
            and not [e for e in published if e["topic"].startswith(WEBHOOK_TOPICS)])


def recorder(app: Any, pattern: str, consumer: str) -> list[dict[str, Any]]:
    """The events of ``pattern`` as a consumer of that name receives them."""
    seen: list[dict[str, Any]] = []

    async def handler(event: dict[str, Any]) -> None:
        seen.append(event)
    app.state.services.bus.subscribe(pattern, handler, consumer=consumer)
    return seen


async def dead_letters(app: Any) -> list[dict[str, Any]]:
    await app.state.services.bus.drain()
    return await app.state.services.store.find_documents(DEAD_LETTERS, order_by="created_at")

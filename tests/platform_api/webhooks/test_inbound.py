"""What every webhook endpoint does: HTTPS only (TLS, or a trusted proxy's word), the
answer before the work, a secret that is not configured, the client's address."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.webhooks.inbound import RECEIPTS
from tests.conftest import make_settings
from tests.platform_api.webhooks.conftest import LEAVE_SECRET, nothing_kept
from tests.platform_api.webhooks.signing import (
    body_of,
    hub_headers,
    livekit_headers,
    standard_headers,
    stripe_headers,
)

CHECKOUT = {"id": "evt_1Q2w3E4r5T6y7U8i", "object": "event", "type": "invoice.paid",
            "created": 1764000000, "data": {"object": {"id": "in_1"}}}
LEAVE = {"leave_request_id": "LR-2026-118", "organization_id": "org-1", "user_id": "u-7",
         "start": "2026-12-01", "end": "2026-12-05", "type": "annual",
         "approved_by": "u-1"}


def signed_requests() -> list[tuple[str, str, bytes, dict[str, str]]]:
    """(method, path, body, headers) of a correctly signed request to each endpoint."""
    stripe_body = body_of(CHECKOUT)
    video_body = body_of({"event": "room_started", "id": "EV_kx91", "createdAt": "1764000000",
                          "room": {"sid": "RM_1", "name": "consult-4411"}})
    hub_body = body_of({"object": "whatsapp_business_account", "entry": []})
    leave_body = body_of(LEAVE)
    return [
        ("POST", "/api/webhooks/billing", stripe_body, stripe_headers(stripe_body)),
        ("POST", "/api/webhooks/video", video_body, livekit_headers(video_body)),
        ("POST", "/api/payments/webhooks/mobile-money-a?order_id=INV-1&token=t", b"{}", {}),
        ("POST", "/api/payments/webhooks/mobile-money-b?order_id=INV-1&token=t", b"{}", {}),
        ("GET", "/webhook?hub.mode=subscribe&hub.verify_token=kliniki-verify-7731"
                "&hub.challenge=1158201444", b"", {}),
        ("POST", "/webhook", hub_body, hub_headers(hub_body)),
        ("POST", "/api/gtm/webhooks/email-delivery", b"{}", standard_headers(b"{}", "msg_1")),
        ("POST", "/api/gtm/webhooks/inbound", b"{}", standard_headers(b"{}", "msg_2")),
        ("POST", "/api/workforce/webhooks/leave-approved", leave_body,
         standard_headers(leave_body, "msg_3", secret=LEAVE_SECRET)),
    ]


@pytest.mark.parametrize(("method", "path", "body", "headers"), signed_requests(),
                         ids=lambda v: v if isinstance(v, str) and v.startswith(("/", "G", "P"))
                         else "")
async def test_a_request_over_plain_http_is_refused_with_nothing_kept(
        app, client, published, method, path, body, headers):
    response = await client.request(method, path, content=body, headers=headers)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "HTTPS_REQUIRED"
    assert await nothing_kept(app, published)


async def test_https_said_by_a_trusted_proxy_is_believed_and_by_anyone_else_not(app):
    body = body_of(LEAVE)

    async def post(peer: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=(peer, 40112))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            return await c.post("/api/workforce/webhooks/leave-approved", content=body,
                                headers={**standard_headers(body, f"msg-{peer}",
                                                            secret=LEAVE_SECRET),
                                         "X-Forwarded-Proto": "https",
                                         "X-Forwarded-For": "196.201.214.200"})
    assert (await post("10.20.3.4")).status_code == 200  # the load balancer
    refused = await post("203.0.113.9")  # a client claiming HTTPS itself
    assert refused.status_code == 403


async def test_the_answer_does_not_wait_for_a_slow_consumer(app, secure):
    release, started = asyncio.Event(), asyncio.Event()

    async def slow_roster_update(event: dict[str, Any]) -> None:
        started.set()
        await release.wait()
    app.state.services.bus.subscribe("platform.workforce.leave_approved", slow_roster_update,
                                     consumer="rosters")
    body = body_of(LEAVE)
    first = await secure.post("/api/workforce/webhooks/leave-approved", content=body,
                              headers=standard_headers(body, "msg_slow_1", secret=LEAVE_SECRET))
    await asyncio.wait_for(started.wait(), 10)  # the consumer has it, and is stuck
    second = await secure.post("/api/workforce/webhooks/leave-approved", content=body,
                               headers=standard_headers(body, "msg_slow_2",
                                                        secret=LEAVE_SECRET))
    assert (first.status_code, second.status_code) == (200, 200)  # answered meanwhile
    release.set()
    await app.state.services.bus.drain()


async def test_an_endpoint_without_its_secret_answers_503_so_the_platform_retries(tmp_path):
    app = create_app(make_settings(tmp_path))
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="https://testserver") as c:
            body = body_of(CHECKOUT)
            for path, headers in (("/api/webhooks/billing", stripe_headers(body)),
                                  ("/api/webhooks/video", livekit_headers(body)),
                                  ("/webhook", hub_headers(body)),
                                  ("/api/gtm/webhooks/inbound", standard_headers(body, "m"))):
                response = await c.post(path, content=body, headers=headers)
                assert response.status_code == 503, path
                assert response.json()["error"]["code"] == "WEBHOOK_NOT_CONFIGURED"
            handshake = await c.get("/webhook?hub.mode=subscribe&hub.verify_token=&"
                                    "hub.challenge=1")
            assert handshake.status_code == 503
        assert await app.state.services.store.count_documents(RECEIPTS) == 0

"""``POST /api/webhooks/video``: the video platform's room events (LiveKit-style).

Verification: the ``Authorization`` header carries a JWT signed (HS256) with the API
secret, issued by the API key, whose ``sha256`` claim is the base64 SHA-256 digest of the
body; ``livekit-api``'s ``WebhookReceiver`` (with its ``TokenVerifier``) checks the
signature, the issuer, the expiry (a stale token is refused) and the digest, with
``HEALTHPLATFORM_VIDEO_API_KEY`` / ``HEALTHPLATFORM_VIDEO_API_SECRET``. The event id is
the event's ``id``.

Effect: the notification *is* the event; it is published as ``platform.video.<event>``
for ``room_started``, ``room_finished``, ``participant_joined``, ``participant_left`` and
``track_published`` with the payload agreed with the Scheduling area (its consumer of
``platform.video.>`` updates the telemedicine session Encounter, identified by
``urn:healthplatform:telemedicine-room|<room name>``, and its participants)::

    {event, room_name, room_sid, participant_identity, participant_sid, track_sid,
     created_at (ISO 8601 UTC), id (the platform's event id)}

Other events of the platform (egress, ingress, track_unpublished, ...) are acknowledged
and recorded, not published.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from google.protobuf.json_format import ParseError
from livekit.api import TokenVerifier, WebhookReceiver
from livekit.protocol.webhook import WebhookEvent

from platform_api.envelope import Envelope
from platform_api.services import request_services
from platform_api.webhooks.inbound import (
    PLATFORM_BODY,
    REFUSALS,
    Inbound,
    WebhookAck,
    accept,
    configured,
    dead_letter_body,
    refuse,
    require_https,
)

FAMILY = "video"
PUBLISHED = frozenset({"room_started", "room_finished", "participant_joined",
                       "participant_left", "track_published"})

router = APIRouter(tags=["webhooks"])


@router.post("/api/webhooks/video", response_model=Envelope[WebhookAck],
             responses=REFUSALS, openapi_extra=PLATFORM_BODY,
             summary="Video platform room events (signed JWT with the body's digest)")
async def video_webhook(request: Request) -> Any:
    require_https(request, FAMILY)
    services = request_services(request)
    settings = services.settings
    key = configured(settings.video_api_key, FAMILY, "VIDEO_API_KEY")
    secret = configured(settings.video_api_secret, FAMILY, "VIDEO_API_SECRET")
    body = await request.body()
    token = request.headers.get("authorization", "")
    if token[:7].lower() == "bearer ":
        token = token[7:]
    if not token:
        raise refuse(FAMILY, request, "no Authorization token")
    try:
        text = body.decode("utf-8")
        event = WebhookReceiver(TokenVerifier(key, secret)).receive(text, token.strip())
    except ParseError as exc:  # the digest matched: signed, but not an event
        return await dead_letter_body(services, FAMILY, body, str(exc))
    except Exception as exc:  # the library raises jwt errors and bare Exceptions alike
        raise refuse(FAMILY, request, f"{type(exc).__name__}: {exc}") from None
    if not event.id or not event.event:
        return await dead_letter_body(services, FAMILY, body, "the event has no id or type")
    topic = f"platform.video.{event.event}" if event.event in PUBLISHED else None
    return await accept(services, FAMILY, [Inbound(event.id, topic, room_event(event))])


def room_event(event: WebhookEvent) -> dict[str, Any]:
    """The payload of ``platform.video.<event>`` (coordination with Scheduling)."""
    created = datetime.fromtimestamp(event.created_at, UTC) if event.created_at else \
        datetime.now(UTC)
    return {
        "event": event.event,
        "room_name": event.room.name or None,
        "room_sid": event.room.sid or None,
        "participant_identity": event.participant.identity or None,
        "participant_sid": event.participant.sid or None,
        "track_sid": event.track.sid or None,
        "created_at": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "id": event.id,
    }

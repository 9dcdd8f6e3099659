"""POST /api/webhooks/video: LiveKit-signed room events are published as
platform.video.<event> with the payload agreed with the Scheduling area."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.platform_api.webhooks.conftest import dead_letters, nothing_kept, recorder
from tests.platform_api.webhooks.signing import body_of, livekit_headers

PATH = "/api/webhooks/video"
ROOM = {"sid": "RM_hJk2Lm9", "name": "consult-kibera-4411"}
DOCTOR = {"sid": "PA_7yQ2xW", "identity": "practitioner-wanjiku-kamau"}


def room_event(event: str, event_id: str, **extra: Any) -> dict[str, Any]:
    return {"event": event, "id": event_id, "createdAt": "1764061200", "room": ROOM, **extra}


async def send(secure: Any, event: dict[str, Any] | bytes, **signing: Any) -> Any:
    body = body_of(event)
    return await secure.post(PATH, content=body, headers=livekit_headers(body, **signing))


@pytest.mark.parametrize(("event", "extra", "participant", "track"), [
    ("room_started", {}, None, None),
    ("participant_joined", {"participant": DOCTOR}, DOCTOR, None),
    ("track_published", {"participant": DOCTOR, "track": {"sid": "TR_AMa1", "type": "AUDIO"}},
     DOCTOR, "TR_AMa1"),
    ("participant_left", {"participant": DOCTOR}, DOCTOR, None),
    ("room_finished", {}, None, None),
])
async def test_each_room_event_is_published_with_the_agreed_payload(
        app, secure, event, extra, participant, track):
    seen = recorder(app, "platform.video.>", "telemedicine_sessions")
    response = await send(secure, room_event(event, f"EV_{event}", **extra))
    assert response.status_code == 200
    await app.state.services.bus.drain()
    [published] = seen
    assert published["topic"] == f"platform.video.{event}"
    assert published["payload"] == {
        "event": event, "room_name": "consult-kibera-4411", "room_sid": "RM_hJk2Lm9",
        "participant_identity": participant and participant["identity"],
        "participant_sid": participant and participant["sid"], "track_sid": track,
        "created_at": "2025-11-25T09:00:00Z", "id": f"EV_{event}"}


async def test_other_events_are_acknowledged_not_published(app, secure):
    seen = recorder(app, "platform.video.>", "telemedicine_sessions")
    response = await send(secure, room_event("egress_started", "EV_egress1"))
    assert response.status_code == 200
    await app.state.services.bus.drain()
    assert seen == []


async def test_a_redelivered_event_is_published_once(app, secure):
    seen = recorder(app, "platform.video.>", "telemedicine_sessions")
    event = room_event("participant_joined", "EV_dup1", participant=DOCTOR)
    await send(secure, event)
    again = await send(secure, event)
    assert again.json()["data"]["duplicate"] is True
    await app.state.services.bus.drain()
    assert len(seen) == 1


async def test_unsigned_wrongly_signed_tampered_or_expired_events_are_401(
        app, secure, published):
    body = body_of(room_event("room_started", "EV_bad"))
    unsigned = await secure.post(PATH, content=body)
    other_secret = await secure.post(PATH, content=body, headers=livekit_headers(
        body, secret="another-secret-entirely-0000000000"))
    other_key = await secure.post(PATH, content=body, headers=livekit_headers(
        body, key="APIsomeoneelse"))
    tampered = await secure.post(PATH, content=body.replace(b"room_started", b"room_finished"),
                                 headers=livekit_headers(body))
    expired = await secure.post(PATH, content=body, headers=livekit_headers(
        body, ttl=timedelta(minutes=-5)))
    for response in (unsigned, other_secret, other_key, tampered, expired):
        assert response.status_code == 401, response.text
    assert "hash mismatch" in tampered.json()["error"]["message"]
    assert "expired" in expired.json()["error"]["message"].lower()
    assert await nothing_kept(app, published)


async def test_a_signed_body_that_is_not_an_event_becomes_a_dead_letter(app, secure):
    assert (await send(secure, b'{"event": "room_started", "room": ')).status_code == 200
    assert (await send(secure, b'{"room": {"name": "consult-1"}}')).status_code == 200
    entries = await dead_letters(app)
    assert [e["topic"] for e in entries] == ["platform.webhook.video"] * 2
    assert entries[1]["error"] == "malformed video webhook body: the event has no id or type"


async def test_a_consumer_failing_on_a_room_event_leaves_a_dead_letter(app, secure):
    async def update_session(event: dict[str, Any]) -> None:
        raise LookupError(f"no telemedicine Encounter for room {event['payload']['room_name']}")
    app.state.services.bus.subscribe("platform.video.>", update_session,
                                     consumer="telemedicine_sessions")
    await send(secure, room_event("room_started", "EV_fail1"))
    [entry] = await dead_letters(app)
    assert (entry["consumer"], entry["topic"]) == ("telemedicine_sessions",
                                                   "platform.video.room_started")
    assert "consult-kibera-4411" in entry["error"]

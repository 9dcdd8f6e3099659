"""The video platform's server API: a LiveKit-style RoomService over Twirp, through the
official ``livekit-api`` client.

``POST {video_url}/twirp/livekit.RoomService/CreateRoom`` (and ``ListParticipants``,
``DeleteRoom``) with protobuf bodies, each request authorized by a short JWT signed with
the API secret (``HS256``, issuer the API key, a ``video`` grant of ``roomCreate`` or
``roomAdmin`` on the room). Join tokens for the doctor and the patient are JWTs of the
same kind with ``roomJoin`` on one room, an identity and a display name, valid
``video_token_ttl_seconds``. Settings: ``HEALTHPLATFORM_VIDEO_URL``,
``HEALTHPLATFORM_VIDEO_API_KEY``, ``HEALTHPLATFORM_VIDEO_API_SECRET`` (no URL: video
visits are disabled, 503 ``VIDEO_NOT_CONFIGURED``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from livekit import api as livekit
from livekit.api.room_service import RoomService

from platform_api.envelope import ApiError
from platform_api.services import Services

TIMEOUT_SECONDS = 10.0
PARTICIPANT_STATES = {0: "joining", 1: "joined", 2: "active", 3: "disconnected"}


class VideoPlatformError(ApiError):
    def __init__(self, message: str):
        super().__init__(502, "VIDEO_PLATFORM_ERROR", message)


@dataclass(frozen=True)
class LiveParticipant:
    identity: str
    name: str
    sid: str
    state: str
    joined_at: str | None


def _epoch(seconds: int) -> str | None:
    return datetime.fromtimestamp(seconds, UTC).isoformat() if seconds else None


class VideoPlatform:
    """The RoomService of one video platform (see the module docstring)."""

    def __init__(self, url: str, api_key: str, api_secret: str, token_ttl: float):
        self.url, self.api_key, self.api_secret = url.rstrip("/"), api_key, api_secret
        self.token_ttl = timedelta(seconds=token_ttl)

    @property
    def enabled(self) -> bool:
        return bool(self.url and self.api_key and self.api_secret)

    def require_configured(self) -> None:
        if not self.enabled:
            raise ApiError(503, "VIDEO_NOT_CONFIGURED", "Video visits are not configured "
                           "(HEALTHPLATFORM_VIDEO_URL, _VIDEO_API_KEY, _VIDEO_API_SECRET)")

    @asynccontextmanager
    async def _rooms(self) -> AsyncIterator[RoomService]:
        self.require_configured()
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            try:
                yield RoomService(session, self.url, self.api_key, self.api_secret,
                                          failover=False)
            except livekit.ServerError as exc:
                raise VideoPlatformError(f"The video platform refused: {exc.code}: "
                                         f"{exc.message}") from None
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise VideoPlatformError(f"The video platform cannot be reached: "
                                         f"{type(exc).__name__}") from None

    async def create_room(self, name: str, *, metadata: str, empty_timeout: int = 600,
                          max_participants: int = 6) -> str:
        """Create the room (the platform answers the existing one for a name in use);
        its sid."""
        async with self._rooms() as rooms:
            room = await rooms.create_room(livekit.CreateRoomRequest(
                name=name, empty_timeout=empty_timeout, max_participants=max_participants,
                metadata=metadata))
        return str(room.sid)

    async def list_participants(self, name: str) -> list[LiveParticipant] | None:
        """Who is in the room now; None when the platform has no such room (closed)."""
        try:
            async with self._rooms() as rooms:
                found = await rooms.list_participants(livekit.ListParticipantsRequest(
                    room=name))
        except VideoPlatformError as exc:
            if "not_found" in exc.message:
                return None
            raise
        return [LiveParticipant(p.identity, p.name, p.sid,
                                PARTICIPANT_STATES.get(int(p.state), str(p.state)),
                                _epoch(int(p.joined_at))) for p in found.participants]

    async def delete_room(self, name: str) -> bool:
        """Close the room and disconnect everyone; False when it was already gone."""
        try:
            async with self._rooms() as rooms:
                await rooms.delete_room(livekit.DeleteRoomRequest(room=name))
        except VideoPlatformError as exc:
            if "not_found" in exc.message:
                return False
            raise
        return True

    def join_token(self, room: str, identity: str, name: str | None) -> str:
        token = (livekit.AccessToken(self.api_key, self.api_secret)
                 .with_identity(identity).with_name(name or identity)
                 .with_ttl(self.token_ttl)
                 .with_grants(livekit.VideoGrants(room_join=True, room=room)))
        return str(token.to_jwt())

    @property
    def join_url(self) -> str:
        """Where clients connect (the platform's WebSocket address)."""
        return self.url.replace("https://", "wss://", 1).replace("http://", "ws://", 1)


def video_platform(services: Services) -> VideoPlatform:
    settings: Any = services.settings
    return VideoPlatform(settings.video_url, settings.video_api_key,
                         settings.video_api_secret, settings.video_token_ttl_seconds)


__all__ = ["LiveParticipant", "VideoPlatform", "VideoPlatformError", "video_platform"]

"""A local stand-in of the video platform's server API: LiveKit's RoomService over Twirp
(protobuf bodies, errors as Twirp JSON), each request checked against the API key and
secret (an HS256 JWT whose ``video`` grant must allow the call), rooms kept in memory.
``join`` plays a client entering a room with a join token."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import jwt
from aiohttp import web
from livekit.protocol import models, room

PREFIX = "/twirp/livekit.RoomService/"


@dataclass
class Room:
    name: str
    sid: str
    metadata: str
    empty_timeout: int
    participants: dict[str, models.ParticipantInfo] = field(default_factory=dict)


class VideoStandIn:
    def __init__(self, api_key: str, api_secret: str):
        self.api_key, self.api_secret = api_key, api_secret
        self.rooms: dict[str, Room] = {}
        self.calls: list[str] = []
        self.app = web.Application()
        for method, handler in (("CreateRoom", self.create_room),
                                ("ListParticipants", self.list_participants),
                                ("DeleteRoom", self.delete_room)):
            self.app.router.add_post(PREFIX + method, self._guarded(method, handler))

    # -- auth ------------------------------------------------------------------------------
    def _claims(self, request: web.Request) -> dict[str, Any]:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            raise _twirp(401, "unauthenticated", "no token")
        try:
            claims: dict[str, Any] = jwt.decode(token, self.api_secret, algorithms=["HS256"],
                                                options={"verify_aud": False})
        except jwt.PyJWTError as exc:
            raise _twirp(401, "unauthenticated", str(exc)) from None
        if claims.get("iss") != self.api_key:
            raise _twirp(401, "unauthenticated", "unknown API key")
        return claims

    def _guarded(self, method: str, handler: Callable[[dict[str, Any], bytes],
                                                      Awaitable[bytes]]) -> Any:
        async def serve(request: web.Request) -> web.Response:
            claims = self._claims(request)  # a Twirp error is raised as an HTTPException
            if request.content_type != "application/protobuf":
                raise _twirp(415, "malformed", "protobuf bodies only")
            self.calls.append(method)
            body = await handler(claims.get("video") or {}, await request.read())
            return web.Response(body=body, content_type="application/protobuf")
        return serve

    # -- RoomService -----------------------------------------------------------------------
    async def create_room(self, grant: dict[str, Any], body: bytes) -> bytes:
        if not grant.get("roomCreate"):
            raise _twirp(403, "permission_denied", "roomCreate needed")
        asked = room.CreateRoomRequest.FromString(body)
        made = self.rooms.setdefault(asked.name, Room(
            asked.name, f"RM_{len(self.rooms) + 1:04d}", asked.metadata, asked.empty_timeout))
        return models.Room(name=made.name, sid=made.sid, metadata=made.metadata,
                           empty_timeout=made.empty_timeout,
                           creation_time=int(time.time())).SerializeToString()

    async def list_participants(self, grant: dict[str, Any], body: bytes) -> bytes:
        asked = room.ListParticipantsRequest.FromString(body)
        self._admin(grant, asked.room)
        found = self.rooms.get(asked.room)
        if found is None:
            raise _twirp(404, "not_found", "requested room does not exist")
        return room.ListParticipantsResponse(
            participants=list(found.participants.values())).SerializeToString()

    async def delete_room(self, grant: dict[str, Any], body: bytes) -> bytes:
        if not grant.get("roomCreate"):
            raise _twirp(403, "permission_denied", "roomCreate needed")
        asked = room.DeleteRoomRequest.FromString(body)
        if self.rooms.pop(asked.room, None) is None:
            raise _twirp(404, "not_found", "requested room does not exist")
        return room.DeleteRoomResponse().SerializeToString()

    def _admin(self, grant: dict[str, Any], name: str) -> None:
        if not grant.get("roomAdmin") or grant.get("room") != name:
            raise _twirp(403, "permission_denied", f"roomAdmin on {name} needed")

    # -- a client joining ------------------------------------------------------------------
    def join(self, token: str) -> models.ParticipantInfo:
        claims = jwt.decode(token, self.api_secret, algorithms=["HS256"],
                            options={"verify_aud": False})
        grant = claims["video"]
        assert grant.get("roomJoin") and grant["room"] in self.rooms, grant
        person = models.ParticipantInfo(
            identity=claims["sub"], name=claims.get("name", ""),
            sid=f"PA_{len(self.rooms[grant['room']].participants) + 1}",
            state=models.ParticipantInfo.State.ACTIVE, joined_at=int(time.time()))
        self.rooms[grant["room"]].participants[person.identity] = person
        return person


def _twirp(status: int, code: str, message: str) -> web.HTTPException:
    """A Twirp error: its HTTP status and ``{"code", "msg"}``."""
    return _TwirpError(status, code, message)


class _TwirpError(web.HTTPException):
    def __init__(self, status: int, code: str, message: str):
        self.status_code = status
        super().__init__(text=f'{{"code": "{code}", "msg": "{message}"}}',
                         content_type="application/json")

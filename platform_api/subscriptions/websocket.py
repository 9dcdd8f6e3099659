"""The websocket channel: binding tokens and the socket clients bind with them.

``$get-ws-binding-token`` (:mod:`fhir_server.interactions.subscription`) gives a caller
who may read the named websocket subscriptions a random token, valid for
``subscription_ws_token_seconds`` and kept only as its SHA-256 digest. The client opens
``ws(s)://<host>/fhir/$subscription-ws`` and sends ``bind-with-token <token>``; the server
answers a handshake notification per subscription (a backport Bundle, type
``handshake``), then pushes each event notification as a text frame. A token that is
unknown, expired or used up is answered with an OperationOutcome and the socket is closed
(code 1008, policy violation). A token binds once.

Tokens and bound sockets live in the process that issued them: with several processes
behind a balancer, the client must reach the one that answered its token request
(sticky sessions), and that process must be the one consuming the resource events
(the in-process event bus; on NATS each process consumes a share of them).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from fhir_server.outcome import FhirError, Issue, operation_outcome

JSON = dict[str, Any]
PATH = "/fhir/$subscription-ws"
router = APIRouter()


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class BindingTokens:
    def __init__(self, lifetime: float):
        self.lifetime = lifetime
        self._tokens: dict[str, tuple[float, tuple[str, ...]]] = {}

    def issue(self, subscription_ids: list[str]) -> tuple[str, float]:
        now = time.time()
        self._tokens = {k: v for k, v in self._tokens.items() if v[0] > now}  # expired go
        token = secrets.token_urlsafe(32)
        expires = now + self.lifetime
        self._tokens[digest(token)] = (expires, tuple(subscription_ids))
        return token, expires

    def redeem(self, token: str) -> tuple[str, ...]:
        found = self._tokens.pop(digest(token), None)
        if found is None or found[0] <= time.time():
            raise FhirError.of(401, "security", "The binding token is unknown, expired or "
                               "already used: ask $get-ws-binding-token for another")
        return found[1]


def expiration(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


@router.websocket(PATH)
async def subscription_socket(websocket: WebSocket) -> None:
    from platform_api.subscriptions import channels_of

    channels = channels_of(websocket.app.state.services)
    await websocket.accept()
    bound: list[Any] = []
    try:
        while True:
            text = (await websocket.receive_text()).strip()
            command, _, token = text.partition(" ")
            if command != "bind-with-token" or not token:
                await _refuse(websocket, "Send 'bind-with-token <token>'")
                return
            try:
                bound += await channels.bind(token.strip(), websocket)
            except FhirError as exc:
                await _refuse(websocket, str(exc))
                return
    except WebSocketDisconnect:
        pass
    finally:
        for active in bound:
            active.sockets.discard(websocket)


async def _refuse(websocket: WebSocket, message: str) -> None:
    await websocket.send_text(orjson.dumps(operation_outcome(
        [Issue("error", "security", message)])).decode())
    await websocket.close(code=1008)

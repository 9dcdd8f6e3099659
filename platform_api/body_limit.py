"""413 for request bodies over ``max_body_bytes``, before any handler reads them.

Pure ASGI middleware (not ``BaseHTTPMiddleware``: it costs a task per request). A
declared ``Content-Length`` over the limit is refused at once, without reading a byte;
a body without one (chunked) is counted as it streams in and refused when it passes the
limit. The refusal speaks the dialect of where the request went: a FHIR
OperationOutcome under ``/fhir``, the /api envelope elsewhere.

Starlette ships a ``RequestBodyLimitMiddleware`` too, but it answers in plain text.
"""

from __future__ import annotations

from fastapi import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from platform_api.envelope import ApiError
from platform_api.refusals import refusal_response

BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a streamed body passes the limit.

    A FastAPI ``HTTPException`` on purpose: FastAPI re-raises those from body parsing
    (any other exception there becomes a 400); the middleware then answers the 413.
    """

    def __init__(self, limit: int):
        super().__init__(413, f"Request body is larger than the limit of {limit} bytes")


def too_large_response(path: str, limit: int) -> Response:
    message = f"Request body is larger than the limit of {limit} bytes"
    return refusal_response(path, ApiError(413, "PAYLOAD_TOO_LARGE", message))


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_bytes: int):
        if max_bytes < 0:
            raise ValueError("max_body_bytes must be zero or more")
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in BODYLESS_METHODS:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None:
            if declared > self.max_bytes:
                await too_large_response(scope["path"], self.max_bytes)(scope, receive, send)
                return
            # The server frames the body by Content-Length: no more bytes can arrive.
            await self.app(scope, receive, send)
            return
        await self._counted(scope, receive, send)

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        received = 0
        exceeded = answered = False
        limit = self.max_bytes

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    raise BodyTooLarge(limit)
            return message

        async def guarded_send(message: Message) -> None:
            # Once the body was cut off, whatever the app answers (its handlers render
            # the exception in their own way) is replaced by the one 413 of this module.
            nonlocal answered
            if not exceeded:
                await send(message)
            elif message["type"] == "http.response.start" and not answered:
                answered = True
                await too_large_response(scope["path"], limit)(scope, receive, send)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except BodyTooLarge:
            pass  # answered below
        if exceeded and not answered:
            await too_large_response(scope["path"], limit)(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None

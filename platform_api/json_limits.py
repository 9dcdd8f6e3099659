"""Bounds on the JSON bodies of /fhir and /api, checked on the raw text before any parser.

A JSON body may nest at most ``max_depth`` levels and hold at most ``max_elements``
elements (object members and array items); beyond either the request is refused before
it is parsed, with an answer naming the limit (an /api body that is not JSON at all is
400 ``INVALID_JSON`` here too, for routes that take no body): 400 for the depth (FHIR: an
OperationOutcome ``structure``; /api: ``JSON_TOO_DEEP``), 413 for the elements (FHIR
``too-costly``; /api ``PAYLOAD_TOO_LARGE``).

Why: a body nested hundreds of levels passes the JSON parsers (orjson takes 1,024 levels,
the standard library until the interpreter's recursion limit) and then fails whatever
walks it recursively later: the JSON encoder of the store (254 levels) failed inside the
group commit, and every client in that batch with it. A body of a few megabytes holding
hundreds of thousands of elements (one Patient with 210,000 names) is valid but costs
seconds of validation and indexing. No FHIR resource needs either: the deepest real ones
(nested Questionnaire items inside a Bundle) stay well within 100 levels.

The check costs a few ``bytes.count`` calls for an ordinary body: the ``{``, ``[`` and
commas bound the number of elements from above (a comma inside a string counts too: only
a body of hundreds of thousands of values comes near the bound) and the brackets bound
the depth. Only a body with more brackets than the depth allows is measured exactly,
strings left out (a ``[`` in a narrative opens nothing), and a large one in a worker
thread, so that the event loop keeps serving the other requests meanwhile.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from itertools import accumulate

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from platform_api.envelope import ApiError
from platform_api.refusals import refusal_response

DEFAULT_MAX_DEPTH = 100
DEFAULT_MAX_ELEMENTS = 200_000

WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
# Bodies larger than this are measured in a worker thread (tens of ms a megabyte here).
OFFLOAD_BYTES = 256 * 1024
# The nesting step of each byte: +1 opens, -1 closes, 0 otherwise.
_STEP = [0] * 256
_STEP[ord("{")] = _STEP[ord("[")] = 1
_STEP[ord("}")] = _STEP[ord("]")] = -1
_NOT_BRACKETS = bytes(b for b in range(256) if _STEP[b] == 0)


@dataclass(frozen=True, slots=True)
class JsonLimits:
    max_depth: int = DEFAULT_MAX_DEPTH
    max_elements: int = DEFAULT_MAX_ELEMENTS

    def __post_init__(self) -> None:
        if self.max_depth < 2 or self.max_elements < 1:
            raise ValueError("max_json_depth must be at least 2 and max_json_elements "
                             "at least 1")


class JsonLimitExceeded(ValueError):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code = status, code


def check_json_text(raw: bytes, limits: JsonLimits) -> None:
    """Raise :class:`JsonLimitExceeded` when ``raw`` (JSON text, valid or not) nests
    deeper or holds more elements than ``limits`` allow."""
    containers = raw.count(b"{") + raw.count(b"[")
    elements = containers + raw.count(b",") + 1
    if elements > limits.max_elements:
        raise JsonLimitExceeded(
            413, "PAYLOAD_TOO_LARGE",
            f"The JSON body holds about {elements:,} elements (object members and array "
            f"items); the limit is {limits.max_elements:,} (HEALTHPLATFORM_MAX_JSON_ELEMENTS)")
    if containers <= limits.max_depth:
        return  # not enough brackets to nest that deep
    brackets = _outside_strings(raw).translate(None, _NOT_BRACKETS)
    depth = max(accumulate(map(_STEP.__getitem__, brackets)), default=0)
    if depth > limits.max_depth:
        raise JsonLimitExceeded(
            400, "JSON_TOO_DEEP",
            f"The JSON body nests {depth} levels deep; the limit is {limits.max_depth} "
            "(HEALTHPLATFORM_MAX_JSON_DEPTH)")


def _outside_strings(raw: bytes) -> bytes:
    """The text between JSON strings. Escaped characters go first (a ``\\"`` closes
    nothing); every quote left then opens or closes a string, so the pieces between
    them are outside and inside strings in turn."""
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.split(b'"')[0::2])


WEBHOOKS = ("/api/webhooks/", "/api/gtm/webhooks/")


def _is_json(scope: Scope) -> bool:
    """A JSON body, or one without a Content-Type (FHIR takes that as FHIR JSON)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media.endswith(b"json") or media.endswith(b"+json")
    return True


class JsonLimitMiddleware:
    """Refuse JSON request bodies beyond :class:`JsonLimits` (module docstring) before
    the routes parse them; the body read here is handed on unchanged."""

    def __init__(self, app: ASGIApp, *, limits: JsonLimits):
        self.app, self.limits = app, limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in WITH_BODY or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        body, complete = await _read_body(receive)
        try:
            if len(body) > OFFLOAD_BYTES:
                await asyncio.to_thread(check_json_text, body, self.limits)
            else:
                check_json_text(body, self.limits)
            # Inbound webhooks are exempt: their handler verifies the signature first and
            # keeps a signed body it cannot read as a dead letter (loses nothing).
            if scope["path"].startswith("/api/") and body.strip() and \
                    not scope["path"].startswith(WEBHOOKS):
                _parsable(body)
        except JsonLimitExceeded as exc:
            refusal = ApiError(exc.status, exc.code, str(exc))
            await refusal_response(scope["path"], refusal)(scope, receive, send)
            return
        await self.app(scope, _replay(body, complete, receive), send)


def _parsable(body: bytes) -> None:
    """An /api JSON body must parse, checked here once for every route: a route that
    takes no body (``POST /api/auth/logout``) never reads it, and would otherwise act on
    a malformed one (issue 32). orjson parses at about a gigabyte a second."""
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        place = "not UTF-8"
        try:  # the standard library's words: the line and column, as the routes say
            json.loads(body)
        except json.JSONDecodeError as exc:
            place = f"{exc.msg} at line {exc.lineno}, column {exc.colno}"
        except UnicodeDecodeError:
            pass
        raise JsonLimitExceeded(400, "INVALID_JSON",
                                f"The request body is not valid JSON: {place}") from None


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The whole body, and whether the client disconnected meanwhile."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), True


def _replay(body: bytes, complete: bool, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, then whatever the server sends next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            if complete:
                return {"type": "http.request", "body": body, "more_body": False}
            return {"type": "http.disconnect"}
        return await receive()

    return replay

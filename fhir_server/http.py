"""HTTP plumbing shared by the FHIR interactions: content types, headers, responses.

FHIR endpoints speak FHIR: bodies are ``application/fhir+json`` and every refusal is an
OperationOutcome (never the /api envelope).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qsl

import orjson
from starlette.requests import Request
from starlette.responses import Response

from fhir_server.outcome import FhirError, Issue, operation_outcome
from fhir_server.store import (
    ConditionChanged,
    InvalidSearch,
    MultipleMatches,
    ResourceExists,
    ResourceGone,
    ResourceNotFound,
    SearchTooCostly,
    StoredResource,
    StoreError,
    TransactionsUnavailable,
    UnstorableResource,
    VersionConflict,
)

FHIR_JSON = "application/fhir+json"
_JSON_TYPES = ("application/fhir+json", "application/json", "application/json+fhir")
_FORMAT_JSON = {"json", "application/json", "application/fhir+json", "application/json+fhir"}
_ETAG = re.compile(r'^(?:W/)?"(\d+)"$')


class FhirResponse(Response):
    media_type = FHIR_JSON

    def render(self, content: Any) -> bytes:
        if isinstance(content, bytes):
            return content
        return orjson.dumps(content)


def check_format(request: Request) -> None:
    """``_format`` and ``Accept``: only JSON is served (XML → 406)."""
    # The query string is parsed only when it names _format (a read has none to parse).
    fmt = request.query_params.get("_format") \
        if b"_format" in request.scope.get("query_string", b"") else None
    if fmt is not None and fmt not in _FORMAT_JSON:
        raise FhirError.of(406, "not-supported", f"_format={fmt!r} is not supported; use json")
    accept = request.headers.get("accept")
    if accept and "xml" in accept and "json" not in accept and "*/*" not in accept:
        raise FhirError.of(406, "not-supported", "Only application/fhir+json is served")


_PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json")


async def read_json_body(request: Request, *, patch: bool = False) -> Any:
    """The JSON body (400 when empty or not JSON); its Content-Type must be a FHIR JSON
    type, or, for a PATCH (``patch``), a JSON (Merge) Patch type (415 otherwise)."""
    content_type = request.headers.get("content-type", FHIR_JSON).split(";")[0].strip().lower()
    accepted = (*_JSON_TYPES, *_PATCH_TYPES) if patch else _JSON_TYPES
    if content_type and content_type not in accepted:
        raise FhirError.of(415, "not-supported",
                           f"Content-Type {content_type!r} is not supported; use "
                           f"{' or '.join(accepted) if patch else FHIR_JSON}")
    raw = await request.body()
    if not raw:
        raise FhirError.of(400, "required", "The request body is empty")
    if raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark (RFC 8259 8.1: ignored)
        raw = raw[3:]
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise FhirError.of(400, "structure", f"The body is not valid JSON: {exc}") from None


def parse_etag(value: str | None, header: str = "If-Match") -> int | None:
    if value is None:
        return None
    match = _ETAG.match(value.strip())
    if not match:
        raise FhirError.of(400, "value", f'{header} must look like W/"<version>", got {value!r}')
    return int(match.group(1))


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(instant: str) -> str:
    """An instant as an HTTP date (RFC 9110 IMF-fixdate), for Last-Modified: what
    ``email.utils.format_datetime(..., usegmt=True)`` writes, at a fraction of its cost
    (it is on every read and write)."""
    t = parse_instant(instant)
    return (f"{_DAYS[t.weekday()]}, {t.day:02d} {_MONTHS[t.month - 1]} {t.year:04d} "
            f"{t.hour:02d}:{t.minute:02d}:{t.second:02d} GMT")


def parse_instant(instant: str) -> datetime:
    return datetime.fromisoformat(instant.replace("Z", "+00:00")).astimezone(UTC)


def not_modified(request: Request, stored: StoredResource) -> bool:
    """Conditional read: If-None-Match (ETag) and If-Modified-Since."""
    inm = request.headers.get("if-none-match")
    if inm is not None:
        tags = {t.strip().removeprefix("W/") for t in inm.split(",")}
        return f'"{stored.version}"' in tags or "*" in tags
    ims = request.headers.get("if-modified-since")
    if ims is not None:
        try:
            since = parsedate_to_datetime(ims)
        except (TypeError, ValueError):
            return False
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        return parse_instant(stored.last_updated).replace(microsecond=0) <= since
    return False


def version_headers(stored: StoredResource) -> dict[str, str]:
    return {"ETag": stored.etag, "Last-Modified": http_date(stored.last_updated)}


def resource_response(stored: StoredResource, status: int = 200, *, prefer: str | None = None,
                      location: str | None = None, issues: Sequence[Issue] = ()
                      ) -> FhirResponse:
    """The answer to a write; ``issues`` (what the profile check found in ``warn``
    mode) go into the OperationOutcome a client asks for with
    ``Prefer: return=OperationOutcome``."""
    headers = version_headers(stored)
    if location:
        headers["Location"] = location
    if prefer == "minimal":
        return FhirResponse(b"", status_code=status, headers=headers)
    if prefer == "OperationOutcome":
        stored_issue = Issue("information", "informational", f"{stored.resource_type}/"
                             f"{stored.id} version {stored.version} stored")
        return FhirResponse(operation_outcome([stored_issue, *issues]), status_code=status,
                            headers=headers)
    return FhirResponse(stored.body, status_code=status, headers=headers)


def prefer_return(request: Request) -> str | None:
    prefer = request.headers.get("prefer")
    if not prefer:
        return None
    for part in prefer.split(";"):
        for item in part.split(","):
            key, _, value = item.strip().partition("=")
            if key.strip() == "return":
                value = value.strip().strip('"')
                if value in ("minimal", "representation", "OperationOutcome"):
                    return value
    return None


def error_response(error: FhirError) -> FhirResponse:
    return FhirResponse(error.outcome(), status_code=error.status, headers=error.headers)


def store_error_to_fhir(exc: StoreError) -> FhirError:
    if isinstance(exc, ResourceGone):
        return FhirError(410, Issue("error", "deleted", str(exc)),
                         headers={"ETag": f'W/"{exc.version}"'})
    if isinstance(exc, ResourceNotFound):
        return FhirError.of(404, "not-found", str(exc))
    if isinstance(exc, VersionConflict):
        return FhirError.of(412, "conflict", f"Version conflict: {exc}")
    if isinstance(exc, ResourceExists):
        return FhirError.of(409, "duplicate", str(exc))
    if isinstance(exc, MultipleMatches):
        return FhirError.of(412, "multiple-matches", str(exc))
    if isinstance(exc, SearchTooCostly):
        return FhirError.of(400, "too-costly", str(exc))
    if isinstance(exc, InvalidSearch):
        return FhirError.of(400, "invalid", str(exc))
    if isinstance(exc, UnstorableResource):
        return FhirError.of(400, "structure", str(exc))
    if isinstance(exc, TransactionsUnavailable):
        return FhirError.of(501, "not-supported", str(exc))
    if isinstance(exc, ConditionChanged):
        return FhirError.of(409, "conflict", f"A concurrent write changed the match: {exc}")
    return FhirError.of(500, "exception", "The store refused the operation")


def conditional_criteria(request: Request) -> list[tuple[str, str]]:
    """The search criteria of a conditional update/delete/patch (``[type]?criteria``)."""
    return [(k, v) for k, v in request.query_params.multi_items()
            if k not in ("_format", "_pretty")]


def if_none_exist(request: Request) -> list[tuple[str, str]] | None:
    """The criteria of ``If-None-Exist`` (``identifier=sys|val``, the query without ``?``)."""
    header = request.headers.get("if-none-exist")
    if header is None:
        return None
    return parse_query(header)


def parse_query(query: str) -> list[tuple[str, str]]:
    """``a=1&b=2`` (optionally with a leading ``Type?`` or ``?``) → [(a, 1), (b, 2)]."""
    query = query.split("?", 1)[1] if "?" in query else query
    return parse_qsl(query, keep_blank_values=True)


def outcome_response(status: int, diagnostics: str, code: str = "informational",
                     severity: str = "information") -> FhirResponse:
    return FhirResponse(operation_outcome([Issue(severity, code, diagnostics)]),
                        status_code=status)


def parameter_values(body: Any, operation: str) -> list[tuple[str, str]]:
    """The (name, value) pairs of an operation's ``Parameters`` body whose parameters
    each hold one primitive value (string, instant, code, id...)."""
    if not isinstance(body, dict) or body.get("resourceType") != "Parameters":
        raise FhirError.of(400, "invalid", f"{operation} takes a Parameters resource")
    pairs: list[tuple[str, str]] = []
    for i, parameter in enumerate(body.get("parameter") or []):
        name = parameter.get("name") if isinstance(parameter, dict) else None
        values = [v for k, v in (parameter.items() if isinstance(parameter, dict) else ())
                  if k.startswith("value") and isinstance(v, str)]
        if not isinstance(name, str) or len(values) != 1:
            raise FhirError.of(400, "invalid", "Each parameter needs a name and one string, "
                               "instant or code value", f"Parameters.parameter[{i}]")
        pairs.append((name, values[0]))
    return pairs

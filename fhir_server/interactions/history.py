"""history: instance (``[type]/[id]/_history``), type (``[type]/_history``) and system
(``_history``), newest first, with ``_since``, ``_at`` and ``_count``.

Paging uses a cursor on the store's write order (``_cursor``), so a page link stays valid
and shows no duplicates while new versions are being written.

What the caller may see: an instance's history when it may read the resource (its latest
version with content); the type and system histories list the versions of the resources
the caller may read now (the store applies the caller's grants, as for a search).
"""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.bundle import bundle, history_entry
from fhir_server.http import FhirResponse, check_format
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import FhirError
from fhir_server.search.dates import date_range

DEFAULT_COUNT = 50
MAX_COUNT = 1000
MAX_INTEGER = 2**63 - 1  # a cursor is a position in the store's write order (64 bits)


def _int_param(request: Request, name: str, default: int | None) -> int | None:
    value = request.query_params.get(name)
    if value is None:
        return default
    if not value.isdecimal() or int(value) > MAX_INTEGER:
        raise FhirError.of(400, "value", f"{name} must be an integer from 0 to {MAX_INTEGER}",
                           name)
    return int(value)


async def history(ctx: FhirContext, request: Request, resource_type: str | None = None,
                  resource_id: str | None = None) -> Response:
    check_format(request)
    if resource_type is not None:
        ctx.service.check_type(resource_type)
    params = request.query_params
    try:
        since = date_range(params["_since"])[0] if "_since" in params else None
        at = date_range(params["_at"])[1] if "_at" in params else None
    except ValueError as exc:
        raise FhirError.of(400, "value", str(exc), "_since" if "_since" in params else "_at"
                           ) from None
    count = min(_int_param(request, "_count", DEFAULT_COUNT) or 0, MAX_COUNT)
    cursor = _int_param(request, "_cursor", None)
    caller = ctx.caller(request)
    if resource_id is not None and resource_type is not None:
        # Instance history of an id never used is a 404, not an empty bundle.
        if await ctx.service.store.read_current(resource_type, resource_id) is None:
            raise FhirError.of(404, "not-found", f"{resource_type}/{resource_id} is not known")
        await caller.check_history(resource_type, resource_id)
    page = await caller.history(resource_type, resource_id, since=since, at_or_before=at,
                                count=count, before_seq=cursor)
    base = ctx.fhir_base(request)
    path = "/".join(p for p in (resource_type, resource_id, "_history") if p)
    self_url = f"{base}/{path}"
    links = {"self": f"{self_url}?{request.url.query}" if request.url.query else self_url}
    if count and len(page.entries) == count:
        query = {k: v for k, v in params.items() if k != "_cursor"}
        query["_cursor"] = str(page.entries[-1].seq)
        links["next"] = f"{self_url}?{urlencode(query)}"
    entries = [history_entry(e, base) for e in page.entries]
    return FhirResponse(bundle("history", entries, total=page.total, links=links))

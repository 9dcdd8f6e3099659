"""update: ``PUT [base]/[type]/[id]``; If-Match → 412 when stale; update-as-create (201)
when the client names a new id."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import (
    check_format,
    parse_etag,
    prefer_return,
    read_json_body,
    resource_response,
)
from fhir_server.interactions.context import FhirContext


async def update(ctx: FhirContext, request: Request, resource_type: str, resource_id: str
                 ) -> Response:
    check_format(request)
    if_match = parse_etag(request.headers.get("if-match"))
    body = await read_json_body(request)
    stored, created = await ctx.service.update(resource_type, resource_id, body,
                                               if_match=if_match)
    location = ctx.location(request, resource_type, stored.id, stored.version)
    return resource_response(stored, 201 if created else 200, prefer=prefer_return(request),
                             location=location)

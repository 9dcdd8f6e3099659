"""update: ``PUT [base]/[type]/[id]``; If-Match → 412 when stale; update-as-create (201)
when the client names a new id.

Conditional update: ``PUT [base]/[type]?criteria`` (R4 3.1.0.4.3): no match creates,
one match is updated (a body id that differs from it is a 400), several are a 412.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.conformance.profiles import collected_warnings
from fhir_server.http import (
    check_format,
    conditional_criteria,
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
    with collected_warnings() as warnings:
        stored, created = await ctx.caller(request).update(resource_type, resource_id, body,
                                                           if_match=if_match)
    location = ctx.location(request, resource_type, stored.id, stored.version)
    return resource_response(stored, 201 if created else 200, prefer=prefer_return(request),
                             location=location, issues=warnings)


async def conditional_update(ctx: FhirContext, request: Request, resource_type: str
                             ) -> Response:
    check_format(request)
    ctx.service.check_type(resource_type)
    if_match = parse_etag(request.headers.get("if-match"))
    body = await read_json_body(request)
    stored, created = await ctx.caller(request).conditional_update(
        resource_type, conditional_criteria(request), body, if_match=if_match)
    location = ctx.location(request, resource_type, stored.id, stored.version)
    return resource_response(stored, 201 if created else 200, prefer=prefer_return(request),
                             location=location)

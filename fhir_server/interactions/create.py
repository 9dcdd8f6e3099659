"""create: ``POST [base]/[type]``; 201 with Location (``_history``), ETag and the
representation asked for by ``Prefer: return=``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import check_format, prefer_return, read_json_body, resource_response
from fhir_server.interactions.context import FhirContext


async def create(ctx: FhirContext, request: Request, resource_type: str) -> Response:
    check_format(request)
    ctx.service.check_type(resource_type)
    body = await read_json_body(request)
    stored = await ctx.service.create(body, expected_type=resource_type)
    location = ctx.location(request, resource_type, stored.id, stored.version)
    return resource_response(stored, 201, prefer=prefer_return(request), location=location)

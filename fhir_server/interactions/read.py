"""read: ``GET [base]/[type]/[id]`` with conditional read (If-None-Match, If-Modified-Since)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import (
    FhirResponse,
    check_format,
    not_modified,
    resource_response,
    version_headers,
)
from fhir_server.interactions.context import FhirContext


async def read(ctx: FhirContext, request: Request, resource_type: str, resource_id: str
               ) -> Response:
    check_format(request)
    stored = await ctx.caller(request).read(resource_type, resource_id)
    if not_modified(request, stored):
        return FhirResponse(b"", status_code=304, headers=version_headers(stored))
    return resource_response(stored)

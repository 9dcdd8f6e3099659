"""vread: ``GET [base]/[type]/[id]/_history/[vid]``; a deleted version answers 410."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import check_format, resource_response
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import FhirError


async def vread(ctx: FhirContext, request: Request, resource_type: str, resource_id: str,
                version_id: str) -> Response:
    check_format(request)
    if not version_id.isdecimal():
        raise FhirError.of(404, "not-found", f"Unknown version {version_id!r}")
    stored = await ctx.caller(request).read(resource_type, resource_id, int(version_id))
    return resource_response(stored)

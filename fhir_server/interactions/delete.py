"""delete: ``DELETE [base]/[type]/[id]``; writes a versioned tombstone. Deleting an
already deleted resource succeeds again (idempotent); an id never used is a 404."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse, parse_etag
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import information


async def delete(ctx: FhirContext, request: Request, resource_type: str, resource_id: str
                 ) -> Response:
    if_match = parse_etag(request.headers.get("if-match"))
    stored = await ctx.service.delete(resource_type, resource_id, if_match=if_match)
    return FhirResponse(
        information(f"{resource_type}/{resource_id} deleted"),
        headers={"ETag": stored.etag},
    )

"""patch: ``PATCH [base]/[type]/[id]`` with a JSON Patch (``application/json-patch+json``),
a JSON Merge Patch (``application/merge-patch+json``, or a plain ``application/json``
object as fhirpy sends it) or a FHIRPath Patch (a ``Parameters`` resource): see
``fhir_server.patches``. ``PATCH [base]/[type]?criteria`` patches the one resource that
matches (none: 404, several: 412)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import (
    check_format,
    conditional_criteria,
    parse_etag,
    prefer_return,
    read_json_body,
    resource_response,
)
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import FhirError
from fhir_server.patches import patch_from_body
from fhir_server.store import MultipleMatches


async def patch(ctx: FhirContext, request: Request, resource_type: str, resource_id: str
                ) -> Response:
    check_format(request)
    content_type = request.headers.get("content-type", "")
    if_match = parse_etag(request.headers.get("if-match"))
    body = patch_from_body(content_type, await read_json_body(request, patch=True))
    stored = await ctx.caller(request).patch(resource_type, resource_id, body,
                                             if_match=if_match)
    return resource_response(stored, prefer=prefer_return(request))


async def conditional_patch(ctx: FhirContext, request: Request, resource_type: str
                            ) -> Response:
    ctx.service.check_type(resource_type)
    ids = await ctx.caller(request).match_ids(resource_type, conditional_criteria(request),
                                              limit=2)
    if not ids:
        raise FhirError.of(404, "not-found", f"No {resource_type} matches the criteria")
    if len(ids) > 1:
        raise MultipleMatches(resource_type, len(ids))
    return await patch(ctx, request, resource_type, ids[0])

"""delete: ``DELETE [base]/[type]/[id]``; writes a versioned tombstone. Deleting an
already deleted resource succeeds again (idempotent); an id never used is a 404.

Conditional delete: ``DELETE [base]/[type]?criteria`` deletes every match in one commit
(``conditionalDelete = multiple``, at most 100); no match answers 200 with an
OperationOutcome saying nothing was deleted.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse, conditional_criteria, parse_etag
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import information


async def delete(ctx: FhirContext, request: Request, resource_type: str, resource_id: str
                 ) -> Response:
    if_match = parse_etag(request.headers.get("if-match"))
    stored = await ctx.caller(request).delete(resource_type, resource_id, if_match=if_match)
    return FhirResponse(
        information(f"{resource_type}/{resource_id} deleted"),
        headers={"ETag": stored.etag},
    )


async def conditional_delete(ctx: FhirContext, request: Request, resource_type: str
                             ) -> Response:
    deleted = await ctx.caller(request).conditional_delete(resource_type,
                                                           conditional_criteria(request))
    if not deleted:
        return FhirResponse(information(f"No {resource_type} matched; nothing was deleted"))
    names = ", ".join(f"{s.resource_type}/{s.id}" for s in deleted)
    headers = {"ETag": deleted[0].etag} if len(deleted) == 1 else {}
    return FhirResponse(information(f"Deleted {len(deleted)}: {names}"), headers=headers)

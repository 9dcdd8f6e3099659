"""create: ``POST [base]/[type]``; 201 with Location (``_history``), ETag and the
representation asked for by ``Prefer: return=``.

Conditional create (``If-None-Exist: identifier=sys|val``, R4 3.1.0.8.1): no match
creates (201), one match answers 200 with that resource and creates nothing, several
answer 412. The check runs inside the store's commit, so two identical requests at the
same moment still create one resource; it sees what the caller may see. Criteria in the
query string (``POST [type]?identifier=...``) are taken the same way: clients such as
fhirpy's ``get_or_create`` send them there.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.conformance.profiles import collected_warnings
from fhir_server.http import (
    check_format,
    conditional_criteria,
    if_none_exist,
    prefer_return,
    read_json_body,
    resource_response,
)
from fhir_server.interactions.context import FhirContext


async def create(ctx: FhirContext, request: Request, resource_type: str) -> Response:
    check_format(request)
    ctx.service.check_type(resource_type)
    body = await read_json_body(request)
    criteria = if_none_exist(request)
    if criteria is None:
        criteria = conditional_criteria(request) or None
    with collected_warnings() as warnings:
        stored, created = await ctx.caller(request).create(
            body, expected_type=resource_type, if_none_exist=criteria)
    location = ctx.location(request, resource_type, stored.id, stored.version)
    return resource_response(stored, 201 if created else 200, prefer=prefer_return(request),
                             location=location, issues=warnings)

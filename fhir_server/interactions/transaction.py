"""transaction / batch: ``POST [base]`` with a Bundle (R4 3.1.0.11).

The engine is :mod:`fhir_server.transactions`; this is the HTTP door: the body, the
caller's access, ``Prefer: return=``, the response.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse, check_format, prefer_return, read_json_body
from fhir_server.interactions.context import FhirContext
from fhir_server.transactions import cyclic_gc_deferred, process_bundle


async def transaction_or_batch(ctx: FhirContext, request: Request) -> Response:
    """``POST [base]``: a transaction or batch Bundle."""
    check_format(request)
    size = request.headers.get("content-length", "")
    with cyclic_gc_deferred(size.isdecimal() and int(size) > 64 * 1024):  # parsing included
        body = await read_json_body(request)
        result = await process_bundle(ctx.service, body, access=ctx.caller(request).access,
                                      base_url=ctx.fhir_base(request),
                                      prefer=prefer_return(request))
    return FhirResponse(result)

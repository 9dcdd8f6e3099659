"""search-type: ``GET [base]/[type]?...`` and ``POST [base]/[type]/_search``.

The answer is a searchset Bundle (:mod:`fhir_server.searchset`). Unknown or unsupported
parameters are ignored and reported (``Prefer: handling=lenient``, the default) or
refused with 400 under ``Prefer: handling=strict``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse, check_format
from fhir_server.interactions.context import FhirContext
from fhir_server.searchset import Params, run_search


def strict_handling(request: Request) -> bool:
    return "handling=strict" in request.headers.get("prefer", "").replace(" ", "")


async def search_params(request: Request) -> Params:
    """Query parameters, plus the form body of ``POST .../_search``."""
    params = list(request.query_params.multi_items())
    if request.method == "POST":
        form = await request.form()
        params += [(k, str(v)) for k, v in form.multi_items()]
    return params


async def search_type(ctx: FhirContext, request: Request, resource_type: str) -> Response:
    check_format(request)
    ctx.service.check_type(resource_type)
    params = await search_params(request)
    result = await run_search(ctx.caller(request), ctx.fhir_base(request), resource_type,
                              [resource_type], params, strict=strict_handling(request))
    return FhirResponse(result)

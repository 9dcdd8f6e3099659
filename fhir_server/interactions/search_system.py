"""search-system: ``GET [base]?...`` and ``POST [base]/_search`` across resource types.

``_type=Patient,Observation`` limits the types; without it every type is searched and
only the parameters every type has (``_id``, ``_lastUpdated``, ``_tag``, ``_profile``,
``_security``, ``_source``, ``_text``, ``_content``) apply. With ``_type``, a parameter
must exist, with the same type, on each listed type.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse, check_format
from fhir_server.interactions.context import FhirContext
from fhir_server.interactions.search_type import search_params, strict_handling
from fhir_server.outcome import FhirError
from fhir_server.searchset import run_search
from fhir_server.validation import is_resource_type, resource_types


def requested_types(params: list[tuple[str, str]]) -> list[str] | None:
    """The ``_type`` values (all occurrences, comma separated), or None when absent."""
    values = [t.strip() for name, value in params if name == "_type" for t in value.split(",")]
    if not values:
        return None
    unknown = [t for t in values if not is_resource_type(t)]
    if unknown:
        raise FhirError.of(400, "value", f"_type names unknown types: {', '.join(unknown)}",
                           "_type")
    return sorted(set(values))


async def search_system(ctx: FhirContext, request: Request) -> Response:
    check_format(request)
    params = await search_params(request)
    types = requested_types(params)
    result = await run_search(ctx.caller(request), ctx.fhir_base(request), "", types or
                              sorted(resource_types()), params,
                              strict=strict_handling(request), all_types=types is None)
    return FhirResponse(result)

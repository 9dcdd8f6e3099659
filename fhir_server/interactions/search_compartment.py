"""search-compartment: ``GET [base]/Patient/[id]/[type]?...`` (R4 3.1.1.1).

The resources of a type that belong to a patient's compartment: those whose compartment
parameters (from the official CompartmentDefinition, e.g. Observation ``subject`` and
``performer``) reference the patient, further filtered by the usual search parameters.
``*`` as the type searches every type of the compartment. Only the Patient compartment is
defined by the generated registry; other compartments answer 404. The owner must be the
caller's to read (403), and the results are what the caller may see.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse, check_format
from fhir_server.interactions.context import FhirContext
from fhir_server.interactions.search_type import search_params, strict_handling
from fhir_server.outcome import FhirError
from fhir_server.search.plan import compartment
from fhir_server.searchset import run_search


async def search_compartment(ctx: FhirContext, request: Request, compartment_type: str,
                             owner_id: str, resource_type: str) -> Response:
    check_format(request)
    service = ctx.service
    service.check_type(compartment_type)
    registry = await service.refresh_registry()
    members = registry.compartment_types(compartment_type)
    if not members:
        raise FhirError.of(404, "not-supported",
                           f"The {compartment_type} compartment is not supported")
    if resource_type == "*":
        types = members
    else:
        service.check_type(resource_type)
        if resource_type not in members:
            raise FhirError.of(400, "invalid", f"{resource_type} resources are not in the "
                               f"{compartment_type} compartment")
        types = [resource_type]
    caller = ctx.caller(request)
    await caller.read(compartment_type, owner_id)  # 404/410 unknown, 403 not the caller's
    params = await search_params(request)
    path = f"{compartment_type}/{owner_id}/{resource_type}"
    result = await run_search(caller, ctx.fhir_base(request), path, types, params,
                              strict=strict_handling(request),
                              compartment=compartment(registry, compartment_type, owner_id,
                                                      types))
    return FhirResponse(result)

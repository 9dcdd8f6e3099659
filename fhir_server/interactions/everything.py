"""``GET [base]/Patient/[id]/$everything``: the patient's record (R4 Patient/$everything).

The Patient, everything in the Patient compartment, and the resources those reference
(practitioners, organizations, medications, ...; ``search.mode = include``), as a
searchset Bundle paged like any search: whatever of it the caller may see. Parameters:
``_since`` (only resources changed since then), ``_type`` (only these types), ``_count``
(page size).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse, check_format
from fhir_server.interactions.context import FhirContext
from fhir_server.interactions.search_system import requested_types
from fhir_server.outcome import FhirError
from fhir_server.search.plan import Include, compartment
from fhir_server.searchset import run_search

_PASSED = ("_count", "_cursor", "_format")


async def everything(ctx: FhirContext, request: Request, patient_id: str) -> Response:
    check_format(request)
    service = ctx.service
    caller = ctx.caller(request)
    await caller.read("Patient", patient_id)  # 404/410 unknown, 403 not the caller's
    registry = await service.refresh_registry()
    query = list(request.query_params.multi_items())
    members = ["Patient", *registry.compartment_types("Patient")]
    wanted = requested_types(query)
    types = sorted(set(members) & set(wanted)) if wanted else sorted(set(members))
    if not types:
        raise FhirError.of(400, "value", "None of the _type values is in the Patient "
                           "compartment", "_type")
    params = [(k, v) for k, v in query if k in _PASSED]
    since = [v for k, v in query if k == "_since"]
    fhir_base = ctx.fhir_base(request)
    plan = await caller.parse(types, [*params, *(("_lastUpdated", f"ge{s}") for s in since)],
                              strict=True, base_url=fhir_base)
    plan.includes = [Include(t, "*") for t in types]
    result = await run_search(
        caller, fhir_base, f"Patient/{patient_id}/$everything",
        types, [*params, *(("_since", s) for s in since), *(("_type", t) for t in wanted or [])],
        strict=True, plan=plan,
        compartment=compartment(registry, "Patient", patient_id, types, include_owner=True))
    return FhirResponse(result)

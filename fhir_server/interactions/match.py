"""``POST [base]/Patient/$match``: the patients that may be the one described (R4
operation Patient-match; IHE PDQm ITI-119 Patient Demographics Match).

The body is a ``Parameters`` with ``resource`` (the Patient to match: validated as R4),
``onlyCertainMatches`` (boolean: only ``certain`` ones) and ``count`` (at most this many,
1-100, default 10); a bare Patient is taken as the ``resource``. The answer is a searchset
Bundle, best first, each entry with ``search.mode`` = ``match``, ``search.score`` (0-1)
and the ``match-grade`` extension (``certain`` | ``probable`` | ``possible``), whatever
of it the caller may see.

The matching itself is not FHIR's business: the app gives a matcher in the context's
extras (``MATCHER``: ``matcher(caller, patient, count, only_certain)`` → ``[(patient,
score, grade)]``); without one the operation is 501.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.caller import CallerFhir
from fhir_server.http import FhirResponse, check_format, read_json_body
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import FhirError

JSON = dict[str, Any]
MATCHER = "patient_matcher"
MATCH_GRADE = "http://hl7.org/fhir/StructureDefinition/match-grade"
MAX_COUNT = 100
PatientMatcher = Callable[[CallerFhir, JSON, int, bool],
                          Awaitable[list[tuple[JSON, float, str]]]]


async def match(ctx: FhirContext, request: Request) -> Response:
    check_format(request)
    matcher: PatientMatcher | None = ctx.extras.get(MATCHER)
    if matcher is None:
        raise FhirError.of(501, "not-supported", "Patient/$match is not offered here")
    resource, only_certain, count = _arguments(await read_json_body(request))
    await ctx.service.validate(resource, "Patient")
    base = ctx.fhir_base(request)
    found = await matcher(ctx.caller(request), resource, count, only_certain)
    return FhirResponse({
        "resourceType": "Bundle", "type": "searchset", "total": len(found),
        "link": [{"relation": "self", "url": f"{base}/Patient/$match"}],
        "entry": [{"fullUrl": f"{base}/Patient/{patient['id']}", "resource": patient,
                   "search": {"mode": "match", "score": round(score, 6), "extension": [
                       {"url": MATCH_GRADE, "valueCode": grade}]}}
                  for patient, score, grade in found]})


def _arguments(body: Any) -> tuple[JSON, bool, int]:
    """(resource, onlyCertainMatches, count) from a Parameters body (or a bare Patient)."""
    if isinstance(body, dict) and body.get("resourceType") == "Patient":
        return body, False, 10
    if not isinstance(body, dict) or body.get("resourceType") != "Parameters":
        raise FhirError.of(400, "invalid", "The body must be a Parameters resource with a "
                           "'resource' parameter holding a Patient")
    resource: Any = None
    only_certain: Any = False
    count: Any = 10
    for parameter in body.get("parameter") or []:
        if not isinstance(parameter, dict):
            continue
        name = parameter.get("name")
        if name == "resource":
            resource = parameter.get("resource")
        elif name == "onlyCertainMatches":
            only_certain = parameter.get("valueBoolean")
            if not isinstance(only_certain, bool):
                raise FhirError.of(400, "value", "onlyCertainMatches takes valueBoolean",
                                   "Parameters.parameter.valueBoolean")
        elif name == "count":
            count = parameter.get("valueInteger")
            if not isinstance(count, int) or isinstance(count, bool) \
                    or not 1 <= count <= MAX_COUNT:
                raise FhirError.of(400, "value", f"count takes a valueInteger from 1 to "
                                   f"{MAX_COUNT}", "Parameters.parameter.valueInteger")
    if not isinstance(resource, dict) or resource.get("resourceType") != "Patient":
        raise FhirError.of(400, "required", "The 'resource' parameter must hold the Patient "
                           "to match", "Parameters.parameter.resource")
    return resource, only_certain, count

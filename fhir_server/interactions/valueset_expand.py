"""``ValueSet/$expand`` (R4 OperationDefinition ValueSet-expand): the codes of a value set.

``GET|POST [base]/ValueSet/$expand`` with ``url`` (a value set the server knows) or a
``valueSet`` resource in the body; or ``[base]/ValueSet/[id]/$expand``. Takes ``filter``
(text the code or display contains), ``count`` and ``offset`` (paging, at most 1,000 codes
a page), ``includeDesignations``, ``activeOnly`` and ``excludeNotForUI``. Answers the
ValueSet with its ``expansion``: ``total`` (all codes matching), ``offset``, the
parameters used, and ``contains``.

A value set that takes codes from a system the server does not hold (SNOMED CT, LOINC)
cannot be listed: 422 ``too-costly``, as a terminology server answers; an unknown value
set is a 404.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse
from fhir_server.interactions.context import FhirContext
from fhir_server.interactions.terminology_common import read_input, stored_resource, terminology
from fhir_server.outcome import FhirError
from fhir_server.terminology.valuesets import ExpansionError

MAX_PAGE = 1000


async def valueset_expand(ctx: FhirContext, request: Request,
                          resource_id: str | None = None) -> Response:
    found = await read_input(request, "$expand")
    content = await terminology(ctx)
    if resource_id is not None:
        value_set = await stored_resource(ctx, request, "ValueSet", resource_id)
    elif found.complex("valueSet") is not None:
        value_set = found.complex("valueSet") or {}
        if value_set.get("resourceType") != "ValueSet":
            raise FhirError.of(400, "invalid", "the valueSet parameter must be a ValueSet",
                               "valueSet")
    else:
        found.require("url")
        url = str(found.text("url"))
        value_set = content.value_set(url, found.text("valueSetVersion")) or {}
        if not value_set:
            raise FhirError.of(404, "not-found", f"The value set {url} is not known to the "
                               "server", "url")
    count = found.integer("count", MAX_PAGE, high=MAX_PAGE)
    offset = found.integer("offset", 0, high=1_000_000)
    designations = found.flag("includeDesignations")
    text = found.text("filter")
    try:
        entries = content.engine.expand(value_set, text=text,
                                        active_only=found.flag("activeOnly"),
                                        exclude_not_selectable=found.flag("excludeNotForUI"))
    except ExpansionError as exc:
        raise FhirError.of(422 if exc.code == "too-costly" else 400, exc.code,
                           str(exc)) from None
    used: list[dict[str, Any]] = [{"name": "offset", "valueInteger": offset},
                                  {"name": "count", "valueInteger": count}]
    if text:
        used.append({"name": "filter", "valueString": text})
    if designations:
        used.append({"name": "includeDesignations", "valueBoolean": True})
    expansion = {
        "identifier": f"urn:uuid:{uuid.uuid4()}",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "total": len(entries), "offset": offset, "parameter": used,
        "contains": [e.to_json(designations) for e in entries[offset:offset + count]],
    }
    result = {k: v for k, v in value_set.items() if k not in ("expansion", "text")}
    result["expansion"] = expansion
    return FhirResponse(result)

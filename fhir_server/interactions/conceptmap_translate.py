"""``ConceptMap/$translate`` (R4 OperationDefinition ConceptMap-translate): a code mapped
to another code system.

``GET|POST [base]/ConceptMap/$translate`` with ``system`` + ``code`` (or ``coding`` /
``codeableConcept``) and one of ``url`` (a concept map), ``source`` / ``target`` (value
sets a map goes between) or ``targetsystem``; ``[base]/ConceptMap/[id]/$translate`` for a
stored map; ``reverse`` to map back. Without a map named, every map the server knows
(stored ones, then the R4 ones) is tried. Answers ``result`` (a match was found),
``message`` and each ``match``: ``equivalence``, ``concept`` (a Coding) and ``source`` (the
map's URL).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse
from fhir_server.interactions.context import FhirContext
from fhir_server.interactions.terminology_common import (
    codings_of,
    parameters,
    read_input,
    stored_resource,
    terminology,
)
from fhir_server.outcome import FhirError
from fhir_server.terminology.conceptmaps import is_match, translate


async def conceptmap_translate(ctx: FhirContext, request: Request,
                               resource_id: str | None = None) -> Response:
    found = await read_input(request, "$translate")
    found.require("code", "coding", "codeableConcept")
    content = await terminology(ctx)
    context = await ctx.service.conformance.registry.refresh()
    if resource_id is not None:
        maps = [await stored_resource(ctx, request, "ConceptMap", resource_id)]
    elif found.text("url"):
        url = str(found.text("url"))
        concept_map = content.concept_map(url, found.text("conceptMapVersion"))
        if concept_map is None:
            raise FhirError.of(404, "not-found", f"The concept map {url} is not known to the "
                               "server", "url")
        maps = [concept_map]
    elif found.complex("conceptMap") is not None:
        maps = [found.complex("conceptMap") or {}]
    else:
        maps = content.concept_maps(context.stored_of("ConceptMap"))
        source, target = found.text("source"), found.text("target")
        maps = [m for m in maps if _scope(m, "source") in (None, source) or source is None]
        maps = [m for m in maps if _scope(m, "target") in (None, target) or target is None]
    target_system = found.text("targetsystem")
    reverse = found.flag("reverse")
    matches = []
    for coding in codings_of(found):
        for concept_map in maps:
            matches += translate(concept_map, coding.get("system"), str(coding.get("code")),
                                 target_system, reverse=reverse)
    good = [m for m in matches if is_match(m)]
    items: list[tuple[str, Any]] = [("result", bool(good))]
    if not good:
        items.append(("message", "no mapping was found for the code"
                      + (f" into {target_system}" if target_system else "")))
    for match in matches:
        concept = {k: v for k, v in (("system", match.system), ("code", match.code),
                                     ("display", match.display)) if v is not None}
        parts: list[tuple[str, Any]] = [("equivalence", ("Code", match.equivalence))]
        if concept:
            parts.append(("concept", ("Coding", concept)))
        parts.append(("source", ("Uri", match.source)))
        items.append(("match", parts))
    return FhirResponse(parameters(*items))


def _scope(concept_map: dict[str, Any], side: str) -> str | None:
    for key in (f"{side}Uri", f"{side}Canonical"):
        if concept_map.get(key):
            return str(concept_map[key])
    return None

"""``CodeSystem/$lookup`` (R4 OperationDefinition CodeSystem-lookup): the details of a
code of a code system.

``GET|POST [base]/CodeSystem/$lookup`` with ``system`` + ``code`` (and ``version``) or a
``coding``. Answers ``name``, ``version``, ``display``, each ``designation`` (language,
use, value) and ``property`` (the concept's own properties, ``parent`` and ``child`` from
the hierarchy; only those named when ``property`` is given). A code system the server
does not hold, or a code not in it, is a 404 OperationOutcome.
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
    terminology,
)
from fhir_server.outcome import FhirError
from fhir_server.terminology.codesystems import Concept


async def codesystem_lookup(ctx: FhirContext, request: Request) -> Response:
    found = await read_input(request, "$lookup")
    found.require("code", "coding")
    coding = codings_of(found)[0]
    system, code = coding.get("system"), coding.get("code")
    if not system or not code:
        raise FhirError.of(400, "required", "$lookup needs a system and a code", "system")
    content = await terminology(ctx)
    code_system = content.code_system(system, coding.get("version"))
    if code_system is None:
        raise FhirError.of(404, "not-found", f"The code system {system} is not known to the "
                           "server", "system")
    concept = code_system.lookup(code)
    if concept is None:
        raise FhirError.of(404, "not-found", f"The code '{code}' is not in {system}", "code")
    wanted = {str(p) for p in found.all("property")}
    items: list[tuple[str, Any]] = [
        ("name", code_system.name), ("version", code_system.version),
        ("display", concept.display or concept.code)]
    if concept.definition and (not wanted or "definition" in wanted):
        items.append(("definition", concept.definition))
    for designation in concept.designations:
        parts: list[tuple[str, Any]] = [("language", ("Code", designation.get("language"))),
                                        ("use", ("Coding", designation.get("use"))),
                                        ("value", designation.get("value"))]
        items.append(("designation", [(n, v) for n, v in parts
                                      if v is not None and v != ("Code", None)
                                      and v != ("Coding", None)]))
    items += [("property", part) for part in _properties(concept, wanted)]
    return FhirResponse(parameters(*items))


def _properties(concept: Concept, wanted: set[str]) -> list[list[tuple[str, Any]]]:
    found = []
    for prop in concept.properties:
        name = prop.get("code")
        if wanted and name not in wanted:
            continue
        value = next(((key[5:], v) for key, v in prop.items() if key.startswith("value")),
                     None)
        if name and value is not None:
            found.append([("code", ("Code", name)), ("value", value)])
    for name, codes in (("parent", concept.parents), ("child", concept.children)):
        if wanted and name not in wanted:
            continue
        found += [[("code", ("Code", name)), ("value", ("Code", code))]
                  for code in sorted(codes)]
    return found

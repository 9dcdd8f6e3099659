"""``CodeSystem/$validate-code`` (R4 OperationDefinition CodeSystem-validate-code):
whether a code is in a code system, and its display.

``GET|POST [base]/CodeSystem/$validate-code`` with ``url`` (the system) + ``code`` (and
``version``, ``display``), a ``coding`` or a ``codeableConcept``; or
``[base]/CodeSystem/[id]/$validate-code`` for a stored code system. Answers ``result``,
``display`` and a ``message`` when the code is not valid, or its display is not the
code system's. A code system the server does not hold is a 404.
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
from fhir_server.terminology.codesystems import CodeSystemIndex


async def codesystem_validate_code(ctx: FhirContext, request: Request,
                                   resource_id: str | None = None) -> Response:
    found = await read_input(request, "$validate-code")
    found.require("code", "coding", "codeableConcept")
    content = await terminology(ctx)
    codings = codings_of(found)
    code_system: CodeSystemIndex | None
    if resource_id is not None:
        code_system = CodeSystemIndex(await stored_resource(ctx, request, "CodeSystem",
                                                            resource_id))
    else:
        url = found.text("url") or next((c.get("system") for c in codings if c.get("system")),
                                        None)
        if url is None:
            raise FhirError.of(400, "required", "$validate-code needs the code system's url "
                               "(or a coding with a system)", "url")
        code_system = content.code_system(url, found.text("version"))
        if code_system is None:
            raise FhirError.of(404, "not-found", f"The code system {url} is not known to the "
                               "server", "url")
    return FhirResponse(parameters(*_verdict(code_system, codings)))


def _verdict(code_system: CodeSystemIndex, codings: list[dict[str, Any]]
             ) -> list[tuple[str, Any]]:
    messages = []
    for coding in codings:
        if coding.get("system") not in (None, code_system.url):
            messages.append(f"the system {coding.get('system')} is not {code_system.url}")
            continue
        concept = code_system.lookup(str(coding.get("code")))
        if concept is None:
            messages.append(f"the code '{coding.get('code')}' is not in {code_system.url}")
            continue
        display = coding.get("display")
        shown = concept.display or concept.code
        if display and display.strip().lower() != shown.strip().lower() and not any(
                str(d.get("value", "")).lower() == display.lower()
                for d in concept.designations):
            return [("result", False), ("display", shown),
                    ("message", f"the display '{display}' is not the display of "
                     f"{code_system.url}#{concept.code} ('{shown}')")]
        return [("result", True), ("display", shown)]
    return [("result", False), ("message", "; ".join(messages) or "no code was given")]

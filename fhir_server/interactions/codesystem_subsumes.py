"""``CodeSystem/$subsumes`` (R4 OperationDefinition CodeSystem-subsumes): how two codes
of a code system relate in its hierarchy.

``GET|POST [base]/CodeSystem/$subsumes`` with ``system`` + ``codeA`` + ``codeB`` (or
``codingA`` / ``codingB``), or ``[base]/CodeSystem/[id]/$subsumes``. Answers ``outcome``:
``equivalent``, ``subsumes`` (A is an ancestor of B), ``subsumed-by`` or
``not-subsumed``. A code not in the system is a 400 naming it.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse
from fhir_server.interactions.context import FhirContext
from fhir_server.interactions.terminology_common import (
    parameters,
    read_input,
    stored_resource,
    terminology,
)
from fhir_server.outcome import FhirError
from fhir_server.terminology.codesystems import CodeSystemIndex


async def codesystem_subsumes(ctx: FhirContext, request: Request,
                              resource_id: str | None = None) -> Response:
    found = await read_input(request, "$subsumes")
    coding_a, coding_b = found.complex("codingA") or {}, found.complex("codingB") or {}
    code_a = found.text("codeA") or coding_a.get("code")
    code_b = found.text("codeB") or coding_b.get("code")
    if not code_a or not code_b:
        raise FhirError.of(400, "required", "$subsumes needs codeA and codeB (or codingA and "
                           "codingB)", "codeA")
    code_system: CodeSystemIndex | None
    if resource_id is not None:
        code_system = CodeSystemIndex(await stored_resource(ctx, request, "CodeSystem",
                                                            resource_id))
    else:
        system = found.text("system") or coding_a.get("system") or coding_b.get("system")
        if not system:
            raise FhirError.of(400, "required", "$subsumes needs the system", "system")
        code_system = (await terminology(ctx)).code_system(system, found.text("version"))
        if code_system is None:
            raise FhirError.of(404, "not-found", f"The code system {system} is not known to "
                               "the server", "system")
    for name, coding in (("codingA", coding_a), ("codingB", coding_b)):
        if coding.get("system") not in (None, code_system.url):
            raise FhirError.of(400, "invalid", f"{name} is from {coding.get('system')}, not "
                               f"{code_system.url}", name)
    try:
        outcome = code_system.subsumes(str(code_a), str(code_b))
    except KeyError as exc:
        raise FhirError.of(400, "code-invalid", f"The code '{exc.args[0]}' is not in "
                           f"{code_system.url}",
                           "codeA" if exc.args[0] == code_a else "codeB") from None
    return FhirResponse(parameters(("outcome", ("Code", outcome))))

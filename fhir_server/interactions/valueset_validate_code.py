"""``ValueSet/$validate-code`` (R4 OperationDefinition ValueSet-validate-code): whether a
code is in a value set (a pick list's check before a client sends).

``GET|POST [base]/ValueSet/$validate-code`` with ``url`` (or a ``valueSet`` resource) and
``system`` + ``code`` (``display``), a ``coding`` or a ``codeableConcept``; or
``[base]/ValueSet/[id]/$validate-code``. Answers ``result``, the code's ``display``, and a
``message`` when it is not valid. When membership cannot be told (the value set takes
codes of a system the server does not hold) ``result`` is false with a message saying
so, as a terminology server answers what it cannot confirm.
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
from fhir_server.terminology.valuesets import ExpansionError


async def valueset_validate_code(ctx: FhirContext, request: Request,
                                 resource_id: str | None = None) -> Response:
    found = await read_input(request, "$validate-code")
    found.require("code", "coding", "codeableConcept")
    content = await terminology(ctx)
    if resource_id is not None:
        value_set = await stored_resource(ctx, request, "ValueSet", resource_id)
    elif found.complex("valueSet") is not None:
        value_set = found.complex("valueSet") or {}
    else:
        found.require("url")
        url = str(found.text("url"))
        value_set = content.value_set(url, found.text("valueSetVersion")) or {}
        if not value_set:
            raise FhirError.of(404, "not-found", f"The value set {url} is not known to the "
                               "server", "url")
    try:
        members = content.engine.members_of(value_set)
    except ExpansionError as exc:
        raise FhirError.of(400, exc.code, str(exc)) from None
    codings = codings_of(found, system_name="system", version_name="systemVersion")
    messages: list[str] = []
    for coding in codings:
        code = coding.get("code")
        if not isinstance(code, str):
            continue
        verdict = content.engine.member(members, coding.get("system"), code)
        if verdict.result is True:
            return FhirResponse(parameters(*_valid(content, coding, verdict.display)))
        messages.append(verdict.message)
    return FhirResponse(parameters(("result", False),
                                   ("message", "; ".join(messages) or "no code was given")))


def _valid(content: Any, coding: dict[str, Any], display: str | None
           ) -> list[tuple[str, Any]]:
    given = coding.get("display")
    if display is None and coding.get("system"):
        code_system = content.code_system(coding["system"])
        concept = code_system.lookup(coding["code"]) if code_system else None
        display = concept.display if concept else None
    if given and display and given.strip().lower() != display.strip().lower():
        return [("result", False), ("display", display),
                ("message", f"the display '{given}' is not the display of the code "
                 f"('{display}')")]
    return [("result", True), ("display", display)]

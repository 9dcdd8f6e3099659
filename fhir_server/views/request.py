"""The parameters of ``$run`` and ``$viewdefinition-export`` (SQL on FHIR v2
OperationDefinitions ViewDefinitionRun and ViewDefinitionExport).

They come in the query string (GET, and what a POST adds to its URL) and in a
``Parameters`` body (POST): ``value[x]`` for primitives and references, ``resource``
for ``viewResource`` and ``resource``, ``part`` for an export's ``view``. A parameter
the operation does not define, or does not offer here (``source``: this server reads
its own store), is a 400 naming it; so is a value of the wrong kind.

Views are resolved as the caller (:func:`resolve_view`): ``viewReference`` as a relative
(``ViewDefinition/123``) or absolute URL of this server's, or a canonical URL
(``url|version``) searched among the stored ViewDefinitions the caller may read;
``viewResource`` inline. A stored view runs as it was validated on write; an inline one
is checked against the ViewDefinition structure and compiled first (422 naming each
element at fault, as the specification asks of an invalid view).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fhir_server.bulk.request import is_instant
from fhir_server.caller import CallerFhir
from fhir_server.outcome import FhirError, Issue
from fhir_server.search.values import parse_reference
from fhir_server.store import ResourceGone, ResourceNotFound
from fhir_server.validation import structure_issues
from fhir_server.views.definition import CompiledView, ViewInvalid, compile_view
from fhir_server.views.output import output_format

JSON = dict[str, Any]


@dataclass(slots=True)
class Param:
    """One parameter: its value (a string from a query; from a body the ``value[x]``,
    the ``resource`` or, for ``part``, the parts) and where it is, for errors."""

    name: str
    value: Any
    where: str
    parts: list[Param] = field(default_factory=list)


def query_params(pairs: list[tuple[str, str]]) -> list[Param]:
    return [Param(name, value, name) for name, value in pairs
            if name not in ("_pretty",)]


def body_params(body: Any, operation: str) -> list[Param]:
    if not isinstance(body, dict) or body.get("resourceType") != "Parameters":
        raise FhirError.of(400, "invalid", f"{operation} takes a Parameters resource")
    return _params(body.get("parameter"), "Parameters.parameter")


def _params(raw: Any, where: str) -> list[Param]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise FhirError.of(400, "structure", f"{where} must be a list", where)
    found = []
    for i, parameter in enumerate(raw):
        here = f"{where}[{i}]"
        if not isinstance(parameter, dict) or not isinstance(parameter.get("name"), str):
            raise FhirError.of(400, "required", "Each parameter needs a name", here)
        values = [v for k, v in parameter.items() if k.startswith("value")]
        if "resource" in parameter:
            values.append(parameter["resource"])
        parts = _params(parameter.get("part"), f"{here}.part")
        if len(values) > 1 or (not values and not parts):
            raise FhirError.of(400, "invalid", f"{parameter['name']}: one value, resource "
                               "or part is needed", here)
        found.append(Param(parameter["name"], values[0] if values else None, here, parts))
    return found


# -- values --------------------------------------------------------------------------------
def text(param: Param) -> str:
    if not isinstance(param.value, str) or not param.value:
        raise FhirError.of(400, "invalid", f"{param.name} must be a string", param.where)
    return param.value


def boolean(param: Param) -> bool:
    if isinstance(param.value, bool):
        return param.value
    if param.value in ("true", "false"):
        return param.value == "true"
    raise FhirError.of(400, "invalid", f"{param.name} must be true or false", param.where)


def count(param: Param) -> int:
    value = param.value
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise FhirError.of(400, "invalid", f"{param.name} must be a positive integer",
                           param.where)
    return value


def instant(param: Param) -> str:
    value = text(param)
    if not is_instant(value):
        raise FhirError.of(400, "value", f"{param.name} must be an instant with a time "
                           "zone, e.g. 2026-01-31T00:00:00Z", param.where)
    return value


def reference(param: Param) -> str:
    """A reference's literal URL (``valueReference.reference``) or a string/uri."""
    value = param.value
    if isinstance(value, dict):
        value = value.get("reference")
    if not isinstance(value, str) or not value:
        raise FhirError.of(400, "invalid", f"{param.name} must be a reference "
                           "(e.g. Patient/123)", param.where)
    return value


def resource(param: Param, expected: str | None = None) -> JSON:
    value = param.value
    if not isinstance(value, dict) or not isinstance(value.get("resourceType"), str):
        raise FhirError.of(400, "invalid", f"{param.name} must be a resource", param.where)
    if expected is not None and value["resourceType"] != expected:
        raise FhirError.of(400, "invalid", f"{param.name} must be a {expected}, not a "
                           f"{value['resourceType']}", param.where)
    return value


# -- what both operations share ------------------------------------------------------------------
@dataclass(slots=True)
class Common:
    fmt: str | None = None
    header: bool = True
    since: str | None = None
    patients: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)

    def take(self, param: Param) -> bool:
        """Read ``param`` when it is one of these; whether it was."""
        if param.name == "_format":
            self.fmt = output_format(text(param))
        elif param.name == "header":
            self.header = boolean(param)
        elif param.name == "_since":
            self.since = instant(param)
        elif param.name == "patient":
            self.patients.append(reference(param))
        elif param.name == "group":
            self.groups.append(reference(param))
        elif param.name == "source":
            raise FhirError.of(400, "not-supported", "The server does not support the "
                               "'source' parameter: views run over its own data",
                               param.where)
        else:
            return False
        return True


def unknown(param: Param, operation: str) -> FhirError:
    return FhirError.of(400, "not-supported", f"{param.name} is not a parameter of "
                        f"{operation}", param.where)


# -- views -----------------------------------------------------------------------------------
async def stored_view(caller: CallerFhir, view_id: str, where: str) -> JSON:
    try:
        return await caller.read_json("ViewDefinition", view_id)
    except (ResourceNotFound, ResourceGone):
        raise FhirError.of(404, "not-found", f"ViewDefinition with id {view_id!r} not "
                           "found", where) from None


async def referenced_view(caller: CallerFhir, value: str, where: str) -> JSON:
    """The stored ViewDefinition a ``viewReference`` names (see the module docstring)."""
    parsed = parse_reference(value)
    if parsed.resource_type == "ViewDefinition" and parsed.id and "|" not in value:
        return await stored_view(caller, parsed.id, where)
    url, _, version = value.partition("|")
    found = await caller.search("ViewDefinition", [("url", url)])
    if version:
        found = [v for v in found if v.get("version") == version]
    if not found:
        raise FhirError.of(404, "not-found", f"ViewDefinition with reference {value!r} not "
                           "found", where)
    if len(found) > 1:
        raise FhirError.of(400, "multiple-matches", f"Several ViewDefinitions have the URL "
                           f"{value!r}: add |version", where)
    return found[0]


def inline_view(view: JSON, where: str) -> CompiledView:
    """An inline ViewDefinition checked and compiled (422 naming what is wrong). Its
    ``status`` may be left out: a view sent to run is not one published."""
    checked = view if "status" in view else {**view, "status": "draft"}
    issues = [Issue(i.severity, i.code, i.diagnostics.replace("ViewDefinition", where, 1),
                    tuple(e.replace("ViewDefinition", where, 1) for e in i.expression))
              for i in structure_issues(checked, "ViewDefinition")]
    if issues:
        raise ViewInvalid(issues, 422)
    try:
        return compile_view(view, where=where, strict=False)
    except ViewInvalid as exc:
        raise ViewInvalid(exc.issues, 422) from None


def stored_compiled(view: JSON, where: str) -> CompiledView:
    """A stored view compiled to run (it passed the strict checks when written)."""
    try:
        return compile_view(view, where=where, strict=False)
    except ViewInvalid as exc:  # stored before today's checks: say so, not a 500
        raise ViewInvalid(exc.issues, 422) from None

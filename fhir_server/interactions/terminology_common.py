"""What the terminology operations share: their input parameters (from the query string
of a GET, or a ``Parameters`` body of a POST, or both), the terminology content they read,
the resource an instance-level call names, and their ``Parameters`` answers.

Every operation reads the content the validator reads (shipped R4 terminology and the
CodeSystem, ValueSet and ConceptMap resources stored on the server, by canonical URL); an
instance-level call (``ValueSet/[id]/$expand``) reads the stored resource as its caller,
so the access policy decides. Bad input is a 400 OperationOutcome naming the parameter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from fhir_server.http import check_format, read_json_body
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import FhirError
from fhir_server.terminology.content import TerminologyContent


@dataclass(slots=True)
class OperationInput:
    """An operation's parameters by name: values (primitives as text, complex values and
    resources as dicts), in order."""

    operation: str
    values: dict[str, list[Any]] = field(default_factory=dict)

    def all(self, name: str) -> list[Any]:
        return self.values.get(name, [])

    def text(self, name: str) -> str | None:
        found = self.values.get(name)
        if not found:
            return None
        value = found[0]
        if not isinstance(value, str):
            raise FhirError.of(400, "invalid", f"{self.operation}: the parameter '{name}' "
                               "must be a simple value", name)
        return value

    def complex(self, name: str) -> dict[str, Any] | None:
        found = self.values.get(name)
        if not found:
            return None
        if not isinstance(found[0], dict):
            raise FhirError.of(400, "invalid", f"{self.operation}: the parameter '{name}' "
                               "must be a complex value (a Parameters body)", name)
        return found[0]  # type: ignore[no-any-return]

    def flag(self, name: str) -> bool:
        value = self.values.get(name)
        if not value:
            return False
        text = str(value[0]).lower()
        if text not in ("true", "false"):
            raise FhirError.of(400, "invalid", f"{self.operation}: '{name}' must be true or "
                               "false", name)
        return text == "true"

    def integer(self, name: str, default: int, *, low: int = 0, high: int = 10_000) -> int:
        value = self.text(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise FhirError.of(400, "invalid", f"{self.operation}: '{name}' must be an "
                               f"integer, not {value!r}", name) from None
        if not low <= number <= high:
            raise FhirError.of(400, "invalid", f"{self.operation}: '{name}' must be between "
                               f"{low} and {high}", name)
        return number

    def require(self, *names: str) -> None:
        if not any(self.values.get(n) for n in names):
            raise FhirError.of(400, "required", f"{self.operation} needs "
                               f"{' or '.join(repr(n) for n in names)}", names[0])


async def read_input(request: Request, operation: str) -> OperationInput:
    """The parameters of a GET (query string) or POST (Parameters body, and the query)."""
    check_format(request)
    found = OperationInput(operation)
    for name, value in request.query_params.multi_items():
        if not name.startswith("_"):
            found.values.setdefault(name, []).append(value)
    if request.method == "POST":
        body = await read_json_body(request)
        if not isinstance(body, dict) or body.get("resourceType") != "Parameters":
            raise FhirError.of(400, "invalid", f"{operation} takes a Parameters resource as "
                               "its body")
        for index, parameter in enumerate(body.get("parameter") or ()):
            if not isinstance(parameter, dict) or not isinstance(parameter.get("name"), str):
                raise FhirError.of(400, "invalid", "each parameter needs a name",
                                   f"Parameters.parameter[{index}]")
            value = _value_of(parameter)
            if value is None:
                raise FhirError.of(400, "invalid", f"the parameter '{parameter['name']}' has "
                                   "no value", f"Parameters.parameter[{index}]")
            found.values.setdefault(parameter["name"], []).append(value)
    return found


def _value_of(parameter: dict[str, Any]) -> Any:
    if "resource" in parameter:
        return parameter["resource"]
    for key, value in parameter.items():
        if key.startswith("value"):
            if isinstance(value, bool):
                return "true" if value else "false"
            if isinstance(value, int | float):
                return str(value)
            return value
    if parameter.get("part"):
        return {p.get("name"): _value_of(p) for p in parameter["part"] if isinstance(p, dict)}
    return None


async def terminology(ctx: FhirContext) -> TerminologyContent:
    return (await ctx.service.conformance.registry.refresh()).terminology


async def stored_resource(ctx: FhirContext, request: Request, resource_type: str,
                          resource_id: str) -> dict[str, Any]:
    """The resource an instance-level call names, read as the caller (404, 403, 410)."""
    return await ctx.caller(request).read_json(resource_type, resource_id)


def parameters(*items: tuple[str, Any]) -> dict[str, Any]:
    """A Parameters resource from (name, value) pairs: a bool, str, int, a dict with
    ``_type`` (e.g. ``{"_type": "Coding", ...}``), a resource, or a list of parts."""
    return {"resourceType": "Parameters",
            "parameter": [p for name, value in items if (p := parameter(name, value))]}


def parameter(name: str, value: Any, kind: str = "String") -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return {"name": name, "valueBoolean": value}
    if isinstance(value, int):
        return {"name": name, "valueInteger": value}
    if isinstance(value, str):
        return {"name": name, f"value{kind}": value}
    if isinstance(value, tuple) and len(value) == 2:  # (type, value)
        return {"name": name, f"value{value[0]}": value[1]}
    if isinstance(value, dict) and "resourceType" in value:
        return {"name": name, "resource": value}
    if isinstance(value, list):  # parts
        return {"name": name, "part": [p for n, v in value if (p := parameter(n, v))]}
    raise TypeError(f"cannot write {value!r} as a parameter")


def codings_of(found: OperationInput, code_name: str = "code", system_name: str = "system",
               version_name: str = "version") -> list[dict[str, Any]]:
    """The codings an operation was given: ``code`` + ``system``, ``coding``, or the
    codings of ``codeableConcept``."""
    codings: list[dict[str, Any]] = []
    code = found.text(code_name)
    if code is not None:
        codings.append({"system": found.text(system_name), "code": code,
                        "version": found.text(version_name), "display": found.text("display")})
    coding = found.complex("coding")
    if coding is not None:
        codings.append(coding)
    concept = found.complex("codeableConcept")
    if concept is not None:
        codings += [c for c in concept.get("coding") or () if isinstance(c, dict)]
    return codings


def first(items: Iterable[Any]) -> Any:
    return next(iter(items), None)

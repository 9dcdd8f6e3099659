"""Validation of incoming resources against the official FHIR R4 JSON Schema.

Every write is checked with the R4 JSON Schema (``fhir_server/data/fhir.schema.json``,
generated from the official definitions by ``scripts/generate_fhir_data.py``) through
``jsonschema-rs``, a compiled validator: types, cardinality (arrays), required elements,
code value sets bound as ``enum``, primitive formats (the spec's regular expressions) and
no unknown elements, in 5-40 µs a resource.

Departure from the design (ARCHITECTURE.md names fhir.resources): fhir.resources'
pydantic models cost 270-950 µs a resource on this hardware, more than storing it, and
made validation a third of every write and of HL7 ingest. They remain the validator for
the one type the R4 schema lacks (SubscriptionStatus, an R4B backport), and
``strict=True`` adds them on top of the schema for the rules it cannot express (one
``value[x]`` of a choice, an element needs a value or an extension): see
``HEALTHPLATFORM_FHIR_STRICT_VALIDATION``.

The stored JSON is the client's JSON, not a model dump. Errors name the failing element as
a FHIRPath-like expression (``Patient.name[0].given``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from functools import cache
from typing import Any

import jsonschema_rs
import orjson
from pydantic import ValidationError

# The definitions the validator checks against, also read here by older callers.
from fhir_server.definitions import is_resource_type as is_resource_type
from fhir_server.definitions import resource_types as resource_types
from fhir_server.definitions import schema as _schema
from fhir_server.definitions import schema_definitions as schema_definitions
from fhir_server.outcome import FhirError, Issue

ID_PATTERN = re.compile(r"^[A-Za-z0-9\-.]{1,64}$")


def preload() -> None:
    """Load the R4 schema and compile its validator now rather than on the first write.

    A long-running server calls this before it freezes what startup made (``gc.freeze``,
    see ``platform_api.cli.tune_gc``): the schema is ~56,000 dicts and lists that live as
    long as the process, which loaded later stayed among the objects the garbage
    collector walks; and the first write no longer waits ~0.3 s for the compile."""
    resource_types()
    _compiled()


def _validator(resource_type: str) -> Any | None:
    """The validator for resources of ``resource_type``, or None for a type the R4 schema
    lacks. One validator serves every type (see ``_compiled``)."""
    return _compiled() if resource_type in _schema()["definitions"] else None


@cache
def _compiled() -> Any:
    """The whole R4 schema compiled once, each resource checked against the definition of
    its ``resourceType``.

    A validator per type (``{"$ref": "#/definitions/Patient"}``) compiled the whole schema
    every time, since ``contained`` may hold a resource of any type: 52 MB and 0.25 s per
    resource type a server met (1.6 GB for 30 types, measured), which a clinic's small
    machine cannot spare. Here the root picks the definition by ``resourceType``: a list
    per initial letter (``enum``), then the type itself (``const``), so a resource passes
    ~20 cheap checks before its own definition (+1-3 µs a resource). Draft 7 for ``if`` /
    ``then``; the schema is draft 6, whose keywords mean the same in draft 7. Errors point
    into ``definitions`` as before (``$ref`` targets are reported by their location)."""
    schema = _schema()
    types = sorted(t for t in resource_types() if t in schema["definitions"])
    groups: dict[str, list[str]] = {}
    for name in types:
        groups.setdefault(name[0], []).append(name)

    def pick(names: list[str], then: Any) -> dict[str, Any]:
        key = {"enum": names} if len(names) > 1 else {"const": names[0]}
        return {"if": {"properties": {"resourceType": key}}, "then": then}

    root = {key: value for key, value in schema.items() if key not in ("oneOf", "discriminator")}
    root["$schema"] = "http://json-schema.org/draft-07/schema#"
    root["allOf"] = [
        pick(names, {"allOf": [pick([name], {"$ref": f"#/definitions/{name}"})
                               for name in names]})
        for names in groups.values()]
    return jsonschema_rs.Draft7Validator(root)


@cache
def _model(resource_type: str) -> Any | None:
    from fhir.resources.R4B import get_fhir_model_class

    try:
        return get_fhir_model_class(resource_type)
    except (KeyError, ValueError, AttributeError, ImportError):
        return None


def check_id(resource_id: str) -> None:
    if not ID_PATTERN.match(resource_id):
        raise FhirError.of(400, "value", f"Invalid resource id {resource_id!r}: "
                           "1-64 characters of A-Z, a-z, 0-9, '-' and '.'")


def _expression(resource_type: str, loc: tuple[Any, ...]) -> str:
    path = resource_type
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "__root__":
            path += f".{part}"
    return path


def validate_resource(body: Any, expected_type: str | None = None, *, strict: bool = False
                      ) -> dict[str, Any]:
    """Check ``body`` is a valid resource (of ``expected_type`` when given); return it.

    ``strict`` adds the fhir.resources model checks to the JSON Schema's."""
    resource_type = check_shape(body, expected_type)
    validator = _validator(resource_type)
    if validator is not None and not validator.is_valid(body):
        raise FhirError(400, list(_schema_issues(validator, body, resource_type)))
    if strict or validator is None:
        issues = _model_issues(body, resource_type)
        if issues:
            raise FhirError(400, issues)
    issues = content_issues(body, resource_type)
    if issues:
        raise FhirError(400, issues)
    return body


def content_issues(body: dict[str, Any], resource_type: str) -> list[Issue]:
    """What an added type's own rules find wrong beyond its schema: a ViewDefinition's
    paths, column names and collections (:mod:`fhir_server.views.definition`)."""
    if resource_type != "ViewDefinition":
        return []
    from fhir_server.views.definition import view_issues
    return view_issues(body)


def structure_issues(body: Any, expected_type: str | None = None) -> list[Issue]:
    """What the JSON Schema alone finds wrong with ``body`` (for a resource that is run
    rather than stored, such as a ViewDefinition sent to ``$run``)."""
    try:
        resource_type = check_shape(body, expected_type)
    except FhirError as exc:
        return exc.issues
    validator = _validator(resource_type)
    if validator is None or validator.is_valid(body):
        return []
    return list(_schema_issues(validator, body, resource_type))


def check_shape(body: Any, expected_type: str | None) -> str:
    """A JSON object of a known resource type (the expected one) with a valid id: its
    type; otherwise a 400 FhirError."""
    if not isinstance(body, dict):
        raise FhirError.of(400, "structure", "The body must be a JSON object (a FHIR resource)")
    resource_type = body.get("resourceType")
    if not isinstance(resource_type, str) or not resource_type:
        raise FhirError.of(400, "required", "resourceType is missing", "resourceType")
    if expected_type is not None and resource_type != expected_type:
        raise FhirError.of(
            400, "invalid",
            f"resourceType {resource_type!r} does not match the URL's type {expected_type!r}",
            "resourceType",
        )
    if not is_resource_type(resource_type):
        raise FhirError.of(400, "not-supported", f"Unknown resource type {resource_type!r}",
                           "resourceType")
    if "id" in body and (not isinstance(body["id"], str) or not ID_PATTERN.match(body["id"])):
        raise FhirError.of(400, "value", "id must be 1-64 characters of A-Z a-z 0-9 - .",
                           f"{resource_type}.id")
    return resource_type


# At most this many issues for one resource: the first ones say what is wrong.
MAX_ISSUES = 20


def _schema_issues(validator: Any, body: Any, path: str) -> Iterator[Issue]:
    seen: set[str] = set()
    for error in validator.iter_errors(body):
        expression = _expression(path, tuple(error.instance_path))
        kind = type(error.kind).__name__
        # A primitive's value fails both its type and its pattern: one issue is enough.
        key = expression if kind in ("Type", "Pattern") else f"{expression} {error.message}"
        if key in seen:
            continue
        seen.add(key)
        nested = _nested_resource(error)
        if nested is not None:  # a contained / entry resource: say what is wrong inside it
            yield from _schema_issues(nested, error.instance, expression)
        elif kind == "AdditionalProperties":  # one issue per unknown element, named
            for name in error.kind.unexpected:
                yield Issue("error", "structure", f"{expression}.{name}: unknown element "
                            f"(not defined in FHIR R4 for {expression})",
                            (f"{expression}.{name}",))
        else:
            code = "required" if kind in ("Required", "AnyOf") else "value"
            if _is_choice_conflict(kind, error):  # name the element, not its parent
                expression = f"{expression}.{error.schema_path[-2]}"
            yield Issue("error", code, f"{expression}: {_message(kind, error)}", (expression,))
        if len(seen) >= MAX_ISSUES:
            return


def _nested_resource(error: Any) -> Any | None:
    """The validator of a resource inside a resource that failed the ``ResourceList``
    choice (``contained``, ``Bundle.entry.resource``, ``Parameters.parameter.resource``)."""
    instance = error.instance
    if type(error.kind).__name__ != "OneOfNotValid" or not isinstance(instance, dict):
        return None
    resource_type = instance.get("resourceType")
    if not isinstance(resource_type, str):
        return None
    return _validator(resource_type)


def _message(kind: str, error: Any) -> str:
    if kind == "Pattern" and len(error.schema_path) >= 2:
        return f"{json.dumps(error.instance)} is not a valid FHIR {error.schema_path[-2]}"
    if kind == "AnyOf":  # a required primitive (value or _extension), a required choice
        names = [n for option in _schema_node(error.schema_path)
                 for n in option.get("required", [])]
        return f"{' or '.join(names)} is required"
    if _is_choice_conflict(kind, error):
        return "another type of the same choice element is given too (one type at a time)"
    if kind == "OneOfNotValid" and isinstance(error.instance, dict):
        return "not a resource of a known type (resourceType missing or unknown)"
    return str(error.message)


def _is_choice_conflict(kind: str, error: Any) -> bool:
    path = error.schema_path
    return kind == "Not" and len(path) >= 3 and path[-3] == "dependencies"


def _schema_node(path: Any) -> Any:
    node: Any = _schema()
    for part in path:
        node = node[part]
    return node


def _model_issues(body: dict[str, Any], resource_type: str) -> list[Issue]:
    model = _model(resource_type)
    if model is None:
        return []
    try:
        model.model_validate(body)
    except ValidationError as exc:
        return [
            Issue("error", "structure" if err["type"] == "extra_forbidden" else "value",
                  f"{_expression(resource_type, err['loc'])}: {err['msg']}",
                  (_expression(resource_type, err["loc"]),))
            for err in exc.errors()
        ]
    except KeyError:
        # A resource of a type the models lack inside this one (a ViewDefinition in a
        # Parameters or Bundle): the schema has checked it, the models cannot.
        return []
    return []


def without_invalid_elements(resource: dict[str, Any]) -> dict[str, Any]:
    """``resource`` as far as the R4 schema accepts it: a copy without the elements it
    refuses (unknown ones, and values of the wrong type or format), or ``resource``
    itself when it is valid. For what reads records stored before today's validation
    caught them (an /api view of a Patient whose ``name`` holds a list of lists): they
    show what is sound instead of failing. Problems no element carries (a required
    element missing from the resource itself) stay."""
    validator = _validator(str(resource.get("resourceType")))
    if validator is None or validator.is_valid(resource):
        return resource
    paths: set[tuple[str | int, ...]] = set()
    for error in validator.iter_errors(resource):
        path = tuple(error.instance_path)
        if type(error.kind).__name__ == "AdditionalProperties":
            paths.update((*path, name) for name in error.kind.unexpected)
        elif path:
            paths.add(path)
    pruned: dict[str, Any] = orjson.loads(orjson.dumps(resource))
    # Deepest first, and the later items of a list before the earlier ones, so that no
    # removal moves what another one points at.
    for path in sorted(paths, key=_removal_order, reverse=True):
        _remove(pruned, path)
    return pruned


def _removal_order(path: tuple[str | int, ...]) -> tuple[Any, ...]:
    return (len(path), *((1, part, "") if isinstance(part, int) else (0, 0, part)
                         for part in path))


def _remove(node: Any, path: Sequence[str | int]) -> None:
    for part in path[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return  # already gone with an element that contained it
    last = path[-1]
    if isinstance(node, dict) and isinstance(last, str):
        node.pop(last, None)
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        del node[last]

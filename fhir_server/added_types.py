"""Resource types this server stores beyond FHIR R4, defined as data.

``fhir_server/data/added-types.json`` is a Bundle of StructureDefinitions and their
SearchParameters, today one type: **ViewDefinition** (SQL on FHIR v2; the
specification defines it as a logical model over R5's CanonicalResource, transcribed here
as a resource type with the elements of that model and its base). From the Bundle:

- :func:`added_type_names`: the types, which :func:`fhir_server.validation.resource_types`
  adds to R4's (routes, search, capability statement, validation all follow);
- :func:`schema_definitions`: each StructureDefinition turned into JSON Schema
  definitions in the shape of the R4 schema's (a property per element, ``value[x]`` one
  property per type, arrays for ``max = *``, required elements, no unknown elements,
  backbone elements as ``<Type>_<Element>`` definitions, ``contentReference`` as a
  ``$ref``), which the validator merges into the R4 schema;
- :func:`search_parameters`: the SearchParameters, which
  ``scripts/generate_search_parameters.py`` writes into the registry with R4's.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

JSON = dict[str, Any]
FILE = "added-types.json"


@cache
def _bundle() -> list[JSON]:
    text = resources.files("fhir_server.data").joinpath(FILE).read_text()
    return [entry["resource"] for entry in json.loads(text)["entry"]]


def structures() -> list[JSON]:
    return [r for r in _bundle() if r["resourceType"] == "StructureDefinition"]


def search_parameters() -> list[JSON]:
    return [r for r in _bundle() if r["resourceType"] == "SearchParameter"]


@cache
def added_type_names() -> frozenset[str]:
    return frozenset(sd["type"] for sd in structures())


def structure(resource_type: str) -> JSON | None:
    return next((sd for sd in structures() if sd["type"] == resource_type), None)


# A datatype the R4 schema does not define, checked as the one it specializes: R4's
# schema leaves out the types no R4 resource reaches (oid, uuid), and integer64 is R5's
# (a string in JSON).
STANDS_FOR = {"oid": "uri", "uuid": "uri", "integer64": "string"}


def schema_definitions(known: frozenset[str]) -> dict[str, JSON]:
    """JSON Schema definitions of every added type (R4 schema conventions); ``known``:
    the datatypes the schema defines (others as :data:`STANDS_FOR` says, else left
    out)."""
    definitions: dict[str, JSON] = {}
    for sd in structures():
        definitions.update(_definitions_of(sd, known))
    return definitions


def _definition_name(path: str) -> str:
    """``ViewDefinition.select.column`` → ``ViewDefinition_Select_Column``."""
    head, *rest = path.split(".")
    return "_".join([head, *(part[:1].upper() + part[1:] for part in rest)])


def _definitions_of(sd: JSON, known: frozenset[str]) -> dict[str, JSON]:
    elements = sd["snapshot"]["element"]
    root = sd["type"]
    definitions: dict[str, JSON] = {root: {
        "properties": {"resourceType": {"const": root}}, "additionalProperties": False,
        "required": ["resourceType"], "type": "object"}}
    for element in elements[1:]:
        parent_path, _, name = element["path"].rpartition(".")
        parent = definitions.setdefault(_definition_name(parent_path), {
            "properties": {}, "additionalProperties": False, "type": "object"})
        many = element["max"] == "*"
        if element.get("contentReference"):
            targets = [(name, _definition_name(element["contentReference"].lstrip("#")))]
        elif name.endswith("[x]"):
            codes = [t["code"] if t["code"] in known else STANDS_FOR.get(t["code"], "")
                     for t in element["type"]]
            targets = [(name[:-3] + t["code"][:1].upper() + t["code"][1:], code)
                       for t, code in zip(element["type"], codes, strict=True)
                       if code in known]
        else:
            code = element["type"][0]["code"]
            if code == "BackboneElement":
                code = _definition_name(element["path"])
                definitions.setdefault(code, {"properties": {}, "additionalProperties":
                                              False, "type": "object"})
            elif code == "Resource":
                code = "ResourceList"
            targets = [(name, code)]
        for key, code in targets:
            ref = {"$ref": f"#/definitions/{code}"}
            parent["properties"][key] = {"type": "array", "items": ref} if many else ref
            if code[:1].islower():  # a primitive: its id and extensions in _<name>
                element_ref = {"$ref": "#/definitions/Element"}
                parent["properties"][f"_{key}"] = {"type": "array", "items": element_ref} \
                    if many else element_ref
        if element["min"] >= 1 and not name.endswith("[x]"):
            parent.setdefault("required", []).append(name)
    for name, definition in definitions.items():
        if name != root:  # backbone elements carry id, extension, modifierExtension
            properties = definition["properties"]
            properties.setdefault("id", {"$ref": "#/definitions/string"})
            for key in ("extension", "modifierExtension"):
                properties.setdefault(key, {"type": "array",
                                            "items": {"$ref": "#/definitions/Extension"}})
    return definitions


def summary_elements() -> dict[str, dict[str, list[str]]]:
    """Per added type, its top-level elements marked isSummary and those required (what
    ``_summary`` and ``_elements`` keep), as the search-parameter generator records them."""
    result: dict[str, dict[str, list[str]]] = {}
    for sd in structures():
        summary, mandatory = [], []
        for element in sd["snapshot"]["element"]:
            path = element["path"].split(".")
            if len(path) != 2:
                continue
            name = path[1].removesuffix("[x]")
            if element.get("isSummary"):
                summary.append(name)
            if element.get("min", 0) >= 1:
                mandatory.append(name)
        result[sd["type"]] = {"summary": summary, "mandatory": mandatory}
    return result

